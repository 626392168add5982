"""Check an export as the serving side reads it: what each engine reads, and speculators' own loader drafting the same
ids as our decoder.

    python -m dflash_lab.evaluation.export_check <export dir> [--target T] [--contexts 3] [--json FILE]

1. What vLLM, SGLang and speculators read (serving_engines.py): mask id, target layer ids, draft tokens, causal and
   window per layer, the vocabulary, and each engine that cannot serve the export (one line with the alternative).
2. A pruned head is the target's rows: `lm_head.weight == target_head[arange(d) + d2t]` in the export's dtype, bit
   for bit.
3. speculators 0.9.0 loads the export with its own code on the CPU. Full vocabulary: its converter and
   `from_pretrained`, what `SpeculatorModel.from_pretrained(export, verifier=target)` runs. Pruned: its converter
   cannot (it forces the full vocabulary), so the converter's config with `draft_vocab_size = d` and the export's
   `lm_head` + `d2t` (+ `t2d`) is saved by speculators' `save_pretrained`, the layout it saves its own pruned DFlash
   drafters in, and read back by its `from_pretrained`.
4. Drafts on the same contexts (seeded random target features, a random anchor token; fp32): our decoder against
   speculators' drafter, (a) its own forward with its own masks, (b) its layers under vLLM's mask rule as read from
   config.json. Every draft id must be identical, except (a) on a sliding layer whose context is longer than
   window - block size: speculators counts the window from the anchor, vLLM and dflash-lab from each query, so
   those ids are reported, not required.

Exit status 0 when everything required holds, 1 when not, 2 when the check cannot run (the message says why).
speculators is a PyPI dependency of this check only: `pip install --no-deps speculators==0.9.0` (its pins pull a CUDA
build of torch; the few packages it imports are in dflash-lab's `test` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from dflash_lab.data.draft_vocab import target_ids_of
from dflash_lab.drafter.blocks import dense_mask
from dflash_lab.target.load import TargetLoadError, read_embedding_weight, read_head_weight, resolve_target_path
from .export import DrafterNotFoundError, load_exported
from .export_format import HEAD, is_exported
from .serving_engines import VERSIONS, draft_vocab_of, engine_readings, is_dspark

SPECULATORS_FIX = (f"pip install --no-deps speculators=={VERSIONS['speculators']} (the packages it imports come with "
                   "dflash-lab's test extra: pip install -e '.[test]'; --no-deps because its pins pull a CUDA torch)")


class ExportCheckError(RuntimeError):
    """The check cannot run (no speculators, no target); the message names the fix."""


def _speculators():
    try:
        import speculators
        from loguru import logger
    except ImportError as e:
        raise ExportCheckError(f"the check loads the export with speculators {VERSIONS['speculators']}, which does "
                               f"not import here ({e}). Fix: {SPECULATORS_FIX}.") from None
    logger.disable("speculators")  # its converter logs every step; our report says what matters
    return speculators


def speculators_version() -> str:
    """The installed speculators release; the rules of serving_engines.py were read in VERSIONS['speculators']."""
    from importlib.metadata import version

    return version("speculators")


def speculators_load(export_dir: Path, cfg: dict, target_dir: str, work: Path):
    """The export as speculators' own loader reads it (module docstring, point 3); fp32, eager attention."""
    _speculators()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its save / load bars; the check prints its own lines
    try:
        return _speculators_load(export_dir, cfg, target_dir, work)
    finally:
        hf_logging.enable_progress_bar()


def _speculators_load(export_dir: Path, cfg: dict, target_dir: str, work: Path):
    from safetensors.torch import load_file
    from speculators import SpeculatorModel
    from speculators.convert.dflash.converter import DFlashConverter
    from speculators.convert.entrypoints import maybe_convert_external_checkpoint
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    d = draft_vocab_of(cfg)
    path = work / "speculators"
    if d is None:  # exactly what from_pretrained(export, verifier=target) runs, into a folder we clean up
        maybe_convert_external_checkpoint(str(export_dir), verifier=target_dir, output_path=str(path), config_dict=cfg)
    else:
        config = DFlashConverter()._build_config(cfg, target_dir, None)
        config.draft_vocab_size = d
        model = DFlashDraftModel(config)
        state = load_file(str(export_dir / "model.safetensors"))
        d2t = state.pop("d2t")
        t2d = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
        t2d[target_ids_of(d2t)] = True
        model.load_vocab_mappings(t2d, d2t)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            raise ExportCheckError(f"speculators' DFlashDraftModel has no place for {unexpected} of {export_dir}: "
                                   "this export holds tensors speculators does not serve. Fix: export again with "
                                   "this dflash-lab, or check the tensors it names against docs/dflash-method.md")
        model.load_verifier_weights()  # the embedding from the target; the head stays the export's rows
        model.save_pretrained(str(path))
    config = DFlashSpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = "eager"  # its masks as dense tensors (CPU)
    model = SpeculatorModel.from_pretrained(str(path), config=config, dtype=torch.float32)  # the target's fp32 rows
    return model.float().eval()


def vllm_masks(reading: dict, S: int, B: int) -> list[torch.Tensor]:
    """Per draft layer, the (1, 1, B, S + B) bool mask of one block after S context tokens, by vLLM's rule as read
    from config.json: every context key (within the window, counted from the query), and the block's keys causally
    or all of them."""
    q = S + torch.arange(B)[:, None]  # query positions
    k_ctx = torch.arange(S)[None, :]
    out = []
    for causal, window in zip(reading["causal"], reading["window"]):
        ctx = torch.ones(B, S, dtype=torch.bool) if window is None else (q - k_ctx < window)
        own = torch.ones(B, B, dtype=torch.bool)
        if causal:
            own = own.tril()
        out.append(torch.cat([ctx, own], dim=1)[None, None])
    return out


def _ours(drafter, embed, head, feats, anchor: int) -> torch.Tensor:
    """Our decoder's logits over its head (d or V rows) for the block [anchor, MASK...] after the context `feats`."""
    cfg = drafter.config
    S, B = feats.shape[1], cfg.block_size
    ids = torch.full((B,), cfg.mask_token_id)
    ids[0] = anchor
    masks = {key: dense_mask(torch.tensor([[S]]), torch.tensor([[True]]), seq_len=S, block_size=B, sliding_window=w)
             for key, w in zip(cfg.mask_keys, cfg.windows)}
    pos = torch.arange(S + B)[None]
    hidden = drafter(feats, embed[ids][None], pos[:, S:], pos[:, :S], masks)
    return hidden[0] @ head.T


def _theirs_own(model, feats, anchor: int) -> torch.Tensor:
    """speculators' own forward (its masks, its anchor handling) for the same block: the context, then the anchor
    as the only supervised position, so it is the one anchor chosen."""
    S, B = feats.shape[1], model.block_size
    T = S + B + 1  # speculators never anchors in the last B positions
    hs = torch.zeros(1, T, feats.shape[2])
    hs[:, :S] = feats
    input_ids = torch.zeros(1, T, dtype=torch.long)
    input_ids[0, S] = anchor
    loss_mask = torch.zeros(1, T, dtype=torch.long)
    loss_mask[0, S] = 1
    H = model.config.transformer_layer_config.hidden_size
    _, logits, *_ = model._backbone_forward(hs, input_ids, loss_mask, torch.zeros(1, T, H),
                                            torch.zeros(1, T, dtype=torch.long), max_anchors=1)
    return logits[0]


def _theirs_engine_mask(model, feats, anchor: int, masks: list[torch.Tensor]) -> torch.Tensor:
    """speculators' modules (embedding, fc, norms, RoPE, layers, head) run under the masks given per layer."""
    S, B = feats.shape[1], model.block_size
    ids = torch.full((1, B), model.mask_token_id)
    ids[0, 0] = anchor
    x = model.embed_tokens(ids)
    ctx = model.hidden_norm(model.fc(feats))
    pos = torch.arange(S + B)[None]
    rope = model.rotary_emb(feats, pos)
    for layer, m in zip(model.layers, masks):
        additive = torch.zeros(m.shape).masked_fill_(~m, float("-inf"))
        x = layer(hidden_states=x, target_hidden=ctx, attention_mask=additive, position_ids=pos, use_cache=False,
                  position_embeddings=rope)
    return model.lm_head(model.norm(x))[0]


def _to_target(ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    return ids if d2t is None else ids + d2t[ids]


def context_lengths(cfg: dict, n: int) -> list[int]:
    """`n` context lengths: short to a few blocks; on a sliding drafter one within window - block size (where
    speculators' window rule equals vLLM's) and the rest past the window."""
    B = cfg["block_size"]
    W = cfg.get("sliding_window") if "sliding_attention" in (cfg.get("layer_types") or []) else None
    lengths = [3 + (4 * B + 5) * k // max(n - 1, 1) for k in range(n)]
    if W is not None:
        lengths = [max(1, min(W - B, 3))] + [W + B + 7 * k for k in range(n - 1)]
    return sorted(set(lengths))


def check_export(export_dir: str | Path, *, target: str | None = None, contexts: int = 3, seed: int = 0,
                 log=print) -> dict:
    """Run the check (module docstring); returns the report (JSON-able) with `ok`."""
    path = Path(export_dir).expanduser()
    if contexts < 1:
        raise ExportCheckError(f"contexts={contexts}: the check drafts after at least one context. Fix: --contexts 1 "
                               "or more (default 3)")
    cfg_file = path / "config.json"
    if cfg_file.is_file() and is_dspark(json.loads(cfg_file.read_text())):
        raise ExportCheckError(f"{path} is a DSpark export: speculators {VERSIONS['speculators']} has no DSpark "
                               "drafter to load it with. Fix: its engine check is tests/test_dspark_export.py "
                               "(vLLM's and SGLang's own DSpark config parsing and load_weights on the export)")
    if not is_exported(path):
        raise DrafterNotFoundError(f"{path} is not an exported DFlash drafter (config.json with architectures "
                                   "['DFlashDraftModel'] + dflash_config, and model.safetensors).")
    from safetensors import safe_open

    cfg = json.loads((path / "config.json").read_text())
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        exported_head = f.get_tensor(HEAD) if HEAD in names else None
        d2t = f.get_tensor("d2t") if "d2t" in names else None
    target = target or (cfg.get("dflash_lab") or {}).get("target")
    if target is None:
        raise ExportCheckError(f"{path}/config.json does not name its target. Fix: pass --target <the model the "
                               "drafter was trained on>.")
    try:
        target_dir = resolve_target_path(target)
        target_head, embed = read_head_weight(target).float(), read_embedding_weight(target).float()
    except TargetLoadError as e:
        raise ExportCheckError(str(e)) from None
    readings = engine_readings(cfg, names)
    report = {"export": str(path), "target": target, "engines": readings, "required": [], "informative": []}
    log(f"export {path} (target {target})")
    for engine, r in readings.items():
        causal = "".join("C" if c else "N" for c in r["causal"])
        log(f"  {engine} {r['version']}: mask id {r['mask_token_id']}, layer ids "
            f"{r.get('target_layer_ids', r.get('aux_hidden_state_layer_ids'))}, {r['draft_tokens']} draft tokens, "
            f"layers {causal} (C causal, N non-causal), windows {r['window']}, vocabulary: {r['vocabulary']}")
        if r["cannot_serve"]:
            log(f"    cannot serve: {r['cannot_serve']}")

    d = draft_vocab_of(cfg)
    if d is not None:
        if exported_head is None or d2t is None:
            rows_ok = False
        else:
            rows_ok = torch.equal(exported_head, target_head[target_ids_of(d2t)].to(exported_head.dtype))
        report["required"].append({"what": "lm_head.weight is the target head's rows arange(d) + d2t",
                                   "ok": bool(rows_ok)})
        log(f"  pruned head: lm_head.weight {'==' if rows_ok else '!='} target_head[arange({d}) + d2t] "
            f"({'bit for bit' if rows_ok else 'NOT the rows vLLM must read'})")
    _, drafter = load_exported(path)
    # our decoder drafts over the head the engines read: the export's rows (pruned) or the target's head
    ours_head = exported_head.float() if (d is not None and exported_head is not None) else target_head
    with tempfile.TemporaryDirectory(prefix="export-check-") as work:
        theirs = speculators_load(path, cfg, target_dir, Path(work))
        report["speculators_version"] = speculators_version()
        if report["speculators_version"] != VERSIONS["speculators"]:
            log(f"  note: speculators {report['speculators_version']} is installed; this check was written against "
                f"{VERSIONS['speculators']}")
        report["speculators_loaded"] = {
            "class": type(theirs).__name__, "draft_vocab_size": int(theirs.draft_vocab_size),
            "aux_hidden_state_layer_ids": list(theirs.config.aux_hidden_state_layer_ids),
            "mask_token_id": theirs.config.mask_token_id, "block_size": theirs.block_size,
            "nan_parameters": [n for n, p in theirs.named_parameters() if torch.isnan(p).any()]}
        loaded_ok = not report["speculators_loaded"]["nan_parameters"]
        report["required"].append({"what": "speculators filled every parameter", "ok": loaded_ok})
        their_d2t = theirs.d2t if theirs.use_draft_vocab else None
        g = torch.Generator().manual_seed(seed)
        W = cfg.get("sliding_window") if "sliding_attention" in (cfg.get("layer_types") or []) else None
        B = cfg["block_size"]
        n_feats = len(cfg["dflash_config"]["target_layer_ids"]) * cfg["hidden_size"]
        with torch.no_grad():
            for S in context_lengths(cfg, contexts):
                feats = torch.randn(1, S, n_feats, generator=g)
                anchor = int(torch.randint(0, cfg["vocab_size"], (1,), generator=g))
                if anchor == cfg["dflash_config"]["mask_token_id"]:
                    anchor = (anchor + 1) % cfg["vocab_size"]
                ours = _ours(drafter, embed, ours_head, feats, anchor)[1:]  # slot 0 is the anchor, not a draft
                our_ids = _to_target(ours.argmax(-1), d2t)
                for how, logits in (
                        ("speculators forward, its own masks", _theirs_own(theirs, feats, anchor)),
                        ("speculators layers, vLLM's masks",
                         _theirs_engine_mask(theirs, feats, anchor, vllm_masks(readings["vllm"], S, B)))):
                    logits = logits[1:]
                    ids = _to_target(logits.argmax(-1), their_d2t)
                    row = {"what": how, "context": S, "ids": int(ids.numel()),
                           "identical": int((ids == our_ids).sum()),
                           "max_logit_diff": float((logits - ours).abs().max())}
                    row["ok"] = row["identical"] == row["ids"]
                    own_rule_differs = how.endswith("own masks") and W is not None and S > W - B
                    (report["informative"] if own_rule_differs else report["required"]).append(row)
                    log(f"  context {S:4d}, {how}: {row['identical']}/{row['ids']} draft ids identical, max |logit "
                        f"diff| {row['max_logit_diff']:.2e}" + (" (speculators' window rule differs here: reported, "
                                                              "not required)" if own_rule_differs else ""))
    n_ids = sum(r["ids"] for r in report["required"] if "ids" in r)
    report["ok"] = all(r["ok"] for r in report["required"]) and n_ids > 0  # nothing compared proves nothing
    log(f"{'OK' if report['ok'] else 'FAILED'}: {n_ids} draft ids compared with speculators "
        f"{VERSIONS['speculators']}'s loader" + ("" if report["ok"] else "; see the lines above"))
    return report


def reference_load(out_dir: str | Path, log=print) -> str | None:
    """Load an export with its remote code (the DFlashDraftModel shipped beside it, which SGLang / vLLM users load)
    and return that class's name; raise if a tensor is missing or left over. A variant with no remote-code class
    (DSpark: the engines' own model files serve it; tests/test_dspark_export.py runs their loaders) returns None."""
    out = Path(out_dir).expanduser()
    cfg = json.loads((out / "config.json").read_text())
    if "auto_map" not in cfg:
        log(f"export: {cfg.get('architectures')} has no remote-code class; the engines load it with their own "
            "model code")
        return None
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"]:
        missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
        raise ExportCheckError(f"the export in {out} does not load cleanly in its reference code: missing {missing}, "
                               f"unexpected {unexpected}. Fix: export again with this dflash-lab "
                               "(`python -m dflash_lab.evaluation.export RUN OUT`)")
    return type(model).__name__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.export_check",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("export_dir", help="a folder written by python -m dflash_lab.evaluation.export")
    ap.add_argument("--target", default=None, help="the model the drafter was trained on (default: the one the "
                    "export's config.json names)")
    ap.add_argument("--contexts", type=int, default=3, help="how many context lengths to draft after (default 3)")
    ap.add_argument("--json", default=None, help="also write the report to this JSON file")
    args = ap.parse_args(argv)
    try:
        report = check_export(args.export_dir, target=args.target, contexts=args.contexts)
    except (ExportCheckError, DrafterNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
