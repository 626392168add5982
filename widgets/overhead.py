"""Overhead benchmark: training steps/s with the GPU monitor + dashboard refreshes running vs not, interleaved.

    python -m widgets.overhead                                   # CPU, embedded tiny target
    python -m widgets.overhead --devices cuda:0 --repeats 9      # one GPU (ipywidgets not needed)

"on" = a GpuMonitor sampling at --monitor-hz and writing system.jsonl, plus a refresh thread at --refresh-hz doing
what the live dashboard does each tick: poll the trainer's ring buffer and the monitor, rebuild the DashboardState,
render the HTML fragments, and (with --widgets on, the default where ipywidgets + plotly + anywidget import) push
them into real widgets and one batched plotly FigureWidget update (no browser attached: the comm messages are built
and dropped). Blocks of --steps-per-block steps alternate off/on (order flipped every repeat) after a warm-up;
the result is the median steps/s of each mode and their difference, the median of the per-repeat on/off ratios
(robust to a shared machine's drift), process CPU seconds per step in each mode, and the measured cost of one
monitor sample and one refresh (cost x rate = the CPU share the dashboard takes, independent of machine noise).
One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def _widgets_available() -> bool:
    try:
        import anywidget  # noqa: F401 - plotly's FigureWidget needs it
        import ipywidgets  # noqa: F401
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True


class _Refresher:
    """A thread doing one dashboard refresh per period (model only, or the real widgets)."""

    def __init__(self, trainer, monitor, hz: float, use_widgets: bool):
        from .controls import TrainingControls
        from .html import balance_html, gpus_html, header_html
        from .model import DashboardModel
        from .sources import TrainerSource

        self.period = 1.0 / hz
        model = DashboardModel(600, total_steps=trainer.config.steps)
        source = TrainerSource(trainer, monitor, TrainingControls(trainer))
        if use_widgets:
            from .dashboard import LiveDashboard

            dash = LiveDashboard(source, model, refresh_hz=min(hz, 2.0))
            self._tick = dash.refresh
        else:
            def tick():
                s = model.state(**source.poll(model))
                header_html(s), gpus_html(s), balance_html(s)

            self._tick = tick
        self.costs: list[float] = []
        self._stop = threading.Event()
        self._thread = None

    def _loop(self):
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self._tick()
            dt = time.perf_counter() - t0
            self.costs.append(dt)
            self._stop.wait(max(0.0, self.period - dt))

    def start(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="overhead-refresh")
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()


def run(args) -> dict:
    from dflash_lab import TrainConfig, Trainer
    from dflash_lab.runs.gpu_monitor import GpuMonitor

    use_widgets = {"on": True, "off": False, "auto": _widgets_available()}[args.widgets]
    if use_widgets and not _widgets_available():
        raise SystemExit("--widgets on needs ipywidgets, plotly and anywidget; use --widgets off (model only).")
    tmp = Path(tempfile.mkdtemp(prefix="dflash-overhead-"))
    cfg = TrainConfig(target=args.target, devices=tuple(args.devices), steps=10**6, seq_len=args.seq_len,
                      num_anchors=args.num_anchors, batch_size=args.batch_size, log_every=10, runs_dir=str(tmp),
                      run_name="overhead")
    trainer = Trainer(cfg, log=lambda *_: None)
    if getattr(trainer, "monitor", None) is not None:  # GPU runs start their own sampler: "off" means none at all
        trainer.monitor.stop()
    print(f"warm-up: {args.warmup} steps on {','.join(args.devices)}", file=sys.stderr)
    trainer.step(args.warmup)
    rates = {"off": [], "on": []}
    cpu = {"off": [], "on": []}  # process CPU seconds per step (all threads: training + monitor + refresh)
    monitor_costs, refresh_costs = [], []
    monitor_status = None
    for r in range(args.repeats):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            monitor = refresher = None
            if mode == "on":
                monitor = GpuMonitor(interval_s=1.0 / args.monitor_hz, jsonl_path=trainer.run_dir / "system.jsonl")
                monitor.start()
                refresher = _Refresher(trainer, monitor, args.refresh_hz, use_widgets)
                refresher.start()
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.step(args.steps_per_block)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if mode == "on":
                refresher.stop()
                monitor.stop()
                monitor_costs += monitor.sample_seconds
                monitor_status = monitor.status
                refresh_costs += refresher.costs
            rates[mode].append(args.steps_per_block / dt)
            cpu[mode].append(dc / args.steps_per_block)
            print(f"repeat {r + 1}/{args.repeats} {mode:>3}: {rates[mode][-1]:.3f} steps/s", file=sys.stderr)
    trainer.close()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    # Each repeat's on/off pair ran back to back: their ratio cancels slow drifts of a shared machine.
    paired = statistics.median(1 - b / a for a, b in zip(rates["off"], rates["on"]))
    mon_ms = 1e3 * statistics.median(monitor_costs) if monitor_costs else None
    ref_ms = 1e3 * statistics.median(refresh_costs) if refresh_costs else None
    share = ((mon_ms or 0) * args.monitor_hz + (ref_ms or 0) * args.refresh_hz) / 1e3
    import torch

    from dflash_lab.runs.rundir import environment_info

    env = environment_info()
    dev = args.devices[0]
    name = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else f"cpu x{os.cpu_count()}"
    return {
        "bench": "dashboard_overhead", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": env.get("git_commit"), "torch": env.get("torch"), "device_name": name,
        "devices": list(args.devices), "target": args.target,
        "seq_len": args.seq_len, "num_anchors": args.num_anchors, "batch_size": args.batch_size,
        "widgets": use_widgets, "monitor_hz": args.monitor_hz, "refresh_hz": args.refresh_hz,
        "repeats": args.repeats, "steps_per_block": args.steps_per_block,
        "steps_per_s_off_median": round(off, 4), "steps_per_s_on_median": round(on, 4),
        "slowdown_pct": round(100 * (off - on) / off, 3),
        "paired_slowdown_pct_median": round(100 * paired, 3),
        "cpu_s_per_step_off_median": round(statistics.median(cpu["off"]), 5),
        "cpu_s_per_step_on_median": round(statistics.median(cpu["on"]), 5),
        "off_runs": [round(x, 4) for x in rates["off"]], "on_runs": [round(x, 4) for x in rates["on"]],
        "monitor_sample_ms_median": None if mon_ms is None else round(mon_ms, 4),
        "refresh_ms_median": None if ref_ms is None else round(ref_ms, 4),
        "dashboard_cpu_share_pct": round(100 * share, 4),
        "monitor_status": monitor_status,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", nargs="+", default=["cpu"], help="drafter devices, e.g. cuda:0 (default cpu)")
    p.add_argument("--target", default="tiny", help='target: "tiny", a local directory or a hub id (default tiny)')
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--num-anchors", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--warmup", type=int, default=10, help="steps before measuring (default 10)")
    p.add_argument("--steps-per-block", type=int, default=20, help="steps per measured block (default 20)")
    p.add_argument("--repeats", type=int, default=7, help="off/on pairs, order alternating (default 7)")
    p.add_argument("--monitor-hz", type=float, default=2.0)
    p.add_argument("--refresh-hz", type=float, default=2.0)
    p.add_argument("--widgets", choices=("auto", "on", "off"), default="auto",
                   help="refresh real widgets (needs ipywidgets+plotly+anywidget) or only the model (default auto)")
    p.add_argument("--out", help="also append the JSON line to this file")
    args = p.parse_args(argv)
    res = run(args)
    line = json.dumps(res)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    print(f"steps/s off {res['steps_per_s_off_median']:.3f}, on {res['steps_per_s_on_median']:.3f}: "
          f"slowdown {res['slowdown_pct']:+.2f}% (median of paired repeats {res['paired_slowdown_pct_median']:+.2f}%); "
          f"CPU s/step off {res['cpu_s_per_step_off_median']:.4f}, on {res['cpu_s_per_step_on_median']:.4f}; "
          f"dashboard CPU share {res['dashboard_cpu_share_pct']:.3f}%", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
