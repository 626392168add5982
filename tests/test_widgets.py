"""Dashboard model numbers, controls on a real Trainer, attach mode on a real run dir, and the headless view output."""

import base64
import json
import math
import threading
import time
from pathlib import Path

import pytest

from widgets.model import BoundedSeries, DashboardModel, balance_from, format_eta, new_by_step, replica_rows
from widgets.sources import JsonlFollower

ROOT = Path(__file__).resolve().parents[1]


def rec(step, loss, *, st=0.5, state="warming_up", steady_st=None, tokens=1000, **kw):
    r = {"step": step, "loss": loss, "lr": 1e-3 * step, "sim_tau": 1 + step / 100, "acc": step / 1000,
         "step_time_s": st, "tokens_per_s": tokens / st, "throughput_state": state,
         "steady_step_time_s": steady_st, "steady_tokens_per_s": tokens / steady_st if steady_st else None}
    r.update(kw)
    return r


# -- model ----------------------------------------------------------------------------------------------------------
def test_bounded_series_keeps_recent_points_and_the_whole_span():
    s = BoundedSeries(max_points=100)
    for i in range(1, 10_001):
        s.append(i, float(i))
    assert len(s) <= 100
    assert s.x[0] == 1 and s.x[-1] == 10_000  # the whole run stays visible
    assert s.x[-20:] == list(range(9981, 10_001))  # recent steps at full resolution
    assert s.x == sorted(s.x) and s.y == [float(x) for x in s.x]


def test_model_numbers_eta_ema_warmup_marker():
    m = DashboardModel(max_points=50, total_steps=100)
    recs = [rec(i, 4.0 - 0.01 * i, st=0.9 if i < 4 else 0.5) for i in range(1, 6)]
    recs += [rec(i, 4.0 - 0.01 * i, state="steady", steady_st=0.5) for i in range(6, 11)]
    assert m.add_metrics(recs) == 10
    assert m.add_metrics(recs[:3]) == 0  # already seen steps are ignored
    s = m.state(phase="training")
    assert s.step == 10 and s.total_steps == 100
    assert s.eta_s == pytest.approx(0.5 * 90) and not s.eta_estimated and s.eta_text == "0h00m45s"
    assert s.steady_from_step == 6  # where the warm-up span ends on the tokens/s plot
    assert s.tokens_per_s == pytest.approx(2000) and s.steady_tokens_per_s == pytest.approx(2000)
    ema = None
    for r in recs:
        ema = r["loss"] if ema is None else 0.9 * ema + 0.1 * r["loss"]
    assert s.loss_ema == pytest.approx(ema) and s.loss == pytest.approx(3.9)
    assert s.series["loss"][0] == list(range(1, 11)) and s.series["lr"][1][-1] == pytest.approx(0.01)
    line = s.summary_line()
    assert line.startswith("step 10/100 | 2.0k tok/s | loss 3.9000 | sim tau 1.10 | ETA 0h00m45s | training")


def test_model_eta_while_warming_up_is_marked_estimated():
    m = DashboardModel(total_steps=20)
    m.add_metrics([rec(1, 3.0, st=2.0), rec(2, 3.0, st=1.0), rec(3, 3.0, st=1.0)])
    s = m.state()
    assert s.eta_estimated and s.eta_s == pytest.approx(17.0) and s.eta_text == "~0h00m17s"
    assert "(warming up)" in s.summary_line()
    assert format_eta(3725) == "1h02m05s"


def test_new_by_step_reads_only_the_tail():
    items = [{"step": i} for i in range(1, 8)]
    assert new_by_step(items, 5) == [{"step": 6}, {"step": 7}]
    assert new_by_step(items, 7) == [] and new_by_step(items, 0) == items


def test_balance_recommendation_names_the_idle_side_and_the_move():
    assert balance_from([{"loss": 1.0}]) is None  # no wait keys (colocated placement): show nothing
    b = balance_from([{"drafter_wait_frac": 0.30}, {"drafter_wait_frac": 0.40, "target_wait_frac": 0.02}])
    assert b.idle_side == "drafters"
    assert b.recommendation == ("drafter GPUs wait 35% of the time for features: move one GPU from drafters to "
                                "targets")
    b = balance_from([{"drafter_wait_frac": 0.02, "target_wait_frac": 0.5}], n_target_gpus=1, n_drafter_gpus=3)
    assert b.idle_side == "targets" and "add a drafter GPU" in b.recommendation
    b = balance_from([{"drafter_wait_frac": 0.05, "target_wait_frac": 0.08}])
    assert b.idle_side is None and b.recommendation == "balanced: drafters wait 5%, targets wait 8% of the time"


def test_replica_rows_from_loader_reports():
    from dflash_lab.targets import LoadProgress

    rows = replica_rows({0: LoadProgress(replica=0, device="cuda:0", source="x", tensors_done=100,
                                         tensors_total=400, gb_done=4.0, gb_total=16.0, seconds=3.0),
                         1: LoadProgress(replica=1, device="cuda:1", source="x", tensors_done=400, tensors_total=400,
                                         gb_done=16.0, gb_total=16.0, seconds=9.5, done=True, memory_gb=16.2)})
    assert rows[0] == {"label": "replica 0 (cuda:0)", "fraction": 0.25,
                       "text": "100/400 tensors, 4.0/16.0 GB, 3.0 s"}
    assert rows[1]["fraction"] == 1.0 and rows[1]["text"].endswith("loaded, 16.2 GB on device")


def test_gpu_rows_and_no_gpu_state_from_monitor_samples():
    m = DashboardModel()
    m.add_system({"time": 1.0, "host": {"cpu_pct": 50.0, "ram_used_gb": 3.0, "ram_total_gb": 24.0},
                  "gpus": [], "no_gpu": True})
    s = m.state()
    assert s.gpus == [] and s.gpu_status.startswith("no NVIDIA GPU") and s.host["ram_total_gb"] == 24.0
    m.add_system({"time": 2.0, "host": {}, "gpus": [{"label": "cuda:0 (gpu 3)", "mem_used_gb": 70.0,
                                                     "mem_total_gb": 140.0, "mem_view": "nvml_v2",
                                                     "kernel_busy_pct": 97, "power_w": 610.0, "temp_c": 61}]})
    g = m.state().gpus[0]
    assert g.label == "cuda:0 (gpu 3)" and g.used_frac == 0.5 and g.kernel_busy_pct == 97


def test_html_fragments_carry_the_numbers():
    from widgets.html import balance_html, gpus_html, header_html

    m = DashboardModel(total_steps=100)
    m.add_metrics([rec(7, 2.5, drafter_wait_frac=0.35)])
    m.add_system({"time": 1.0, "host": {"cpu_pct": 12.0, "ram_used_gb": 3.0, "ram_total_gb": 24.0}, "gpus": [],
                  "no_gpu": True})
    s = m.state(phase="paused", phase_detail="at step 7")
    h = header_html(s)
    assert '<span class="dfl-step">7</span>' in h and '<span class="dfl-loss">2.5000</span>' in h
    assert '<span class="dfl-phase">paused: at step 7</span>' in h and "warming up" in h
    assert "no NVIDIA GPU" in gpus_html(s) and "host RAM" in gpus_html(s)
    assert "move one GPU from drafters to targets" in balance_html(s)


# -- attach: following files ----------------------------------------------------------------------------------------
def test_jsonl_follower_waits_for_whole_lines_and_survives_rewrites(tmp_path):
    p = tmp_path / "metrics.jsonl"
    f = JsonlFollower(p)
    assert f.read_new() == []  # the file does not exist yet
    p.write_text('{"step": 1}\n{"step": 2')
    assert f.read_new() == [{"step": 1}]
    with open(p, "a") as fh:
        fh.write(', "loss": 1.5}\n')
    assert f.read_new() == [{"step": 2, "loss": 1.5}]
    assert f.read_new() == []
    p.write_text('{"step": 1}\n')  # rewritten shorter (a resume truncates the log): start over
    assert f.read_new() == [{"step": 1}]
