"""HTML fragments of the dashboard (header, GPU bars, replica progress, balance) from a DashboardState; no widgets.

Every number sits in an element with a `dfl-*` class, so a browser test (and a curious user) can read it from the DOM.
"""

from __future__ import annotations

import html

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
    colour = PHASE_COLOURS.get(s.phase, "#8250df")
    total = f" / {s.total_steps}" if s.total_steps else ""
    warm = s.throughput_state != "steady"
    steady = "warming up" if warm else f"{format_rate(s.steady_tokens_per_s)} tok/s steady"
    cells = [
        ("phase", f'<b style="color:{colour}">{_v("phase", s.phase_text)}</b>'),
        ("step", f'{_v("step", str(s.step))}{html.escape(total)}'),
        ("tokens/s", f'{_v("tps", format_rate(s.tokens_per_s), value=s.tokens_per_s)} now &middot; '
                     f'{_v("tps-steady", steady, "median over the steps since warm-up ended")}'),
        ("loss", f'{_v("loss", _num(s.loss, ".4f"), value=s.loss)} '
                 f'<small>(ema {_v("loss-ema", _num(s.loss_ema, ".4f"))})</small>'),
        ("lr", _v("lr", _num(s.lr, ".3g"))),
        ("sim. acceptance", _v("sim-tau", _num(s.sim_tau, ".2f"),
                               "simulated acceptance length from block accuracy (not a real decode)")),
        ("ETA", _v("eta", s.eta_text, "~ = estimated from warm-up steps")),
    ]
    items = "".join(f'<div style="margin-right:18px"><div style="font-size:11px;color:#57606a">{k}</div>'
                    f'<div style="font-size:15px">{v}</div></div>' for k, v in cells)
    err = ""
    if s.error:
        err = f'<div class="dfl-error" style="color:#cf222e;white-space:pre-wrap">{html.escape(s.error)}</div>'
    return f'<div class="dfl-header" style="display:flex;flex-wrap:wrap;font-family:sans-serif">{items}</div>{err}'


def _bar(frac: float, colour: str, width_px: int = 260) -> str:
    pct = max(0.0, min(1.0, frac)) * 100
    return (f'<div style="width:{width_px}px;height:12px;background:#eaeef2;border-radius:3px;display:inline-block;'
            f'vertical-align:middle"><div style="width:{pct:.1f}%;height:100%;background:{colour};'
            f'border-radius:3px"></div></div>')


def gpus_html(s: DashboardState) -> str:
    rows = []
    if not s.gpus:
        h = s.host
        cpu = h.get("cpu_pct")
        ram = f'{h.get("ram_used_gb", 0):.1f} / {h.get("ram_total_gb", 0):.1f} GB' if h.get("ram_total_gb") else "-"
        ram_frac = (h.get("ram_used_gb") or 0) / h["ram_total_gb"] if h.get("ram_total_gb") else 0
        rss = f' &middot; this process {h["proc_rss_gb"]:.2f} GB' if h.get("proc_rss_gb") is not None else ""
        return (f'<div class="dfl-gpus" style="font-family:sans-serif;font-size:13px">'
                f'<div class="dfl-gpu-status" style="color:#57606a">{html.escape(s.gpu_status)}</div>'
                f'<div>host RAM {_bar(ram_frac, "#8250df")} {ram}{rss}</div>'
                f'<div>host CPU {_bar((cpu or 0) / 100, "#0969da")} {_num(cpu, ".0f")}%</div></div>')
    for g in s.gpus:
        if g.error:
            rows.append(f'<div><b>{html.escape(g.label)}</b> <span style="color:#cf222e">{html.escape(g.error)}'
                        f'</span></div>')
            continue
        colour = "#cf222e" if g.used_frac > 0.95 else "#1a7f37"
        mem = f"{_num(g.used_gb, '.1f')} / {_num(g.total_gb, '.0f')} GB"
        torch_txt = ""
        if g.torch_reserved_gb is not None:
            torch_txt = (f" &middot; torch reserved {g.torch_reserved_gb:.1f} / allocated "
                         f"{g.torch_allocated_gb or 0:.1f} GB")
        rows.append(
            f'<div class="dfl-gpu" style="margin:2px 0"><b style="display:inline-block;width:130px">'
            f'{html.escape(g.label)}</b>{_bar(g.used_frac, colour)} '
            f'<span class="dfl-gpu-mem" title="NVML {html.escape(g.mem_view)}: memory used by all processes">{mem}'
            f'</span>{torch_txt} &middot; <span title="share of time some kernel ran: a liveness signal, not speed">'
            f'kernel busy {_num(g.kernel_busy_pct, ".0f")}%</span> &middot; {_num(g.power_w, ".0f")} W &middot; '
            f'{_num(g.temp_c, ".0f")} &deg;C</div>')
    view = s.gpus[0].mem_view if s.gpus else ""
    note = (f'<div style="font-size:11px;color:#57606a">memory: NVML {html.escape(view)} view (used by all '
            'processes); torch = this process\'s caching allocator</div>')
    return f'<div class="dfl-gpus" style="font-family:sans-serif;font-size:13px">{"".join(rows)}{note}</div>'


def replicas_html(s: DashboardState) -> str:
    if not s.replicas:
        return ""
    rows = "".join(f'<div><span style="display:inline-block;width:130px">{html.escape(r["label"])}</span>'
                   f'{_bar(r["fraction"], "#0969da", 200)} {html.escape(r["text"])}</div>' for r in s.replicas)
    return f'<div class="dfl-replicas" style="font-family:sans-serif;font-size:13px">{rows}</div>'


def balance_html(s: DashboardState) -> str:
    b = s.balance
    if b is None:
        return ""
    colour = "#1a7f37" if b.idle_side is None else "#9a6700"
    return (f'<div class="dfl-balance" style="font-family:sans-serif;font-size:13px;color:{colour}">'
            f'supply / demand: {html.escape(b.recommendation)}</div>')
