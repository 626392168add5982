"""Check every field of a config dataclass against its annotation, so a field added later is checked too.

`-p lr abc` reaches TrainConfig as the string 'abc' (papermill parses unquoted numbers only); without this check it
failed later with a TypeError naming no field. Rules: int excludes bool, float accepts int, `X | None`, `tuple[X,
...]` checks every item (a JSON/YAML list becomes a tuple), any float must be finite.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Callable


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass field `name` of `cls`: code that repeats a default (a CLI flag, a message, a second
    config) reads it here, so the field stays its one source."""
    f = cls.__dataclass_fields__[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise KeyError(f"{cls.__name__}.{name} has no default")


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` is of the annotated type: int excludes bool, float accepts int, tuple[X, ...] checks items."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        args = typing.get_args(hint)
        return isinstance(value, tuple) and (len(args) != 2 or args[1] is not Ellipsis
                                             or all(_matches(v, args[0]) for v in value))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # Any and other hints are not checked here


def _cli_example(hint: Any, default: Any) -> str:
    """A value of the field's own type for the papermill hint: its default when it has one, else one per type (an
    int field must not be told `-p draft_vocab_size 0.001`, itself invalid)."""
    if default is not dataclasses.MISSING and default is not None and _matches(default, hint) and \
            isinstance(default, (int, float, str)):
        return str(default)  # papermill reads True / False / None / numbers unquoted
    kinds = [h for h in typing.get_args(hint) if h is not type(None)] or [hint]
    return {int: "16", float: "0.001", bool: "True", str: "name"}.get(kinds[0], "0.001")


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_field_types(obj: Any, fail: Callable[[str, str, Any, str, str], None]) -> None:
    """Every field against its annotation (so fields added later are checked too): lists become tuples for tuple
    fields (JSON / YAML give lists); floats must be finite. A papermill `-p lr abc` arrives here as the string 'abc'."""
    c = type(obj).__name__
    for f in dataclasses.fields(obj):
        hint, v = _field_hints(type(obj))[f.name], getattr(obj, f.name)
        if isinstance(v, list) and "tuple" in str(hint):
            v = tuple(v)
            object.__setattr__(obj, f.name, v)
        example = f", e.g. the default {f.default!r}" if f.default not in (dataclasses.MISSING, None) else ""
        if not _matches(v, hint):
            if "tuple" in str(hint):  # a lone string for a tuple field: say how to wrap it
                fix = (f"use ({v!r},)" if isinstance(v, str) else f"pass a tuple{example}") + \
                      f" (papermill: `-y '{f.name}: [...]'`)"
            else:
                fix = (f"pass a value of type {_type_name(hint)}{example} (papermill: `-p {f.name} "
                       f"{_cli_example(hint, f.default)}`; quoted numbers stay strings)")
            fail(c, f.name, v, f"must be {_type_name(hint)}, got {type(v).__name__}", fix)
        if isinstance(v, float) and not math.isfinite(v):
            fail(c, f.name, v, "must be a finite number", f"pass a finite value{example}")
