"""Golden loss curves: the first 20 losses of a small fixed CPU run, for the notebook Trainer and the torchrun rank
loop (RankTrainer in one process; test_distributed ties 2 gloo ranks to that one process). Pinned in
tests/golden_losses.json; test_golden.py compares within TOLERANCE.

A change that alters numerics on purpose (a new init, another loss reduction, a merge of such a branch) regenerates
them, and the diff of the JSON file shows by how much:

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m tests.golden --update
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

GOLDEN_FILE = Path(__file__).resolve().parent / "golden_losses.json"
STEPS = 20
TOLERANCE = dict(rel=2e-4, abs=1e-5)  # fp32 on CPU: summation order across thread counts only


def config(tmp: Path):
    from dflash_lab import TrainConfig
    from dflash_lab.tiny import ensure_tiny_target, tiny_data_path

    ensure_tiny_target()
    tmp.mkdir(parents=True, exist_ok=True)
    data = tmp / "golden64.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:64]))
    return TrainConfig(target="tiny", data=str(data), steps=STEPS, seq_len=64, batch_size=2, block_size=8,
                       num_anchors=4, num_draft_layers=1, lr=3e-3, log_every=1, seed=0, runs_dir=str(tmp / "runs"))


def trainer_losses(tmp: Path) -> list[float]:
    from dflash_lab.train.trainer import Trainer

    t = Trainer(config(tmp), write_run_dir=False, log=lambda *a: None)
    try:
        t.step(STEPS)
        return [r["loss"] for r in t.history]
    finally:
        t.close()


def torchrun_losses(tmp: Path) -> list[float]:
    from dflash_lab.train.distributed import DistConfig, DistContext
    from dflash_lab.train.rank_trainer import RankTrainer

    cfg = config(tmp)
    ctx = DistContext(DistConfig(backend="gloo"), train_devices=cfg.devices, env=None)
    rt = RankTrainer(cfg, ctx, tmp / "rank_run", log=lambda *a: None, checkpoints=False)
    try:
        rt.train(progress_every_s=1e9)
        return [r["loss"] for r in rt.metrics.ring.snapshot()]
    finally:
        rt.close()
        ctx.close()


def measure() -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        return {"trainer": trainer_losses(Path(d) / "a"), "torchrun": torchrun_losses(Path(d) / "b")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--update", action="store_true", help=f"rewrite {GOLDEN_FILE.name} with the losses measured now")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    got = measure()
    if args.update:
        GOLDEN_FILE.write_text(json.dumps({"steps": STEPS, **got}, indent=1) + "\n")
        print(f"wrote {GOLDEN_FILE}")
    else:
        print(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
