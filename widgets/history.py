"""What the dashboard remembers besides the curves: memory and utilisation of each device over time, and the events a
run went through (pause, stop, LR change, checkpoint, evaluation) as markers at their steps. No ipywidgets here.

A row of numbers says how a device is now; a strip of its last minutes says whether memory creeps up or the GPU sits
idle between steps, which nvitop and W&B show and a snapshot cannot. Markers put the run's own history on the curves:
a loss jump right after an LR change or a resume reads differently from one out of nowhere.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

# event -> marker kind (events.jsonl); evaluation markers come from metric records that carry held-out figures
# Pause and stop are drawn where the loop paused or stopped (`paused`, `stopped`: the step after the one running when
# the button was clicked, once it is booked), not at the click (`control` pause, `stop_requested`), which named the
# step before.
EVENT_KINDS = {"stopped": "stop", "interrupted": "stop", "checkpoint": "checkpoint", "lr_override": "lr",
               "resumed": "resume", "diverged": "failed", "paused": "pause"}
CONTROL_KINDS = {"resume": "resume"}  # clicks whose effect leaves no other event
EVAL_KEYS = ("real_tau", "eval_tau", "val_sim_tau")
KIND_STYLE = {  # colour, plotly dash, label
    "pause": ("#9a6700", "dot", "pause"), "resume": ("#1a7f37", "dot", "resume"), "stop": ("#cf222e", "solid", "stop"),
    "lr": ("#8250df", "dash", "LR change"), "checkpoint": ("#57606a", "dot", "checkpoint"),
    "eval": ("#0969da", "dashdot", "evaluation"), "failed": ("#cf222e", "solid", "diverged")}
MAX_MARKERS = 40  # newest markers drawn (each is a line on every panel)


@dataclass
class DeviceHistory:
    """One device's samples over time: memory in use as a share of capacity, and kernel-busy (or CPU) percent."""

    label: str
    t: list[float] = field(default_factory=list)  # seconds since the first sample of the dashboard
    mem_frac: list[float] = field(default_factory=list)
    util_pct: list[float | None] = field(default_factory=list)
    max_points: int = 240

    def append(self, t: float, mem_frac: float | None, util_pct: float | None) -> None:
        self.t.append(t)
        self.mem_frac.append(min(1.0, max(0.0, mem_frac or 0.0)))
        self.util_pct.append(util_pct)
        if len(self.t) > self.max_points:  # the older half thinned by 2: the whole run stays, recent at full rate
            half = len(self.t) // 2
            self.t, self.mem_frac, self.util_pct = (x[:half:2] + x[half:] for x in (self.t, self.mem_frac,
                                                                                 self.util_pct))


class SystemHistory:
    """Per-device histories fed with GpuMonitor samples (a sample seen twice, or older than one seen, is skipped)."""

    def __init__(self, max_points: int = 240):
        self.max_points = max_points
        self.devices: dict[str, DeviceHistory] = {}
        self._t0: float | None = None
        self._last_time: float | None = None

    def add(self, sample: dict | None) -> None:
        if not sample or sample.get("time") is None or (self._last_time is not None and
                                                         sample["time"] <= self._last_time):
            return  # seen already: a monitor ring is read whole at every refresh
        self._last_time = t = float(sample["time"])
        self._t0 = t if self._t0 is None else self._t0
        rows = []
        for g in sample.get("gpus") or []:
            if g.get("error") or not g.get("mem_total_gb"):
                continue
            rows.append((g.get("label", "?"), (g.get("mem_used_gb") or 0) / g["mem_total_gb"], g.get("kernel_busy_pct")))
        if not rows:  # a machine without GPUs: the host is the device
            h = sample.get("host") or {}
            if h.get("ram_total_gb"):
                rows.append(("host", (h.get("ram_used_gb") or 0) / h["ram_total_gb"], h.get("cpu_pct")))
        for label, mem, util in rows:
            dev = self.devices.setdefault(label, DeviceHistory(label, max_points=self.max_points))
            dev.append(t - self._t0, mem, util)


@dataclass(frozen=True)
class Marker:
    step: int
    kind: str  # a key of KIND_STYLE
    text: str


def markers_from_events(events: list[dict]) -> list[Marker]:
    out = []
    # a run written before the loop booked `paused` has only the click (`control` pause): draw that instead
    clicked_pause = not any(e.get("event") == "paused" for e in events)
    for e in events:
        ev, step = e.get("event"), e.get("step")
        if not isinstance(step, (int, float)):
            continue
        kind = EVENT_KINDS.get(ev) or (CONTROL_KINDS.get(e.get("action")) if ev == "control" else None)
        if kind is None and clicked_pause and ev == "control" and e.get("action") == "pause":
            kind = "pause"
        if kind is None:
            continue
        detail = {"lr": f"lr {e.get('lr'):.3g}" if isinstance(e.get("lr"), (int, float)) else "",
                  "checkpoint": str(e.get("reason") or ""), "stop": str(e.get("reason") or e.get("source") or ev)
                                                                               .replace("controls.", "")}.get(kind, "")
        out.append(Marker(int(step), kind, f"{KIND_STYLE[kind][2]} at step {int(step)}" + (f" ({detail})" if detail
                                                                                         else "")))
    return out


def marker_from_record(r: dict) -> Marker | None:
    """An evaluation marker for a metric record that carries held-out figures (validation / real tau)."""
    found = [k for k in EVAL_KEYS if isinstance(r.get(k), (int, float))]
    if not found:
        return None
    what = ", ".join(f"{k} {r[k]:.2f}" for k in found)
    return Marker(int(r["step"]), "eval", f"evaluation at step {int(r['step'])} ({what})")


def strip_svg(h: DeviceHistory, *, width: int = 200, height: int = 28) -> str:
    """A sparkline of memory (filled) and utilisation (line) over time; `data-*` carry the numbers for tests."""
    if len(h.t) < 2:
        return (f'<span class="dfl-strip" data-device="{html.escape(h.label)}" data-points="{len(h.t)}" '
                'style="color:#57606a;font-size:11px">collecting history ...</span>')
    t0, t1 = h.t[0], h.t[-1]
    span = max(t1 - t0, 1e-9)
    x = [(t - t0) / span * width for t in h.t]
    mem = " ".join(f"{xi:.1f},{height - m * height:.1f}" for xi, m in zip(x, h.mem_frac))
    util = " ".join(f"{xi:.1f},{height - (u or 0) / 100 * height:.1f}" for xi, u in zip(x, h.util_pct))
    title = (f"{h.label}: memory {100 * h.mem_frac[-1]:.0f}% of capacity (filled), busy {h.util_pct[-1] or 0:.0f}% "
             f"(line), over the last {span:.0f} s")
    return (f'<svg class="dfl-strip" data-device="{html.escape(h.label)}" data-points="{len(h.t)}" '
            f'data-span-s="{span:.1f}" viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
            f'style="width:100%;height:{height}px;display:block;background:#f6f8fa;border-radius:3px">'
            f'<title>{html.escape(title)}</title>'
            f'<polygon points="0,{height} {mem} {width},{height}" fill="#1a7f37" fill-opacity="0.35"/>'
            f'<polyline points="{util}" fill="none" stroke="#0969da" stroke-width="1.2"/></svg>')


def markers_html(markers: list[Marker]) -> str:
    """The key under the curves: each kind with its colour and the steps it happened at (newest last)."""
    if not markers:
        return ""
    by_kind: dict[str, list[int]] = {}
    for m in markers:
        by_kind.setdefault(m.kind, []).append(m.step)
    items = []
    for kind, steps in by_kind.items():
        colour, _, label = KIND_STYLE[kind]
        shown = ", ".join(str(s) for s in steps[-6:]) + (" ..." if len(steps) > 6 else "")
        items.append(f'<span class="dfl-marker" data-kind="{kind}" data-count="{len(steps)}" style="margin-right:14px">'
                     f'<span style="color:{colour}">&#9474;</span> {html.escape(label)} {html.escape(shown)}</span>')
    return (f'<div class="dfl-markers" style="font-family:sans-serif;font-size:12px;color:#57606a;'
            f'white-space:normal">markers on the curves: {"".join(items)}</div>')
