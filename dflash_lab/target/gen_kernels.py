"""Which kernels the target's own modules run while the generation engine drives them: decode attention without
repeated K/V for grouped-query targets, and fused or plain RMSNorms; set for the engine's forwards, then put back.

Decode attention. Hugging Face's sdpa path repeats K and V to every query head when a mask is given
(`repeat_kv`, since SDPA's mask kernels take no grouped K/V): for SmolLM2 (9 query heads, 3 KV heads) a decode step
at 512 rows x 256 positions then reads and writes ~7x the cache bytes it needs, ~10 GB per step over 30 layers. A
one-token query does not need it: the g query heads that share a KV head become g query rows of that KV head,
    query (B, kvh * g, 1, d) -> (B, kvh, g, d),   mask (B, 1, 1, S) -> (B, 1, g, S),   K/V (B, kvh, S, d) as stored
which is the same attention (each query row's softmax over the same keys) with K/V read once. Prefill and every
other shape go to Hugging Face's own sdpa function unchanged. The function is registered in transformers'
AttentionInterface under its own name and selected through the attention modules' config only inside
`engine_kernels`, so the model is the plain sdpa model for everyone else.

Per-row lengths. When the engine passes `decode_lengths` (each row's key count, position + 1) and `decode_kernel`
through the decoder layer's keywords (transformers' Llama and Qwen3 layers hand extra keywords down to the
attention function), a one-token step runs decode_attention.py instead: row b reads only its own keys, not the
length bucket of the longest row. `decode_attention_choice` resolves the engine's knob to the kernel that runs.

RMSNorms: `fused=True` runs them as one torch.rms_norm kernel (features.fuse_rms_norms, as the trainer's feature
extractor does); `fused=False` runs the modules' own forward. Either way the previous state comes back on exit.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from .decode_attention import reference_decode_attention, triton_available, triton_decode_attention
from .features import fuse_rms_norms

GROUPED_DECODE = "dflash_grouped_decode"
DECODE_ATTENTION = ("auto", "sdpa", "triton", "reference")
PER_ROW_KERNELS = {"triton": triton_decode_attention, "reference": reference_decode_attention}


def grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             is_causal=None, **kwargs):
    """Hugging Face attention-function contract -> (attn_output (B, T, H, d), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    lengths, kernel = kwargs.pop("decode_lengths", None), kwargs.pop("decode_kernel", "triton")
    B, n_heads, T, d = query.shape
    kv_heads = key.shape[1]
    if T == 1 and lengths is not None and kwargs.get("position_bias") is None:
        return PER_ROW_KERNELS[kernel](query, key, value, lengths, scaling), None
    if T != 1 or attention_mask is None or n_heads == kv_heads or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    g = n_heads // kv_heads
    q = query.reshape(B, kv_heads, g, d)  # query head h = kv * g + j (the order repeat_kv serves them in)
    mask = attention_mask.expand(B, 1, g, attention_mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=0.0,
                                                           scale=scaling)  # (B, kvh, g, d)
    return out.reshape(B, n_heads, 1, d).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)  # idempotent: a name -> function entry


def _attention_configs(decoder) -> list:
    """The distinct config objects the decoder's attention modules read their implementation from."""
    seen = {}
    for layer in decoder.layers:
        cfg = getattr(getattr(layer, "self_attn", None), "config", None)
        if cfg is not None:
            seen[id(cfg)] = cfg
    return list(seen.values())


def _norms(decoder) -> list:
    return [m for m in decoder.modules()
            if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon") and hasattr(m, "weight")]


def _all_sdpa(decoder) -> bool:
    return all(getattr(c, "_attn_implementation", None) == "sdpa" for c in _attention_configs(decoder))


def grouped_decode_applies(decoder) -> bool:
    """True for sdpa targets with grouped-query attention (where repeat_kv would copy K/V)."""
    attn = getattr(decoder.layers[0], "self_attn", None)
    return getattr(attn, "num_key_value_groups", 1) > 1 and _all_sdpa(decoder)


def decode_attention_choice(choice: str, decoder, device: torch.device, grouped_decode: bool) -> str:
    """The kernel a Generator's decode steps run: "sdpa" (masked over the length bucket), "triton" or "reference"
    (per-row lengths, decode_attention.py). auto = triton on CUDA when triton imports and the target is sdpa."""
    if choice not in DECODE_ATTENTION:
        raise ValueError(f"Generator decode_attention={choice!r} is not one of {', '.join(DECODE_ATTENTION)}. Fix: "
                         "use 'auto' (Triton per-row kernel on CUDA when triton imports, else sdpa).")
    if choice == "sdpa":
        return choice
    why = None
    if not grouped_decode:
        why = "grouped_decode=False runs Hugging Face's own attention"
    elif not _all_sdpa(decoder):
        why = "the target's attention implementation is not sdpa"
    elif choice != "reference" and (device.type != "cuda" or not triton_available()):
        why = f"the engine runs on {device}" if device.type != "cuda" else "triton is not importable"
    if why is None:
        return "triton" if choice == "auto" else choice
    if choice == "auto":
        return "sdpa"
    raise ValueError(f"Generator decode_attention={choice!r} cannot run here: {why}. Fix: use 'auto' or 'sdpa'.")


_active: dict[int, list] = {}  # id(decoder) -> [engines inside, what to put back]
_active_lock = threading.Lock()


@contextlib.contextmanager
def engine_kernels(decoder, *, grouped_decode: bool, fused_norms: bool, per_row: bool = False):
    """Inside: grouped decode attention (if asked and it applies; with per_row also for sdpa targets without
    grouped-query attention, whose decode steps pass per-row lengths) and fused / plain RMSNorms; outside: as before.

    Engines sharing one model (CPU threads) nest: the first one in sets the kernels, the last one out puts the
    model back, so no engine sees the settings change under it (the first one's settings hold for all)."""
    key = id(decoder)
    with _active_lock:
        if key in _active:
            _active[key][0] += 1
        else:
            _active[key] = [1, _apply(decoder, grouped_decode, fused_norms, per_row)]
    try:
        yield
    finally:
        with _active_lock:
            _active[key][0] -= 1
            if _active[key][0] == 0:
                _active.pop(key)[1]()


def _apply(decoder, grouped_decode: bool, fused_norms: bool, per_row: bool = False):
    """Set the engine's kernels on `decoder`; returns the function that puts the previous ones back."""
    applies = grouped_decode_applies(decoder) or (per_row and _all_sdpa(decoder))
    configs = _attention_configs(decoder) if grouped_decode and applies else []
    old_impl = [c._attn_implementation for c in configs]
    norms = _norms(decoder)
    old_fwd = [m.__dict__.get("forward") for m in norms]  # an instance forward = fused earlier by someone
    if configs:
        _register()
    for c in configs:
        c._attn_implementation = GROUPED_DECODE
    for m in norms:
        m.__dict__.pop("forward", None)
    if fused_norms:
        fuse_rms_norms(decoder)

    def restore() -> None:
        for c, impl in zip(configs, old_impl):
            c._attn_implementation = impl
        for m, fwd in zip(norms, old_fwd):
            m.__dict__.pop("forward", None)
            if fwd is not None:
                m.forward = fwd

    return restore
