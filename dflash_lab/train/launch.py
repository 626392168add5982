"""Start a torchrun training job on this machine from a notebook, follow it, and print the command for a cluster.

    run_dir = prepare_run(TrainConfig(...), DistConfig(parallel="ddp"))   # new run dir: config.json + distributed.json
    job = launch(run_dir, nproc_per_node=2, gpus=[0, 1])                   # torchrun in its own session, logs in run dir
    job.status(); job.tail(); job.follow(); job.stop()                     # from any later cell
    print(cluster_command(run_dir, nnodes=2, nproc_per_node=8, rdzv_endpoint="node0:29500"))

The job is a child process group of the kernel (start_new_session), so `stop()` and `kill()` reach torchrun and every
rank, and nothing else. `stop()` is cooperative first: it writes the STOP file that rank 0 reads at the next step
boundary (every rank then stops at the same step and rank 0 writes a checkpoint), and signals only if the job has
not ended after `grace_s`. All output (torchrun's and every rank's) goes to `<run_dir>/launch.log`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dflash_lab.runs import rundir
from dflash_lab.config import TrainConfig
from .distributed import DIST_CONFIG_FILE, DistConfig
from .prepare import resolve_settings

LOG_FILE = "launch.log"
LAUNCH_FILE = "launch.json"


def prepare_run(config: TrainConfig, dist: DistConfig | None = None, *, run_dir: str | Path | None = None,
                log=print) -> Path:
    """A new run directory (runs/<name>-<stamp>-<id>/) holding config.json and distributed.json; returns it. Fields
    left unset are chosen here, once, for the target, data and GPUs (prepare.resolve_settings): every rank reads the
    same values from config.json."""
    if config.unresolved and not config.resume_from:
        config = resolve_settings(config, log=log)[0].config
    path = Path(run_dir) if run_dir else rundir.new_run_dir(config.runs_dir, config.run_name)
    path.mkdir(parents=True, exist_ok=True)
    rundir.write_json(path / rundir.CONFIG_FILE, config.to_dict())
    rundir.write_json(path / DIST_CONFIG_FILE, (dist or DistConfig()).to_dict())
    return path


def torchrun_args(run_dir: str | Path, *, nproc_per_node: int, nnodes: int = 1, rdzv_backend: str | None = None,
                  rdzv_endpoint: str | None = None, rdzv_id: str | None = None, node_rank: int | None = None,
                  launcher: list[str] | None = None, train_args: tuple[str, ...] = ()) -> list[str]:
    """argv of `torchrun ... -m dflash_lab.train --config <run_dir>/config.json`. No rendezvous = --standalone."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node}, nnodes={nnodes}: both must be >= 1.")
    argv = list(launcher or [sys.executable, "-m", "torch.distributed.run"])
    if rdzv_endpoint is None:
        if nnodes != 1:
            raise ValueError(f"nnodes={nnodes} needs a rendezvous endpoint. Fix: pass rdzv_endpoint='host:29500' "
                             "(a host every node can reach).")
        argv += ["--standalone", "--nnodes", "1"]
    else:
        argv += ["--nnodes", str(nnodes), "--rdzv-backend", rdzv_backend or "c10d", "--rdzv-endpoint", rdzv_endpoint,
                 "--rdzv-id", rdzv_id or Path(run_dir).name]
        if node_rank is not None:
            argv += ["--node-rank", str(node_rank)]
    argv += ["--nproc-per-node", str(nproc_per_node), "--max-restarts", "0",
             "-m", "dflash_lab.train", "--config", str(Path(run_dir) / rundir.CONFIG_FILE), *train_args]
    return argv


def cluster_command(run_dir: str | Path, *, nnodes: int, nproc_per_node: int, rdzv_endpoint: str = "HOST:29500",
                    rdzv_backend: str = "c10d") -> str:
    """The shell command(s) to run the same job on `nnodes` machines (run dir on a filesystem every node sees).

    c10d (elastic rendezvous): the same command on every node; torchrun assigns node ranks when all have joined.
    static: one command per node with --node-rank 0..nnodes-1 (node 0 hosts the rendezvous store).
    """
    if rdzv_backend == "static":
        lines = [f"# node {k}:\n" + shlex.join(torchrun_args(
            run_dir, nproc_per_node=nproc_per_node, nnodes=nnodes, rdzv_backend="static",
            rdzv_endpoint=rdzv_endpoint, node_rank=k, launcher=["torchrun"])) for k in range(nnodes)]
        return "\n".join(lines)
    cmd = shlex.join(torchrun_args(run_dir, nproc_per_node=nproc_per_node, nnodes=nnodes, rdzv_backend=rdzv_backend,
                                   rdzv_endpoint=rdzv_endpoint, launcher=["torchrun"]))
    return f"# on each of the {nnodes} nodes (same command; {rdzv_endpoint.split(':')[0]} must be reachable):\n{cmd}"


class Job:
    """A running torchrun job: poll / wait / tail / follow / status / stop / kill."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path, command: list[str], log_path: Path):
        self.proc, self.run_dir, self.command, self.log_path = proc, Path(run_dir), command, log_path
        self.started = time.time()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """None while running, else torchrun's exit code (0 = every rank finished or stopped cleanly)."""
        return self.proc.poll()

    @property
    def running(self) -> bool:
        return self.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def tail(self, n: int = 20) -> str:
        """The last n lines of launch.log (torchrun and all ranks)."""
        if not self.log_path.is_file():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 200 * n - 4096))
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def errors(self) -> list[dict]:
        """error.rank{R}.json reports written by ranks that failed (rank, step, error, traceback)."""
        out = []
        for p in sorted(self.run_dir.glob("error.rank*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        return out

    def status(self) -> dict:
        """Process state + rank 0's status.json (phase, step) + the first failing rank's error, if any."""
        st = {}
        try:
            st = json.loads((self.run_dir / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            pass
        rc = self.poll()
        errors = self.errors()
        state = "running" if rc is None else ("finished" if rc == 0 else "failed")
        out = {"state": state, "returncode": rc, "phase": st.get("phase", "starting"), "step": st.get("step"),
               "steps": st.get("steps"), "world_size": st.get("world_size"), "pid": self.pid,
               "elapsed_s": round(time.time() - self.started, 1), "log": str(self.log_path)}
        if errors:
            first = min(errors, key=lambda e: e.get("time", 0))
            out["error"] = f"rank {first['rank']} at step {first['step']}: {first['error']}"
        return out

    def describe(self) -> str:
        s = self.status()
        line = f"{s['state']} (pid {s['pid']}, {s['elapsed_s']:.0f}s) | phase {s['phase']}"
        if s.get("step") is not None:
            line += f" | step {s['step']}/{s['steps']}"
        if "error" in s:
            line += f" | FAILED: {s['error']}"
        elif s["state"] == "failed":
            line += f" | exit code {s['returncode']}: see {self.log_path}"
        return line

    def __repr__(self) -> str:
        return f"Job({self.run_dir.name}: {self.describe()})"

    def follow(self, *, timeout_s: float | None = None, print_fn=print, poll_s: float = 1.0, callbacks=(),
               callback_every_s: float = 10.0) -> int | None:
        """Print new lines of launch.log as they come until the job ends (or timeout_s); returns the exit code.

        Runs on the calling thread, so it also works headless (papermill --log-output shows each line); each of
        `callbacks` (no arguments, e.g. a dashboard view's `refresh`) runs every `callback_every_s` and at the end.
        """
        pos, t_end = 0, (time.monotonic() + timeout_s) if timeout_s else None
        last_cb = time.monotonic()
        while True:
            if callbacks and (time.monotonic() - last_cb >= callback_every_s or self.poll() is not None):
                last_cb = time.monotonic()
                for cb in callbacks:
                    cb()
            rc = self.poll()
            if self.log_path.is_file():
                with open(self.log_path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
                for line in chunk.decode(errors="replace").splitlines():
                    print_fn(line)
            if rc is not None:
                print_fn(self.describe())
                return rc
            if t_end is not None and time.monotonic() >= t_end:
                return None
            time.sleep(poll_s)

    def stop(self, grace_s: float = 120.0) -> int:
        """Cooperative stop: STOP file -> every rank stops at the same step after a checkpoint; signals after grace_s."""
        if self.running:
            (self.run_dir / "STOP").touch()
            try:
                return self.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def kill(self, term_wait_s: float = 30.0) -> int:
        """SIGTERM to torchrun's process group (torchrun forwards it to the ranks), SIGKILL after term_wait_s."""
        if self.running:
            self._signal(signal.SIGTERM)
            try:
                return self.wait(term_wait_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        return self.wait()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the job's own session (start_new_session): torchrun and its ranks only
        except ProcessLookupError:
            pass


def launch(run_dir: str | Path, *, nproc_per_node: int = 1, gpus: list[int] | None = None,
           env: dict | None = None, train_args: tuple[str, ...] = ()) -> Job:
    """torchrun --standalone --nproc-per-node N -m dflash_lab.train --config <run_dir>/config.json, in the background.

    gpus: CUDA ordinals for the job (CUDA_VISIBLE_DEVICES), one per process; [] hides every GPU (a CPU job with
    gloo); None leaves the environment as is. env: extra variables for every rank.
    """
    run_dir = Path(run_dir)
    if not (run_dir / rundir.CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{run_dir / rundir.CONFIG_FILE} does not exist. Fix: create the run with "
                                "prepare_run(config, dist) first.")
    if gpus and len(gpus) < nproc_per_node:
        raise ValueError(f"gpus={gpus} has fewer GPUs than nproc_per_node={nproc_per_node} (one process per GPU). "
                         "Fix: list one GPU per process.")
    cmd = torchrun_args(run_dir, nproc_per_node=nproc_per_node, train_args=train_args)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if gpus is not None:
        full_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    log_path = run_dir / LOG_FILE
    with open(log_path, "ab") as log:
        log.write(f"$ {shlex.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                start_new_session=True)
    rundir.write_json(run_dir / LAUNCH_FILE, {"command": cmd, "pid": proc.pid, "host": socket.gethostname(),
                                              "time": time.time(), "nproc_per_node": nproc_per_node,
                                              "CUDA_VISIBLE_DEVICES": full_env.get("CUDA_VISIBLE_DEVICES")})
    return Job(proc, run_dir, cmd, log_path)
