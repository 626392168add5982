"""The one error type of config validation, and the helper that raises it naming the field, the value and the fix."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value is invalid; the message names the field, the value and the fix."""


def fail(cls: str, name: str, value: Any, why: str, fix: str) -> None:
    raise ConfigError(f"{cls}.{name}={value!r} is invalid: {why}. Fix: {fix}.")
