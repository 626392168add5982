"""What vLLM, SGLang and speculators read from a DFlash export, whether each serves it as trained, and the command.

The rules below restate, per engine release, how its own code reads a z-lab-format export (config.json +
model.safetensors). They were read in the released wheels (paths inside them in brackets) and are the one place the
export, its check and the docs take them from:

vLLM 0.34.0 (`--speculative-config '{"method": "dflash", ...}'`)
  - layers: causal per layer = top-level `is_causal`, else `dflash_config.causal`, else "the layer slides"
    [model_executor/models/qwen3_dflash.py `_dflash_layer_causal`]; window = `dflash_config.swa_window_size` or
    `sliding_window`, counting the query itself.
  - head: a `draft_vocab_size`-row head. An `lm_head.weight` in the checkpoint is the drafter's own (it differs from
    the target's, so it is not replaced [v1/worker/gpu/spec_decode/dflash/utils.py, eagle/utils.py `_should_share`]);
    without one the target's head is shared and the logits processor keeps its FIRST `draft_vocab_size` columns
    [layers/logits_processor.py `_get_logits`]. `compute_logits` scatters column i to target id i + d2t[i].
  - drafts `num_speculative_tokens` tokens after the anchor; `block_size` in config.json is not read.
SGLang 0.5.23 (`--speculative-algorithm DFLASH`)
  - layers: full = ENCODER_ONLY (non-causal), sliding = DECODER with the config's window, unless `is_causal`
    [srt/models/dflash.py `_get_dflash_layer_attention_params`].
  - head: none of its own; the DFlash worker drafts with the TARGET's full head [srt/speculative/dflash_worker_v2.py];
    `d2t` and `lm_head.weight` are skipped by `load_weights` as unexpected names. A pruned drafter is not servable.
  - block size from `--speculative-num-draft-tokens` (else config.json `block_size`).
speculators 0.9.0 (`SpeculatorModel.from_pretrained(export, verifier=target)`)
  - converts a z-lab export [convert/dflash/converter.py]: `draft_vocab_size` := the target's vocabulary (a pruned
    drafter becomes a full-vocabulary one; `d2t` is dropped; a reduced `lm_head.weight` fails to load: size
    mismatch), aux layer ids = ids + 1, and `sliding_window_non_causal` left at its default False.
  - its own sliding window is W context keys before the anchor for EVERY block slot [models/dflash/attention.py];
    vLLM and dflash-lab count the window from each query (slot j sees j fewer context keys).
  - vLLM serving the speculators format maps `sliding_window_non_causal` to ONE `dflash_config.causal` for every
    layer [transformers_utils/configs/speculators/algos.py `update_dflash`]: the converter's False makes every
    layer, full ones included, causal. The z-lab format is not affected.
"""

from __future__ import annotations

import json
import shlex

VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23", "speculators": "0.9.0"}
SLIDING = "sliding_attention"
DSPARK_ARCHITECTURE = "Qwen3DSparkModel"  # what vLLM's and SGLang's model registries map to their DSpark drafter


def draft_vocab_of(cfg: dict) -> int | None:
    """The pruned draft vocabulary size of an exported config.json, None for the full vocabulary."""
    d = cfg.get("draft_vocab_size")
    return None if d is None or d == cfg["vocab_size"] else int(d)


def is_dspark(cfg: dict) -> bool:
    """A DSpark export (architectures Qwen3DSparkModel): its block_size is the engines' number of drafts."""
    return DSPARK_ARCHITECTURE in (cfg.get("architectures") or [])


def drafts_per_step(cfg: dict) -> int:
    """Tokens an engine drafts per step from this export: a z-lab DFlash block of B slots is the last verified token
    and B-1 drafts; a DSpark export writes the drafts themselves as block_size (export_variant.py)."""
    return int(cfg["block_size"]) if is_dspark(cfg) else int(cfg["block_size"]) - 1


def _layer_types(cfg: dict) -> list[str]:
    return list(cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"])


def vllm_reading(cfg: dict, tensor_names: set[str]) -> dict:
    """What vLLM 0.34.0 reads from a z-lab-format export (its rules, module docstring)."""
    types = _layer_types(cfg)
    dc = cfg.get("dflash_config") or {}
    causal = []
    for t in types:
        if cfg.get("is_causal") is not None:
            causal.append(bool(cfg["is_causal"]))
        elif dc.get("causal") is not None:
            causal.append(bool(dc["causal"]))
        else:
            causal.append(t == SLIDING)
    window = dc.get("swa_window_size", cfg.get("sliding_window"))
    d = draft_vocab_of(cfg)
    why = None
    if d is None:
        vocab = f"the target's head, all {cfg['vocab_size']} ids"
    elif "lm_head.weight" in tensor_names and "d2t" in tensor_names:
        vocab = f"the export's own {d}-row lm_head, column i -> target id i + d2t[i]"
    else:
        vocab = f"the target's FIRST {d} rows (no lm_head in the export), column i -> target id i + d2t[i]"
        why = (f"vLLM {VERSIONS['vllm']} would draft draft id i with target row i instead of row i + d2t[i]. "
               "Fix: export again with this dflash-lab (it writes the drafter's head rows as lm_head.weight)")
    return {"version": VERSIONS["vllm"], "mask_token_id": dc.get("mask_token_id"),
            "target_layer_ids": list(dc.get("target_layer_ids", [])), "draft_tokens": drafts_per_step(cfg),
            "causal": causal, "window": [window if t == SLIDING else None for t in types], "vocabulary": vocab,
            "cannot_serve": why}


def sglang_reading(cfg: dict) -> dict:
    """What SGLang 0.5.23 reads from a z-lab-format export (its rules, module docstring)."""
    types = _layer_types(cfg)
    dc = cfg.get("dflash_config") or {}
    causal = [bool(cfg["is_causal"]) if cfg.get("is_causal") is not None else t == SLIDING for t in types]
    d = draft_vocab_of(cfg)
    why = None
    if d is not None:
        why = (f"SGLang {VERSIONS['sglang']} cannot serve a pruned draft vocabulary ({d} of {cfg['vocab_size']} ids): it drafts "
               "over the target's full head and ignores d2t, a different drafter. Alternative: serve this export "
               "with vLLM, or train with draft_vocab_size=None (the full vocabulary) for SGLang")
    return {"version": VERSIONS["sglang"], "mask_token_id": dc.get("mask_token_id"),
            "target_layer_ids": list(dc.get("target_layer_ids", [])), "draft_tokens": drafts_per_step(cfg),
            "causal": causal, "window": [cfg.get("sliding_window") if t == SLIDING else None for t in types],
            "vocabulary": f"the target's head, all {cfg['vocab_size']} ids", "cannot_serve": why}


def speculators_reading(cfg: dict) -> dict:
    """What speculators 0.9.0 makes of a z-lab-format export through `from_pretrained(..., verifier=...)`."""
    types = _layer_types(cfg)
    dc = cfg.get("dflash_config") or {}
    d = draft_vocab_of(cfg)
    why = None
    if d is not None:
        why = (f"speculators {VERSIONS['speculators']} converts a z-lab export to the full vocabulary (draft_vocab_size := "
               f"{cfg['vocab_size']}, d2t dropped, the {d}-row lm_head refused: size mismatch); its own format "
               "holds a pruned head (lm_head + d2t + t2d), which `python -m dflash_lab.evaluation.export_check` "
               "writes to load it")
    return {"version": VERSIONS["speculators"], "mask_token_id": dc.get("mask_token_id"),
            "aux_hidden_state_layer_ids": [i + 1 for i in dc.get("target_layer_ids", [])],
            "draft_tokens": drafts_per_step(cfg), "causal": [t == SLIDING for t in types],
            "window": [cfg.get("sliding_window") if t == SLIDING else None for t in types],
            "window_rule": "W context keys before the anchor for every slot (vLLM: counted from each query)",
            "vocabulary": f"the target's head, all {cfg['vocab_size']} ids" if d is None else
                          f"{d} ids through lm_head + d2t (its own format only)",
            "cannot_serve": why}


def engine_readings(cfg: dict, tensor_names) -> dict:
    """{engine: what it reads, and `cannot_serve` (one line naming the engine and the alternative) or None}."""
    names = set(tensor_names)
    return {"vllm": vllm_reading(cfg, names), "sglang": sglang_reading(cfg), "speculators": speculators_reading(cfg)}


DRAFTING = ("argmax", "sample")  # how a DSpark drafter's drafts were drawn at T > 0 (SpeculativeDecoder's names)


def serving_commands(cfg: dict, export_dir, target: str, *, draft_sampling: str = "argmax",
                     draft_topk: int | None = None, adaptive_verification: bool = False) -> dict:
    """{engine: the command that serves this export as it was evaluated} for vLLM and SGLang, each as its release
    parses the flags. DFlash (vLLM: `--speculative-config` JSON, method "dflash", num_speculative_tokens =
    block_size - 1; SGLang: `--speculative-algorithm DFLASH`, `--speculative-draft-model-path`,
    `--speculative-num-draft-tokens` = block_size). DSpark exports (architectures Qwen3DSparkModel) write block_size
    as the number of drafts, so vLLM's method "dspark" takes num_speculative_tokens = block_size and SGLang's DSPARK
    reads the block from the checkpoint (its `--speculative-dspark-block-size` is inferred when omitted).

    A DSpark drafter's decoding options are pinned to the ones it was evaluated with, because the engines' defaults
    differ at T > 0: vLLM drafts the argmax unless `draft_sample_method` is "probabilistic"
    [config/speculative.py], SGLang samples each draft unless SGLANG_DSPARK_USE_GREEDY_DRAFT=1 [srt/environ.py].
    draft_sampling "argmax" / "sample" -> vLLM "greedy" / "probabilistic", SGLang's variable 1 / 0. draft_topk ->
    vLLM's `dspark_draft_topk`; adaptive_verification (the confidence head choosing how many drafts to verify,
    VerifyPolicy's "cost" rule with lag 1) -> vLLM's `enable_adaptive_verification`. SGLang has no top-k option and
    prices its adaptive verification differently (verify_budget.py), so with either there is no SGLang command. An
    engine that cannot serve the export has none either (see `engine_readings`)."""
    B, dspark, drafts = cfg["block_size"], is_dspark(cfg), drafts_per_step(cfg)
    if draft_sampling not in DRAFTING:
        raise ValueError(f"draft_sampling={draft_sampling!r} has no serving equivalent. Fix: use one of "
                         f"{list(DRAFTING)}.")
    if not dspark and (draft_sampling != "argmax" or draft_topk is not None or adaptive_verification):
        raise ValueError("draft_sampling, draft_topk and adaptive_verification pin a DSpark drafter's decoding; this "
                         "export is a DFlash drafter, served with the engines' argmax drafts. Fix: leave them at "
                         "their defaults.")
    if adaptive_verification and not cfg.get("enable_confidence_head"):
        raise ValueError("adaptive_verification needs the confidence head, and this export has none "
                         "(enable_confidence_head is false). Fix: leave adaptive_verification off.")
    spec = {"method": "dspark" if dspark else "dflash", "model": str(export_dir), "num_speculative_tokens": drafts}
    if dspark:
        spec["draft_sample_method"] = "greedy" if draft_sampling == "argmax" else "probabilistic"
        if draft_topk is not None:
            spec["dspark_draft_topk"] = draft_topk
        if adaptive_verification:
            spec["enable_adaptive_verification"] = True
    out = {"vllm": f"vllm serve {shlex.quote(str(target))} --speculative-config {shlex.quote(json.dumps(spec))}"}
    if draft_vocab_of(cfg) is None and draft_topk is None and not adaptive_verification:
        env = f"SGLANG_DSPARK_USE_GREEDY_DRAFT={int(draft_sampling == 'argmax')} " if dspark else ""
        tail = "" if dspark else f" --speculative-num-draft-tokens {B}"
        out["sglang"] = (f"{env}python -m sglang.launch_server --model-path {shlex.quote(str(target))} "
                         f"--speculative-algorithm {'DSPARK' if dspark else 'DFLASH'} --speculative-draft-model-path "
                         f"{shlex.quote(str(export_dir))}{tail}")
    return out
