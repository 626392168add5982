"""`SweepGrid(sweep_dir)`: a live view of a sweep: one row per variant and overlaid loss / real-tau curves.

    grid = SweepGrid(sweep.dir); grid                   # live widgets in JupyterLab, an HTML table under papermill
    sweep.run(callbacks=[grid.callback])                # throttled refresh from the sweep's polling loop
    grid.refresh()                                      # the final table (the one the saved notebook keeps)

The variants run in their own processes, so everything is read from files: sweep.json (status, run dirs) and each
run's metrics.jsonl, followed incrementally (sources.JsonlFollower). `SweepGridModel` holds no widgets and is what
the tests drive; the live view adds an ipywidgets HTML table and a plotly FigureWidget (one trace per variant and
panel). The static mode shows one HTML output rewritten in place (display_id), which GitHub renders; the notebook's
PNG figure comes from dflash_lab.workflows.sweep_results.plot_sweep.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

from dflash_lab.runs.rundir import PROJECT_ROOT

from .env import dashboard_mode
from .model import format_eta, format_rate
from .sources import JsonlFollower

# tokens/s: the steady rate (median step time after warm-up, sequence tokens incl. padding), the figure the results
# table ranks by; while a variant still warms up, its latest instant rate, marked "~". (The grid once showed the
# last instant rate, 12.3k, next to the table's steady 8,380, without saying which was which.)
GRID_COLUMNS = ("variant", "status", "step", "loss", "real tau", "steady tokens/s", "ETA")


class SweepGridModel:
    """Rows and curves of a sweep directory, updated by `poll()` (new metric lines only)."""

    def __init__(self, sweep_dir: str | Path):
        self.sweep_dir = Path(sweep_dir)
        self.followers: dict[str, JsonlFollower] = {}  # variant -> its current run's metrics.jsonl
        self.curves: dict[str, dict[str, list]] = {}  # variant -> {"loss": [(step, v)], "real_tau": [(step, v)]}
        self.last: dict[str, dict] = {}  # variant -> {"step", "loss", "real_tau", "tokens_per_s", ...}
        self.state: dict = {}

    def poll(self) -> list[dict]:
        """Read what changed; returns the grid rows."""
        try:
            self.state = json.loads((self.sweep_dir / "sweep.json").read_text())
        except (OSError, ValueError):  # the sweep is rewriting it: keep the last good state
            pass
        for v in self.state.get("variants", []):
            name, run_dir = v["name"], v.get("run_dir")
            if not run_dir:
                continue
            f = self.followers.get(name)
            if f is None or f.path.parent != Path(run_dir):  # first sight, or a rerun in a new run dir
                self.followers[name] = f = JsonlFollower(Path(run_dir) / "metrics.jsonl")
                self.curves[name] = {"loss": [], "real_tau": []}
                self.last[name] = {}
            for r in f.read_new():
                for key in ("loss", "real_tau"):
                    if r.get(key) is not None:
                        self.curves[name][key].append((r["step"], r[key]))
                self.last[name].update({k: r[k] for k in ("step", "loss", "real_tau", "tokens_per_s",
                                                          "steady_tokens_per_s") if r.get(k) is not None})
        return self.rows()

    def rows(self, now: float | None = None) -> list[dict]:
        now = time.time() if now is None else now
        steps = self.state.get("spec", {}).get("steps")
        out = []
        for v in self.state.get("variants", []):
            last = self.last.get(v["name"], {})
            step = last.get("step")
            eta = None
            if v["status"] == "running" and step and steps and v.get("started"):
                eta = (now - v["started"]) / step * (steps - step)  # includes start-up: an upper estimate
            out.append({"variant": v["name"], "status": v["status"] + (" (skipped: done)" if v.get("skipped") else ""),
                        "step": f"{step or 0}/{steps}", "loss": last.get("loss"), "real tau": last.get("real_tau"),
                        "steady tokens/s": (last["steady_tokens_per_s"], False) if last.get("steady_tokens_per_s")
                        else (last.get("tokens_per_s"), True), "ETA": format_eta(eta) if eta is not None else "-",
                        "error": v.get("error")})
        return out

    def text(self) -> str:
        """The grid as plain text, one line per variant: what `papermill --log-output` prints of the static table
        (it printed `<IPython.core.display.HTML object>`)."""
        lines = [f"sweep {self.state.get('name', self.sweep_dir.name)}:"]
        for r in self.rows():
            tau = "-" if r["real tau"] is None else f"{r['real tau']:.3f}"
            loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
            lines.append(f"  {r['variant']} {r['status']} {r['step']} | loss {loss} | real tau {tau} | ETA {r['ETA']}")
        return "\n".join(lines)

    def bundle(self) -> dict:
        return {"text/html": self.html(), "text/plain": self.text()}

    def html(self) -> str:
        def cell(key, r):
            x = r[key]
            if key == "loss":
                return "-" if x is None else f"{x:.4f}"
            if key == "real tau":
                return "-" if x is None else f"{x:.3f}"
            if key == "steady tokens/s":
                rate, warming = x
                return "-" if rate is None else ("~" if warming else "") + format_rate(rate)
            return str(x)

        rows = self.rows()
        head = "".join(f"<th>{c}</th>" for c in GRID_COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(c, r))}</td>" for c in GRID_COLUMNS) + "</tr>"
                       + (f"<tr><td></td><td colspan='{len(GRID_COLUMNS) - 1}'>"
                          f"{html.escape(r['error'][:300])}</td></tr>" if r["error"] else "") for r in rows)
        title = html.escape(self.state.get("name", self.sweep_dir.name))
        return (f"<div><b>sweep {title}</b> ({html.escape(_shown_path(self.sweep_dir))})"
                f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                "<small>steady tokens/s: sequence tokens per second (padding included) after warm-up, the figure of "
                "the results table; ~: still warming up, the latest step's rate</small></div>")


def _shown_path(path: Path) -> str:
    """The sweep folder relative to the project (what a shared notebook should name), else as given."""
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def _figure_widget():
    """A 1x2 plotly FigureWidget (loss, real tau vs step), or None where plotly's widget support is missing."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=2, subplot_titles=("training loss (decayed CE)", "real tau (held-out)"))
        fig.update_layout(height=340, autosize=True, margin=dict(l=55, r=15, t=40, b=30), uirevision="keep")
        return go.FigureWidget(fig)
    except ImportError:
        return None


class SweepGrid:
    """The live (JupyterLab) or static (papermill) view of a sweep directory; `callback(sweep)` refreshes it."""

    def __init__(self, sweep_dir, *, mode: str | None = None, every_s: float = 2.0):
        sweep_dir = getattr(sweep_dir, "dir", sweep_dir)  # a Sweep or its folder
        self.model = SweepGridModel(sweep_dir)
        self.mode = mode or dashboard_mode()[0]
        self.every_s, self.last_time = every_s, 0.0
        self.handle = self.table = self.figure = None
        self.traces: dict[tuple[str, str], object] = {}
        if self.mode == "live":
            import ipywidgets

            self.table = ipywidgets.HTML()
            self.figure = _figure_widget()
            self.box = ipywidgets.VBox([self.table] + ([self.figure] if self.figure is not None else []))
        self.model.poll()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.mode == "live":
            self._update_live()
            display(self.box)
        else:
            self.handle = display(self.model.bundle(), raw=True, display_id=True)

    def _update_live(self) -> None:
        self.table.value = self.model.html()
        if self.figure is None:
            return
        with self.figure.batch_update():
            for i, (name, curves) in enumerate(self.model.curves.items()):
                for col, key in ((1, "loss"), (2, "real_tau")):
                    trace = self.traces.get((name, key))
                    if trace is None:
                        self.figure.add_scatter(x=[], y=[], name=name, legendgroup=name, showlegend=col == 1,
                                                mode="lines" if key == "loss" else "lines+markers",
                                                line=dict(color=f"hsl({(i * 67) % 360},65%,45%)"), row=1, col=col)
                        trace = self.traces[(name, key)] = self.figure.data[-1]
                    xs, ys = zip(*curves[key]) if curves[key] else ((), ())
                    trace.x, trace.y = list(xs), list(ys)

    def refresh(self) -> None:
        self.model.poll()
        self.last_time = time.monotonic()
        if self.mode == "live":
            self._update_live()
        elif self.handle is not None:
            self.handle.update(self.model.bundle(), raw=True)

    def callback(self, sweep=None) -> None:
        """For `Sweep.run(callbacks=[...])`: refresh at most every `every_s` seconds."""
        if time.monotonic() - self.last_time >= self.every_s:
            self.refresh()
