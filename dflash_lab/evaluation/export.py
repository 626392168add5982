"""Export a trained drafter as the DFlashDraftModel checkpoint that SGLang, vLLM and z-lab load; load it back.

    python -m dflash_lab.evaluation.export <run dir | checkpoint dir | drafter.safetensors> <out dir> [--dtype bfloat16] [--force] [--target T]

writes <out dir>/config.json (Qwen3 fields + block_size, num_target_layers, dflash_config {mask_token_id,
target_layer_ids}, explicit layer_types, auto_map -> dflash.DFlashDraftModel), model.safetensors (bf16, exactly the
names of docs/dflash-method.md section 4, no embedding; a pruned draft vocabulary adds `d2t` and its head rows of the
target as `lm_head.weight`) and dflash.py (the remote-code model, so that
`AutoModel.from_pretrained(out_dir, trust_remote_code=True)` works). It prints which engine cannot serve the drafter
(before writing) and the serving command of each that can (serving_engines.py); `python -m
dflash_lab.evaluation.export_check <out dir>` checks an export against speculators' own loader. `load_exported(out_dir)` reads it back into a
`DFlashDrafter`; exported and re-imported drafters give identical outputs (tests/test_export.py). The export is
written into a temp folder and renamed into place; a non-empty <out dir> is refused unless --force, and a folder that
holds a model (e.g. the target) or a training run is refused even then.

`resolve_drafter(path)` is the one place that turns "a run dir, a checkpoint dir or a .safetensors file" into
(DrafterConfig, weights path); evaluate.py uses it too. A run dir means its newest weights; `--checkpoint best`
takes the weights of the step with the best held-out real tau (`checkpoints/best/`, described by `best.json`, both
written while training), `--checkpoint step-N` (or N) a step's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dflash_lab.runs import weights
from dflash_lab.runs.checkpoint import CheckpointError, respect_umask
from .export_dest import ExportRefused, guard_destination, swap_into_place
from .export_format import (HEAD, build_export, config_from_export, export_config, export_state_names,  # noqa: F401
                            is_exported)
from .export_variant import state_from_served, with_variant
from .export_serving import serving_target
from .serving_engines import DRAFTING, VERSIONS, engine_readings, serving_commands
from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.drafter.variants import variant_of
from dflash_lab.target.load import TargetLoadError, read_head_weight

TEMPLATE = Path(__file__).resolve().parents[1] / "export_template" / "dflash.py"
WEIGHTS = "drafter.safetensors"
DRAFTER_CONFIG = "drafter_config.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
BEST = "best"  # checkpoints/best/: the drafter at the best held-out real tau (train/validation.py writes it)
BEST_FILE = "best.json"  # <run>/best.json: which step that was, its real tau and interval, on which prompts
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class DrafterNotFoundError(FileNotFoundError):
    """No drafter weights / config where the user pointed; the message lists every place looked at."""


# ------------------------------------------------------------------------------------------------------------------
# Finding a drafter
# ------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DrafterSource:
    """Where a drafter lives: its config, its weights file, and the run directory outputs should go to."""

    config: DrafterConfig
    weights: Path
    run_dir: Path  # the run directory (or the checkpoint's own dir when it is not inside a run)
    kind: str  # "run" | "checkpoint" | "exported"
    step: int | None = None


def _step_of(weights: Path) -> int | None:
    m = STEP_DIR.match(weights.parent.name)
    if m:
        return int(m.group(1))
    try:
        from safetensors import safe_open

        with safe_open(str(weights), "pt") as f:
            step = (f.metadata() or {}).get("step")
        return int(step) if step is not None else None
    except Exception:  # noqa: BLE001 - the step is informative only
        return None


def _find_config(start: Path, looked: list[str]) -> tuple[DrafterConfig, Path] | None:
    """drafter_config.json (or a checkpoint's state.json "drafter_config") in `start` or up to two directories
    above (checkpoints/step-N -> run dir)."""
    for d in (start, start.parent, start.parent.parent):
        p = d / DRAFTER_CONFIG
        looked.append(str(p))
        if p.is_file():
            return drafter_config_from_dict(json.loads(p.read_text())), d
        state = d / "state.json"
        if state.is_file():
            looked.append(f"{state} ['drafter_config']")
            dc = json.loads(state.read_text()).get("drafter_config")
            if dc:
                return drafter_config_from_dict(dc), d
    return None


def train_config_of(src: "DrafterSource") -> dict | None:
    """The TrainConfig dict of the run a drafter came from (run config.json, or the checkpoint's state.json)."""
    for d in (src.weights.parent, src.run_dir):
        state = d / "state.json"
        if state.is_file():
            cfg = json.loads(state.read_text()).get("config")
            if cfg:
                return cfg
    p = src.run_dir / "config.json"
    if src.kind != "exported" and p.is_file():
        d = json.loads(p.read_text())
        return d if "target" in d else None
    return None


def drafter_config_from_dict(d: dict) -> DrafterConfig:
    d = dict(d)
    for k in ("target_layer_ids", "layer_types"):
        if isinstance(d.get(k), list):
            d[k] = tuple(d[k])
    return DrafterConfig(**d)


def _run_of(config_dir: Path) -> Path:
    """The run directory of a checkpoint: the nearest dir that has config.json or metrics.jsonl."""
    for d in (config_dir, config_dir.parent, config_dir.parent.parent):
        if (d / "config.json").is_file() or (d / "metrics.jsonl").is_file():
            return d
    return config_dir


def _entries(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


def checkpoint_candidates(run_dir: Path) -> list[Path]:
    """Weights files of a run, newest first: step-N/ or checkpoints/drafter.safetensors (best/ only by name).

    A run still training renames step-N+1.tmp into place and step-N to step-N.deleting between our reading of the
    folder and our look inside step-N: that listing would find no weights at all although the run always has one.
    The folder is listed again until it reads the same before and after (a rotation per save; a few tries)."""
    ck = run_dir / "checkpoints"
    for attempt in range(weights.ROTATION_RETRIES + 1):
        before = _entries(ck)
        rest = [p for p in ck.glob(f"step-*/{WEIGHTS}") if STEP_DIR.match(p.parent.name)]
        if (ck / WEIGHTS).is_file():
            rest.append(ck / WEIGHTS)
        if _entries(ck) == before:
            break
        time.sleep(0.01 * (attempt + 1))
    # newest by step; the final save_drafter() file wins a tie with the step dir of the same step
    rest.sort(key=lambda p: ((_step_of(p) or -1), p.parent == ck), reverse=True)
    return rest


def named_checkpoint(run_dir: Path, name: str) -> Path:
    """The weights a run's checkpoint NAME means: "best", "latest" (the newest), "step-N" or "N"."""
    name = str(name).strip()
    ck = run_dir / "checkpoints"
    if name == BEST:
        best = ck / BEST / WEIGHTS
        if best.is_file():
            return best
        raise DrafterNotFoundError(
            f"{run_dir} has no best checkpoint ({best} is missing). It is written while training each time the "
            "held-out real tau improves (real_tau_every > 0 and a held-out set). Fix: use --checkpoint latest, or "
            "train with real tau measured.")
    if name == "latest":
        cands = checkpoint_candidates(run_dir)
        if cands:
            return cands[0]
        raise DrafterNotFoundError(f"{run_dir} holds no drafter weights under {ck}.")
    m = re.fullmatch(r"(?:step-)?(\d+)", name)
    if m:
        step = int(m.group(1))
        hit = [p for p in checkpoint_candidates(run_dir) if _step_of(p) == step]
        if hit:
            return hit[0]
        have = sorted({s for s in map(_step_of, checkpoint_candidates(run_dir)) if s is not None})
        raise DrafterNotFoundError(f"{run_dir} has no checkpoint of step {step}; it has steps {have}. Fix: pass "
                                   "one of them, latest or best.")
    raise DrafterNotFoundError(f"checkpoint {name!r} is not a checkpoint name. Fix: pass best, latest, step-N or N.")


def best_marker(run_dir: str | Path) -> dict | None:
    """<run>/best.json (step, real tau and interval of the best checkpoint), or None."""
    f = Path(run_dir) / BEST_FILE
    try:
        return json.loads(f.read_text()) if f.is_file() else None
    except (OSError, ValueError):
        return None


def resolve_drafter(path: str | Path, checkpoint: str | None = None) -> DrafterSource:
    """A run dir, a checkpoint dir, an exported dir or a .safetensors file -> DrafterSource. A run dir means its
    newest weights, or the named `checkpoint` (best | latest | step-N | N); raises DrafterNotFoundError listing
    every place it looked."""
    p = Path(path).expanduser()
    looked: list[str] = []
    if checkpoint:
        if not (p.is_dir() and (p / "checkpoints").is_dir()):
            raise DrafterNotFoundError(f"--checkpoint {checkpoint} needs a run directory with checkpoints/, and "
                                       f"{p} is not one. Fix: pass the run directory, or leave --checkpoint out.")
        w = named_checkpoint(p, checkpoint)
        hit = _find_config(w.parent, looked)
        if hit is None:
            raise DrafterNotFoundError(f"found {w} but no {DRAFTER_CONFIG}; looked at: {', '.join(looked)}.")
        kind = "checkpoint" if checkpoint != "latest" else "run"
        return DrafterSource(hit[0], w, p, kind, _step_of(w))
    if not p.exists():
        raise DrafterNotFoundError(f"{p} does not exist. Pass a run directory (runs/<name>-<stamp>-<id>/), a "
                                   f"checkpoint directory holding {WEIGHTS}, an exported directory, or a "
                                   ".safetensors file.")
    if p.is_file():
        if p.suffix != ".safetensors":
            raise DrafterNotFoundError(f"{p} is not a .safetensors file. Pass a run directory, a checkpoint directory "
                                       f"or a drafter .safetensors file.")
        if p.name == "model.safetensors" and is_exported(p.parent):
            return _exported_source(p.parent)
        hit = _find_config(p.parent, looked)
        if hit is None:
            raise DrafterNotFoundError(f"found weights {p} but no {DRAFTER_CONFIG}; looked at: {', '.join(looked)}. "
                                       "Fix: keep the weights inside their run directory, or copy the run's "
                                       f"{DRAFTER_CONFIG} next to them.")
        cfg, cdir = hit
        return DrafterSource(cfg, p, _run_of(cdir), "checkpoint", _step_of(p))
    if is_exported(p):
        return _exported_source(p)
    direct = p / WEIGHTS
    looked.append(str(direct))
    if direct.is_file():  # a checkpoint directory (step-N/, best/) or a bare dir with the weights
        hit = _find_config(p, looked)
        if hit:
            return DrafterSource(hit[0], direct, _run_of(hit[1]), "checkpoint", _step_of(direct))
    cands = checkpoint_candidates(p)
    looked += [str(p / "checkpoints" / "step-*" / WEIGHTS), str(p / "checkpoints" / WEIGHTS)]
    if cands:
        hit = _find_config(cands[0].parent, looked)
        if hit:
            return DrafterSource(hit[0], cands[0], p, "run", _step_of(cands[0]))
    raise DrafterNotFoundError(
        f"no trained drafter found under {p}; looked for: {', '.join(dict.fromkeys(looked))}. "
        f"Fix: pass a finished run directory (trainer.finish() / trainer.save_drafter() writes checkpoints/{WEIGHTS}),"
        " a checkpoint directory, or an exported directory (config.json + model.safetensors).")


def load_drafter(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 checkpoint: str | None = None, log=print) -> tuple[DrafterSource, DFlashDrafter]:
    """resolve_drafter + weights loaded into a DFlashDrafter (eval mode, requires_grad off). A run still training
    may rotate the chosen checkpoint away: its newest complete weights are read instead, and a damaged file is
    named with the one used (runs/weights.py)."""
    src = weights.retry_rotated(lambda: resolve_drafter(path, checkpoint))
    if src.kind == "exported":
        _, drafter = load_exported(src.run_dir, device=device, dtype=dtype)
        return src, drafter
    if src.kind == "run":
        used, state = weights.read_newest_weights(lambda: checkpoint_candidates(src.run_dir), log=log)
        src = replace(src, weights=used, step=_step_of(used)) if used != src.weights else src
    else:
        state = weights.read_weights(src.weights)
    drafter = DFlashDrafter(src.config)
    _load_state(drafter, state, str(src.weights))
    drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return src, drafter


def _load_state(drafter: DFlashDrafter, state: dict, where: str) -> None:
    heads = variant_of(drafter.config).export_tensor_prefix  # a variant's heads are trained weights too
    want = export_state_names(drafter.config) + [k for k in drafter.state_dict() if k.startswith(heads)]
    # RoPE tables are recomputed, never learned; a pruned export's head rows are the target's (our decoder selects
    # them from the target through d2t; export_check.py compares the two)
    pruned_head = {HEAD} if drafter.config.draft_vocab_size is not None else set()
    got = {k for k in state if not k.startswith("rotary_emb.") and k not in pruned_head}
    missing, extra = sorted(set(want) - got), sorted(got - set(want))
    if missing or extra:
        more = lambda xs: f"{xs[:6]}{'...' if len(xs) > 6 else ''}"  # noqa: E731
        raise ValueError(f"{where} does not match the drafter config: missing {more(missing)}, unexpected "
                         f"{more(extra)}. Fix: pass the weights together with "
                         "the drafter_config.json / config.json they were saved with.")
    own = drafter.state_dict()
    for k in want:
        if tuple(state[k].shape) != tuple(own[k].shape):
            raise ValueError(f"{where}: tensor {k} has shape {tuple(state[k].shape)} but the config expects "
                             f"{tuple(own[k].shape)}. Fix: use the config the weights were saved with.")
    drafter.load_state_dict({k: state[k].to(own[k].dtype) for k in want}, strict=False)


def _exported_source(path: Path) -> DrafterSource:
    cfg = config_from_export(json.loads((path / "config.json").read_text()))
    return DrafterSource(cfg, path / "model.safetensors", path, "exported", None)


def export_drafter(source: str | Path, out_dir: str | Path, *, dtype: str = "bfloat16", force: bool = False,
                   log=print, checkpoint: str | None = None, target: str | None = None,
                   drafting: dict | None = None) -> Path:
    """Write config.json, model.safetensors and dflash.py into out_dir; returns out_dir.

    `target`: the model the drafter was trained on (default: the run's own config says); a pruned draft vocabulary
    needs it (its head rows are exported), and the serving commands name it. Before anything is written, each engine
    that cannot serve the drafter is named in one line with the alternative; after, the command of each that can.
    Everything is written into a sibling temp folder that is renamed into place at the end, so a failed export
    leaves out_dir as it was. A non-empty out_dir is refused unless `force`; a model or a run folder always is.
    `drafting`: a DSpark drafter's decoding as it was evaluated, pinned in the printed commands (draft_sampling,
    draft_topk, adaptive_verification: serving_engines.serving_commands; default evaluate's argmax drafts).
    """
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported. Fix: use one of {sorted(_DTYPES)} "
                         "(serving uses bfloat16).")
    src, drafter = load_drafter(source, checkpoint=checkpoint, log=log)
    out = Path(out_dir).expanduser()
    if out.resolve() == src.run_dir.resolve() and src.kind != "exported":
        raise ExportRefused(f"out dir {out} is the run directory itself; its config.json would be overwritten. "
                            "Fix: pass a new directory, e.g. <run dir>/export.")
    guard_destination(out, force, source=src.weights if src.kind != "exported" else None)
    target = target or (train_config_of(src) or {}).get("target") or _export_target(src)
    head = None
    if src.config.draft_vocab_size is not None:
        if target is None:
            raise ValueError(f"{src.weights} has a pruned draft vocabulary ({src.config.draft_vocab_size} ids): its "
                             "export carries the target head's rows, and no target is known. Fix: pass --target "
                             "<the model it was trained on> (target= in Python).")
        head = read_head_weight(target)
    extra = {"dflash_lab": {"source": str(src.weights), "step": src.step, "target": target}}
    if src.weights.parent.name == BEST and (marker := best_marker(src.run_dir)):
        extra["dflash_lab"]["best"] = marker  # why this step: its held-out real tau and interval
    state = drafter.state_dict()
    tensors, config = build_export(src.config, state, dtype=_DTYPES[dtype], target_head=head, extra=extra)
    # a drafter variant's heads and config entries, as the engines load them (export_variant.py)
    tensors, config = with_variant(src.config, state, tensors, config, _DTYPES[dtype], log)
    readings = engine_readings(config, tensors)
    # computed before writing: drafting options this export cannot be served with are refused with nothing written
    commands = serving_commands(config, out.resolve(), serving_target(target), **(drafting or {}))
    for engine in ("vllm", "sglang"):
        if readings[engine]["cannot_serve"]:
            log(f"not for {engine}: {readings[engine]['cannot_serve']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.export-{secrets.token_hex(4)}")
    tmp.mkdir()  # mkdir (not tempfile.mkdtemp, which is 0700) so the folder follows the umask
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": str(src.weights)})
        respect_umask(tmp / "model.safetensors")  # safetensors writes 0600
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        shutil.copyfile(TEMPLATE, tmp / "dflash.py")
        swap_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_params = sum(t.numel() for t in tensors.values())
    log(f"exported {src.kind} drafter {src.weights} (step {src.step}) -> {out}: {len(tensors)} tensors, "
        f"{n_params / 1e6:.2f}M parameters, {dtype}")
    for engine, command in commands.items():
        log(f"serve with {engine} {VERSIONS[engine]}: {command}")
    return out


def _export_target(src: DrafterSource) -> str | None:
    """The target an exported folder names (its config.json's dflash_lab block), for re-exporting it."""
    if src.kind != "exported":
        return None
    return (json.loads((src.run_dir / "config.json").read_text()).get("dflash_lab") or {}).get("target")


def load_exported(out_dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
                  ) -> tuple[DrafterConfig, DFlashDrafter]:
    """Read an exported directory back into dflash_lab: (DrafterConfig, DFlashDrafter in eval mode)."""
    from safetensors.torch import load_file

    path = Path(out_dir).expanduser()
    if not is_exported(path):
        raise DrafterNotFoundError(f"{path} is not an exported DFlash drafter: expected config.json with "
                                   "architectures ['DFlashDraftModel'] (or a drafter variant's, e.g. "
                                   "['Qwen3DSparkModel']) + dflash_config, and model.safetensors.")
    cfg = config_from_export(json.loads((path / "config.json").read_text()))
    drafter = DFlashDrafter(cfg)
    state = state_from_served(cfg, load_file(str(path / "model.safetensors")))
    _load_state(drafter, state, str(path / "model.safetensors"))
    drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return cfg, drafter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.export", description=__doc__.split("\n")[0])
    ap.add_argument("source", help="run directory, checkpoint directory, or drafter .safetensors file")
    ap.add_argument("out_dir", help="directory to write config.json, model.safetensors and dflash.py into")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES), help="weights dtype (default bfloat16)")
    ap.add_argument("--force", action="store_true", help="replace a non-empty out dir (never a model or a run)")
    ap.add_argument("--checkpoint", default=None, help="which weights of a run: latest (default), best (the best "
                    "held-out real tau while training), step-N or N")
    ap.add_argument("--target", default=None, help="the model the drafter was trained on (default: the run's "
                    "config.json); a pruned draft vocabulary exports its head rows, and the serving commands name it")
    ap.add_argument("--draft-sampling", default="argmax", choices=list(DRAFTING), help="DSpark: how the "
                    "evaluated drafts were drawn at T > 0; the serving commands pin it (default argmax)")
    ap.add_argument("--draft-topk", type=int, default=None, help="DSpark: the top-k candidates it was evaluated "
                    "with (vLLM's dspark_draft_topk)")
    ap.add_argument("--adaptive-verification", action="store_true", help="DSpark: evaluated with the confidence "
                    "head choosing how many drafts to verify (vLLM's enable_adaptive_verification)")
    args = ap.parse_args(argv)
    drafting = {"draft_sampling": args.draft_sampling, "draft_topk": args.draft_topk,
                "adaptive_verification": args.adaptive_verification}
    try:
        export_drafter(args.source, args.out_dir, dtype=args.dtype, force=args.force, checkpoint=args.checkpoint,
                       target=args.target, drafting=drafting)
    except (DrafterNotFoundError, ValueError, CheckpointError, TargetLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
