"""The DFlashDraftModel checkpoint format, both ways: tensor names, config.json from a DrafterConfig and back.

The format SGLang, vLLM and z-lab load (docs/dflash-method.md section 4); export.py writes and reads folders in it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.data.draft_vocab import target_ids_of
from .export_variant import variant_fields_of_export, variant_of_export

HEAD = "lm_head.weight"  # a pruned drafter's own head: the target's rows of its draft vocabulary


def build_export(config: DrafterConfig, state: dict, *, dtype: torch.dtype, target_head: torch.Tensor | None = None,
                 extra: dict | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, config.json) of the serving checkpoint: the one place its contents are decided.

    `state` is the drafter's state dict; `target_head` (V, H) is required for a pruned draft vocabulary, whose
    export carries `lm_head.weight` = target_head[arange(d) + d2t] beside `d2t` and `draft_vocab_size`: the layout
    speculators saves its own pruned DFlash drafters in, and the rows vLLM reads as the drafter's head
    (serving_engines.py). A variant adds its tensors and config keys to what this returns."""
    tensors = {k: state[k].detach().to("cpu", dtype if state[k].is_floating_point() else state[k].dtype)
               .contiguous() for k in export_state_names(config)}  # d2t stays int64
    H, nH = config.hidden_size, config.num_target_features * config.hidden_size
    assert tensors["fc.weight"].shape == (H, nH), tensors["fc.weight"].shape  # [H, n*H] per the format
    if config.draft_vocab_size is not None:
        if target_head is None:
            raise ValueError("a pruned draft vocabulary exports the target head's rows as lm_head.weight, and no "
                             "target head was given. Fix: pass target= (the model the drafter was trained on).")
        if tuple(target_head.shape) != (config.vocab_size, H):
            raise ValueError(f"the target head has shape {tuple(target_head.shape)}, the drafter expects "
                             f"({config.vocab_size}, {H}). Fix: pass the target the drafter was trained on.")
        ids = target_ids_of(tensors["d2t"])
        tensors[HEAD] = target_head.detach().to("cpu")[ids].to(dtype).contiguous()
    return tensors, export_config(config, dtype=str(dtype).replace("torch.", ""), extra=extra)


def export_state_names(config: DrafterConfig) -> list[str]:
    """Exactly the tensor names of the serving checkpoint (docs/dflash-method.md section 4)."""
    names = []
    for i in range(config.num_hidden_layers):
        a = f"layers.{i}.self_attn."
        names += [a + f"{x}_proj.weight" for x in "qkvo"] + [a + "q_norm.weight", a + "k_norm.weight"]
        names += [f"layers.{i}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        names += [f"layers.{i}.input_layernorm.weight", f"layers.{i}.post_attention_layernorm.weight"]
    names += ["fc.weight", "hidden_norm.weight", "norm.weight"]
    # a pruned drafter's draft -> target map, int64 offsets as EAGLE-3 / speculators store it
    return names + (["d2t"] if config.draft_vocab_size is not None else [])


def export_config(config: DrafterConfig, *, dtype: str = "bfloat16", extra: dict | None = None) -> dict:
    """The config.json of a DFlashDraftModel checkpoint (Qwen3 fields + the DFlash fields, layer_types explicit)."""
    sliding = "sliding_attention" in config.layer_types
    windows = sorted({w for w in config.windows if w is not None})
    if len(windows) > 1:  # perf
        raise ValueError(
            f"the drafter has {len(windows)} distinct sliding windows {windows} (layer_windows="
            f"{list(config.layer_windows)}), but config.json has ONE `sliding_window` for every sliding_attention "
            "layer: Hugging Face's Qwen3Config and the engines that read it (vLLM, SGLang) would serve every sliding "
            "layer with the same window, a different model than the one trained. Fix: train with one window "
            "(layer_windows=() and sliding_window=W) for a servable drafter; per-layer windows are for experiments.")
    window = windows[0] if windows else None
    rope_params = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling:
        rope_params = {**config.rope_scaling, "rope_theta": config.rope_theta}
        rope_params.setdefault("rope_type", rope_params.get("type", "default"))
    out = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "rope_parameters": rope_params,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.tie_word_embeddings,
        "layer_types": list(config.layer_types),
        "use_sliding_window": sliding,
        "sliding_window": window if sliding else None,
        "max_window_layers": config.num_hidden_layers,
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        "dflash_config": {"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids)},
        "dtype": dtype,
    }
    if config.draft_vocab_size is not None:  # (absent = the full vocabulary, as in z-lab's configs)
        out["draft_vocab_size"] = config.draft_vocab_size
    if extra:
        out.update(extra)
    return out


def is_exported(path: Path) -> bool:
    cfg = path / "config.json"
    if not (cfg.is_file() and (path / "model.safetensors").is_file()):
        return False
    try:
        d = json.loads(cfg.read_text())
    except json.JSONDecodeError:
        return False
    archs = d.get("architectures") or []
    return ("DFlashDraftModel" in archs or variant_of_export(d) != "dflash") and "dflash_config" in d


def config_from_export(d: dict) -> DrafterConfig:
    """DrafterConfig from an exported config.json (ours, a published z-lab one, or a variant's: its heads' fields
    and training block read back by export_variant.variant_fields_of_export)."""
    dc = d.get("dflash_config") or {}
    missing = [k for k in ("mask_token_id", "target_layer_ids") if k not in dc]
    if missing or "block_size" not in d:
        raise ValueError(f"exported config.json lacks {missing + ([] if 'block_size' in d else ['block_size'])}: "
                         "not a DFlashDraftModel checkpoint. Fix: export with `python -m dflash_lab.evaluation.export`.")
    ids = tuple(dc["target_layer_ids"])
    rope_theta = d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    layer_types = tuple(d.get("layer_types") or ())
    n_target = d.get("num_target_layers") or max(ids) + 1
    variant = {"block_size": d["block_size"], **variant_fields_of_export(d)}
    return DrafterConfig(
        hidden_size=d["hidden_size"], target_hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
        rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=float(rope_theta), rope_scaling=d.get("rope_scaling"),
        max_position_embeddings=d.get("max_position_embeddings", 40960), vocab_size=d["vocab_size"],
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        mask_token_id=dc["mask_token_id"], num_target_layers=n_target, target_layer_ids=ids,
        layer_types=layer_types, sliding_window=d.get("sliding_window") if "sliding_attention" in layer_types else None,
        draft_vocab_size=d.get("draft_vocab_size") if d.get("draft_vocab_size") != d["vocab_size"] else None,
        **variant)
