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
    from dflash_lab.target.load import LoadProgress

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
    assert '<span class="dfl-step">7</span>' in h and '<span class="dfl-loss" data-value="2.5">2.5000</span>' in h
    assert '<span class="dfl-phase">paused</span>' in h and "warming up" not in h  # only a training run warms up
    assert "warming up" in header_html(m.state(phase="training"))
    assert '<span class="dfl-phase-detail">at step 7</span>' in h.split("dfl-message-line")[1]  # its own line
    assert "flex-wrap:nowrap" in h and "ETA" not in h  # one line; no ETA while paused
    assert "no NVIDIA GPU" in gpus_html(s) and "host RAM" in gpus_html(s)
    assert "move one GPU from drafters to targets" in balance_html(s)
    assert "ETA" in header_html(m.state(phase="training"))
    # stopped before its step time settled (103 noisy steps): the rate runs list shows, never "steady -"
    assert "last 2.0k" in header_html(s) and "steady -" not in header_html(s)


def test_the_feature_store_line_shows_what_it_keeps_and_serves_from_the_newest_record():
    from widgets.html import balance_html, store_text

    m = DashboardModel(total_steps=100)
    m.add_metrics([rec(7, 2.5)])
    assert store_text(m.state().store) == "" and "dfl-store" not in balance_html(m.state())  # no store: no line
    m.add_metrics([rec(8, 2.4, feature_store_rows=38_566, feature_store_stored=55_809, feature_store_gib=66.203,
                       feature_store_hit_rate=0.6123, feature_store_host_rows=17_243, feature_store_host_gib=29.598,
                       feature_store_host_share=0.3094)])
    line = store_text(m.state().store)
    assert line == ("feature store: 55,809 of 55,809 windows kept (66.2 GiB on the GPU + 29.6 GiB in host memory); "
                    "61.2% of windows served from it, 31% of those from host memory")
    assert '<div class="dfl-store"' in balance_html(m.state()) and line in balance_html(m.state())
    m.add_metrics([rec(9, 2.3, feature_store_rows=26_347, feature_store_stored=20_000, feature_store_gib=46.0,
                       feature_store_hit_rate=0.25)])
    assert store_text(m.state().store) == ("feature store: 20,000 of 26,347 windows kept (46.0 GiB on the GPU); "
                                           "25.0% of windows served from it")


def test_eight_gpu_rows_are_compact_and_aligned():
    from widgets.html import gpus_html

    m = DashboardModel()
    m.add_system({"time": 1.0, "host": {}, "gpus": [
        {"label": f"cuda:{i} (gpu {i})", "name": "NVIDIA H200", "mem_used_gb": 10.0 * (i + 1), "mem_total_gb": 140.0,
         "mem_view": "v2", "kernel_busy_pct": 90 + i, "power_w": 500.0 + i, "temp_c": 60 + i} for i in range(8)]})
    h = gpus_html(m.state())
    assert h.count('class="dfl-gpu"') == 8 and "display:grid" in h  # one grid: columns line up across rows
    assert "80.0 / 140 GB" in h and "97%" in h and "507 W" in h and "67 &deg;C" in h  # memory vs capacity, busy, W, C
    assert 'style="width:57.1%' in h  # the 8th bar: 80 of 140 GB


def test_real_tau_shows_its_interval_beside_it():
    m = DashboardModel(total_steps=100)
    m.add_metrics([rec(10, 2.5, real_tau=1.75, real_tau_low=1.5, real_tau_high=2.0, real_tau_prompts=32)])
    s = m.state(phase="training")
    assert s.real_tau_ci == (1.5, 2.0) and "real tau 1.75 [1.50, 2.00]" in s.summary_line()
    from widgets.html import header_html

    assert 'class="dfl-real-tau-ci" title="95% bootstrap interval over the held-out prompts">[1.50, 2.00]' in \
        header_html(s)
    m.add_metrics([rec(20, 2.4, real_tau=1.9)])  # a record without an interval shows none (never a stale one)
    assert m.state().real_tau_ci is None and "dfl-real-tau-ci" not in header_html(m.state())


def test_loss_ema_advances_per_step_not_per_logged_line():
    every = DashboardModel()
    every.add_metrics([rec(i, 10.0 if i <= 10 else 2.0) for i in range(1, 101)])
    sparse = DashboardModel()  # an attached view reading metrics.jsonl written every 10 steps
    sparse.add_metrics([rec(i, 10.0 if i <= 10 else 2.0) for i in [1] + list(range(10, 101, 10))])
    # after 90 steps at loss 2.0 the per-step EMA is 2 + 8 * 0.9**90 = 2.0006: both views agree on it
    assert every.state().loss_ema == pytest.approx(2.0 + 8 * 0.9 ** 90)
    assert sparse.state().loss_ema == pytest.approx(2.0 + 8 * 0.9 ** 90)
    assert sparse.state().series["loss_ema"][1][1] == pytest.approx(10.0)  # step 10: still 10
    assert sparse.state().series["loss_ema"][1][2] == pytest.approx(2.0 + 8 * 0.9 ** 10)  # step 20: 4.79


def test_eta_only_while_training_and_sparse_val_and_real_tau_keys():
    m = DashboardModel(total_steps=100)
    m.add_metrics([rec(5, 3.0, st=1.0), rec(10, 2.5, st=1.0, val_acc=0.4, val_sim_tau=2.25, real_tau=1.75),
                   rec(15, 2.4, st=1.0)])
    s = m.state(phase="training")
    assert s.eta_text == "~0h01m25s" and "ETA" in s.summary_line()
    assert s.val_sim_tau == 2.25 and s.real_tau == 1.75  # sparse keys: the latest value stays shown
    assert s.series["real_tau"] == ([10], [1.75]) and s.series["val_sim_tau"] == ([10], [2.25])
    for phase in ("idle", "paused", "stopped", "finished"):
        assert m.state(phase=phase).eta_text == "-" and "ETA" not in m.state(phase=phase).summary_line()
    from widgets.html import header_html

    h = header_html(s)
    assert 'class="dfl-real-tau" title="real speculative decoding" data-value="1.75"' in h and "dfl-val-sim-tau" in h
    m.add_metrics([rec(20, 2.3, tau_gap={"step": 20, "sim_tau": 3.5, "real_tau": 1.75})])
    assert m.state().warning == "tau gap at step 20: simulated and real tau part ways (sim_tau 3.50, real_tau 1.75)"
    assert "dfl-warning" in header_html(m.state()).split("dfl-message-line")[1]


# -- attach: following files ----------------------------------------------------------------------------------------
def test_run_dir_states_from_what_the_run_records(tmp_path):
    """summary.json is checked against the target; events.jsonl gives stops, divergence and tau_gap warnings."""
    from widgets.runstate import run_dir_state
    from widgets.sources import RunDirSource

    (tmp_path / "config.json").write_text(json.dumps({"steps": 400}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(rec(i, 3.0)) + "\n" for i in range(10, 111, 10)))
    (tmp_path / "system.jsonl").write_text(json.dumps({"time": 1.0, "host": {"cpu_pct": 50.0}, "gpus": [],
                                                       "no_gpu": True}) + "\n")
    src, m = RunDirSource(tmp_path), DashboardModel()
    assert src.poll(m)["phase"] == "training"  # files just written: the writer is alive
    newest = max((tmp_path / f).stat().st_mtime for f in ("metrics.jsonl", "system.jsonl"))  # 25 s after the last
    assert run_dir_state(tmp_path, step=110, total=400, now=newest + 25).detail.startswith(
        "at step 110 of 400: the writer is gone (no file written for 25 s)")  # no lock to ask: the files' age
    from dflash_lab.runs import lock as run_lock

    run_lock.acquire(tmp_path, log=lambda *a: None)  # from here on a live writer holds the run's lock
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "tau_gap", "step": 100, "message": "sim tau 4.1 vs real tau 2.0"}) + "\n")
        f.write(json.dumps({"event": "stop_requested", "step": 110}) + "\n")
    info = src.poll(m)
    assert (info["phase"], info["phase_detail"]) == ("stopped", "at step 110 of 400")
    assert m.state(**info).warning == "sim tau 4.1 vs real tau 2.0"
    with open(tmp_path / "system.jsonl", "a") as f:  # a sample after the end: the readings stay frozen
        f.write(json.dumps({"time": 2.0, "host": {"cpu_pct": 99.0}, "gpus": [], "no_gpu": True}) + "\n")
    src.poll(m)
    assert m.state(phase="stopped").host["cpu_pct"] == 50.0 and m.state(phase="stopped").eta_text == "-"
    run_lock.release(tmp_path)
    # an old-style summary that says "finished" at 110/400 is shown as what it is
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "steps": 110, "target_steps": 400}))
    assert src.poll(m)["phase"] == "stopped"
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "steps": 400, "target_steps": 400}))
    assert src.poll(m)["phase"] == "finished"
    (tmp_path / "summary.json").write_text(json.dumps({"status": "diverged", "steps": 57, "diverged_at": 57}))
    info = src.poll(m)
    assert info["phase"] == "failed" and info["phase_detail"] == "diverged at step 57"


def test_the_run_lock_decides_whether_the_writer_lives(tmp_path):
    """Fresh files do not make a dead run "training" (Ctrl-C a few seconds ago), nor quiet files a live one gone
    (a slow step): whoever holds run.lock is the writer."""
    from dflash_lab.runs import lock as run_lock
    from widgets.runstate import run_dir_state

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(rec(i, 3.0)) + "\n" for i in range(10, 56, 5)))
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "start", "step": 0}) + "\n")
    run_lock.acquire(tmp_path, log=lambda *a: None)
    try:
        quiet = run_dir_state(tmp_path, step=55, total=400, now=time.time() + 600)  # 10 minutes without a write
        assert (quiet.phase, quiet.detail) == ("training", f"following {tmp_path.name}")
    finally:
        run_lock.release(tmp_path)
    fresh = run_dir_state(tmp_path, step=55, total=400)  # written a moment ago, but nobody holds the lock
    assert (fresh.phase, fresh.detail) == (
        "stopped", "at step 55 of 400: the writer is gone (its process has exited (run.lock released)) without "
                   "summary.json")


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


def test_mode_detection_outside_a_kernel(monkeypatch):
    from widgets.env import dashboard_mode, headless_tool_in_ancestry

    monkeypatch.delenv("DFLASH_DASHBOARD", raising=False)
    assert dashboard_mode() == ("static", "not running in a Jupyter kernel")
    assert headless_tool_in_ancestry() is None  # pytest is not papermill
    monkeypatch.setenv("DFLASH_DASHBOARD", "live")
    assert dashboard_mode()[0] == "live"
    monkeypatch.setenv("DFLASH_DASHBOARD", "fancy")
    with pytest.raises(ValueError, match="DFLASH_DASHBOARD='fancy'"):
        dashboard_mode()


# -- a real Trainer on the embedded tiny target ---------------------------------------------------------------------
SMALL = dict(target="tiny", data="tiny", seq_len=128, batch_size=4, block_size=8, num_anchors=12, num_draft_layers=2,
             lr=3e-3, steps=400, log_every=1)


def _until(cond, timeout=300.0, what=""):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """TrainingView(config) in live mode: builds the Trainer on a background thread (widgets without a frontend)."""
    from dflash_lab import TrainConfig
    from widgets import TrainingView

    cfg = TrainConfig(**SMALL, runs_dir=str(tmp_path_factory.mktemp("runs")))
    view = TrainingView(cfg, mode="live", log=lambda *a: None)
    trainer = view.wait_trainer(timeout=300)
    yield view, trainer
    view.close()
    trainer.close()


def test_built_in_the_background_with_replica_progress_and_system_jsonl(live):
    view, trainer = live
    assert view.trainer is trainer and trainer.phase == "ready"
    rows = replica_rows(view.builder.replica_progress())
    assert rows and rows[0]["label"] == "replica 0 (cpu)" and rows[0]["fraction"] == 1.0
    assert view.monitor.running and view.monitor.jsonl_path == trainer.run_dir / "system.jsonl"
    _until(lambda: (trainer.run_dir / "system.jsonl").is_file(), 10, "system.jsonl in the run dir")
    # the dashboard's view of the monitor lags by one sampling period (slow on a loaded CI machine): wait for it
    _until(lambda: view.state().gpu_status.startswith("no NVIDIA GPU"), 10, "a system sample in the dashboard")
    s = view.state()
    assert s.phase == "ready" and s.step == 0 and s.gpu_status.startswith("no NVIDIA GPU")


def test_controls_run_pause_lr_checkpoint_stop_step_on_a_real_trainer(live):
    view, trainer = live
    c = view.controls
    assert c.run() == "training to step 400"
    _until(lambda: trainer.step_count >= 3, 60, "3 steps")
    assert c.run() == "already training" and "loop is running" in c.step_n(2)  # never a second loop
    c.pause()
    _until(lambda: trainer.phase == "paused", 30, "the loop to pause")
    paused_at = trainer.step_count
    time.sleep(1.0)
    assert trainer.step_count == paused_at
    assert view.state().phase_text.startswith(f"paused: at step {paused_at}")
    assert view.state().eta_text == "-"  # no ETA while paused
    from dflash_lab.runs import rundir

    events = rundir.read_jsonl(trainer.run_dir / rundir.EVENTS_FILE)
    assert [e["step"] for e in events if e.get("event") == "paused"] == [paused_at]  # where it paused, not the click
    # Checkpoint now acts while paused (the paused loop writes it), without Run
    assert "written now" in c.checkpoint()
    _until(lambda: trainer.last_checkpoint_step == paused_at, 30, "the checkpoint written while paused")
    from dflash_lab.runs.checkpoint import DRAFTER_FILE

    assert (trainer.last_checkpoint / DRAFTER_FILE).is_file() and trainer.step_count == paused_at
    view.state()  # a refresh reports it
    assert c.message.startswith(f"checkpoint written at step {paused_at}")
    # Step N while paused: the paused loop takes N steps and stays paused
    assert c.step_n(3) == f"stepping 3 while paused (from step {paused_at})"
    # Checkpoint now while those steps run: not "the loop is paused" (it is stepping)
    assert "the loop is taking Step N's steps" in c.checkpoint()
    _until(lambda: trainer.step_count == paused_at + 3 and trainer.phase == "paused", 60, "3 steps while paused")
    time.sleep(0.5)
    assert trainer.step_count == paused_at + 3 and c.loop_active()
    paused_at += 3
    assert "ignored" in c.set_lr(-1.0) and trainer.controls.new_lr is None
    c.set_lr(1e-4)
    assert c.run() == "resumed"
    _until(lambda: trainer.step_count >= paused_at + 2, 60, "steps after resume")
    assert trainer.last_metrics["lr"] == 1e-4
    c.stop()
    c.join(60)
    assert trainer.phase == "stopped" and not c.loop_active()
    stopped_at = trainer.step_count
    assert trainer.last_checkpoint_step == stopped_at
    assert [m.step for m in view.state().markers if m.kind == "stop"] == [stopped_at]  # the marker where it stopped
    # After Stop, a later cell's step()/train() (Run All) does not train on without a checkpoint
    trainer.step(5)
    trainer.train()
    assert trainer.step_count == stopped_at and trainer.phase == "stopped"
    # Checkpoint now while idle writes at once (a background thread); it is already there for this step
    c.checkpoint()
    c.join(60)
    assert trainer.last_checkpoint_step == stopped_at and c.error is None
    c.step_n(2)  # Step N after Stop: asked for explicitly, so it runs
    c.join(60)
    assert trainer.step_count == stopped_at + 2 and c.error is None
    view.refresh()  # one refresh of the real widgets (no frontend attached)
    s = view.live.state
    assert s.step == trainer.step_count and s.phase == "idle"
    assert f'<span class="dfl-step">{trainer.step_count}</span>' in view.live.header.value
    loss_x = list(view.live.fig.data[0].x)
    assert loss_x == [float(i) for i in range(1, trainer.step_count + 1)]
    assert view.live.fig.data[0].y[-1] == pytest.approx(trainer.last_metrics["loss"])


def test_attached_view_follows_the_run_dir_and_stops_it_with_a_stop_file(live):
    from widgets import AttachedView

    view, trainer = live
    att = AttachedView(trainer.run_dir, mode="static")
    s = att.state()
    assert s.step == trainer.step_count and s.total_steps == 400  # metrics.jsonl (log_every=1) + config.json
    assert s.loss == pytest.approx(trainer.last_metrics["loss"]) and s.gpu_status.startswith("no NVIDIA GPU")
    before = s.step
    assert view.controls.run().startswith("training to step")
    _until(lambda: att.state().step >= before + 2, 60, "the attached view to see new steps")
    att.source.request_stop()  # what the attached dashboard's Stop button does
    view.controls.join(60)
    assert trainer.phase == "stopped" and (trainer.run_dir / "STOP.done").is_file()
    s = att.state()
    assert s.step == trainer.step_count and s.phase == "stopped" and s.eta_text == "-"  # events.jsonl: stop_requested
    from widgets.runstate import run_dir_state

    # the writer's process gone (files silent for 60 s) before finish(): stopped, never "finished"
    gone = run_dir_state(trainer.run_dir, step=s.step, total=400, now=time.time() + 60)
    assert gone.phase == "stopped" and gone.detail.startswith(f"at step {s.step} of 400")
    summary = trainer.finish()  # summary.json says stopped: the attached view says so too, with the step of 400
    assert summary["status"] == "stopped (resumable)"
    s = AttachedView(trainer.run_dir, mode="static").state()
    assert s.phase == "stopped" and s.phase_detail.startswith(f"at step {trainer.step_count} of 400")


def test_a_diverging_run_shows_failed_with_the_error(live):
    """Last user of the shared trainer: an absurd LR from the dashboard makes the loss non-finite for real (1e30:
    weights that large overflow fp32 in the first norm; at 1e6 the norms can keep a CPU run finite for 20 steps)."""
    view, trainer = live
    c = view.controls
    c.set_lr(1e30)
    c.step_n(20)
    c.join(120)
    assert trainer.diverged_at is not None, "lr=1e30 should make the loss non-finite within 20 steps"
    s = view.state()
    assert s.phase_text == f"failed: diverged at step {trainer.diverged_at}"
    assert s.error.startswith("TrainingDiverged: training stopped: loss=")
    view.refresh()
    assert "dfl-error" in view.live.header.value and "#cf222e" in view.live.header.value


# -- headless: papermill runs explore.ipynb; the saved notebook holds a PNG and no widget state ---------------------
def test_headless_explore_notebook_has_png_and_no_widget_state(tmp_path):
    import nbformat
    import papermill

    out = tmp_path / "explore.out.ipynb"
    papermill.execute_notebook(str(ROOT / "notebooks" / "explore.ipynb"), str(out), cwd=str(tmp_path),
                               parameters={"steps": 6, "log_every": 2, "seq_len": 128, "block_size": 8,
                                           "num_anchors": 12, "num_draft_layers": 2, "hand_steps": 2,
                                           "runs_dir": str(tmp_path / "runs")},  # "runs" = <project>/runs
                               progress_bar=False, kernel_name="python3")
    nb = nbformat.read(out, as_version=4)
    raw = out.read_text()
    assert "widgets" not in nb.metadata and "application/vnd.jupyter.widget" not in raw
    view_cell = next(c for c in nb.cells if c.cell_type == "code" and "TrainingView(config" in c.source)
    images = [o for o in view_cell.outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(images) == 1  # rewritten in place (display_id), never appended
    png = base64.b64decode(images[0].data["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    train_cell = next(c for c in nb.cells if c.cell_type == "code" and "view.callback" in c.source)
    assert any("step 6/6" in o.get("text", "") for o in train_cell.outputs)  # the compact progress line
    inspect_cell = next(c for c in nb.cells if c.cell_type == "code" and "SampleView(" in c.source)
    assert "class='dfi'" in inspect_cell.outputs[0].data["text/html"]  # the token-level view of the last batch
    run_dir = next((tmp_path / "runs").iterdir())
    system = [json.loads(x) for x in (run_dir / "system.jsonl").read_text().splitlines()]
    assert system and system[0]["no_gpu"] is True
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[:4] == [1, 2, 4, 6]
    summary = json.loads((run_dir / "summary.json").read_text())  # the finish cell: the run is complete
    assert summary["status"] == "finished" and summary["steps"] == 8  # 6 trained + 2 by hand


def test_model_side_imports_without_jupyter_packages():
    """widgets.overhead / model / sources / controls run on GPU servers without ipywidgets, plotly or IPython."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('ipywidgets', 'plotly', 'anywidget', 'IPython'): sys.modules[m] = None\n"
            "import widgets, widgets.overhead, widgets.model, widgets.sources, widgets.controls, widgets.builder\n"
            "assert widgets.DashboardModel is widgets.model.DashboardModel\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_attached_view_skips_and_counts_garbage_metric_lines(tmp_path):
    """A metrics file with a bare number, null, a string, a step "abc" and a step past the configured steps: the
    dashboard draws the good rows only and says how many lines it skipped."""
    from widgets.model import DashboardModel
    from widgets.sources import RunDirSource

    (tmp_path / "config.json").write_text(json.dumps({"steps": 4}))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n123\nnull\n"text"\n'
                                            '{"step": "abc", "loss": 1.0}\n{"step": 2, "loss": 1.5}\n'
                                            '{"step": 402, "loss": 1.0}\n')
    follower = JsonlFollower(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in follower.read_new()] == [1, "abc", 2, 402] and follower.bad_lines == 3
    model = DashboardModel()
    RunDirSource(tmp_path).poll(model)
    assert model.last_step == 2 and "5 line(s) of metrics.jsonl skipped" in model.warning


def test_checkpoint_now_says_when_it_will_be_written_in_each_state_of_the_loop():
    """Paused and idle: now; paused but taking Step N's steps: after them; Pause clicked but the loop still in its
    step (phase training, no steps asked): at the boundary where it pauses, not "taking Step N's steps"."""
    import threading
    from types import SimpleNamespace

    from widgets.controls import TrainingControls

    def said(phase, pause, paused_steps):
        ctl = SimpleNamespace(pause=threading.Event(), paused_steps=paused_steps, checkpoint=threading.Event(),
                              request_checkpoint=lambda: None)
        if pause:
            ctl.pause.set()
        trainer = SimpleNamespace(controls=ctl, step_count=12, phase=phase, loops_running=1)
        return TrainingControls(trainer).checkpoint()

    assert said("paused", True, 0) == "checkpoint requested at step 12 (written now (the loop is paused))"
    assert said("paused", True, 3).endswith("(written at the next step boundary (the loop is taking Step N's steps))")
    assert said("training", True, 0) == "checkpoint requested at step 12 (written at the next step boundary)"
    assert said("training", False, 0) == "checkpoint requested at step 12 (written at the next step boundary)"
