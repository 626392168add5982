"""GPU time a run spent training, on every metrics row, and the GPU-minutes it took to reach a tau.

    clock = TrainClock(devices=2, previous=rows_of_earlier_jobs)   # started when the trainer is built
    record.update(clock.fields())     # {"train_wall_s": ..., "gpu_seconds": ...} on every row
    gpu_minutes_to(rows, 3.0)         # the GPU-minutes of the first row whose real tau reached 3.0 (None if none)

"How many GPU-hours does a drafter take?" is answered by `gpu_seconds`: the devices the run holds times the wall time
of its training jobs, loading, validation, real-tau checks and checkpoints included (the devices are held through
them), summed over every job of a resumed run. What happens before training (writing the data, regenerating answers)
is a phase of its own (the recipe's results.json times each phase apart). A CPU run counts its one CPU device, so its
figure reads as device-seconds. The clock is an argument: tests feed one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

from .rundir import METRICS_FILE
from .run_files import read_metrics

TAU_KEYS = ("real_tau", "eval_tau")  # real speculative decoding on held-out prompts, logged while training


class TrainClock:
    """Wall seconds and device-seconds of training so far, continuing the rows of earlier jobs of the same run."""

    def __init__(self, *, devices: int, previous: Iterable[dict] = (), clock: Callable[[], float] = time.monotonic,
                 started: float | None = None):
        self.devices, self.clock = max(1, int(devices)), clock
        self.started = clock() if started is None else started  # `clock` time this job's trainer was built
        self.continue_from(previous)

    def continue_from(self, previous: Iterable[dict]) -> None:
        """Count what the earlier jobs of a resumed run logged (their last `train_wall_s` and `gpu_seconds`) before
        this one. Their device-seconds are carried as logged: a run resumed on another number of devices prices only
        this job's wall time at this job's count."""
        rows = list(previous)
        self.before = _last_number(rows, "train_wall_s")
        self.gpu_before = _last_number(rows, "gpu_seconds", default=self.before * self.devices)

    def fields(self) -> dict:
        this_job = self.clock() - self.started
        return {"train_wall_s": round(self.before + this_job, 3),
                "gpu_seconds": round(self.gpu_before + this_job * self.devices, 3)}


def _last_number(rows: list[dict], key: str, default: float = 0.0) -> float:
    return next((float(r[key]) for r in reversed(rows) if isinstance(r.get(key), (int, float))), default)


def tau_points(rows: Iterable[dict]) -> list[dict]:
    """(step, tau, gpu_minutes) of every row that measured real tau while training and knows its GPU time."""
    out = []
    for r in rows:
        tau = next((r[k] for k in TAU_KEYS if isinstance(r.get(k), (int, float))), None)
        if tau is not None and isinstance(r.get("gpu_seconds"), (int, float)):
            out.append({"step": r["step"], "tau": float(tau), "gpu_minutes": r["gpu_seconds"] / 60})
    return out


def gpu_minutes_to(rows: Iterable[dict], tau: float) -> float | None:
    """GPU-minutes of the first measurement that reached `tau` (None if none did)."""
    return next((p["gpu_minutes"] for p in tau_points(rows) if p["tau"] >= tau), None)


def best_tau(rows: Iterable[dict]) -> dict | None:
    """The measurement with the highest real tau (the earliest of equals): {step, tau, gpu_minutes}, or None."""
    points = tau_points(rows)
    return max(points, key=lambda p: (p["tau"], -p["gpu_minutes"])) if points else None


def gpu_seconds_at(run_dir, step: int | None) -> float | None:
    """The GPU-seconds a run had spent when it logged `step` (the last row at or before it): what an evaluation of
    that step's weights cost to train. None without a row that knows it (a run from before GPU time was logged)."""
    path = Path(run_dir) / METRICS_FILE
    if step is None or not path.is_file():
        return None
    rows = [r for r in read_metrics(path) if r["step"] <= step and isinstance(r.get("gpu_seconds"), (int, float))]
    return rows[-1]["gpu_seconds"] if rows else None
