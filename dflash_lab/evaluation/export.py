"""Export a trained drafter as the DFlashDraftModel checkpoint that SGLang, vLLM and z-lab load; load it back.

    python -m dflash_lab.evaluation.export <run dir | checkpoint dir | drafter.safetensors> <out dir> [--dtype bfloat16] [--force]

writes <out dir>/config.json (Qwen3 fields + block_size, num_target_layers, dflash_config {mask_token_id,
target_layer_ids}, explicit layer_types, auto_map -> dflash.DFlashDraftModel), model.safetensors (bf16, exactly the
names of docs/dflash-method.md section 4, no embedding, no lm_head) and dflash.py (the remote-code model, so that
`AutoModel.from_pretrained(out_dir, trust_remote_code=True)` works). `load_exported(out_dir)` reads it back into a
`DFlashDrafter`; exported and re-imported drafters give identical outputs (tests/test_export.py). The export is
written into a temp folder and renamed into place; a non-empty <out dir> is refused unless --force, and a folder that
holds a model (e.g. the target) or a training run is refused even then.

`resolve_drafter(path)` is the one place that turns "a run dir, a checkpoint dir or a .safetensors file" into
(DrafterConfig, weights path); evaluate.py uses it too.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dflash_lab.runs import checkpoint, weights
from .export_dest import ExportRefused, guard_destination, swap_into_place
from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter

TEMPLATE = Path(__file__).resolve().parents[1] / "export_template" / "dflash.py"
WEIGHTS = "drafter.safetensors"
DRAFTER_CONFIG = "drafter_config.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
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


def checkpoint_candidates(run_dir: Path) -> list[Path]:
    """Weights files of a run, best first: checkpoints/best/, then newest step-N/ or checkpoints/drafter.safetensors."""
    ck = run_dir / "checkpoints"
    found = []
    best = ck / "best" / WEIGHTS
    if best.is_file():
        found.append(best)
    rest = [p for p in ck.glob(f"step-*/{WEIGHTS}") if STEP_DIR.match(p.parent.name)]
    if (ck / WEIGHTS).is_file():
        rest.append(ck / WEIGHTS)
    # newest by step; the final save_drafter() file wins a tie with the step dir of the same step
    rest.sort(key=lambda p: ((_step_of(p) or -1), p.parent == ck), reverse=True)
    return found + rest


def resolve_drafter(path: str | Path) -> DrafterSource:
    """A run dir, a checkpoint dir, an exported dir or a .safetensors file -> DrafterSource. Prefers the run's
    `best` checkpoint, then its newest; raises DrafterNotFoundError listing every place it looked."""
    p = Path(path).expanduser()
    looked: list[str] = []
    if not p.exists():
        raise DrafterNotFoundError(f"{p} does not exist. Pass a run directory (runs/<stamp>-<name>-<id>/), a "
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
    looked += [str(p / "checkpoints" / "best" / WEIGHTS), str(p / "checkpoints" / "step-*" / WEIGHTS),
               str(p / "checkpoints" / WEIGHTS)]
    if cands:
        hit = _find_config(cands[0].parent, looked)
        if hit:
            return DrafterSource(hit[0], cands[0], p, "run", _step_of(cands[0]))
    raise DrafterNotFoundError(
        f"no trained drafter found under {p}; looked for: {', '.join(dict.fromkeys(looked))}. "
        f"Fix: pass a finished run directory (trainer.finish() / trainer.save_drafter() writes checkpoints/{WEIGHTS}),"
        " a checkpoint directory, or an exported directory (config.json + model.safetensors).")


def load_drafter(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 log=print) -> tuple[DrafterSource, DFlashDrafter]:
    """resolve_drafter + weights loaded into a DFlashDrafter (eval mode, requires_grad off). A run still training
    may rotate the chosen checkpoint away: its newest complete weights are read instead, and a damaged file is
    named with the one used (runs/weights.py)."""
    src = weights.retry_rotated(lambda: resolve_drafter(path))
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
    want = export_state_names(drafter.config)
    got = {k for k in state if not k.startswith("rotary_emb.")}  # RoPE tables are recomputed, never learned
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


# ------------------------------------------------------------------------------------------------------------------
# Export format
# ------------------------------------------------------------------------------------------------------------------

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
    return "DFlashDraftModel" in d.get("architectures", []) and "dflash_config" in d


def config_from_export(d: dict) -> DrafterConfig:
    """DrafterConfig from an exported config.json (ours or a published z-lab one)."""
    dc = d.get("dflash_config") or {}
    missing = [k for k in ("mask_token_id", "target_layer_ids") if k not in dc]
    if missing or "block_size" not in d:
        raise ValueError(f"exported config.json lacks {missing + ([] if 'block_size' in d else ['block_size'])}: "
                         "not a DFlashDraftModel checkpoint. Fix: export with `python -m dflash_lab.evaluation.export`.")
    ids = tuple(dc["target_layer_ids"])
    rope_theta = d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    layer_types = tuple(d.get("layer_types") or ())
    n_target = d.get("num_target_layers") or max(ids) + 1
    return DrafterConfig(
        hidden_size=d["hidden_size"], target_hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
        rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=float(rope_theta), rope_scaling=d.get("rope_scaling"),
        max_position_embeddings=d.get("max_position_embeddings", 40960), vocab_size=d["vocab_size"],
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), block_size=d["block_size"],
        mask_token_id=dc["mask_token_id"], num_target_layers=n_target, target_layer_ids=ids,
        layer_types=layer_types, sliding_window=d.get("sliding_window") if "sliding_attention" in layer_types else None,
        draft_vocab_size=d.get("draft_vocab_size") if d.get("draft_vocab_size") != d["vocab_size"] else None)


def _exported_source(path: Path) -> DrafterSource:
    cfg = config_from_export(json.loads((path / "config.json").read_text()))
    return DrafterSource(cfg, path / "model.safetensors", path, "exported", None)


def export_drafter(source: str | Path, out_dir: str | Path, *, dtype: str = "bfloat16", force: bool = False,
                   log=print) -> Path:
    """Write config.json, model.safetensors and dflash.py into out_dir; returns out_dir.

    Everything is written into a sibling temp folder that is renamed into place at the end, so a failed export
    leaves out_dir as it was. A non-empty out_dir is refused unless `force`; a model or a run folder always is.
    """
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported. Fix: use one of {sorted(_DTYPES)} "
                         "(serving uses bfloat16).")
    src, drafter = load_drafter(source, log=log)
    out = Path(out_dir).expanduser()
    if out.resolve() == src.run_dir.resolve() and src.kind != "exported":
        raise ExportRefused(f"out dir {out} is the run directory itself; its config.json would be overwritten. "
                            "Fix: pass a new directory, e.g. <run dir>/export.")
    guard_destination(out, force, source=src.weights if src.kind != "exported" else None)
    names = export_state_names(src.config)
    state = drafter.state_dict()
    tensors = {k: state[k].detach().to("cpu", _DTYPES[dtype] if state[k].is_floating_point() else state[k].dtype)
               .contiguous() for k in names}  # d2t stays int64
    H, nH = src.config.hidden_size, src.config.num_target_features * src.config.hidden_size
    assert tensors["fc.weight"].shape == (H, nH), tensors["fc.weight"].shape  # [H, n*H] per the format
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.export-{secrets.token_hex(4)}")
    tmp.mkdir()  # mkdir (not tempfile.mkdtemp, which is 0700) so the folder follows the umask
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": str(src.weights)})
        checkpoint.respect_umask(tmp / "model.safetensors")  # safetensors writes 0600
        extra = {"dflash_lab": {"source": str(src.weights), "step": src.step}}
        (tmp / "config.json").write_text(json.dumps(export_config(src.config, dtype=dtype, extra=extra), indent=2)
                                         + "\n")
        shutil.copyfile(TEMPLATE, tmp / "dflash.py")
        swap_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_params = sum(t.numel() for t in tensors.values())
    log(f"exported {src.kind} drafter {src.weights} (step {src.step}) -> {out}: {len(tensors)} tensors, "
        f"{n_params / 1e6:.2f}M parameters, {dtype}")
    return out


def load_exported(out_dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
                  ) -> tuple[DrafterConfig, DFlashDrafter]:
    """Read an exported directory back into dflash_lab: (DrafterConfig, DFlashDrafter in eval mode)."""
    from safetensors.torch import load_file

    path = Path(out_dir).expanduser()
    if not is_exported(path):
        raise DrafterNotFoundError(f"{path} is not an exported DFlash drafter: expected config.json with "
                                   "architectures ['DFlashDraftModel'] + dflash_config, and model.safetensors.")
    cfg = config_from_export(json.loads((path / "config.json").read_text()))
    drafter = DFlashDrafter(cfg)
    _load_state(drafter, load_file(str(path / "model.safetensors")), str(path / "model.safetensors"))
    drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return cfg, drafter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.export", description=__doc__.split("\n")[0])
    ap.add_argument("source", help="run directory, checkpoint directory, or drafter .safetensors file")
    ap.add_argument("out_dir", help="directory to write config.json, model.safetensors and dflash.py into")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES), help="weights dtype (default bfloat16)")
    ap.add_argument("--force", action="store_true", help="replace a non-empty out dir (never a model or a run)")
    args = ap.parse_args(argv)
    try:
        out = export_drafter(args.source, args.out_dir, dtype=args.dtype, force=args.force)
    except (DrafterNotFoundError, ValueError, checkpoint.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = json.loads((out / "config.json").read_text())
    B = cfg["block_size"]
    print(f"serve with vLLM:  --speculative-config '{{\"method\":\"dflash\",\"model\":\"{out}\","
          f"\"num_speculative_tokens\":{B - 1}}}'")
    print(f"serve with SGLang: --speculative-algorithm DFLASH --speculative-draft-model-path {out} "
          f"--speculative-num-draft-tokens {B}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
