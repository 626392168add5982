"""The one check of a command's `--threads`: torch CPU threads from 0 (torch's own default) to this machine's cores.

torch takes any integer: -1 raises deep inside it, and 100000 makes it start that many threads (the process
crashes and the machine runs out of threads for everyone). More threads than cores only slows small models down,
so the bound is the cores this process may run on. Every command that sets torch's threads parses its flag with
`threads_arg`, so a bad value is argparse's one-line error naming the flag, the value and the range.
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS says, else the machine's count), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def threads_arg(text: str) -> int:
    """argparse `type=` of --threads: an integer in 0..cpu_cores(); 0 leaves torch's default."""
    cores = cpu_cores()
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or not 0 <= n <= cores:
        raise argparse.ArgumentTypeError(
            f"--threads {text} is invalid: this machine has {cores} CPU core(s) for this process. Fix: 1..{cores} "
            "(1 is fastest for small models on the CPU), or 0 for torch's default")
    return n


@contextmanager
def torch_threads(n: int | None):
    """torch's intra-op CPU threads set to n inside the block (None or 0: left as they are), restored after, so an
    evaluation in a notebook's kernel leaves training beside it as it found it."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
