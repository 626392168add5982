"""The processes a workflow starts (a sweep's variants, a scaling study's points): which device each sees, and that
each dies with the workflow that started it.

A variant or point trains for minutes to hours in its own process. When the workflow's process goes (SIGKILL, a
restarted notebook kernel, a device call's time limit) nothing can stop its children in an orderly way, and a
child left training holds its run directory's lock: the next resume finds it busy and the child's GPU time is
spent on a study nobody reads. So the child asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG,
Linux), then checks that the parent is still there: a parent that died between the fork and that request would
otherwise never signal it. The child learns its parent's pid from the environment (PARENT_ENV), set by child_env.
"""

from __future__ import annotations

import os
import signal
import sys

from dflash_lab.runs.rundir import NOTEBOOK_ENV

PARENT_ENV = "DFLASH_WORKFLOW_PARENT"  # the pid of the workflow that started this process
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def child_env(device: str, parent: int | None = None) -> dict:
    """The environment of a child that runs on `device`: cuda:N handed over as CUDA_VISIBLE_DEVICES (the child sees
    "cuda:0"), and the parent's pid (default: this process) for die_with_parent."""
    env = dict(os.environ)
    env.pop(NOTEBOOK_ENV, None)  # the child is no notebook: it must not copy the workflow's notebook as its own
    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        # cuda:N counts the GPUs this process sees: under CUDA_VISIBLE_DEVICES="2,3", cuda:1 is physical GPU 3
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
    env[PARENT_ENV] = str(os.getpid() if parent is None else parent)
    return env


def die_with_parent() -> None:
    """In a child started with child_env: SIGTERM from the kernel when the parent dies, and end now if it is already
    gone. Does nothing in a process started some other way (no PARENT_ENV)."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit():
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the workflow's own SIGTERM handler still stops its children
        pass
    if os.getppid() != int(parent):
        sys.exit(f"the workflow that started this process (pid {parent}) is gone")
