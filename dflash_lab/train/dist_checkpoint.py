"""Checkpoints of a torchrun job in checkpoint.py's format: full tensors from DDP replicas or FSDP2 shards.

With DDP every drafter rank holds the same full tensors, so rank 0 alone reads and writes them. With FSDP2 each rank
holds a shard (DTensor): every drafter rank takes part in gathering each tensor (collectives, in the same order on
every rank) and rank 0 writes. Restoring goes the other way: every drafter rank reads the files and keeps its shard.
The files are exactly a notebook Trainer's, so either can resume the other's checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from dflash_lab.runs import checkpoint, rundir
from .distributed import full_tensor, shard_like


def gather_full_state(drafter: torch.nn.Module, optimizer, names: list[str], *,
                      export_dtype: torch.dtype) -> tuple[dict, dict, list[dict]]:
    """(drafter tensors in export names and `export_dtype`, masters + AdamW state by name, param-group settings).

    Collective under FSDP2: call it on every drafter rank."""
    weights = {k: full_tensor(v).to(export_dtype if v.is_floating_point() else v.dtype)  # d2t stays int64
               for k, v in drafter.state_dict().items() if not k.startswith("rotary_emb.")}
    sd = optimizer.state_dict()  # MasterAdamW or MasterMuon: one index per trainable parameter
    tensors = {}
    for i, name in enumerate(names):
        tensors[f"master/{name}"] = full_tensor(optimizer.masters[i].detach())
        for key, val in sd["state"].get(i, {}).items():
            tensors[f"{key}/{name}"] = full_tensor(val.detach()) if torch.is_tensor(val) else torch.tensor(val)
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
              for g in sd["param_groups"]]
    return weights, tensors, groups


@torch.no_grad()
def restore_sharded(optimizer, names: list[str], tensors: dict[str, torch.Tensor]) -> None:
    """FSDP2: each rank keeps its shard of every master (= the parameter) and of its AdamW moments."""
    for i, name in enumerate(names):
        master = optimizer.masters[i]
        master.copy_(shard_like(tensors[f"master/{name}"], master))
        per = {k.split("/", 1)[0]: v for k, v in tensors.items()
               if k.split("/", 1)[1] == name and not k.startswith("master/")}
        if per:
            optimizer.inner.state[master] = {k: (v.to(torch.float32) if k == "step" else shard_like(v, master))
                                             for k, v in per.items()}


def write(run_dir: Path, step: int, files: dict, state: dict, *, keep: int, reason: str, log) -> Path | None:
    """checkpoint.write_checkpoint + rotation + events.jsonl; a failed write is reported and training goes on."""
    t0 = time.perf_counter()
    root = Path(run_dir) / checkpoint.CHECKPOINTS_DIR
    try:
        path = checkpoint.write_checkpoint(root, step, files, state)
    except checkpoint.CheckpointError as e:  # the previous checkpoint is intact
        log(f"WARNING: {e}")
        rundir.log_event(run_dir, "checkpoint_failed", step=step, reason=reason, error=str(e))
        return None
    removed = checkpoint.rotate(root, keep)
    seconds = time.perf_counter() - t0
    rundir.log_event(run_dir, "checkpoint", step=step, path=str(path), reason=reason, seconds=round(seconds, 3),
                     removed=[p.name for p in removed])
    log(f"checkpoint {path} ({reason}, {seconds:.1f}s)")
    return path
