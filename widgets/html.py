"""HTML fragments of the dashboard (header, GPU bars, replica progress, balance) from a DashboardState; no widgets.

Every number sits in an element with a `dfl-*` class, so a browser test (and a curious user) can read it from the DOM.
"""

from __future__ import annotations

import html

from .history import strip_svg
from .model import DashboardState, format_rate

PHASE_COLOURS = {"training": "#1a7f37", "paused": "#9a6700", "stopped": "#57606a", "finished": "#0969da",
                 "failed": "#cf222e", "diverged": "#cf222e", "interrupted": "#9a6700", "ready": "#0969da"}


def _v(cls: str, text: str, title: str = "", value=None) -> str:
    """A value in a `dfl-<cls>` span; `value` (the unrounded number) goes into data-value for tests and tools."""
    t = f' title="{html.escape(title)}"' if title else ""
    d = f' data-value="{value!r}"' if isinstance(value, (int, float)) else ""
    return f'<span class="dfl-{cls}"{t}{d}>{html.escape(text)}</span>'


def _num(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def header_html(s: DashboardState) -> str:
    """One line that never wraps (each cell keeps its width; overflow is clipped, not wrapped), then a message line
    for the phase detail, a warning (e.g. `tau_gap`) and an error, each free to wrap on its own."""
    colour = PHASE_COLOURS.get(s.phase, "#8250df")
    total = f" / {s.total_steps}" if s.total_steps else ""
    if s.steady_tokens_per_s and s.throughput_state == "steady":
        steady = f"steady {format_rate(s.steady_tokens_per_s)}"
    elif s.warming_up:
        steady = "warming up"
    else:  # stopped or finished before the step time settled (a short or noisy run): the rate runs list shows too
        steady = f"last {format_rate(s.tokens_per_s)}" if s.tokens_per_s else "steady -"
    tau = _v("sim-tau", _num(s.sim_tau, ".2f"), "simulated acceptance length from block accuracy on the training "
                                                "batch (not a real decode)", s.sim_tau)
    if s.val_sim_tau is not None:
        tau += f' <small>val {_v("val-sim-tau", _num(s.val_sim_tau, ".2f"), "on held-out data", s.val_sim_tau)}</small>'
    if s.real_tau is not None:
        real = _v("real-tau", _num(s.real_tau, ".2f"), "real speculative decoding", s.real_tau)
        if s.real_tau_ci:
            real += " " + _v("real-tau-ci", f"[{s.real_tau_ci[0]:.2f}, {s.real_tau_ci[1]:.2f}]",
                             "95% bootstrap interval over the held-out prompts")
        tau += f" <small>real {real}</small>"
    cells = [
        ("phase", f'<b style="color:{colour}">{_v("phase", s.phase)}</b>'),
        ("step", f'{_v("step", str(s.step))}{html.escape(total)}'),
        ("tokens/s", f'{_v("tps", format_rate(s.tokens_per_s), "now", s.tokens_per_s)} '
                     f'<small>{_v("tps-steady", steady, "median over the steps since warm-up ended")}</small>'),
        ("loss", f'{_v("loss", _num(s.loss, ".4f"), value=s.loss)} '
                 f'<small>ema {_v("loss-ema", _num(s.loss_ema, ".4f"), "per-step EMA (beta 0.9)", s.loss_ema)}'
                 '</small>'),
        ("lr", _v("lr", _num(s.lr, ".3g"), value=s.lr)),
        ("tau", tau),
    ]
    if s.heads:  # a drafter variant's own terms (DSpark: its Markov CE and its confidence head's accuracy)
        cells.append(("heads", " ".join(_v(k.replace("_", "-"), f"{k} {v:.3g}", value=v) for k, v in s.heads.items()
                                        if k in ("markov_ce", "confidence_acc"))))
    if s.phase == "training":  # no ETA when idle, paused, stopped or finished
        cells.append(("ETA", _v("eta", s.eta_text, "~ = estimated from warm-up steps")))
    # clamp(): 15 px values at >= 1,400 px windows, down to 12 px at 1,024 px, so the line fits a narrow cell
    items = "".join(f'<div style="margin-right:clamp(10px,1.2vw,20px);flex:0 0 auto">'
                    f'<div style="font-size:11px;color:#57606a">{k}</div>'
                    f'<div style="font-size:clamp(12px,1.1vw,15px)">{v}</div></div>' for k, v in cells)
    lines = []
    if s.phase_detail:
        lines.append(_v("phase-detail", s.phase_detail))
    if s.warning:
        lines.append(f'<span class="dfl-warning" style="color:#9a6700">&#9888; {html.escape(s.warning)}</span>')
    msg = (f'<div class="dfl-message-line" style="font-size:12px;color:#57606a">{" &middot; ".join(lines)}</div>'
           if lines else "")
    err = ""
    if s.error:
        err = f'<div class="dfl-error" style="color:#cf222e;white-space:pre-wrap">{html.escape(s.error)}</div>'
    return (f'<div class="dfl-header" style="display:flex;flex-wrap:nowrap;overflow:hidden;white-space:nowrap;'
            f'font-family:sans-serif">{items}</div>{msg}{err}')


def _bar(frac: float, colour: str, text: str = "") -> str:
    """A bar that fills its grid cell, with its numbers written over it."""
    pct = max(0.0, min(1.0, frac)) * 100
    return (f'<div style="position:relative;height:16px;background:#eaeef2;border-radius:3px;min-width:120px">'
            f'<div style="width:{pct:.1f}%;height:100%;background:{colour};border-radius:3px"></div>'
            f'<div style="position:absolute;left:6px;right:4px;top:0;line-height:16px;font-size:12px;'
            f'white-space:nowrap;overflow:hidden;text-overflow:ellipsis">{text}</div></div>')


# Fits a ~560 px cell (a 1,024 px window with JupyterLab's file browser open): the minima add up to ~500 px.
GRID = ('display:grid;grid-template-columns:minmax(90px,max-content) minmax(130px,2fr) 7ch 6ch 6ch '
        'minmax(80px,1fr);column-gap:10px;row-gap:3px;align-items:center;font-family:sans-serif;font-size:13px')
HOST_STRIP_HEAD = ('<span style="color:#57606a;font-size:11px" title="host RAM in use (filled) and CPU % (line) over '
                   'time">history: RAM (fill), CPU % (line)</span>')
STRIP_HEAD = ('<span style="color:#57606a;font-size:11px" title="memory in use (filled) and busy % (line) over time">'
              'history: memory (fill), busy (line)</span>')


def _strip(s: DashboardState, label: str) -> str:
    """The history strip of one device (its column of the grid), or an empty cell when there is none yet."""
    h = next((d for d in s.device_history if d.label == label), None)
    return f'<span class="dfl-strip-cell">{strip_svg(h)}</span>' if h is not None else "<span></span>"


def gpus_html(s: DashboardState) -> str:
    """Compact rows, one per GPU (1 to 8): label | memory bar with used / capacity | kernel busy | power | temp."""
    if not s.gpus:
        h = s.host
        cpu = h.get("cpu_pct")
        ram = f'{h.get("ram_used_gb", 0):.1f} / {h.get("ram_total_gb", 0):.1f} GB' if h.get("ram_total_gb") else "-"
        ram_frac = (h.get("ram_used_gb") or 0) / h["ram_total_gb"] if h.get("ram_total_gb") else 0
        rss = f' &middot; this process {h["proc_rss_gb"]:.2f} GB' if h.get("proc_rss_gb") is not None else ""
        frozen = " (last reading: the run has ended)" if s.ended else ""
        # No busy / power / temp columns on a host: its bars take their width (the RAM figures were cut at 1,024 px)
        wide = 'style="grid-column:2/span 4"'
        return (f'<div class="dfl-gpus" style="{GRID}">'
                f'<div class="dfl-gpu-status" style="grid-column:1/-1;color:#57606a;font-size:11px">'
                f'{html.escape(s.gpu_status + frozen)}</div>'
                f'<span></span><span {wide}></span>{HOST_STRIP_HEAD}'
                f'<b>host RAM</b><span class="dfl-host-ram" {wide} title="{ram}{rss.replace(" &middot; ", "; ")}">'
                f'{_bar(ram_frac, "#8250df", ram + rss)}</span>'
                f'<span style="grid-row:span 2">{_strip(s, "host")}</span>'
                f'<b>host CPU</b><span {wide}>'
                f'{_bar((cpu or 0) / 100, "#0969da", _v("cpu", _num(cpu, ".0f") + "%", value=cpu))}</span></div>')
    rows = ['<span style="color:#57606a;font-size:11px">GPU</span>'
            '<span style="color:#57606a;font-size:11px">memory used / capacity (NVML, all processes)</span>'
            '<span style="color:#57606a;font-size:11px" title="share of time some kernel ran: a liveness '
            'signal, not speed">busy</span><span style="color:#57606a;font-size:11px">power</span>'
            f'<span style="color:#57606a;font-size:11px">temp</span>{STRIP_HEAD}']
    for g in s.gpus:
        label = f'<b class="dfl-gpu" title="{html.escape(g.name)}">{html.escape(g.label)}</b>'
        if g.error:
            rows.append(f'{label}<span style="grid-column:2/-1;color:#cf222e">{html.escape(g.error)}</span>')
            continue
        colour = "#cf222e" if g.used_frac > 0.95 else "#1a7f37"
        mem = f"{_num(g.used_gb, '.1f')} / {_num(g.total_gb, '.0f')} GB"
        if g.torch_reserved_gb is not None:
            mem += f" &middot; torch {g.torch_reserved_gb:.1f} reserved / {g.torch_allocated_gb or 0:.1f} alloc"
        rows.append(f'{label}<span class="dfl-gpu-mem" title="NVML {html.escape(g.mem_view)}">'
                    f'{_bar(g.used_frac, colour, mem)}</span>'
                    f'<span class="dfl-gpu-busy">{_num(g.kernel_busy_pct, ".0f")}%</span>'
                    f'<span>{_num(g.power_w, ".0f")} W</span><span>{_num(g.temp_c, ".0f")} &deg;C</span>'
                    f'{_strip(s, g.label)}')
    return f'<div class="dfl-gpus" style="{GRID}">{"".join(rows)}</div>'


def replicas_html(s: DashboardState) -> str:
    if not s.replicas:
        return ""
    rows = "".join(f'<span>{html.escape(r["label"])}</span>{_bar(r["fraction"], "#0969da", html.escape(r["text"]))}'
                   '<span></span><span></span><span></span><span></span>' for r in s.replicas)
    return f'<div class="dfl-replicas" style="{GRID}">{rows}</div>'


def store_text(store: dict) -> str:
    """The feature store in one line: windows kept (GPU and host memory), and the share of windows it served, which
    grows through the first epoch while the store fills: the throughput's warm-up."""
    if "feature_store_rows" not in store:
        return ""
    host_rows = store.get("feature_store_host_rows", 0)
    where = f"{store.get('feature_store_gib', 0):.1f} GiB on the GPU"
    if host_rows:
        where += f" + {store.get('feature_store_host_gib', 0):.1f} GiB in host memory"
    line = (f"feature store: {store.get('feature_store_stored', 0):,} of {store['feature_store_rows'] + host_rows:,} "
            f"windows kept ({where}); {store.get('feature_store_hit_rate', 0):.1%} of windows served from it")
    if host_rows:
        line += f", {store.get('feature_store_host_share', 0):.0%} of those from host memory"
    return line


def balance_html(s: DashboardState) -> str:
    """Supply / demand of the target and drafter sides, and the feature store's line under it."""
    store = store_text(s.store)
    store = (f'<div class="dfl-store" style="font-family:sans-serif;font-size:13px;color:#57606a">'
             f'{html.escape(store)}</div>') if store else ""
    b = s.balance
    if b is None:
        return store
    colour = "#1a7f37" if b.idle_side is None else "#9a6700"
    return (f'<div class="dfl-balance" style="font-family:sans-serif;font-size:13px;color:{colour}">'
            f'supply / demand: {html.escape(b.recommendation)}</div>' + store)
