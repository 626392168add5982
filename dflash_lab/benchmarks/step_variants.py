"""Benchmark additions for FP8 and compile variants, used by `python -m dflash_lab.benchmarks.step`:

- `--drafter-layers NAME`: the drafter's layer pattern from `bench_configs/drafters/NAME.json` ("mixed": sliding
  windows 1024 and 2048 plus full layers, the shape that made the seed's compiled drafter recompile);
- FP8 variants (`graph-fp8`, `compile-fp8`: target and drafter in FP8; `graph-fp8t` target only; `graph-fp8d`
  drafter only; `graph-fp8w`, `compile-fp8w`: also the drafter's weight gradients in FP8; `compile-ct`,
  `compile-fp8-ct`: the target's layer loop compiled as well), each row carrying its
  per-step losses, so FP8 and bf16 loss curves on the same synthetic data and seed sit side by side;
- `--fp8-error`: one row with the FP8 target's feature error against bf16 per extracted layer (relative error,
  cosine) and the target forward's time in bf16 vs FP8 (eager, same batch);
- compile counters (compiled graphs, graph breaks, recompiles after the first step) at the top level of each row;
- `--drafter-variants dflash,dspark,dspark@8`: each drafter variant (drafter/variants.py) timed with every
  `--variants` entry in the same process on the same target replicas; NAME@B runs that arm at block size B (DSpark's
  published 7 drafts a block are block_size 8 here), `--markov-rank` the Markov head's rank (DeepSpec: 256).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.config.field_types import field_default

DRAFTER_DIR = Path(__file__).resolve().parents[1] / "bench_configs" / "drafters"
# variant -> (cuda_graphs, compile_drafter), as bench.VARIANTS
VARIANTS = {"graph-fp8": (True, False), "compile-fp8": (True, True), "graph-fp8t": (True, False),
            "graph-fp8d": (True, False), "graph-fp8w": (True, False), "compile-fp8w": (True, True),
            "compile-ct": (True, True), "compile-fp8-ct": (True, True)}
# variant -> TrainConfig switches; "w": all three drafter GEMMs in FP8; "ct": the target's layer loop compiled too
_T, _D, _W, _C = "target_fp8", "drafter_fp8", "drafter_fp8_weight_grad", "compile_target"
SWITCHES = {"graph-fp8": {_T: True, _D: True}, "compile-fp8": {_T: True, _D: True}, "graph-fp8t": {_T: True},
            "graph-fp8d": {_D: True}, "graph-fp8w": {_T: True, _D: True, _W: True},
            "compile-fp8w": {_T: True, _D: True, _W: True}, "compile-ct": {_C: True},
            "compile-fp8-ct": {_T: True, _D: True, _C: True}}


def switches(variant: str) -> dict:
    return {k: SWITCHES.get(variant, {}).get(k, False) for k in (_T, _D, _W, _C)}


def drafter_layer_names() -> list[str]:
    return sorted(p.stem for p in DRAFTER_DIR.glob("*.json"))


def add_args(p) -> None:
    p.add_argument("--drafter-layers", default="full", choices=drafter_layer_names(),
                   help="drafter layer pattern (bench_configs/drafters/NAME.json); mixed = windows 1024/2048 + full")
    p.add_argument("--fp8-error", action="store_true", help="also emit the FP8 target's feature error vs bf16 per "
                   "extracted layer and the target forward time bf16 vs FP8")
    p.add_argument("--drafter-variants", default="dflash", type=drafter_arms, help="comma list of drafter variants "
                   "(dflash, dspark), each timed with every --variants entry; NAME@B at block size B (dspark@8: "
                   "DSpark's published block)")
    rank = field_default(DrafterConfig, "markov_rank")
    p.add_argument("--markov-rank", type=int, default=rank, help=f"dspark arms: the Markov head's rank (DeepSpec: "
                   f"{rank})")


def drafter_arms(text: str) -> list[tuple[str, int | None]]:
    """"dflash,dspark@8" -> [("dflash", None), ("dspark", 8)]; an unknown name is argparse's one-line error."""
    import argparse

    from dflash_lab.drafter.variants import VARIANTS

    arms = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, block = item.partition("@")
        if name not in VARIANTS or (block and not (block.isdigit() and int(block) >= 2)):
            raise argparse.ArgumentTypeError(f"{item!r}: use NAME or NAME@B with NAME in {sorted(VARIANTS)} and B >= 2")
        arms.append((name, int(block) if block else None))
    return arms


def arm_shape(shape: dict, arm: tuple[str, int | None]) -> dict:
    """The benchmark shape of one drafter arm: its block size where it names one."""
    return {**shape, "block_size": arm[1]} if arm[1] else shape


def arm_drafter_config(args, drafter_cfg, arm: tuple[str, int | None]):
    """The prepared DrafterConfig with this arm's variant, Markov rank and block size."""
    return dataclasses.replace(drafter_cfg, drafter_variant=arm[0], markov_rank=args.markov_rank,
                               block_size=arm[1] or drafter_cfg.block_size)


def drafter_layers(name: str) -> dict:
    """{layer_types, sliding_window, layer_windows} of a pattern, as DrafterConfig/TrainConfig take them."""
    d = json.loads((DRAFTER_DIR / f"{name}.json").read_text())
    return {"layer_types": tuple(d["layer_types"]), "sliding_window": d["sliding_window"],
            "layer_windows": tuple(d["layer_windows"])}


def train_fields(args, variant: str, arm: tuple[str, int | None] = ("dflash", None)) -> dict:
    """Extra TrainConfig fields for a variant: the layer pattern, the FP8 switches and the drafter arm's variant."""
    fields = {**drafter_layers(args.drafter_layers), **switches(variant), "drafter_variant": arm[0],
              "markov_rank": getattr(args, "markov_rank", field_default(DrafterConfig, "markov_rank"))}
    n = len(fields["layer_types"])
    return {**fields, "num_draft_layers": n} if n else fields


def row_fields(args, variant: str, metrics: dict, losses: list[float],
               arm: tuple[str, int | None] = ("dflash", None)) -> dict:
    layers = drafter_layers(args.drafter_layers)
    return {"drafter_variant": arm[0], **({"markov_rank": args.markov_rank} if arm[0] != "dflash" else {}),
            "drafter_layers": args.drafter_layers, "layer_types": list(layers["layer_types"]),
            "layer_windows": list(layers["layer_windows"]), **switches(variant),
            **{k: metrics.get(k) for k in ("compiled_graphs", "graph_breaks", "recompiles_after_first_step")},
            "losses": [round(x, 5) for x in losses]}


def _time_ms(fn, reps: int, device: torch.device) -> float:
    fn()  # warm-up (and any lazy setup)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 3)


def fp8_feature_report(model, layer_ids: tuple[int, ...], *, batch_size: int, seq_len: int, vocab_size: int,
                       reps: int = 5) -> dict:
    """The FP8 target against bf16 on one random batch: per extracted layer relative error and cosine, and the
    eager target forward's median time for each."""
    from dflash_lab.target.fp8 import feature_error
    from dflash_lab.target.features import FeatureExtractor

    ref_ext = FeatureExtractor(model, layer_ids)
    fp8_ext = FeatureExtractor(model, layer_ids, fp8=True)
    dev = ref_ext.device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g).to(dev)
    ref, got = ref_ext(ids), fp8_ext(ids)
    err = feature_error(ref, got, layer_ids)
    del ref, got
    t_ref = _time_ms(lambda: ref_ext(ids), reps, dev)
    t_fp8 = _time_ms(lambda: fp8_ext(ids), reps, dev)
    return {"scenario": "fp8_features", "layer_ids": list(layer_ids), "per_layer": err,
            "rel_err_max": max(e["rel_err"] for e in err.values()),
            "cosine_min": min(e["cosine"] for e in err.values()),
            "target_forward_ms": {"bf16": t_ref, "fp8": t_fp8}, "target_forward_speedup": round(t_ref / t_fp8, 3),
            "timing": "eager (no CUDA graph), median of %d calls, same batch" % reps}
