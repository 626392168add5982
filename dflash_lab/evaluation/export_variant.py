"""What a drafter variant adds to the exported checkpoint: its heads' tensors under the names the engines load, the
config.json entries their loaders read, and what an engine cannot serve, said before anything is written.

The variant table (drafter/variants.py) says which parameters are the variant's (`export_tensor_prefix`, stripped)
and which DrafterConfig fields it exports (`export_config_keys`); SERVED_AS says how the engines serve it. DSpark is
served as vLLM 0.34.0 (`Qwen3DSparkModel` -> qwen3_dspark.Qwen3DSparkForCausalLM) and SGLang 0.5.23
(models/dspark.py `Qwen3DSparkModel`) load it:
- `block_size` is the engines' DSpark block: the number of DRAFTS (gamma). Our block of B slots is the last token
  plus B-1 drafts at their own positions, the engines' `sample_from_anchor: false` layout (1 + gamma queries, the
  anchor a bonus query), so the export writes block_size = B - 1 and sample_from_anchor = false; the training block
  is kept under `dflash_lab.training_block_size`.
- `markov_head_type: "vanilla"` (SGLang refuses a Markov rank without it), `draft_vocab_size` always.
- the confidence head in fp32 (both engines hold it in fp32); no `auto_map` (the remote code shipped beside a DFlash
  export has no heads).
Served tensors: markov_head.markov_w1.weight (V, r), markov_head.markov_w2.weight (V_draft, r),
confidence_head.proj.{weight (1, H [+ r]), bias (1,)}. SGLang declares markov_w2 with a row per TARGET id and drafts
over the full target head, so it cannot load a pruned DSpark drafter: the export says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.variants import variant_of
from dflash_lab.evaluation.serving_engines import VERSIONS


def _dspark_config(config: DrafterConfig) -> dict:
    return {"architectures": ["Qwen3DSparkModel"], "block_size": config.block_size - 1, "sample_from_anchor": False,
            "markov_head_type": "vanilla", "draft_vocab_size": config.draft_vocab_size or config.vocab_size}


def _dspark_notes(config: DrafterConfig) -> list[str]:
    if config.draft_vocab_size is None:
        return []
    return [f"SGLang {VERSIONS['sglang']} cannot serve this DSpark drafter: it has a pruned vocabulary "
            f"({config.draft_vocab_size} ids) and SGLang's Markov head has a row per target id and drafts over the "
            f"whole target head; vLLM {VERSIONS['vllm']} serves it. Fix for SGLang: train with draft_vocab_size=None."]


SERVED_AS = {"dspark": (_dspark_config, _dspark_notes)}
"""variant name -> (its config.json entries as the engines read them, what an engine cannot serve)."""
FP32_TENSORS = ("confidence_head.",)  # served names kept in fp32 whatever the export dtype


@dataclass(frozen=True)
class VariantExport:
    """tensors: served name -> tensor; config: config.json entries to set (None: remove the key); notes: one line
    per engine that cannot serve this drafter, naming the alternative."""

    tensors: dict
    config: dict
    notes: list[str]


def variant_state_names(config: DrafterConfig) -> list[str]:
    """The variant's parameter names in the drafter's state dict (heads built on the meta device: no memory)."""
    variant = variant_of(config)
    if variant.heads is None:
        return []
    with torch.device("meta"):
        heads = variant.heads(config)
    return [variant.export_tensor_prefix + name for name in heads.state_dict()]


def variant_export(config: DrafterConfig, state: dict, dtype: torch.dtype) -> VariantExport:
    """The variant's part of the export from the drafter's state dict (DFlash: nothing)."""
    variant = variant_of(config)
    if variant.heads is None:
        return VariantExport({}, {}, [])
    prefix = variant.export_tensor_prefix
    tensors = {}
    for name in variant_state_names(config):
        served = name[len(prefix):]
        keep = torch.float32 if served.startswith(FP32_TENSORS) else dtype
        tensors[served] = state[name].detach().to("cpu", keep).contiguous()
    layout, notes = SERVED_AS[variant.name]
    entries = {key: getattr(config, key) for key in variant.export_config_keys}
    entries.update(layout(config), auto_map=None)
    entries["dflash_lab"] = {"drafter_variant": variant.name, "training_block_size": config.block_size}
    return VariantExport(tensors, entries, notes(config))


def with_variant(config: DrafterConfig, state: dict, tensors: dict, config_json: dict, dtype: torch.dtype,
                 log=print) -> tuple[dict, dict]:
    """The export's tensors and config.json with the variant's part added (export.py calls this once, before
    writing): notes are logged first, entries merged (`dflash_lab` merged key by key), None entries removed."""
    part = variant_export(config, state, dtype)
    for note in part.notes:
        log(note)
    merged = dict(config_json)
    for key, value in part.config.items():
        if key == "dflash_lab":
            merged[key] = {**merged.get(key, {}), **value}
        elif value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return {**tensors, **part.tensors}, merged
