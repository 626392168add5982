"""Configuration, the floor every stage stands on: frozen, keyword-only dataclasses for every knob (`TrainConfig`,
`DrafterConfig`), validated at construction with errors that name the field, the value and the fix; the per-family
target defaults, per-layer attention windows and the parameter/FLOP model derived from a config.

Imports nothing else of dflash_lab: every other subpackage may import it."""

from .errors import ConfigError
from .drafter_config import DrafterConfig
from .train_config import TrainConfig

__all__ = ["ConfigError", "DrafterConfig", "TrainConfig"]
