"""`python -m dflash_lab.train --config <run dir>/config.json`: one training process, alone or one of many under torchrun.

    torchrun --nnodes 1 --nproc-per-node 8 -m dflash_lab.train --config runs/<run>/config.json
    python -m dflash_lab.train --config runs/<run>/config.json            # one process, no process group
    python -m dflash_lab.train --data chats.jsonl --target T --steps 2000  # a NEW run dir from a data file, then train
    python -m dflash_lab.train --config runs/<run>/config.json --resume runs/<run> --time-budget 9m  # one job of many

The run directory is the folder holding config.json (a TrainConfig); its `distributed.json` (DistConfig) says how
ranks are laid out, and the flags below override both. The loop itself is rank_trainer.RankTrainer. A rank that
fails writes `error.rank{R}.json` (rank, step, traceback), marks status.json failed (the first failing rank wins)
and exits non-zero, so torchrun stops the job and names the root cause. SIGTERM (a scheduler ending the job, `kill`)
and a spent `--time-budget` stop every rank at the next step boundary after a checkpoint, as the STOP file does, and
print the command that continues the run; a second SIGTERM ends the process at once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from dflash_lab.runs import lock as run_lock, rundir
from dflash_lab.runs.checkpoint import CheckpointError
from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.data.chat_formats import DataError
from dflash_lab.target.load import TargetLoadError, resolve_target_path
from .distributed import DistConfig, DistContext
from .launch import prepare_run
from .rank_trainer import STATUS_FILE, STOP_FILE, RankTrainer
from .stopping import BUDGET_REASON, resume_hint

EPILOG = """The notebook way (dashboard, progress lines, summary.json and the executed notebook in the run dir):
notebooks/train.ipynb, headless `papermill notebooks/train.ipynb out.ipynb --log-output -p target T -p data FILE
-y 'gpus: [0]'` (`papermill --help-notebook notebooks/train.ipynb` lists every parameter). This command is the
torchrun entry point: --config runs an existing run dir's config.json; --data writes a new run dir (config.json with
the flags below and any TrainConfig field given with --set, e.g. --set seq_len=3072 --set lr=6e-4) and trains it in
this process."""


# What refuses a command before it owns the run: a bad setting, target, data or checkpoint, the run held by another
# process or used by another run. Such a refusal is one `error:` line and leaves the run folder as it was: it is not
# the run's failure (a `failed` event would make a live or finished run list as failed).
REFUSALS = (ConfigError, TargetLoadError, DataError, CheckpointError, run_lock.Busy, rundir.RunDirUsed)

CLI_DEFAULTS = {"target": "tiny", "devices": ["cpu"], "runs_dir": "runs", "run_name": "train", "heldout_data": None}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.train", description=__doc__.split("\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--config", help="<run dir>/config.json (a TrainConfig); outputs go to its folder")
    how.add_argument("--data", help="chat data file (JSONL/Parquet, OpenAI or ShareGPT) for a NEW run dir")
    p.add_argument("--target", default=None, help="with --data: the target (a known name, a local Hugging Face "
                   "folder or a hub id; default tiny)")
    p.add_argument("--devices", default=None, help="with --data: the one device of this process, e.g. cuda:0 "
                   "(several GPUs: torchrun, or notebooks/train.ipynb)")
    p.add_argument("--heldout-data", default=None, help="with --data: held-out conversations (JSONL) for validation "
                   "and real tau (default: the data's own held-out split)")
    p.add_argument("--run-name", default=None, help="with --data: name part of runs/<name>-<stamp>-<id>/ (default "
                   "train; or --set run_name=NAME, not both)")
    p.add_argument("--runs-dir", default=None, help="with --data: where the new run dir goes (default runs/)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="with --data: any TrainConfig "
                   "field (VALUE read as JSON when it parses: 3072, 6e-4, true, [1, 9]; else a string); repeatable")
    p.add_argument("--resume", default=None, help="run directory or checkpoint folder to continue from "
                   "(overrides config.resume_from)")
    p.add_argument("--steps", type=int, default=None, help="override config.steps")
    p.add_argument("--time-budget", type=duration_s, default=None, metavar="DURATION", help="wall time this process "
                   "may train (TrainConfig.time_budget_s: 540, 540s, 9m, 1h30m), loading included; then it stops "
                   "after a checkpoint and prints the command that continues the run")
    p.add_argument("--backend", default=None, choices=["auto", "nccl", "gloo"], help="override distributed.json")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"], help="override distributed.json")
    p.add_argument("--parallel", default=None, choices=["ddp", "fsdp2"], help="override distributed.json")
    p.add_argument("--targets-per-node", type=int, default=None, help="override distributed.json")
    p.add_argument("--timeout-s", type=float, default=None, help="process-group timeout (override)")
    p.add_argument("--no-checkpoints", action="store_true", help="write no checkpoint at all (benchmarks)")
    return p.parse_args(argv)


def duration_s(text: str) -> float:
    """`540`, `540s`, `9m`, `1h30m` -> seconds (argparse type of --time-budget)."""
    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or m is None or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use seconds (540) or e.g. 540s, 9m, 1h30m")
    h, mins, secs = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mins * 60 + secs


def load_configs(args: argparse.Namespace) -> tuple[TrainConfig, DistConfig, Path, set[str]]:
    """The run's configs, with the command line's changes; the last item names the TrainConfig fields the command
    line set (on resume only these override the checkpoint's config)."""
    config_path = Path(args.config)
    cfg = TrainConfig.from_json(config_path)
    changes = {}
    if args.resume:
        changes["resume_from"] = args.resume
    if args.steps is not None:  # --steps 0 too: the config refuses it instead of the run ignoring it
        changes["steps"] = args.steps
    if args.time_budget is not None:
        changes["time_budget_s"] = args.time_budget
    cfg = cfg.replace(**changes) if changes else cfg
    run_dir = config_path.resolve().parent
    dcfg = DistConfig.load(run_dir)
    over = {k: v for k, v in {"backend": args.backend, "device": args.device, "parallel": args.parallel,
                              "targets_per_node": args.targets_per_node, "timeout_s": args.timeout_s}.items()
            if v is not None}
    return cfg, (dcfg.replace(**over) if over else dcfg), run_dir, set(changes)


def new_run(args: argparse.Namespace) -> Path:
    """--data: a TrainConfig from the flags (checked, the target too, before anything is written) in a new run dir."""
    fields = {}
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set seq_len=3072.")
        try:
            fields[name.strip()] = json.loads(value)
        except ValueError:
            fields[name.strip()] = value
    flags = {"target": args.target, "data": args.data, "heldout_data": args.heldout_data, "runs_dir": args.runs_dir,
             "devices": args.devices.split(",") if args.devices else None, "run_name": args.run_name,
             "steps": args.steps, "time_budget_s": args.time_budget}
    flags = {k: v for k, v in flags.items() if v is not None}
    both = sorted(set(flags) & set(fields))
    if both:  # neither may win silently
        raise ConfigError(f"{', '.join(both)} given twice: by --set and by its own flag. Fix: give each once (e.g. "
                          f"--{both[0].replace('_', '-')} alone).")
    cfg = TrainConfig.from_dict({**CLI_DEFAULTS, **fields, **flags})
    resolve_target_path(cfg.target)  # a misspelled target: one line now, not a traceback after the data loaded
    if cfg.data != "tiny" and not Path(cfg.data).expanduser().exists():
        raise ConfigError(f"--data {cfg.data} does not exist. Fix: pass a JSONL/JSON/Parquet chat file "
                          "(check it first: python -m dflash_lab.data FILE --target T), or tiny (the embedded set).")
    run_dir = prepare_run(cfg)
    print(f"new run dir {run_dir} (config.json); training {cfg.steps} steps of {cfg.target} on {cfg.data}", flush=True)
    return run_dir


class JobStop:
    """Ends this process's run early and cleanly: a spent time budget (a timer) or SIGTERM touches the run dir's STOP
    file, which rank 0 reads at the next step boundary, so every rank stops at the same step after a checkpoint."""

    def __init__(self, run_dir: Path, budget_s: float | None, started: float, *, main_rank: bool,
                 armed: bool = True):
        """`armed=False`: the process does not own the run yet (it may still be refused, and the STOP file would
        stop another process's run): a request is kept and written by `arm()`."""
        self.run_dir, self.main_rank, self.reason, self.armed = run_dir, main_rank, None, armed
        # the timer thread's request and the main thread's arm() can meet: the lock writes the request once
        self._lock, self._written = threading.RLock(), False  # RLock: SIGTERM may land while the main thread holds it
        self.timer = None
        if budget_s is not None:  # the budget counts from the process's start: loading is part of the job
            self.timer = threading.Timer(max(0.0, budget_s - (time.monotonic() - started)), self.request,
                                         args=(f"{BUDGET_REASON} of {budget_s:g} s spent",))
            self.timer.daemon = True
            self.timer.start()
        self.previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        self.request("SIGTERM")

    def request(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        print(f"{reason}: stopping at the next step boundary after a checkpoint", file=sys.stderr, flush=True)
        self._write()

    def arm(self) -> None:
        """The run is this process's now: a request made while it loaded is written."""
        self.armed = True
        self._write()

    def _write(self) -> None:
        """The request into the run (event + STOP), once, and only once the process owns the run."""
        with self._lock:
            if not self.armed or self.reason is None or self._written:
                return
            self._written = True
        reason = self.reason
        try:
            if self.main_rank:
                rundir.log_event(self.run_dir, "stop_requested", source=reason)
            (self.run_dir / STOP_FILE).touch()
        except OSError:
            pass

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        signal.signal(signal.SIGTERM, self.previous)
        stop = self.run_dir / STOP_FILE
        # the run ended before reading it: the next job must not stop (and an unarmed one never wrote it)
        if self.armed and self.reason is not None and stop.exists():
            stop.unlink(missing_ok=True)


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    if args.data is not None:
        try:
            args.config = str(new_run(args) / rundir.CONFIG_FILE)
        except (ConfigError, TargetLoadError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    rank = int(os.environ.get("RANK", 0))
    ctx = trainer = stopper = None
    run_dir = Path(args.config).resolve().parent
    try:
        cfg, dcfg, run_dir, explicit = load_configs(args)
        stopper = JobStop(run_dir, cfg.time_budget_s, started, main_rank=rank == 0, armed=False)
        ctx = DistContext(dcfg, train_devices=cfg.devices)
        if not ctx.distributed and len(cfg.devices) > 1:
            raise ConfigError(f"TrainConfig.devices={cfg.devices!r} names {len(cfg.devices)} devices but this is ONE "
                              f"process. Fix: torchrun --nproc-per-node {len(cfg.devices)} -m dflash_lab.train "
                              f"--config {args.config} (one process per GPU), or use Trainer in a notebook for the "
                              "threaded engine.")
        trainer = RankTrainer(cfg, ctx, run_dir, checkpoints=not args.no_checkpoints, explicit=explicit)
        stopper.arm()
        trainer.train()
        if rank == 0 and trainer.phase == "stopped":
            print(resume_hint(run_dir, torchrun=True), flush=True)
        return 0
    except BaseException as e:
        if isinstance(e, REFUSALS) and trainer is None:  # refused before this process owned the run
            run_lock.release(run_dir)  # its own lock only (taken before a used run dir was refused)
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2
        step = trainer.step_count if trainer is not None else None
        report = {"rank": rank, "step": step, "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc(), "time": time.time(), "host": os.uname().nodename}
        try:
            rundir.write_json(run_dir / f"error.rank{rank}.json", report)
            _failed_status(run_dir, rank, step, report["error"])
            rundir.log_event(run_dir, "failed", rank=rank, step=step, error=report["error"])
        except OSError:
            pass
        print(f"[rank {rank}] FAILED at step {step}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    finally:
        if stopper is not None:
            stopper.close()
        if trainer is not None:
            trainer.close()
            run_lock.release(run_dir)  # rank 0's: the run dir is free, and no stale lock is left behind
        if ctx is not None:
            ctx.close()


def _failed_status(run_dir: Path, rank: int, step: int | None, error: str) -> None:
    """status.json -> failed, naming the FIRST rank that failed (peers that die of it later do not overwrite it)."""
    path = run_dir / STATUS_FILE
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        old = {}
    if old.get("phase") == "failed":
        return
    rundir.write_json(path, {**old, "phase": "failed", "step": step if step is not None else old.get("step"),
                             "time": time.time(), "error": f"rank {rank} at step {step}: {error}",
                             "detail": f"see error.rank{rank}.json and launch.log"})


def run() -> int:
    """The command's entry: torchrun's `record` writes a failing rank's exception to its error file, so the job's
    summary names the rank that died first and why."""
    from torch.distributed.elastic.multiprocessing.errors import record

    code = record(main)()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Every file is written and closed and the process group is destroyed by now. What is left is the C++
        # teardown at interpreter exit, where a gloo/c10d helper thread still joinable aborts the process now and
        # then ("terminate called without an active exception", SIGABRT) AFTER a finished run; torchrun would report
        # that finished rank as the job's root cause. Ending the process here skips that teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(run())
