"""The dashboard's memory/utilisation history strip per device and its event markers, on CPU without a browser (the
browser test checks both in JupyterLab at 1,600 and 1,024 px)."""

import re

import pytest

from widgets.history import DeviceHistory, markers_from_events, strip_svg
from widgets.model import DashboardModel


def gpu_sample(t, used):
    return {"time": t, "host": {"cpu_pct": 50.0, "ram_used_gb": 8, "ram_total_gb": 64},
            "gpus": [{"label": f"cuda:{i} (gpu {i})", "mem_used_gb": used * (i + 1), "mem_total_gb": 140.0,
                      "mem_view": "v2", "kernel_busy_pct": 90 - i} for i in range(2)]}


def test_history_per_gpu_is_kept_over_time_and_bounded():
    m = DashboardModel()
    m.system_history.max_points = 60
    for k in range(200):
        m.add_system(gpu_sample(1000.0 + 0.5 * k, used=10 + k * 0.1))
        m.add_system(gpu_sample(1000.0 + 0.5 * k, used=10 + k * 0.1))  # the same sample polled twice counts once
    s = m.state()
    a, b = s.device_history
    assert (a.label, b.label) == ("cuda:0 (gpu 0)", "cuda:1 (gpu 1)")
    assert len(a.t) <= 60 and a.t[0] == 0.0 and a.t[-1] == pytest.approx(99.5)  # whole run, thinned
    assert a.mem_frac[-1] == pytest.approx((10 + 19.9) / 140) and b.mem_frac[-1] == pytest.approx(2 * 29.9 / 140)
    assert a.util_pct[-1] == 90 and b.util_pct[-1] == 89
    from widgets.html import gpus_html

    h = gpus_html(s)
    strips = re.findall(r'<svg class="dfl-strip" data-device="([^"]+)" data-points="(\d+)"', h)
    assert strips == [("cuda:0 (gpu 0)", str(len(a.t))), ("cuda:1 (gpu 1)", str(len(b.t)))]
    assert "history: memory (fill), busy (line)" in h


def test_a_cpu_machine_has_one_host_strip():
    m = DashboardModel()
    for k in range(5):
        m.add_system({"time": float(k), "host": {"cpu_pct": 20.0 * k, "ram_used_gb": 2 + k, "ram_total_gb": 24},
                      "gpus": [], "no_gpu": True})
    s = m.state()
    (host,) = s.device_history
    assert host.label == "host" and host.util_pct == [0, 20, 40, 60, 80]
    assert host.mem_frac[-1] == pytest.approx(6 / 24)
    from widgets.html import gpus_html

    h = gpus_html(s)
    assert 'data-device="host" data-points="5"' in h
    assert "collecting history" in strip_svg(DeviceHistory("cuda:0", [0.0], [0.1], [5.0]))
    # the strip has its own label in its column, and the RAM figures take the columns a host has no use for
    assert "history: RAM (fill), CPU % (line)" in h.split("<b>host RAM</b>")[0]
    ram = h.split('class="dfl-host-ram" ')[1]
    assert ram.startswith('style="grid-column:2/span 4"') and "6.0 / 24.0 GB" in ram.split("</span>")[0]


# Pause clicked at step 29 (the loop paused after booking step 30), Stop clicked at 51 (stopped after 52).
EVENTS = [{"event": "control", "action": "run", "step": 0}, {"event": "control", "action": "pause", "step": 29},
          {"event": "paused", "step": 30},
          {"event": "control", "action": "set_lr", "step": 30, "lr": 1e-4}, {"event": "lr_override", "step": 31,
                                                                               "lr": 1e-4},
          {"event": "control", "action": "resume", "step": 33}, {"event": "checkpoint", "step": 40, "reason": "periodic"},
          {"event": "stop_requested", "step": 51, "source": "controls.stop"},
          {"event": "stopped", "step": 52, "reason": "stop button"}, {"event": "finish", "step": 52}]


def test_events_and_evaluations_become_markers_on_every_panel():
    from widgets.dashboard import PANEL_AXES, curve_shapes
    from widgets.history import markers_html

    marks = markers_from_events(EVENTS)
    assert [(m.kind, m.step) for m in marks] == [("pause", 30), ("lr", 31), ("resume", 33), ("checkpoint", 40),
                                                ("stop", 52)]  # where it happened; run / set_lr clicks, finish: nothing
    assert marks[1].text == "LR change at step 31 (lr 0.0001)"
    m = DashboardModel()
    m.add_metrics([{"step": k, "loss": 3.0, "sim_tau": 1.5} for k in range(1, 50)]
                  + [{"step": 50, "loss": 2.0, "sim_tau": 2.0, "val_sim_tau": 1.8, "real_tau": 1.6}])
    v0 = m.markers_version
    m.add_events(EVENTS)
    m.add_events(EVENTS[:4])  # read again (a second view of the same file): no duplicates
    s = m.state(phase="stopped")
    assert [(x.kind, x.step) for x in s.markers] == [("pause", 30), ("lr", 31), ("resume", 33), ("checkpoint", 40),
                                                     ("eval", 50), ("stop", 52)]
    assert s.markers_version > v0
    lines = [sh for sh in curve_shapes(s) if sh["type"] == "line"]
    assert len(lines) == 6 * len(PANEL_AXES) and {sh["xref"] for sh in lines} == set(PANEL_AXES)
    assert {sh["x0"] for sh in lines} == {30, 31, 33, 40, 50, 52}
    key = markers_html(s.markers)
    for kind, count in (("pause", 1), ("lr", 1), ("checkpoint", 1), ("eval", 1), ("stop", 1)):
        assert f'data-kind="{kind}" data-count="{count}"' in key


def test_static_render_draws_the_markers_and_the_history():
    from widgets.static import render_png

    m = DashboardModel()
    m.add_metrics([{"step": k, "loss": 3.0 - k / 100, "sim_tau": 1.5, "lr": 1e-3} for k in range(1, 60)])
    for k in range(6):
        m.add_system(gpu_sample(float(k), used=20 + k))
    plain = render_png(m.state(phase="stopped"))
    m.add_events(EVENTS)
    marked = render_png(m.state(phase="stopped"))
    assert plain[:8] == marked[:8] == b"\x89PNG\r\n\x1a\n" and plain != marked


def test_every_sample_measured_between_two_refreshes_is_drawn():
    """A papermill run refreshes its static view rarely: the figure drew the newest sample of each refresh, a straight
    0 -> 100% ramp of two points while system.jsonl held 25 samples."""
    from dflash_lab.runs.metrics import RingBuffer
    from widgets.sources import add_samples

    ring, m = RingBuffer(), DashboardModel()
    for k in range(25):  # a monitor's ring between two refreshes: memory climbs, busy % wobbles
        ring.append(gpu_sample(100.0 + k, used=2.0 + k))
    add_samples(m, ring)
    add_samples(m, ring)  # the next refresh reads the whole ring again: nothing counted twice
    (a, _) = m.state().device_history
    assert len(a.t) == 25 and a.t[:3] == [0.0, 1.0, 2.0]
    assert [round(140 * f, 6) for f in a.mem_frac[:3]] == [2.0, 3.0, 4.0]
    ring.append(gpu_sample(125.0, used=30.0))
    ring.append(gpu_sample(110.5, used=1.0))  # older than one seen (a ring read out of order): skipped
    add_samples(m, ring)
    (a, _) = m.state().device_history
    assert len(a.t) == 26 and a.t[-1] == 25.0


def test_the_plot_remeasures_its_cell_after_the_first_fits_so_a_dropped_resize_heals(monkeypatch):
    """2 s and 6 s after the dashboard is shown, then every FIT_EVERY_S: a window resize the browser dropped under
    load (a plot left 1,154 px wide in a 592 px cell) is fixed by the next autosize, not never."""
    import widgets.dashboard as dash

    board = dash.LiveDashboard(None, DashboardModel())
    if board.fig is None:
        pytest.skip("plotly's FigureWidget (anywidget) is not installed: the dashboard draws a PNG, nothing to fit")
    now = [100.0]
    monkeypatch.setattr(dash.time, "monotonic", lambda: now[0])
    sent = []
    board.fig._send_relayout_msg = lambda msg: sent.append((now[0] - 100.0, msg))
    board._shown_at = 100.0
    for t in range(0, 50):  # the refresh thread's calls, one a second
        now[0] = 100.0 + t
        board._fit_width()
    assert [t for t, _ in sent] == [2.0, 6.0, 6.0 + dash.FIT_EVERY_S, 6.0 + 2 * dash.FIT_EVERY_S]
    assert all(msg == {"autosize": True} for _, msg in sent)


def test_a_run_from_before_paused_was_booked_draws_its_pause_clicks():
    """Older run folders have the click (`control` pause) but no `paused` event: the pause is still drawn, once."""
    old = [{"event": "control", "action": "pause", "step": 29}, {"event": "control", "action": "resume", "step": 33}]
    assert [(m.kind, m.step) for m in markers_from_events(old)] == [("pause", 29), ("resume", 33)]
    assert [m.kind for m in markers_from_events(EVENTS)].count("pause") == 1  # with `paused`: the click is not drawn
