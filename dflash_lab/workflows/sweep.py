"""Sweeps: one base TrainConfig plus named variants, each trained as its own run, ranked by held-out REAL tau.

A researcher asks "which knob helps MY target and data, by how much, for what cost?". Each variant is a name and a
dict of TrainConfig overrides; every variant's TrainConfig is built before anything runs, so a typo fails in the
first second naming the variant and the field. Every run measures real speculative-decoding tau (validation.py)
on the SAME held-out prompts: the sweep turns real tau on (it is off by default on the CPU tiny target) and refuses
variants that change what is measured (held-out data, prompt count, tokens per prompt).

Each variant runs in its own process (`python -m dflash_lab.workflows.sweep --run <run dir>`: a plain Trainer, train(),
finish(); the same code the train notebook runs), so a variant that crashes or runs out of memory is recorded as
failed with its error and the sweep goes on. With several devices the variants form a queue, one per device at a
time; a CUDA device is handed to its process as CUDA_VISIBLE_DEVICES so the run itself sees "cuda:0".

Outputs: `runs/sweeps/<stamp>-<name>/sweep.json` (variants, run dirs, status, errors) and results.csv/json
(sweep_results.py); each variant's run dir is a normal one under `runs/`. Rerunning a sweep of the same name reuses
its newest sweep dir (named exactly `<stamp>-<name>`), skips variants that finished with the same config and whose
run folder is still there, and keeps variants that are no longer listed (their rows stay in the results).

A variant longer than one job: `time_budget_s` in the base (or a variant) stops each variant's run at a step boundary
with a checkpoint once its process has trained that long; the variant is recorded "stopped (resumable)", and the next
run of the sweep resumes it in its own run folder (resume_from) instead of training it again, until it finishes. The
budget is not part of what makes two configs the same variant: a rerun may give it another.

Nothing runs twice or beside itself: one sweep of a name runs at a time (`sweeps/<name>.lock`); a variant's process
dies with the sweep (SIGTERM when its parent goes, SIGKILL and kernel restarts included), and a rerun that finds a
variant's run folder still locked by a live process refuses to start it again. Every variant is measured on the SAME
held-out set: the base's (its data's own held-out split when the base leaves heldout_data unset) is pinned into every
variant, so a variant that trains on other data is still scored on the base's prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.runs import lock as run_lock
from dflash_lab.runs.rundir import new_run_dir, resolve_runs_dir, write_json
from dflash_lab.runs.run_files import RunFileError
from dflash_lab.runs.run_state import STOPPED_RESUMABLE
from dflash_lab.train.validation import heldout_source
from .children import child_env, die_with_parent
from .sweep_results import SWEEP_FILE, read_sweep, write_results

LOG_FILE = "sweep.log"  # a variant's stdout + stderr, in its run dir
# Fields that define the measurement: a variant changing them would not be comparable with the others.
MEASUREMENT_FIELDS = ("heldout_data", "real_tau_prompts", "real_tau_new_tokens", "real_tau_every", "steps")
# Fields the sweep sets per variant / per slot.
SWEEP_OWNED_FIELDS = ("run_name", "runs_dir", "devices", "target_devices", "resume_from")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_STAMP = r"\d{8}T\d{6}Z-"
STOPPED = STOPPED_RESUMABLE  # a variant whose run spent its time budget: the next run of the sweep resumes it
NOT_THE_VARIANT = SWEEP_OWNED_FIELDS + ("time_budget_s",)  # differ between reruns of one variant


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """A sweep: base TrainConfig fields, variants (each {"name": ..., <TrainConfig field>: value, ...}), devices."""

    name: str
    """Sweep name: the folder `runs_dir/sweeps/<stamp>-<name>/`, and the run names `<name>-<variant>`."""
    base: dict
    """TrainConfig fields shared by every variant (e.g. target, data, lr)."""
    variants: tuple
    """Dicts, each with a "name" and any TrainConfig field overrides; {"name": "baseline"} is the base itself."""
    steps: int = 200
    """Optimizer steps of every variant (the same for all, so their tau is comparable)."""
    real_tau_every: int = 50
    """Real tau on the held-out prompts every N steps and at the last step (must be > 0: it is what we rank by)."""
    devices: tuple = ("cpu",)
    """Queue slots: one variant per entry at a time, e.g. ("cuda:0", "cuda:1") or ("cpu",); a device listed twice
    runs two variants on it side by side (their tokens/s then share the device: compare tau, not speed)."""
    runs_dir: str = "runs"
    """Where the runs and `sweeps/` live."""

    def __post_init__(self):
        c = "SweepConfig"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"{c}.name={self.name!r} is invalid: use letters, digits, '_', '.' or '-'. "
                              "Fix: e.g. name='lr-gamma'.")
        if not isinstance(self.base, dict):
            raise ConfigError(f"{c}.base={self.base!r} is invalid: must be a dict of TrainConfig fields. "
                              "Fix: e.g. base={'target': 'tiny', 'lr': 3e-3}.")
        if isinstance(self.variants, dict) or not self.variants:
            raise ConfigError(f"{c}.variants={self.variants!r} is invalid: must be a non-empty list of dicts. "
                              "Fix: e.g. variants=[{'name': 'baseline'}, {'name': 'lr-1e-3', 'lr': 1e-3}].")
        object.__setattr__(self, "variants", tuple(dict(v) if isinstance(v, dict) else v for v in self.variants))
        for name in ("steps", "real_tau_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{c}.{name}={v!r} is invalid: must be an integer >= 1. Fix: e.g. {name}=50.")
        if isinstance(self.devices, str) or not self.devices:
            raise ConfigError(f"{c}.devices={self.devices!r} is invalid: must be a non-empty list of device names. "
                              "Fix: use ['cpu'] or ['cuda:0', 'cuda:1'].")
        object.__setattr__(self, "devices", tuple(self.devices))
        for d in self.devices:
            if d != "cpu" and not re.match(r"^cuda:\d+$", str(d)):
                raise ConfigError(f"{c}.devices={self.devices!r} is invalid: {d!r} is not 'cpu' or 'cuda:N'. "
                                  "Fix: one device per queue slot, e.g. ['cuda:0', 'cuda:1'].")
        for key in sorted(set(self.base) & set(SWEEP_OWNED_FIELDS + ("steps", "real_tau_every"))):
            raise ConfigError(f"{c}.base sets {key}={self.base[key]!r}, which the sweep decides. Fix: remove it "
                              "(use SweepConfig.steps / real_tau_every / devices / runs_dir / name).")
        self.train_configs()  # every variant's TrainConfig, built now: a typo fails before anything runs

    def heldout(self) -> str:
        """The held-out conversations every variant is measured on: the base's heldout_data, else its data's own
        held-out file. A variant that changes `data` would otherwise be scored on another set (or none)."""
        data, given = self.base.get("data", TrainConfig.data), self.base.get("heldout_data")
        if given is None and data != "tiny" and not Path(str(data)).expanduser().exists():
            raise ConfigError(f"SweepConfig.base data={data!r} does not exist. Fix: pass an existing data file or "
                              "folder (its held-out set scores every variant), or set base heldout_data.")
        try:
            found = heldout_source(data, given)
        except FileNotFoundError as e:
            raise ConfigError(f"SweepConfig.base: {e}") from None
        if found is None or found[1] is not None:
            why = "has no held-out set" if found is None else f"holds its held-out set as the split {found[1]!r}"
            raise ConfigError(f"SweepConfig.base data={data!r} {why}: the sweep ranks every variant by real tau on "
                              "ONE held-out file. Fix: set base heldout_data to a JSONL file of held-out "
                              "conversations.")
        return str(found[0])

    def train_configs(self) -> dict[str, TrainConfig]:
        """{variant name: its TrainConfig} (device "cpu" or "cuda:0": the slot decides the real device)."""
        out: dict[str, TrainConfig] = {}
        heldout = self.heldout()
        for i, v in enumerate(self.variants):
            if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not _NAME.match(v["name"]):
                raise ConfigError(f"sweep variant #{i} ({v!r}) is invalid: each variant is a dict with a 'name' of "
                                  "letters, digits, '_', '.' or '-'. Fix: e.g. {'name': 'lr-1e-3', 'lr': 1e-3}.")
            vname = v["name"]
            if vname in out:
                raise ConfigError(f"sweep variant #{i} repeats the name {vname!r}. "
                                  "Fix: give every variant its own name.")
            overrides = {k: x for k, x in v.items() if k != "name"}
            for key in overrides:
                if key in SWEEP_OWNED_FIELDS or key in MEASUREMENT_FIELDS:
                    raise ConfigError(f"sweep variant #{i} {vname!r} sets {key}={overrides[key]!r}: every variant "
                                      "must train the same steps and measure real tau on the same held-out prompts, "
                                      "and the sweep picks run names and devices. Fix: remove it from the variant.")
            fields = {**self.base, **overrides, "heldout_data": heldout, "steps": self.steps,
                      "real_tau_every": self.real_tau_every,
                      "run_name": f"{self.name}-{vname}", "runs_dir": self.runs_dir,
                      "devices": ("cpu",) if self.devices[0] == "cpu" else ("cuda:0",)}
            try:
                out[vname] = TrainConfig.from_dict(fields)
            except (ConfigError, TypeError) as e:
                raise ConfigError(f"sweep variant #{i} {vname!r} (overrides {overrides!r}): {e}") from e
        return out

    def spec(self) -> dict:
        return {"name": self.name, "base": self.base, "variants": list(self.variants), "steps": self.steps,
                "real_tau_every": self.real_tau_every, "devices": list(self.devices), "runs_dir": self.runs_dir}


def load_variants(variants_file: str | Path | None, variants=()) -> list[dict]:
    """The variants of a JSON file (a list of {"name": ..., <field>: value} dicts) if one is named, else `variants`."""
    if not variants_file:
        return list(variants)
    path = Path(variants_file)
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"variants_file={str(variants_file)!r} is unreadable ({e}). Fix: a JSON list of dicts, "
                          'e.g. [{"name": "baseline"}, {"name": "lr-1e-3", "lr": 0.001}].') from e
    if not isinstance(loaded, list):
        raise ConfigError(f"variants_file={str(variants_file)!r} holds a {type(loaded).__name__}, not a list. Fix: "
                          'a JSON list of dicts, e.g. [{"name": "baseline"}, {"name": "lr-1e-3", "lr": 0.001}].')
    return loaded


def sweeps_dir(runs_dir: str | Path = "runs") -> Path:
    return resolve_runs_dir(runs_dir) / "sweeps"


def find_sweep_dir(cfg: SweepConfig) -> Path | None:
    """The newest `runs_dir/sweeps/<stamp>-<name>/` of exactly this sweep's name (never `<stamp>-lr-<name>`)."""
    root = sweeps_dir(cfg.runs_dir)
    name = re.compile(_STAMP + re.escape(cfg.name))
    found = sorted(p for p in root.iterdir() if name.fullmatch(p.name) and (p / SWEEP_FILE).is_file()) \
        if root.is_dir() else []
    return found[-1] if found else None


def sweep_lock(cfg: SweepConfig) -> Path:
    """Held while a sweep of this name runs: a second one would share its folder and train every variant twice."""
    return sweeps_dir(cfg.runs_dir) / f"{cfg.name}.lock"


def _config_key(tc: TrainConfig) -> dict:
    """What must match for a finished run to count as this variant's result (run names and devices may differ)."""
    d = tc.to_dict()
    for k in NOT_THE_VARIANT:
        d.pop(k, None)
    return json.loads(json.dumps(d))


def checkpoint_exists(run_dir: Path) -> bool:
    """Whether a run folder holds a complete checkpoint to resume from (a `step-N/` with its state.json)."""
    root = Path(run_dir) / "checkpoints"
    return root.is_dir() and any((p / "state.json").is_file() for p in root.glob("step-*"))


def _last_error(run_dir: Path, rc: int | None = None) -> str:
    """The error a failed variant left: the signal that killed it (SIGKILL: often the out-of-memory killer), else
    error.json from the child, else the last lines of its log."""
    killed = ""
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
        oom = " (often the out-of-memory killer)" if -rc == signal.SIGKILL else ""
        killed = f"killed by {name}{oom}; "
    try:
        return killed + json.loads((run_dir / "error.json").read_text())["error"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        lines = (run_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()
    except OSError:
        return killed + "no log"
    return killed + (" | ".join(lines[-3:]) or "exited without output")


class Sweep:
    """Runs a SweepConfig: a queue of variant processes over the devices; `state` mirrors sweep.json."""

    def __init__(self, cfg: SweepConfig, *, resume: bool = True, log=print):
        self.cfg, self.log = cfg, log
        self.configs = cfg.train_configs()
        if run_lock.is_held(sweep_lock(cfg)):
            raise run_lock.Busy(f"sweep {cfg.name!r} is running in another process "
                                f"({run_lock.describe(run_lock.read_holder_file(sweep_lock(cfg)))}); a second one "
                                "would train every variant again beside it. Fix: wait for it, or give this sweep "
                                "another name.")
        old = find_sweep_dir(cfg) if resume else None
        previous, old_spec = {}, {}
        if old is None:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            self.dir = sweeps_dir(cfg.runs_dir) / f"{stamp}-{cfg.name}"
            self.dir.mkdir(parents=True)
        else:
            self.dir = old
            try:
                state = read_sweep(old)
            except RunFileError as e:
                raise ConfigError(f"cannot resume sweep {cfg.name!r}: {e} Fix: move {old} aside (its run folders "
                                  "stay under runs/), or pass resume=False for a new sweep folder.") from None
            previous = {v["name"]: v for v in state.get("variants", []) if isinstance(v, dict) and "name" in v}
            old_spec = {v.get("name"): v for v in state.get("spec", {}).get("variants", []) if isinstance(v, dict)}
        self.state = {"name": cfg.name, "spec": cfg.spec(), "sweep_dir": str(self.dir), "variants": []}
        listed = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in cfg.variants}
        for name, tc in self.configs.items():
            self.state["variants"].append(self._carried(name, _config_key(tc), listed[name], previous.get(name)))
        for name, prev in previous.items():  # left out of this run: kept as they were, rows and all
            if name not in listed:
                over = prev.get("overrides", {k: x for k, x in old_spec.get(name, {}).items() if k != "name"})
                self.state["variants"].append({**prev, "overrides": over, "listed": False})
                log(f"sweep {cfg.name}: {name} is not among this run's variants: kept as it was ({prev.get('status')})")
        self.save()

    def _carried(self, name: str, key: dict, overrides: dict, prev: dict | None) -> dict:
        """A variant's record: the previous one if it finished with this config and its run is still there, else
        pending. A previous 'running' one whose run folder a live process still holds is refused (stale child)."""
        run_dir = Path(prev["run_dir"]) if prev and prev.get("run_dir") else None
        if prev and prev.get("status") == "running" and run_dir is not None:
            if run_lock.is_held(run_dir / run_lock.LOCK_FILE):
                raise run_lock.Busy(
                    f"sweep {self.cfg.name}: variant {name!r} is still being trained in {run_dir} by "
                    f"{run_lock.describe(run_lock.read_holder(run_dir))}, left by an earlier run of this sweep "
                    f"that was killed. Fix: wait for it, or stop it (touch {run_dir}/STOP), then rerun.")
        if prev and prev.get("status") == STOPPED and prev.get("config") == key:
            if run_dir is not None and checkpoint_exists(run_dir):
                self.log(f"sweep {self.cfg.name}: {name} stopped at its time budget: resuming it in {run_dir}")
                return {**prev, "status": "pending", "resume": True, "overrides": overrides, "listed": True,
                        "skipped": False}
            self.log(f"sweep {self.cfg.name}: {name} stopped earlier but its checkpoint in {run_dir} is gone: "
                     "training it again")
        if prev and prev.get("status") == "finished" and prev.get("config") == key:
            if run_dir is not None and (run_dir / "summary.json").is_file():
                return {**prev, "overrides": overrides, "listed": True, "skipped": True}
            self.log(f"sweep {self.cfg.name}: {name} finished earlier but its run folder {run_dir} is gone: "
                     "training it again")
        return {"name": name, "status": "pending", "config": key, "overrides": overrides, "listed": True,
                "run_dir": None, "device": None, "error": None, "wall_s": None, "skipped": False}

    def save(self) -> None:
        self.state["updated"] = time.time()
        write_json(self.dir / SWEEP_FILE, self.state)

    def variant(self, name: str) -> dict:
        return next(v for v in self.state["variants"] if v["name"] == name)

    def _start(self, v: dict, device: str) -> subprocess.Popen:
        tc = self.configs[v["name"]]
        if v.pop("resume", False):  # its run spent a time budget: continue it in the same folder, exactly
            run_dir = Path(v["run_dir"])
            tc = tc.replace(resume_from=str(run_dir))
        else:
            run_dir = new_run_dir(tc.runs_dir, tc.run_name)
        tc.to_json(run_dir / "config.json")
        v.update(status="running", run_dir=str(run_dir), device=device, error=None, started=time.time(),
                 skipped=False)
        self.log(f"sweep {self.cfg.name}: {v['name']} on {device} -> {run_dir}")
        logf = open(run_dir / LOG_FILE, "ab")
        try:
            proc = subprocess.Popen([sys.executable, "-m", "dflash_lab.workflows.sweep", "--run", str(run_dir)],
                                    stdout=logf, stderr=subprocess.STDOUT,
                                    env=child_env(device))  # it dies with the sweep (children.py)
        finally:
            logf.close()  # the child holds its own copy of the file descriptor
        v["pid"] = proc.pid
        return proc

    def _end(self, v: dict, rc: int) -> None:
        run_dir = Path(v["run_dir"])
        v["wall_s"] = round(time.time() - v.pop("started"), 2)
        summary = run_dir / "summary.json"
        try:
            status = json.loads(summary.read_text()).get("status") if rc == 0 else None
        except (OSError, ValueError, AttributeError):
            status = None
        ok = status in ("finished", STOPPED)
        v["status"] = status if ok else "failed"
        if not ok:
            v["error"] = _last_error(run_dir, rc) if rc != 0 else f"run ended without finishing (exit {rc})"
        self.log(f"sweep {self.cfg.name}: {v['name']} {v['status']} in {v['wall_s']:.1f} s"
                 + (f": {v['error']}" if v["error"] else ""))

    def run(self, *, callbacks=(), poll_s: float = 0.5) -> list[dict]:
        """Run every pending variant (one per device at a time); returns the ranked results (sweep_results)."""
        with run_lock.holding(sweep_lock(self.cfg), what=f"sweep {self.cfg.name!r}", log=self.log,
                              fix="wait for the other run of this sweep, or give this one another name."):
            return self._run(callbacks, poll_s)

    def _run(self, callbacks, poll_s: float) -> list[dict]:
        pending = [v for v in self.state["variants"] if v["status"] != "finished" and v.get("listed", True)]
        for v in self.state["variants"]:
            if v["status"] == "finished":
                self.log(f"sweep {self.cfg.name}: {v['name']} already finished ({v['run_dir']}): skipped")
        # Slots, not devices: a device listed twice runs two variants on it at once (small targets leave a GPU idle).
        free, running = list(range(len(self.cfg.devices))), {}  # slot -> (variant, process)
        old_term = None
        if threading.current_thread() is threading.main_thread():  # SIGTERM (a kernel restart): stop the children
            old_term = signal.signal(signal.SIGTERM, _terminated)
        try:
            while pending or running:
                while pending and free:
                    v, slot = pending.pop(0), free.pop(0)
                    running[slot] = (v, self._start(v, self.cfg.devices[slot]))
                    self.save()
                for slot, (v, proc) in list(running.items()):
                    rc = proc.poll()
                    if rc is not None:
                        self._end(v, rc)
                        del running[slot]
                        free.append(slot)
                        self.save()
                for cb in callbacks:
                    cb(self)
                time.sleep(poll_s)
        finally:
            for slot, (v, proc) in running.items():  # an interrupt: stop our children, record them as stopped
                proc.terminate()
                proc.wait()
                v.update(status="failed", error="sweep interrupted", wall_s=None)
                v.pop("started", None)
            self.save()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        for cb in callbacks:
            cb(self)
        return write_results(self.dir)


def _terminated(signum, frame):
    raise SystemExit(f"sweep terminated by {signal.Signals(signum).name}")


def run_sweep(cfg: SweepConfig, *, resume: bool = True, callbacks=(), log=print) -> Sweep:
    """Build and run a sweep; returns the Sweep (its `.dir` holds sweep.json and results.csv/json)."""
    sweep = Sweep(cfg, resume=resume, log=log)
    sweep.results = sweep.run(callbacks=callbacks)
    return sweep


def run_variant(run_dir: Path) -> int:
    """One variant's process: a Trainer on `run_dir/config.json`, trained to its steps (or its time budget) and
    finished."""
    die_with_parent()
    from dflash_lab.train.trainer import Trainer  # heavy (torch, transformers): only the child process needs it

    trainer = None
    try:
        trainer = Trainer(TrainConfig.from_json(run_dir / "config.json"), run_dir=run_dir)
        trainer.train(progress_every_s=10.0)
        summary = trainer.finish()
        return 0 if summary.get("status") in ("finished", STOPPED) else 1
    except BaseException as e:
        write_json(run_dir / "error.json", {"error": f"{type(e).__name__}: {e}",
                                            "step": trainer.step_count if trainer else None})
        raise
    finally:
        if trainer is not None:
            trainer.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.workflows.sweep", description="run one sweep variant")
    p.add_argument("--run", required=True, help="the variant's run directory (holding config.json)")
    args = p.parse_args(argv)
    return run_variant(Path(args.run))


if __name__ == "__main__":
    sys.exit(main())
