"""Live dashboard: ipywidgets + one plotly FigureWidget, refreshed from a daemon thread at <= 2 Hz.

Layout: header (phase, step, tokens/s now and steady, loss, LR, simulated acceptance, ETA), target-replica load
bars, per-GPU memory bars with a history strip each (memory and busy % over time; host CPU/RAM without a GPU),
supply/demand balance, four curves (loss + EMA, LR, tokens/s with the warm-up span shaded, simulated acceptance)
with the run's events drawn across them as markers (pause, stop, LR change, checkpoint, evaluation) and their key,
and the control row.

Updates only set widget traits (safe from a thread with ipywidgets 8 / ipykernel 7); nothing prints or uses
`with output:` from the thread. All curves change inside one `fig.batch_update()` (one message), and only when new
steps arrived; curves are bounded (DashboardModel) so each refresh sends at most ~600 points per curve. Without
`anywidget` (plotly's FigureWidget needs it) the curves fall back to a PNG image refreshed every 5 s.
"""

from __future__ import annotations

import threading
import time

import ipywidgets as W

from .history import KIND_STYLE, markers_html
from .html import balance_html, gpus_html, header_html, replicas_html
from .model import DashboardModel, DashboardState

# (model curve, legend name, row, col, legend): raw loss vs its EMA get a legend, and so do the three taus.
CURVES = [("loss", "raw loss", 1, 1, "legend"), ("loss_ema", "EMA (per step)", 1, 1, "legend"),
          ("lr", "lr", 1, 2, None), ("tokens_per_s", "tokens/s", 2, 1, None),
          ("sim_tau", "sim. (train batch)", 2, 2, "legend2"), ("val_sim_tau", "sim. (held-out)", 2, 2, "legend2"),
          ("real_tau", "real decode", 2, 2, "legend2")]
PLOT_HEIGHT_PX = 460
FIT_EVERY_S = 15.0  # after the first two fits, the plot re-measures its cell this often (a dropped resize heals)
PANEL_AXES = ("x", "x2", "x3", "x4")  # the four subplots' x axes: a marker is one line across each
FEW_STEPS = 10  # up to this many steps the step axis ticks every step (auto ticks at 0.5 read "1 2 2 3 3")


def route_to_frontend_subshell(widget) -> None:
    """Let this widget's incoming messages (clicks, typed values) run on the subshell JupyterLab sends them to.

    ipykernel 7.4 routes a comm's incoming messages to the shell that last SENT on that comm
    (`Comm._reply_subshell_for`); for a widget built in a cell that is the main shell, so its clicks would queue
    behind a busy training cell. Forgetting that memo restores the frontend's choice (one subshell per comm target).
    Controls never send after they are built, so it stays forgotten; a no-op on kernels without the memo.
    """
    comm = getattr(widget, "comm", None)
    lock = getattr(comm, "_reply_subshell_lock", None)
    if lock is not None:
        with lock:
            comm.__dict__.pop("_reply_subshell_id", None)


def _figure_widget():
    """A 2x2 plotly FigureWidget that fills its cell's width, or None if plotly's widget support (anywidget) is missing.

    No fixed width: `autosize` + the `responsive` config let plotly.js size the plot to its container (and follow
    window resizes); LiveDashboard asks for one autosize once the plot is on the page (its first render may happen
    before the cell has a width). Axis numbers are plain ("0.0006", "12000"), not SI ("600μ", "12k").
    """
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.07, vertical_spacing=0.17,
                            subplot_titles=("training loss (decayed CE)", "learning rate",
                                            "tokens/s (warm-up shaded once it ends)", "acceptance length tau"))
        for key, name, r, c, legend in CURVES:
            fig.add_trace(go.Scatter(x=[], y=[], name=name, mode="lines+markers" if key in ("val_sim_tau", "real_tau")
                                     else "lines", opacity=0.45 if key == "loss" else 1.0,
                                     showlegend=legend is not None, legend=legend or "legend"), row=r, col=c)
        # legends inside their panels: top right of the loss panel (the loss falls), bottom right of tau (it rises)
        legend = dict(orientation="h", xanchor="right", bgcolor="rgba(255,255,255,0.7)", font=dict(size=10))
        fig.update_layout(height=PLOT_HEIGHT_PX, autosize=True, margin=dict(l=55, r=15, t=40, b=30),
                          legend=dict(legend, x=0.46, y=0.99, yanchor="top"),
                          legend2=dict(legend, x=0.995, y=0.01, yanchor="bottom"),
                          uirevision="keep")  # keep the user's zoom across updates
        fig.update_yaxes(tickformat="~g", exponentformat="none")
        fig.update_xaxes(tickformat="d")
        widget = go.FigureWidget(fig)
        widget._config = {"responsive": True, "displaylogo": False}
        return widget
    except ImportError:
        return None


def curve_shapes(s: DashboardState) -> list[dict]:
    """The warm-up span on the tokens/s panel, and one vertical line per marker across each of the four panels."""
    shapes = []
    if s.steady_from_step is not None:  # x3/y3 = row 2, col 1
        shapes.append(dict(type="rect", xref="x3", yref="y3 domain", x0=0, x1=s.steady_from_step, y0=0, y1=1,
                           fillcolor="#9a6700", opacity=0.12, line_width=0, layer="below"))
    for m in s.markers:
        colour, dash, _ = KIND_STYLE[m.kind]
        for ax in PANEL_AXES:
            shapes.append(dict(type="line", xref=ax, yref=f"y{ax[1:]} domain", x0=m.step, x1=m.step, y0=0, y1=1,
                               line=dict(color=colour, width=1, dash=dash), opacity=0.35 if m.kind == "eval" else 0.7,
                               layer="below",
                               name=f"marker-{m.kind}"))
    return shapes


class LiveDashboard:
    """Widgets + refresh thread over a source (TrainerSource / RunDirSource) and a DashboardModel."""

    def __init__(self, source, model: DashboardModel, *, buttons: dict | None = None, refresh_hz: float = 2.0,
                 title: str = "", lr: float = 3e-4):
        if not 0 < refresh_hz <= 2.0:
            raise ValueError(f"refresh_hz={refresh_hz}: use 0 < refresh_hz <= 2 (plotly resends whole curves; "
                             "faster refreshes cost the kernel more than they show).")
        self.source, self.model = source, model
        self.initial_lr = lr  # what the Set LR box shows first (the config's peak lr)
        self.period = 1.0 / refresh_hz
        self.header = W.HTML()
        self.replicas = W.HTML()
        self.gpus = W.HTML()
        self.balance = W.HTML()
        self.message = W.HTML()
        self.markers = W.HTML()
        self.fig = _figure_widget()
        self.image = None
        if self.fig is None:
            self.image = W.Image(format="png")
            self.image_every_s, self._image_time = 5.0, 0.0
        self._sent_version = -1
        self._sent_shapes: tuple | None = None  # (steady_from_step, markers_version) of the shapes on the plot
        self._few_steps: bool | None = None
        self._shown_at: float | None = None  # when start() ran (the dashboard was just displayed)
        self._fit_after_s = [2.0, 6.0]
        self._fit_every_s = FIT_EVERY_S
        self._last_fit_s = 0.0
        self._last_html: dict[str, str] = {}
        self.state: DashboardState | None = None
        self.last_refresh_s = 0.0
        self.refreshes = 0
        self.refresh_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.title = W.HTML(f"<b>{title}</b>")
        children = [self.title, self.header, self.replicas, self.gpus, self.balance,
                    self.fig if self.fig is not None else self.image, self.markers]
        if buttons:
            children.append(self._controls_row(buttons))
        children.append(self.message)
        self.box = W.VBox(children, layout=W.Layout(border="1px solid #d0d7de", padding="6px", width="100%"))
        self.box.add_class("dflash-dashboard")

    def set_title(self, title: str) -> None:
        self.title.value = f"<b>{title}</b>"

    # -- controls -------------------------------------------------------------------------------------------------
    def _controls_row(self, buttons: dict) -> W.Widget:
        """buttons: name -> callable; names: run, pause, stop, checkpoint, step_n (takes n), set_lr (takes lr)."""
        row = []

        def wire(label, fn, *, style="", tooltip="", arg=None):
            # compact (6 px padding, inputs 64 / 84 px): the row fits one line in a ~560 px cell, a 1,024 px
            # window with JupyterLab's file browser open (the default 12 px padding wrapped Set LR to a second line)
            b = W.Button(description=label, button_style=style, tooltip=tooltip,
                         layout=W.Layout(width="auto", padding="0 6px"))
            b.add_class(f"dfl-btn-{label.lower().replace(' ', '-')}")

            def on_click(_):  # runs on a kernel subshell while a cell is busy: only sets events / starts a thread
                try:
                    msg = fn(arg.value) if arg is not None else fn()
                except Exception as e:  # noqa: BLE001 - show it, never raise into the comm handler
                    msg = f"{label} failed: {type(e).__name__}: {e}"
                self._set_html(self.message, "message", f"<small>{msg}</small>")

            b.on_click(on_click)
            return b

        if "run" in buttons:
            row.append(wire("Run", buttons["run"], style="success", tooltip="train to the configured steps "
                                                                            "(or resume after Pause)"))
        if "pause" in buttons:
            row.append(wire("Pause", buttons["pause"], style="warning", tooltip="pause at the next step boundary"))
        if "stop" in buttons:
            row.append(wire("Stop", buttons["stop"], style="danger", tooltip="stop at the next step boundary"))
        if "checkpoint" in buttons:
            row.append(wire("Checkpoint now", buttons["checkpoint"], tooltip="save at the next step boundary"))
        if "step_n" in buttons:
            n = W.BoundedIntText(value=10, min=1, max=10**9, layout=W.Layout(width="64px"))
            n.add_class("dfl-step-n-input")
            row += [wire("Step N", buttons["step_n"], arg=n, tooltip="run N steps (while paused: N steps, then "
                                                                   "paused again)"), n]
        if "set_lr" in buttons:
            lr = W.FloatText(value=float(self.initial_lr), layout=W.Layout(width="84px"))
            lr.add_class("dfl-lr-input")
            row += [wire("Set LR", buttons["set_lr"], arg=lr, tooltip="override the schedule from the next step"), lr]
        for w in row:
            route_to_frontend_subshell(w)
        # A button and its input stay together (one group each) when a narrow cell wraps the row.
        groups, i = [], 0
        while i < len(row):
            takes_input = isinstance(row[i], W.Button) and i + 1 < len(row) and not isinstance(row[i + 1], W.Button)
            groups.append(W.HBox(row[i:i + 2]) if takes_input else row[i])
            i += 2 if takes_input else 1
        return W.HBox(groups, layout=W.Layout(flex_flow="row wrap"))

    # -- refresh --------------------------------------------------------------------------------------------------
    def refresh(self) -> DashboardState:
        """Poll the source, recompute the state, push what changed to the widgets (one batched plotly update)."""
        with self._lock:
            t0 = time.perf_counter()
            kwargs = self.source.poll(self.model)
            s = self.state = self.model.state(**kwargs)
            self._set_html(self.header, "header", header_html(s))
            self._set_html(self.replicas, "replicas", replicas_html(s) if s.phase.startswith("loading") else "")
            self._set_html(self.gpus, "gpus", gpus_html(s))
            self._set_html(self.balance, "balance", balance_html(s))
            self._set_html(self.markers, "markers", markers_html(s.markers))
            controls = getattr(self.source, "controls", None)
            if controls is not None and controls.message:
                self._set_html(self.message, "message", f"<small>{controls.message}</small>")
            if s.series_version != self._sent_version or (s.steady_from_step, s.markers_version) != self._sent_shapes:
                self._send_curves(s)
            self._fit_width()
            self.last_refresh_s = time.perf_counter() - t0
            self.refreshes += 1
            return s

    def _fit_width(self) -> None:
        """Ask plotly.js to size the plot to its cell, 2 s and 6 s after the dashboard is shown, then every 15 s.

        The widget's first render can happen before the cell is laid out (zero width: plotly falls back to 700 px);
        window resizes are followed by plotly's `responsive` handler, but nothing re-measures after that first
        render, and on a busy machine the browser can drop a resize (a plot left 1,154 px wide in a 592 px cell):
        the repeat heals that within seconds. An autosize that finds the width unchanged redraws nothing. A
        relayout sent before the plot exists would replace it with an empty one, hence the delay.
        """
        if self.fig is None or self._shown_at is None:
            return
        since = time.monotonic() - self._shown_at
        due = self._fit_after_s[0] if self._fit_after_s else self._last_fit_s + self._fit_every_s
        if since >= due:
            if self._fit_after_s:
                self._fit_after_s.pop(0)
            self._last_fit_s = since
            self.fig._send_relayout_msg({"autosize": True})  # plotly_relayout would send only changed values

    def _set_html(self, widget, key: str, value: str) -> None:
        if self._last_html.get(key) != value:
            self._last_html[key] = value
            widget.value = value

    def _send_curves(self, s: DashboardState) -> None:
        if self.fig is None:
            now = time.monotonic()
            if now - self._image_time >= self.image_every_s:
                from .static import render_png

                self._image_time = now
                self.image.value = render_png(s, dpi=60)
                self._sent_version = s.series_version
            return
        import numpy as np

        shapes_key = (s.steady_from_step, s.markers_version)
        few = s.step <= FEW_STEPS
        with self.fig.batch_update():  # one message for all curves
            for i, (key, *_rest) in enumerate(CURVES):
                x, y = s.series.get(key, ([], []))
                self.fig.data[i].x = np.asarray(x, dtype=np.float64)
                self.fig.data[i].y = np.asarray(y, dtype=np.float64)
            if shapes_key != self._sent_shapes:
                self.fig.layout.shapes = curve_shapes(s)
            if few != self._few_steps:
                self.fig.update_xaxes(dtick=1 if few else None)
        self._sent_version, self._sent_shapes, self._few_steps = s.series_version, shapes_key, few

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
                self.refresh_error = None
            except Exception as e:  # noqa: BLE001 - keep refreshing; show the problem in the message line
                self.refresh_error = f"{type(e).__name__}: {e}"
                try:
                    self._set_html(self.message, "message", f"<small>dashboard refresh failed: "
                                                            f"{self.refresh_error}</small>")
                except Exception:  # noqa: BLE001
                    pass
            self._stop.wait(max(self.period - self.last_refresh_s, 0.05))

    def start(self) -> "LiveDashboard":
        if self._shown_at is None:
            self._shown_at = time.monotonic()
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="dflash-dashboard", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None
