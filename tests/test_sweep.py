"""sweep.py, sweep_results.py, widgets/sweep_grid.py and notebooks/sweep.ipynb: variants validated up front, a real
headless sweep on the tiny target (a failing variant recorded, the rest run), the table ranked by the runs' own
held-out real tau, and a rerun that skips the finished variants."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_lab.config import ConfigError
from dflash_lab.runs.rundir import read_jsonl
from dflash_lab.workflows.sweep import Sweep, SweepConfig, child_env, load_variants, run_sweep
from dflash_lab.workflows.sweep_results import rank_rows, read_sweep, results_table
from widgets.sweep_grid import SweepGrid, SweepGridModel

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "sweep.ipynb"
# Tiny and quick: real tau on 2 prompts x 12 tokens at steps 4 and 8 (each variant ~12 s on 2 CPU cores).
BASE = {"target": "tiny", "data": "tiny", "block_size": 8, "num_anchors": 16, "seq_len": 128, "batch_size": 4,
        "num_draft_layers": 1, "lr": 3e-3, "log_every": 2, "val_every": 4, "val_sequences": 2,
        "real_tau_prompts": 2, "real_tau_new_tokens": 12}
VARIANTS = [{"name": "broken", "target": "/nonexistent/model-dir"},  # first: the sweep must go on after it
            {"name": "lr-1e-3", "lr": 1e-3}, {"name": "gamma-2", "gamma": 2.0}]


def _cfg(tmp_path, **kw):
    return SweepConfig(**{"name": "t", "base": BASE, "variants": VARIANTS, "steps": 8, "real_tau_every": 4,
                          "runs_dir": str(tmp_path / "runs"), **kw})


@pytest.mark.parametrize("variants, words", [
    ([{"name": "ok"}, {"name": "typo", "lrr": 1e-3}], ["#1", "'typo'", "lrr"]),
    ([{"name": "ok"}, {"name": "neg", "lr": -1.0}], ["#1", "'neg'", "lr=-1.0"]),
    ([{"name": "a"}, {"name": "a", "lr": 1e-3}], ["#1", "repeats the name 'a'"]),
    ([{"lr": 1e-3}], ["#0", "'name'"]),
    ([{"name": "bad name!"}], ["#0", "bad name!"]),
    ([{"name": "more", "real_tau_prompts": 4}], ["#0", "'more'", "real_tau_prompts=4", "same held-out prompts"]),
    ([{"name": "gpu", "devices": ["cuda:0"]}], ["#0", "'gpu'", "devices"]),
])
def test_variants_are_validated_before_anything_runs(tmp_path, variants, words):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, variants=variants)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert not (tmp_path / "runs").exists()  # nothing was created


@pytest.mark.parametrize("kw, words", [
    ({"steps": 0}, ["steps=0"]), ({"real_tau_every": -5}, ["real_tau_every=-5"]),
    ({"devices": "cuda:0"}, ["devices='cuda:0'"]), ({"devices": ["gpu1"]}, ["'gpu1'"]),
    ({"base": {**BASE, "steps": 5}}, ["steps=5", "sweep decides"]), ({"variants": []}, ["non-empty"]),
])
def test_sweep_settings_are_validated(tmp_path, kw, words):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, **kw)
    for w in words:
        assert w in str(e.value)


def test_every_variant_gets_the_same_measurement_and_its_own_overrides(tmp_path):
    cfgs = _cfg(tmp_path).train_configs()
    assert list(cfgs) == ["broken", "lr-1e-3", "gamma-2"]
    measured = {(c.steps, c.real_tau_every, c.real_tau_prompts, c.real_tau_new_tokens) for c in cfgs.values()}
    assert measured == {(8, 4, 2, 12)}
    assert cfgs["lr-1e-3"].lr == 1e-3 and cfgs["gamma-2"].lr == 3e-3 and cfgs["gamma-2"].gamma == 2.0
    assert cfgs["gamma-2"].run_name == "t-gamma-2" and cfgs["gamma-2"].devices == ("cpu",)
    assert _cfg(tmp_path, devices=["cuda:3", "cuda:5"]).train_configs()["lr-1e-3"].devices == ("cuda:0",)


def test_each_gpu_slot_is_handed_to_its_process_as_the_only_visible_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("DFLASH_NOTEBOOK_OUTPUT", "/tmp/sweep.ipynb")
    env = child_env("cuda:3")
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and "DFLASH_NOTEBOOK_OUTPUT" not in env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert child_env("cuda:1")["CUDA_VISIBLE_DEVICES"] == "6"
    assert child_env("cpu")["CUDA_VISIBLE_DEVICES"] == "4,6"


def test_load_variants_reads_a_json_list(tmp_path):
    f = tmp_path / "v.json"
    f.write_text(json.dumps(VARIANTS[1:]))
    assert load_variants(str(f), [{"name": "ignored"}]) == VARIANTS[1:]
    assert load_variants("", [{"name": "x"}]) == [{"name": "x"}]
    f.write_text('{"name": "x"}')
    with pytest.raises(ConfigError, match="holds a dict"):
        load_variants(str(f))


def test_ranking_puts_the_best_final_real_tau_first_and_unmeasured_last():
    rows = [{"variant": "a", "final_real_tau": 1.5, "best_real_tau": 1.6, "final_loss": 3.0},
            {"variant": "b", "final_real_tau": None, "best_real_tau": None, "final_loss": None},
            {"variant": "c", "final_real_tau": 2.0, "best_real_tau": 2.0, "final_loss": 4.0},
            {"variant": "d", "final_real_tau": 1.5, "best_real_tau": 1.9, "final_loss": 3.5}]
    ranked = rank_rows(rows)
    assert [r["variant"] for r in ranked] == ["c", "d", "a", "b"]
    assert [r["rank"] for r in ranked] == [1, 2, 3, None]


def test_ranking_marks_variants_whose_intervals_overlap_as_not_separated():
    """c's interval overlaps d's, d's overlaps a's, a's and c's do not: rank 1 is separated from rank 3 only."""
    from dflash_lab.workflows.sweep_results import ResultsTable

    iv = lambda t, lo, hi: {"final_real_tau": t, "final_real_tau_low": lo, "final_real_tau_high": hi,  # noqa: E731
                            "real_tau_prompts": 32, "best_real_tau": t, "final_loss": 1.0}
    rows = [{"variant": "a", **iv(2.0, 1.8, 2.2)}, {"variant": "c", **iv(2.6, 2.35, 2.85)},
            {"variant": "d", **iv(2.3, 2.1, 2.5)}, {"variant": "old", "final_real_tau": 2.9, "best_real_tau": 2.9,
                                                    "final_loss": 1.0}]  # logged before intervals: unknown
    ranked = {r["variant"]: r for r in rank_rows(rows)}
    assert [r["variant"] for r in rank_rows(rows)] == ["old", "c", "d", "a"]
    assert ranked["c"]["not_separated_from"] == ["d"] and ranked["d"]["not_separated_from"] == ["c", "a"]
    assert ranked["a"]["not_separated_from"] == ["d"] and ranked["old"]["not_separated_from"] is None
    md = ResultsTable(rank_rows(rows)).to_markdown()
    assert "| 2 | c | - | 2.600 | [2.35, 2.85] n=32 | no (d) |" in md
    assert "| 1 | old | - | 2.900 | - | - |" in md


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """notebooks/sweep.ipynb under the papermill CLI: 3 variants (one broken), 8 steps, real tau at 4 and 8."""
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "variants.json").write_text(json.dumps(VARIANTS))
    cmd = [sys.executable, "-m", "papermill", str(NOTEBOOK), str(tmp / "out.ipynb"), "--no-progress-bar",
           "--cwd", str(REPO / "notebooks"), "-p", "name", "t", "-p", "steps", "8", "-p", "real_tau_every", "4",
           "-p", "variants_file", str(tmp / "variants.json"), "-p", "runs_dir", str(tmp / "runs"),
           "-y", "base: " + json.dumps(BASE)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (sweep_dir,) = [p for p in (tmp / "runs" / "sweeps").iterdir() if p.is_dir()]  # and t.lock (one run at a time)
    return tmp, sweep_dir


def test_notebook_sweep_records_the_failure_and_ranks_by_the_runs_own_real_tau(executed):
    tmp, sweep_dir = executed
    state = read_sweep(sweep_dir)
    status = {v["name"]: v["status"] for v in state["variants"]}
    assert status == {"broken": "failed", "lr-1e-3": "finished", "gamma-2": "finished"}
    broken = next(v for v in state["variants"] if v["name"] == "broken")
    assert "/nonexistent/model-dir" in broken["error"] and "TargetLoadError" in broken["error"]
    rows = json.loads((sweep_dir / "results.json").read_text())["rows"]
    assert [r["variant"] for r in rows][-1] == "broken" and rows[-1]["rank"] is None
    for r in rows[:2]:  # each value is the run's own metrics.jsonl
        metrics = read_jsonl(Path(r["run_dir"]) / "metrics.jsonl")
        taus = {m["step"]: m["real_tau"] for m in metrics if "real_tau" in m}
        assert sorted(taus) == [4, 8]
        assert r["final_real_tau"] == taus[8] and r["best_real_tau"] == max(taus.values())
        assert r["best_tau_step"] == min(s for s, t in taus.items() if t == max(taus.values()))
        assert r["final_loss"] == [m["loss"] for m in metrics if "loss" in m][-1]
        assert r["val_sim_tau"] == [m["val_sim_tau"] for m in metrics if "val_sim_tau" in m][-1]
        assert r["steps"] == 8 and r["tokens_per_s"] > 0 and r["wall_s"] > 0 and r["supervised_tokens_per_s"] > 0
        assert json.loads((Path(r["run_dir"]) / "config.json").read_text())["real_tau_every"] == 4
    assert rows[0]["final_real_tau"] >= rows[1]["final_real_tau"] and [r["rank"] for r in rows[:2]] == [1, 2]
    csv_lines = (sweep_dir / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("rank,variant,status,final_real_tau") and len(csv_lines) == 4
    # the executed notebook renders on GitHub: an HTML ranked table and a PNG figure, no widget state needed
    nb = json.loads((tmp / "out.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    tables = [o["data"]["text/html"] for o in outputs if "<th>real tau (final)</th>" in "".join(
        o.get("data", {}).get("text/html", ""))]
    assert tables and rows[0]["variant"] in "".join(tables[0])
    assert (sweep_dir / "curves.png").stat().st_size > 1000
    # the grid model reads the same files: both finished variants at 8/8 with their last real tau
    grid = {r["variant"]: r for r in SweepGridModel(sweep_dir).poll()}
    assert grid["lr-1e-3"]["step"] == "8/8" and grid["broken"]["status"] == "failed"
    assert grid["gamma-2"]["real tau"] == next(r for r in rows if r["variant"] == "gamma-2")["final_real_tau"]
    # one tokens/s figure, named the same in both: the grid's "steady tokens/s" is the results table's
    for r in rows[:2]:
        rate, _warming = grid[r["variant"]]["steady tokens/s"]
        assert rate == pytest.approx(r["tokens_per_s"], rel=1e-6), (grid[r["variant"]], r)
    assert "steady tokens/s" in SweepGridModel(sweep_dir).html() and "<th>steady tokens/s</th>" in "".join(tables[0])


def test_results_table_renders_markdown_and_html(executed):
    _, sweep_dir = executed
    table = results_table(sweep_dir)
    md = table.to_markdown().splitlines()
    assert md[0].startswith("| rank | variant |") and len(md) == 2 + 3
    assert "<table>" in table._repr_html_() and "TargetLoadError" in table._repr_html_()


def test_live_grid_overlays_one_trace_per_variant_and_panel(executed):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")
    _, sweep_dir = executed
    grid = SweepGrid(sweep_dir, mode="live")
    grid.refresh()
    assert grid.figure is not None and "<td>lr-1e-3</td>" in grid.table.value
    traces = {(t.name, t.mode): t for t in grid.figure.data}
    rows = {r["variant"]: r for r in json.loads((sweep_dir / "results.json").read_text())["rows"]}
    tau = traces[("gamma-2", "lines+markers")]
    assert list(tau.x) == [4, 8] and tau.y[-1] == rows["gamma-2"]["final_real_tau"]
    assert traces[("lr-1e-3", "lines")].y[-1] == rows["lr-1e-3"]["final_loss"]


def test_rerun_skips_finished_variants_and_retries_the_failed_one(executed):
    tmp, sweep_dir = executed
    before = read_sweep(sweep_dir)
    spec = before["spec"]
    cfg = SweepConfig(**{**spec, "variants": spec["variants"]})
    sweep = run_sweep(cfg, log=lambda *a: None)
    assert sweep.dir == sweep_dir  # the same sweep directory, resumed
    after = {v["name"]: v for v in read_sweep(sweep_dir)["variants"]}
    old = {v["name"]: v for v in before["variants"]}
    for name in ("lr-1e-3", "gamma-2"):
        assert after[name]["skipped"] and after[name]["run_dir"] == old[name]["run_dir"]
    assert after["broken"]["status"] == "failed" and after["broken"]["run_dir"] != old["broken"]["run_dir"]
    runs = [p for p in (tmp / "runs").iterdir() if p.name != "sweeps"]
    assert len(runs) == 4  # 3 first time + the retried broken variant
    assert [r["variant"] for r in sweep.results] == [r["variant"] for r in
                                                     json.loads((sweep_dir / "results.json").read_text())["rows"]]
    # a changed variant is not "the same": resume=True still trains it anew
    changed = SweepConfig(**{**spec, "variants": [{"name": "lr-1e-3", "lr": 2e-3}]})
    assert Sweep(changed, log=lambda *a: None).variant("lr-1e-3")["status"] == "pending"


def test_supervised_rate_leaves_out_the_first_fifth_and_padding():
    from dflash_lab.workflows.sweep_results import supervised_rate

    rows = [{"step": s, "supervised_tokens": 100, "step_time_s": 1.0} for s in range(1, 9)]
    rows[0]["step_time_s"] = 50.0  # the first step (capture, compile) must not drag the rate down
    rows += [{"step": 9, "supervised_tokens": 300, "step_time_s": 1.0}, {"step": 10, "loss": 1.0}]
    # 9 logged rows, the first 9 // 5 = 1 dropped: (7 * 100 + 300) / 8 s
    assert supervised_rate(rows) == 125.0
    assert supervised_rate([{"step": 1, "loss": 2.0}]) is None


# --- nothing lost, nothing mixed, nothing run twice -----------------------------------------------------------------
def _finish(sweep, name, taus, *, dead_from=None):
    """What a variant process leaves when it finishes: a run folder with metrics and summary.json, then the record."""
    from dflash_lab.runs.rundir import new_run_dir

    tc = sweep.configs[name]
    run = new_run_dir(tc.runs_dir, tc.run_name)
    tc.to_json(run / "config.json")
    rows = [{"step": s, "loss": 2.0 / s, "acc": 0.0 if dead_from and s >= dead_from else 0.3,
             "grad_norm": 0.0 if dead_from and s >= dead_from else 1.0, **({"real_tau": t} if t else {})}
            for s, t in taus]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text('{"status": "finished"}')
    sweep.variant(name).update(status="finished", run_dir=str(run), wall_s=1.0)
    sweep.save()
    return run


def test_a_sweep_never_takes_over_the_folder_of_a_sweep_whose_name_ends_like_it(tmp_path):
    other = Sweep(_cfg(tmp_path, name="lr-gamma"), log=lambda *a: None)
    mine = Sweep(_cfg(tmp_path, name="gamma", variants=[{"name": "g2", "gamma": 2.0}]), log=lambda *a: None)
    assert mine.dir != other.dir and mine.dir.name.endswith("Z-gamma")
    assert [v["name"] for v in read_sweep(other.dir)["variants"]] == ["broken", "lr-1e-3", "gamma-2"]


def test_a_rerun_with_fewer_variants_keeps_the_others_and_retrains_one_whose_run_folder_is_gone(tmp_path):
    import shutil

    from dflash_lab.workflows.sweep_results import results

    two = _cfg(tmp_path, variants=VARIANTS[1:])
    first = Sweep(two, log=lambda *a: None)
    _finish(first, "lr-1e-3", [(4, 1.5), (8, 1.8)])
    gone = _finish(first, "gamma-2", [(4, 1.4), (8, 1.6)])
    said = []
    fewer = Sweep(_cfg(tmp_path, variants=VARIANTS[2:]), log=said.append)
    assert fewer.dir == first.dir
    kept = fewer.variant("lr-1e-3")
    assert kept["status"] == "finished" and kept["listed"] is False and kept["overrides"] == {"lr": 1e-3}
    assert any("lr-1e-3 is not among this run's variants: kept" in s for s in said)
    rows = {r["variant"]: r for r in results(fewer.dir)}
    assert rows["lr-1e-3"]["final_real_tau"] == 1.8 and rows["gamma-2"]["final_real_tau"] == 1.6
    assert rows["lr-1e-3"]["rank"] == 1 and json.loads(rows["lr-1e-3"]["overrides"]) == {"lr": 1e-3}
    shutil.rmtree(gone)  # deleted by hand: "finished" without a run is no result
    rows = {r["variant"]: r for r in results(fewer.dir)}
    assert rows["gamma-2"]["status"] == "finished (run folder missing)" and "is gone" in rows["gamma-2"]["warning"]
    assert rows["gamma-2"]["rank"] is None
    again = Sweep(_cfg(tmp_path, variants=VARIANTS[2:]), log=said.append)
    assert again.variant("gamma-2")["status"] == "pending" and any("is gone: training it again" in s for s in said)


def test_a_cut_off_sweep_json_is_named_with_the_fix(tmp_path):
    from dflash_lab.runs.run_files import RunFileError

    sweep = Sweep(_cfg(tmp_path), log=lambda *a: None)
    (sweep.dir / "sweep.json").write_text('{"name": "t", "variants": [')
    with pytest.raises(ConfigError, match=rf"{sweep.dir}/sweep.json cannot be read .* Fix: move .* resume=False"):
        Sweep(_cfg(tmp_path), log=lambda *a: None)
    with pytest.raises(RunFileError, match=rf"{sweep.dir}/sweep.json cannot be read"):
        results_table(sweep.dir)


def test_every_variant_is_scored_on_the_bases_heldout_set(tmp_path):
    from dflash_lab.tiny import tiny_heldout_path

    other = tmp_path / "other.jsonl"
    other.write_text(Path(tiny_heldout_path()).read_text())
    cfgs = _cfg(tmp_path, variants=[{"name": "base"}, {"name": "other-data", "data": str(other)}]).train_configs()
    assert {c.heldout_data for c in cfgs.values()} == {str(tiny_heldout_path())}
    with pytest.raises(ConfigError, match=r"has no held-out set: the sweep ranks .* Fix: set base heldout_data"):
        _cfg(tmp_path, base={**BASE, "data": str(other)})  # no heldout.jsonl next to it


def test_a_dead_run_is_flagged_not_reported_as_a_plain_finish(tmp_path):
    from dflash_lab.workflows.sweep_results import variant_row

    sweep = Sweep(_cfg(tmp_path, variants=[{"name": "hot", "lr": 1e3}]), log=lambda *a: None)
    _finish(sweep, "hot", [(2, None), (4, None), (6, None), (8, 1.0)], dead_from=4)
    row = variant_row(sweep.variant("hot"), {"lr": 1e3})
    assert row["status"] == "finished" and "dead run: grad_norm 0 and accuracy 0 from step 4" in row["warning"]
    assert "WARNING: dead run" in results_table(sweep.dir).to_markdown()


def test_a_killed_variant_is_reported_with_its_signal(tmp_path):
    import os
    import signal

    sweep = Sweep(_cfg(tmp_path, variants=[{"name": "oom"}], steps=5000), log=lambda *a: None)

    def kill(s):  # the out-of-memory killer's way: SIGKILL, no traceback, no error.json
        v = s.variant("oom")
        if v["status"] == "running" and not v.get("killed"):
            os.kill(v["pid"], signal.SIGKILL)
            v["killed"] = True

    sweep.run(callbacks=[kill], poll_s=0.1)
    v = read_sweep(sweep.dir)["variants"][0]
    assert v["status"] == "failed" and v["error"].startswith("killed by SIGKILL (often the out-of-memory killer)")


def test_a_live_stale_variant_is_refused_and_a_killed_sweep_takes_its_child_with_it(tmp_path):
    import os
    import signal
    import time

    from dflash_lab.runs.lock import Busy
    from dflash_lab.runs.rundir import _pid_alive
    from tests.test_rundir import _hold_in_subprocess

    cfg = _cfg(tmp_path, variants=[{"name": "slow"}], steps=5000)
    script = ("import sys; from dflash_lab.workflows.sweep import SweepConfig, run_sweep; "
              f"run_sweep(SweepConfig(**{cfg.spec()!r}), log=lambda *a: None)")
    sweeper = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)})
    child = None
    try:
        deadline = time.monotonic() + 600  # bounds on a hang only: a loaded machine starts processes late
        while child is None and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                (folder,) = (tmp_path / "runs" / "sweeps").glob("*-t")
                child = read_sweep(folder)["variants"][0].get("pid")
            except (ValueError, OSError, IndexError):
                continue
        assert child and _pid_alive(child)
        with pytest.raises(Busy, match=rf"sweep 't' is running in another process \(pid {sweeper.pid} "):
            Sweep(cfg, log=lambda *a: None)  # a second sweep of the name would train the variant again beside it
        os.kill(sweeper.pid, signal.SIGKILL)  # a kernel restart
        sweeper.wait()
        deadline = time.monotonic() + 120
        while _pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(child), "the variant process outlived its killed sweep"
    finally:
        for pid in (sweeper.pid, child):
            if pid and _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    # a variant left "running" whose run folder a live process still holds is never started beside it
    run_dir = Path(read_sweep(folder)["variants"][0]["run_dir"])
    holder, _ = _hold_in_subprocess(run_dir)
    try:
        with pytest.raises(Busy, match=rf"variant 'slow' is still being trained in .* by pid {holder.pid} "):
            Sweep(cfg, log=lambda *a: None)
    finally:
        holder.kill()
        holder.wait()
    assert Sweep(cfg, log=lambda *a: None).variant("slow")["status"] == "pending"  # gone: trained again


@pytest.mark.slow
def test_a_variant_that_spends_its_time_budget_is_resumed_by_the_next_run_of_the_sweep(tmp_path):
    """A real variant process with a budget spent before its first step: it stops with a checkpoint, is recorded
    'stopped (resumable)', and the rerun (another budget: not another variant) resumes it in its own folder."""
    from dflash_lab.runs.listing import run_status

    one = [{"name": "lr-1e-3", "lr": 1e-3}]
    first = run_sweep(_cfg(tmp_path, base={**BASE, "time_budget_s": 0.001}, variants=one), log=lambda *a: None)
    v = first.variant("lr-1e-3")
    run = Path(v["run_dir"])
    assert v["status"] == "stopped (resumable)" and v["error"] is None, v
    assert (run / "checkpoints" / "step-0000000" / "state.json").is_file() and run_status(run) == "stopped (resumable)"
    said = []
    again = Sweep(_cfg(tmp_path, base={**BASE, "time_budget_s": 600.0}, variants=one), log=said.append)
    w = again.variant("lr-1e-3")
    assert again.dir == first.dir and w["status"] == "pending" and w["resume"] and w["run_dir"] == str(run)
    assert any("stopped at its time budget: resuming it in" in s for s in said)


def test_the_static_grid_carries_a_text_form_for_log_output(tmp_path):
    """papermill --log-output prints a display's text/plain: the table as lines, never `<IPython...HTML object>`."""
    sweep = Sweep(_cfg(tmp_path, variants=VARIANTS[1:]), log=lambda *a: None)
    _finish(sweep, "lr-1e-3", [(4, 1.5), (8, 1.8)])
    model = SweepGridModel(sweep.dir)
    model.poll()
    bundle = model.bundle()
    assert bundle["text/html"] == model.html() and "<table>" in bundle["text/html"]
    assert bundle["text/plain"].splitlines() == ["sweep t:", "  lr-1e-3 finished 8/8 | loss 0.2500 | real tau 1.800 | "
                                                 "ETA -", "  gamma-2 pending 0/8 | loss - | real tau - | ETA -"]
