"""Per-layer attention windows: the window of each draft layer, the key of its mask, and the distinct
masks a step has to build.

A window is None on full-attention layers and a positive int on sliding ones. Masks are keyed by window, not by layer:
"full_attention", "sliding_attention" (the config's single `sliding_window`, so single-window drafters keep the
layer-type keys) or "sliding_attention_<w>"; a drafter with three sliding windows builds three masks per step, once.
"""

from __future__ import annotations

from .errors import fail


def check_layer_windows(cls: str, layer_types: tuple[str, ...], sliding_window: int | None,
                        layer_windows) -> tuple[int | None, ...]:
    """Validate per-layer windows against the layer types (and `sliding_window` when they are not given)."""
    windows = tuple(layer_windows or ())
    if not windows:
        if "sliding_attention" in layer_types and (sliding_window is None or sliding_window < 1):
            fail(cls, "sliding_window", sliding_window, "sliding_attention layers need a window",
                 "set sliding_window, e.g. 2048 (or one window per layer in layer_windows)")
        return windows
    if len(windows) != len(layer_types):
        fail(cls, "layer_windows", windows, f"it has {len(windows)} entries for {len(layer_types)} draft layers",
             "give one entry per draft layer (None on full_attention layers)")
    for i, (t, w) in enumerate(zip(layer_types, windows)):
        if t == "full_attention" and w is not None:
            fail(cls, "layer_windows", windows, f"layer {i} is full_attention but has window {w!r}",
                 "use None for full_attention layers")
        if t == "sliding_attention" and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            fail(cls, "layer_windows", windows, f"layer {i} is sliding_attention but has window {w!r}",
                 "give sliding layers a positive integer window, e.g. 2048")
    return windows


def layer_windows_of(layer_types, sliding_window, layer_windows=()) -> tuple[int | None, ...]:
    """Window per layer: `layer_windows` if given, else `sliding_window` on sliding layers; None = full."""
    if layer_windows:
        return tuple(layer_windows)
    return tuple(sliding_window if t == "sliding_attention" else None for t in layer_types)


def mask_key(window: int | None, sliding_window: int | None = None) -> str:
    """Key of a window's mask: "full_attention", "sliding_attention" (the config's `sliding_window`, so single-window
    callers keep the layer-type keys) or "sliding_attention_<w>" for any other window."""
    if window is None:
        return "full_attention"
    return "sliding_attention" if window == sliding_window else f"sliding_attention_{window}"


def window_masks(layer_types, sliding_window, layer_windows=()) -> dict[str, int | None]:
    """{mask key: window} for the distinct windows of a drafter (what has to be built once per step)."""
    return {mask_key(w, sliding_window): w for w in layer_windows_of(layer_types, sliding_window, layer_windows)}
