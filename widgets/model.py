"""Dashboard model: turns metric records and monitor samples into the numbers a dashboard shows (no ipywidgets).

The live dashboard, the static (papermill) view and the attach view all render a `DashboardState` built here, so
what they show is computed once and tested on CPU. Records arrive incrementally (`add_metrics`, `add_system`);
history is bounded: each curve keeps at most `max_points` points, the older half thinned by 2 whenever it fills
(recent steps at full resolution, the whole run still visible), so a refresh costs the same at step 100 and 100k.
"""

from __future__ import annotations

import math
import statistics
import threading
from dataclasses import dataclass, field

from dflash_lab.drafter.variants import VARIANTS

from .history import MAX_MARKERS, DeviceHistory, Marker, SystemHistory, marker_from_record, markers_from_events

# A side that waits more than this share of a step is worth a GPU move.
IDLE_THRESHOLD = 0.15
# Phases after which nothing changes: ETA hidden, system readings (CPU, GPU) frozen at their last value.
ENDED_PHASES = ("finished", "stopped", "failed")


class BoundedSeries:
    """(x, y) points, at most `max_points`; when full, every other point of the older half is dropped."""

    def __init__(self, max_points: int = 600):
        if max_points < 8:
            raise ValueError(f"BoundedSeries(max_points={max_points}): use at least 8 points.")
        self.max_points = max_points
        self.x: list[float] = []
        self.y: list[float] = []

    def append(self, x: float, y: float) -> None:
        self.x.append(x)
        self.y.append(y)
        if len(self.x) > self.max_points:
            half = len(self.x) // 2
            self.x = self.x[:half:2] + self.x[half:]
            self.y = self.y[:half:2] + self.y[half:]

    def __len__(self) -> int:
        return len(self.x)


@dataclass
class GpuBar:
    """One GPU row: memory bar (NVML view) + this process's allocator + liveness numbers."""

    label: str
    name: str = ""
    used_gb: float | None = None
    total_gb: float | None = None
    mem_view: str = ""
    torch_reserved_gb: float | None = None
    torch_allocated_gb: float | None = None
    kernel_busy_pct: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    error: str | None = None

    @property
    def used_frac(self) -> float:
        if not self.used_gb or not self.total_gb:
            return 0.0
        return min(1.0, self.used_gb / self.total_gb)


@dataclass
class Balance:
    """Supply (target side) vs demand (drafter side) for split placements, with a plain recommendation."""

    drafter_wait_frac: float | None
    target_wait_frac: float | None
    recommendation: str
    idle_side: str | None  # "drafters" | "targets" | "both" | None


@dataclass
class DashboardState:
    phase: str = "starting"
    phase_detail: str = ""
    error: str | None = None
    replicas: list[dict] = field(default_factory=list)  # {"label", "fraction", "text"} per target replica load
    step: int = 0
    total_steps: int | None = None
    eta_s: float | None = None
    eta_estimated: bool = False  # True while warming up (ETA from recent step times, not the steady median)
    tokens_per_s: float | None = None
    steady_tokens_per_s: float | None = None
    throughput_state: str = "warming_up"
    steady_from_step: int | None = None
    loss: float | None = None
    loss_ema: float | None = None
    lr: float | None = None
    sim_tau: float | None = None
    acc: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    series: dict = field(default_factory=dict)  # name -> (x list, y list)
    series_version: int = 0  # bumps when a curve got new points (views skip re-sending unchanged curves)
    gpus: list[GpuBar] = field(default_factory=list)
    gpu_status: str = ""
    host: dict = field(default_factory=dict)
    balance: Balance | None = None
    store: dict = field(default_factory=dict)  # the feature store's feature_store_* figures of the newest record
    updated: float | None = None  # time of the newest metric record
    val_sim_tau: float | None = None  # held-out validation (logged every few hundred steps; None until then)
    real_tau: float | None = None  # real speculative decoding on held-out prompts
    real_tau_ci: tuple[float, float] | None = None  # its 95% bootstrap interval over those prompts
    warning: str | None = None  # e.g. a `tau_gap` event: simulated and real tau part ways
    device_history: list[DeviceHistory] = field(default_factory=list)  # memory / utilisation over time per device
    markers: list[Marker] = field(default_factory=list)  # pause, stop, LR change, checkpoint, evaluation (by step)
    markers_version: int = 0
    heads: dict = field(default_factory=dict)  # a drafter variant's own loss terms of the newest record (HEAD_TERMS)

    @property
    def ended(self) -> bool:
        return self.phase in ENDED_PHASES

    @property
    def warming_up(self) -> bool:
        """Throughput still warming up, said only of a run that is training (a stopped run warms nothing up)."""
        return self.phase == "training" and self.throughput_state != "steady"

    @property
    def eta_text(self) -> str:
        """The ETA only while training: idle, paused, stopped or finished runs have none."""
        return format_eta(self.eta_s, self.eta_estimated) if self.phase == "training" else "-"

    @property
    def phase_text(self) -> str:
        return f"{self.phase}: {self.phase_detail}" if self.phase_detail else self.phase

    def summary_line(self) -> str:
        """One line: `step 120/200 | 12.3k tok/s (steady) | loss 2.3100 | sim tau 3.10 | ETA 0h01m05s | training`."""
        total = f"/{self.total_steps}" if self.total_steps else ""
        tps = self.steady_tokens_per_s if self.steady_tokens_per_s else self.tokens_per_s
        tps_txt = "-" if tps is None else f"{format_rate(tps)} tok/s"
        tps_txt += " (warming up)" if self.warming_up else ""
        parts = [f"step {self.step}{total}", tps_txt, f"loss {_fmt(self.loss, '.4f')}",
                 f"sim tau {_fmt(self.sim_tau, '.2f')}"]
        if self.real_tau is not None:
            ci = f" [{self.real_tau_ci[0]:.2f}, {self.real_tau_ci[1]:.2f}]" if self.real_tau_ci else ""
            parts.append(f"real tau {_fmt(self.real_tau, '.2f')}{ci}")
        if self.phase == "training":
            parts.append(f"ETA {self.eta_text}")
        parts.append(self.phase_text)
        return " | ".join(parts)


def _fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def format_eta(seconds: float | None, estimated: bool = False) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    txt = f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"
    return f"~{txt}" if estimated else txt


def balance_from(records: list[dict], *, n_target_gpus: int | None = None,
                 n_drafter_gpus: int | None = None) -> Balance | None:
    """Mean wait fractions over `records` (keys `drafter_wait_frac`, `target_wait_frac`); None if no record has them.

    drafter_wait_frac: share of the step the drafter workers wait for features (targets too slow).
    target_wait_frac: share of the step the target workers wait for the drafters to take features (drafters too slow).
    """
    def mean(key):
        vals = [float(r[key]) for r in records if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
        return sum(vals) / len(vals) if vals else None

    dw, tw = mean("drafter_wait_frac"), mean("target_wait_frac")
    if dw is None and tw is None:
        return None
    d, t = dw or 0.0, tw or 0.0
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    if d > IDLE_THRESHOLD and t > IDLE_THRESHOLD:
        return Balance(dw, tw, f"both sides wait (drafters {pct(d)}, targets {pct(t)}): the step is bound by the "
                               "feature hand-off or the host, not by either side's GPUs", "both")
    if d > IDLE_THRESHOLD and d >= t:
        if n_drafter_gpus is not None and n_drafter_gpus <= 1:
            fix = "add a target GPU (there is only one drafter GPU to move)"
        else:
            fix = "move one GPU from drafters to targets"
        return Balance(dw, tw, f"drafter GPUs wait {pct(d)} of the time for features: {fix}", "drafters")
    if t > IDLE_THRESHOLD:
        if n_target_gpus is not None and n_target_gpus <= 1:
            fix = "add a drafter GPU (there is only one target GPU to move)"
        else:
            fix = "move one GPU from targets to drafters"
        return Balance(dw, tw, f"target GPUs wait {pct(t)} of the time for the drafters: {fix}", "targets")
    return Balance(dw, tw, f"balanced: drafters wait {pct(d)}, targets wait {pct(t)} of the time", None)


def replica_rows(progress) -> list[dict]:
    """Normalise per-replica load progress into {"label", "fraction", "text"} rows.

    Accepts a list or a {key: report} dict of dicts or objects such as targets.LoadProgress (replica, device,
    tensors_done, tensors_total, gb_done, gb_total, seconds, done, memory_gb); unknown fields are ignored.
    """
    if not progress:
        return []
    items = list(progress.items()) if isinstance(progress, dict) else list(enumerate(progress))
    rows = []
    for key, info in items:
        if not isinstance(info, dict):
            info = {k: getattr(info, k) for k in dir(info) if not k.startswith("_") and not callable(getattr(info, k))}
        dev = info.get("label") or info.get("device")
        rep = info.get("replica")
        label = f"replica {rep} ({dev})" if rep is not None and dev else str(dev or f"replica {key}")
        n_done, n_total = _num_of(info, "tensors_done", "tensors_loaded", "loaded"), _num_of(info, "tensors_total",
                                                                                           "total", "num_tensors")
        gb_done, gb_total = _num_of(info, "gb_done", "gb", "loaded_gb"), _num_of(info, "gb_total")
        finished = info.get("done") is True
        frac = _num_of(info, "fraction")
        if frac is None and gb_done is not None and gb_total:
            frac = gb_done / gb_total
        if frac is None and n_done is not None and n_total:
            frac = n_done / n_total
        frac = 1.0 if finished else max(0.0, min(1.0, frac or 0.0))
        bits = []
        if n_done is not None and n_total is not None:
            bits.append(f"{int(n_done)}/{int(n_total)} tensors")
        if gb_done is not None:
            bits.append(f"{gb_done:.1f}/{gb_total:.1f} GB" if gb_total is not None else f"{gb_done:.1f} GB")
        secs = _num_of(info, "seconds", "elapsed_s")
        if secs is not None:
            bits.append(f"{secs:.1f} s")
        if finished:
            mem = _num_of(info, "memory_gb")
            bits.append("loaded" + (f", {mem:.1f} GB on device" if mem is not None else ""))
        rows.append({"label": label, "fraction": frac, "text": ", ".join(bits) or f"{100 * frac:.0f}%"})
    return rows


def _num_of(d: dict, *keys) -> float | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def gpu_bars(sample: dict | None) -> tuple[list[GpuBar], dict, str]:
    """GPU rows, host numbers and a status string from one GpuMonitor sample."""
    if not sample:
        return [], {}, "no system sample yet"
    host = sample.get("host") or {}
    if sample.get("no_gpu") or not sample.get("gpus"):
        return [], host, "no NVIDIA GPU: host CPU and RAM only"
    bars = [GpuBar(label=g.get("label", "?"), name=g.get("name", ""), used_gb=g.get("mem_used_gb"),
                   total_gb=g.get("mem_total_gb"), mem_view=g.get("mem_view", ""),
                   torch_reserved_gb=g.get("torch_reserved_gb"), torch_allocated_gb=g.get("torch_allocated_gb"),
                   kernel_busy_pct=g.get("kernel_busy_pct"), power_w=g.get("power_w"), temp_c=g.get("temp_c"),
                   error=g.get("error")) for g in sample["gpus"]]
    return bars, host, f"{len(bars)} GPU(s)"


HEAD_TERMS = tuple(m for v in VARIANTS.values() for m in v.metrics)
"""The loss terms a drafter variant logs beside the loss (DSpark: markov_ce, ..., confidence_acc)."""


class DashboardModel:
    """Aggregates metric records + system samples into a `DashboardState`. Feed it incrementally; read `.state()`."""

    CURVES = ("loss", "loss_ema", "lr", "tokens_per_s", "sim_tau", "acc", "val_sim_tau", "real_tau", "val_acc")

    def __init__(self, max_points: int = 600, total_steps: int | None = None, ema_beta: float = 0.9,
                 balance_window: int = 20):
        self.max_points = max_points
        self.total_steps = total_steps
        self.ema_beta = ema_beta
        self.curves = {name: BoundedSeries(max_points) for name in self.CURVES}
        self.series_version = 0
        self.last: dict = {}
        self.last_step = 0
        self.last_system: dict | None = None
        self.loss_ema: float | None = None
        self.latest: dict[str, float] = {}  # newest value of the sparse keys (val_sim_tau, real_tau)
        self.warning: str | None = None  # set by a source (events.jsonl `tau_gap`) or a record's `tau_gap`
        self.steady_from_step: int | None = None
        self._recent: list[dict] = []  # last `balance_window` records (wait fractions, step times)
        self._balance_window = balance_window
        self.placement: tuple[int | None, int | None] = (None, None)  # (target GPUs, drafter GPUs)
        self.system_history = SystemHistory()
        self.markers: list[Marker] = []
        self.markers_version = 0
        self._lock = threading.RLock()  # a refresh thread and the notebook's thread may both read and feed it

    # -- input --------------------------------------------------------------------------------------------------
    def add_metrics(self, records) -> int:
        """Add metric records in step order; records at or below the last step seen are ignored. Returns #added."""
        with self._lock:
            return self._add_metrics(records)

    def _add_metrics(self, records) -> int:
        added = 0
        for r in records:
            step = r.get("step")
            if not isinstance(step, (int, float)) or step <= self.last_step or "loss" not in r:
                continue
            self._add_one(r)
            added += 1
        if added:
            self.series_version += 1
        return added

    def _add_one(self, r: dict) -> None:
        step = int(r["step"])
        gap = step - self.last_step  # steps since the previous record (log_every when read from metrics.jsonl)
        self.last_step = step
        self.last = r
        loss = r.get("loss")
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            # A per-STEP EMA: a record `gap` steps later decays the old value `gap` times (beta ** gap), so a
            # view reading every 10th step shows the same EMA as one reading every step.
            b = self.ema_beta ** gap
            self.loss_ema = loss if self.loss_ema is None else b * self.loss_ema + (1 - b) * loss
            self.curves["loss"].append(step, loss)
            self.curves["loss_ema"].append(step, self.loss_ema)
        for name in ("lr", "tokens_per_s", "sim_tau", "acc", "val_sim_tau", "real_tau", "val_acc"):
            v = r.get(name)
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.curves[name].append(step, v)
                if name in ("val_sim_tau", "real_tau"):
                    self.latest[name] = v
                if name == "real_tau":  # its interval (None when logged without one)
                    lo, hi = r.get("real_tau_low"), r.get("real_tau_high")
                    self.latest["real_tau_ci"] = (lo, hi) if lo is not None and hi is not None else None
        if r.get("tau_gap"):
            self.warning = tau_gap_text(r["tau_gap"], step)
        mark = marker_from_record(r)
        if mark is not None:
            self._add_markers([mark])
        if self.steady_from_step is None and r.get("throughput_state") == "steady":
            self.steady_from_step = step
        self._recent.append(r)
        if len(self._recent) > self._balance_window:
            del self._recent[0]

    def add_system(self, sample: dict | None) -> None:
        if sample:
            with self._lock:
                self.last_system = sample
                self.system_history.add(sample)

    def add_events(self, events: list[dict]) -> None:
        """events.jsonl lines (any order of arrival): pause / stop / LR change / checkpoint ... become markers."""
        with self._lock:
            self._add_markers(markers_from_events(events))

    def _add_markers(self, new: list[Marker]) -> None:
        if new:
            self.markers = sorted(set(self.markers) | set(new), key=lambda m: (m.step, m.kind))[-MAX_MARKERS:]
            self.markers_version += 1

    def pull(self, metrics_ring=None, system_ring=None) -> int:
        """Read what is new in a metrics RingBuffer (by step) and the newest monitor sample."""
        added = 0
        if metrics_ring is not None:
            with self._lock:
                added = self._add_metrics(new_by_step(metrics_ring.snapshot(), self.last_step))
        if system_ring is not None:
            self.add_system(system_ring.last())
        return added

    # -- output -------------------------------------------------------------------------------------------------
    def state(self, *, phase: str = "training", phase_detail: str = "", error: str | None = None,
              replicas=None, step: int | None = None, total_steps: int | None = None) -> DashboardState:
        with self._lock:
            return self._state(phase, phase_detail, error, replicas, step, total_steps)

    def _state(self, phase, phase_detail, error, replicas, step, total_steps) -> DashboardState:
        r = self.last
        total = total_steps or self.total_steps
        step = self.last_step if step is None else max(step, self.last_step)
        steady_tps = r.get("steady_tokens_per_s")
        steady_st = r.get("steady_step_time_s")
        eta, estimated = None, False
        if phase != "training":
            pass  # no ETA when idle, paused, stopped or finished
        elif total and step < total:
            if steady_st:
                eta = steady_st * (total - step)
            else:
                times = [x["step_time_s"] for x in self._recent if isinstance(x.get("step_time_s"), (int, float))]
                if times:
                    eta, estimated = statistics.median(times) * (total - step), True
        bars, host, gpu_status = gpu_bars(self.last_system)
        if self.last_system and self.last_system.get("gpus") == [] and not self.last_system.get("no_gpu"):
            gpu_status = "no GPU rows in the sample"
        return DashboardState(
            phase=phase, phase_detail=phase_detail, error=error, replicas=replica_rows(replicas),
            step=step, total_steps=total, eta_s=eta, eta_estimated=estimated,
            tokens_per_s=r.get("tokens_per_s"), steady_tokens_per_s=steady_tps,
            throughput_state=r.get("throughput_state", "warming_up"), steady_from_step=self.steady_from_step,
            loss=r.get("loss"), loss_ema=self.loss_ema, lr=r.get("lr"), sim_tau=r.get("sim_tau"), acc=r.get("acc"),
            grad_norm=r.get("grad_norm"), step_time_s=r.get("step_time_s"),
            series={k: (list(s.x), list(s.y)) for k, s in self.curves.items()}, series_version=self.series_version,
            gpus=bars, gpu_status=gpu_status, host=host,
            balance=balance_from(self._recent, n_target_gpus=self.placement[0], n_drafter_gpus=self.placement[1]),
            store={k: v for k, v in r.items() if k.startswith("feature_store_")}, updated=r.get("time"), val_sim_tau=self.latest.get("val_sim_tau"),
            real_tau=self.latest.get("real_tau"), real_tau_ci=self.latest.get("real_tau_ci"), warning=self.warning,
            device_history=[DeviceHistory(d.label, list(d.t), list(d.mem_frac), list(d.util_pct))
                            for d in self.system_history.devices.values()],
            markers=list(self.markers), markers_version=self.markers_version,
            heads={k: r[k] for k in HEAD_TERMS if isinstance(r.get(k), (int, float))},
        )


def tau_gap_text(gap, step: int | None = None) -> str:
    """The header's warning line for a `tau_gap` event or record value (a message string or a dict of fields)."""
    if isinstance(gap, str):
        return gap
    if not isinstance(gap, dict):
        return f"tau gap at step {step}: simulated and real tau part ways"
    if gap.get("message"):
        return str(gap["message"])
    at = gap.get("step", step)
    nums = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in gap.items()
                     if k not in ("step", "time", "utc", "event"))
    return f"tau gap at step {at}: simulated and real tau part ways ({nums})"


def new_by_step(items: list[dict], last_step: int) -> list[dict]:
    """The records of `items` (in step order) with step > last_step, scanning from the end (O(new))."""
    k = len(items)
    while k > 0:
        s = items[k - 1].get("step")
        if isinstance(s, (int, float)) and s <= last_step:
            break
        k -= 1
    return items[k:]
