"""explore.ipynb's first steps in a fresh kernel, the way JupyterLab runs them (a live dashboard), timed per step.

    python bench/explore_first_steps.py fresh second static [env:OMP_WAIT_POLICY=ACTIVE ...]   # STEPS=30 by default

Starts a kernel of this environment with jupyter_client, runs the notebook's code cells with allow_stdin=True (what
JupyterLab sends, so the dashboard is live: widgets, its refresh thread, the Trainer built on a thread), then trains
STEPS steps with a callback that records each step's wall time and every thread's CPU time (utime, stime, minor
faults from /proc/self/task). Modes, each in a fresh kernel: `fresh` (a first Run All), `second` (a second Run All
in the same kernel), `static` (DFLASH_DASHBOARD=static: what papermill gets), `main-team` (a parallel torch op on the
main thread first), `env:NAME=VALUE` (a kernel started with that variable). Prints the first 20 steps' sum, the
medians and the CPU seconds per thread. No GPU, no browser; CPU numbers move with the machine's load, so compare
modes run one after another.

Measured on the shared 2-core machine (2026-12-06, load 6-10 from other jobs), 25 steps each: a first Run All spun
libgomp's full wait (60-99 s for the first 20 steps, ~18 s of CPU in each of the drafter's two threads); a second
Run All, `static`, `main-team` or OMP_WAIT_POLICY=PASSIVE took 4.0-10 s (1.5-2 s of CPU per thread). dflash_lab now
sets OMP_WAIT_POLICY=PASSIVE before torch loads (dflash_lab/__init__.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = int(os.environ.get("STEPS", 30))
PROBE = r'''
import os, time, threading
_T, _C = [], []
def _cpu():
    out = {}
    for tid in os.listdir('/proc/self/task'):
        try:
            f = open(f'/proc/self/task/{tid}/stat').read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(f[11]), int(f[12]), int(f[7]))
    return out
def _cb(*a, **k):
    _T.append(time.perf_counter()); _C.append(_cpu())
'''
REPORT = r'''
import json
_names = {th.native_id: th.name for th in threading.enumerate()}
_d = [b - a for a, b in zip([_t0] + _T, _T)]
_cpu_s = {}
for a, b in zip(_C, _C[1:]):
    for k in b:
        z, c = a.get(k, (0, 0, 0)), _cpu_s.setdefault(_names.get(k, f'native-{k}'), [0.0, 0.0, 0])
        c[0] += (b[k][0] - z[0]) / 100; c[1] += (b[k][1] - z[1]) / 100; c[2] += b[k][2] - z[2]
print('RESULT ' + json.dumps({'steps': _d, 'cpu': {k: v for k, v in _cpu_s.items() if any(v)}}))
'''


def code_cells() -> list[str]:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "explore.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def start_kernel(env_extra: dict):
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, "PYTHONPATH": str(ROOT), **env_extra}, cwd=str(ROOT / "notebooks"))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(120)
    return km, kc


def execute(kc, code: str, timeout: float = 1800) -> str:
    msg_id = kc.execute(code, allow_stdin=True)  # as JupyterLab sends it: the dashboard goes live
    out = []
    while True:
        m = kc.get_iopub_msg(timeout=timeout)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            out.append(m["content"]["text"])
        elif m["msg_type"] == "error":
            out.append("\n".join(m["content"]["traceback"]))
        elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return "".join(out)


def one_run(kc, label: str, runs_dir: str, extra: str = "") -> dict:
    cells = code_cells()
    execute(kc, cells[0] + f"\nsteps = {STEPS}\nruns_dir = {runs_dir!r}\n" + extra)
    for cell in cells[1:3]:  # build the trainer and show the dashboard; wait for it
        execute(kc, cell)
    execute(kc, PROBE)
    execute(kc, "_t0 = time.perf_counter()\ntrainer.train(callbacks=[view.callback, _cb])")
    out = execute(kc, REPORT)
    execute(kc, "view.close()")
    if "RESULT " not in out:
        raise RuntimeError(f"{label}: no result:\n{out[-2000:]}")
    r = json.loads(out.split("RESULT ", 1)[1])
    steps = r["steps"]
    first = sorted(steps[:20])
    print(f"{label}: first 20 steps {sum(steps[:20]):.2f} s (median {first[len(first) // 2]:.3f} s); "
          f"CPU s (user, sys, minor faults) per thread: "
          + ", ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}/{v[2]}" for k, v in r["cpu"].items() if v[0] + v[1] >= 0.05),
          flush=True)
    return r


def main(modes: list[str]) -> int:
    import tempfile

    runs_dir = tempfile.mkdtemp(prefix="explore-first-steps-")
    for mode in modes or ["fresh", "static"]:
        env, extra, label = {}, "", mode
        if mode == "static":
            env = {"DFLASH_DASHBOARD": "static"}
        elif mode == "main-team":
            extra = "import torch; torch.ones(4_000_000).exp_().sum()\n"  # the main thread's OpenMP team first
        elif mode.startswith("env:"):
            name, value = mode[4:].split("=", 1)
            env = {name: value}
        elif mode not in ("fresh", "second"):
            print(f"unknown mode {mode!r}: fresh, second, static, main-team or env:NAME=VALUE")
            return 2
        km, kc = start_kernel(env)
        try:
            t0 = time.monotonic()
            one_run(kc, f"{label} (first Run All)" if mode != "second" else "first Run All", runs_dir, extra)
            if mode == "second":
                one_run(kc, "second Run All, same kernel", runs_dir)
            print(f"  ({time.monotonic() - t0:.0f} s)")
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
