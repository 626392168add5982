"""Hooks the distributed tests set through the environment, read by every torchrun rank at each step.

DFLASH_FAULT="<rank>:<step>" raises on that rank at that step (a dying rank must end the job with a clear error and
leave a resumable checkpoint); DFLASH_DUMP_GRADS=<dir> saves each drafter rank's summed, clipped gradients after
every step (so DDP, FSDP2, split layouts and one process can be compared gradient by gradient).
"""

from __future__ import annotations

import os
from pathlib import Path

from .distributed import full_tensor


def maybe_fault(rank: int, step: int) -> None:
    spec = os.environ.get("DFLASH_FAULT")
    if spec and spec == f"{rank}:{step}":
        raise RuntimeError(f"injected fault on rank {rank} at step {step} (DFLASH_FAULT={spec})")


def maybe_dump_grads(rank: int, names: list[str], optimizer, step: int) -> None:
    out = os.environ.get("DFLASH_DUMP_GRADS")
    if not out:
        return
    from safetensors.torch import save_file

    grads = {n: full_tensor(m.grad).detach().float().cpu().contiguous()
             for n, m in zip(names, optimizer.masters) if m.grad is not None}
    Path(out).mkdir(parents=True, exist_ok=True)
    save_file(grads, str(Path(out) / f"grads.rank{rank}.step{step + 1}.safetensors"))
