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
from dflash_lab.evaluation.serving_engines import DSPARK_ARCHITECTURE, VERSIONS


def _dspark_config(config: DrafterConfig) -> dict:
    return {"architectures": [DSPARK_ARCHITECTURE], "block_size": config.block_size - 1, "sample_from_anchor": False,
            "markov_head_type": "vanilla", "draft_vocab_size": config.draft_vocab_size or config.vocab_size}


def _dspark_notes(config: DrafterConfig) -> list[str]:
    notes = []
    if config.draft_vocab_size is not None:
        notes.append(f"SGLang {VERSIONS['sglang']} cannot serve this DSpark drafter: it has a pruned vocabulary "
                     f"({config.draft_vocab_size} ids) and SGLang's Markov head has a row per target id and drafts "
                     f"over the whole target head; vLLM {VERSIONS['vllm']} serves it. Fix for SGLang: train with "
                     "draft_vocab_size=None.")
    if not config.enable_confidence_head:
        # SGLang builds the head in every ragged verify mode but the static one, whatever the config says
        # (srt/models/dspark.py build_confidence_head), then finds no weights for it
        notes.append(f"SGLang {VERSIONS['sglang']} serves this DSpark drafter only in its default "
                     "SGLANG_RAGGED_VERIFY_MODE=static: it has no confidence head, and SGLang's other verify modes "
                     "build one regardless and refuse a checkpoint without its weights. Fix for those modes: train "
                     "with enable_confidence_head=True.")
    return notes


SERVED_AS = {"dspark": (_dspark_config, _dspark_notes)}
"""variant name -> (its config.json entries as the engines read them, what an engine cannot serve)."""
ARCHITECTURES = {"dspark": DSPARK_ARCHITECTURE}
"""variant name -> the architecture its export names (how an export without our `dflash_lab` block is recognised)."""
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


def variant_of_export(d: dict) -> str:
    """The drafter variant an exported config.json holds: our `dflash_lab.drafter_variant`, else the variant whose
    architecture it names, else "dflash"."""
    named = (d.get("dflash_lab") or {}).get("drafter_variant")
    if named:
        return named
    archs = d.get("architectures") or []
    return next((name for name, arch in ARCHITECTURES.items() if arch in archs), "dflash")


def variant_fields_of_export(d: dict) -> dict:
    """The DrafterConfig fields a variant's export carries, read back: drafter_variant, its export_config_keys and
    the training block (`dflash_lab.training_block_size`; else the engines' block of drafts plus the anchor, when
    the export says sample_from_anchor: false). {} for a DFlash export."""
    from dflash_lab.drafter.variants import VARIANTS

    name = variant_of_export(d)
    if name == "dflash":
        return {}
    if name not in VARIANTS:
        raise ValueError(f"the export names drafter variant {name!r}, which this dflash-lab does not have. Fix: "
                         f"load it with the dflash-lab that wrote it, or add the variant ({sorted(VARIANTS)} here).")
    fields = {"drafter_variant": name, **{k: d[k] for k in VARIANTS[name].export_config_keys if k in d}}
    block = (d.get("dflash_lab") or {}).get("training_block_size")
    fields["block_size"] = block or int(d["block_size"]) + (d.get("sample_from_anchor") is False)
    return fields


def state_from_served(config: DrafterConfig, tensors: dict) -> dict:
    """An export's tensors under the drafter's state-dict names: the variant's heads get their prefix back (the
    inverse of variant_export's renaming); everything else is unchanged."""
    prefix = variant_of(config).export_tensor_prefix
    heads = {name[len(prefix):] for name in variant_state_names(config)}
    return {(prefix + k if k in heads else k): v for k, v in tensors.items()}
