"""The data-scaling workflow on the tiny target: nested subsets, the planned points (matched steps / epochs /
depth), every point trained and evaluated in its own process, and the table and curves read back from scaling.json."""

import json
from pathlib import Path

import pytest

from dflash_lab.config import ConfigError
from dflash_lab.workflows.scaling import (ScalingConfig, final_eval, plan_points, run_scaling, schedule_order,
                                         write_subsets)
from dflash_lab.workflows.scaling_report import load_results, markdown_table, rows, save_curves
from dflash_lab.tiny import tiny_data_path, tiny_heldout_path

BASE = {"block_size": 4, "num_anchors": 8, "seq_len": 96, "batch_size": 4, "num_draft_layers": 1, "lr": 3e-3,
        "log_every": 1, "val_every": 0, "real_tau_every": 0}


def _cfg(tmp_path, **kw):
    fields = dict(target="tiny", pool=str(tiny_data_path()), heldout_data=str(tiny_heldout_path()),
                  prompt_sets={"tiny-heldout": str(tiny_heldout_path())}, sizes=(40, 400), matched_steps=3,
                  matched_epochs=None, extra_depths=(), base=BASE, block_sizes=(4,), eval_new_tokens=8,
                  eval_prompts=2, eval_dtype="float32", out=str(tmp_path / "scaling"))
    return ScalingConfig(**{**fields, **kw})


def test_subsets_are_nested_and_points_planned(tmp_path):
    subsets = write_subsets(tiny_data_path(), (10, 100, 1000), tmp_path, seed=0)
    small, mid, big = (subsets[n].read_text().split("\n")[:-1] for n in (10, 100, 1000))
    assert (len(small), len(mid), len(big)) == (10, 100, 1000)
    assert mid[:10] == small and big[:100] == mid  # every larger set holds the smaller ones
    cfg = _cfg(tmp_path, sizes=(40, 400), matched_steps=50, matched_epochs=1.0, min_steps=20, extra_depths=(2,))
    points = plan_points(cfg, {40: subsets[10], 400: subsets[100]})
    got = [(p["series"], p["conversations"], p["steps"], p["depth"]) for p in points]
    # batch 4: one epoch of 40 conversations is 10 steps -> min_steps 20; of 400 it is 100 steps
    assert got == [("steps", 40, 50, 1), ("epochs", 40, 20, 1), ("steps", 400, 50, 1), ("epochs", 400, 100, 1),
                   ("depth", 400, 50, 2)]
    assert [p["epochs"] for p in points] == [5.0, 2.0, 0.5, 1.0, 0.5]
    # variants train at the largest size: their own steps or the matched ones, their overrides in the config
    cfg = _cfg(tmp_path, sizes=(40, 400), matched_steps=50, variants={"lr": {"lr": 1e-2}, "long": {"steps": 120}})
    points = plan_points(cfg, {40: subsets[10], 400: subsets[100]})
    got = [(p["name"], p["conversations"], p["steps"], p["config"].lr) for p in points]
    assert got == [("steps-n40-d1", 40, 50, 3e-3), ("steps-n400-d1", 400, 50, 3e-3),
                   ("variant-lr", 400, 50, 1e-2), ("variant-long", 400, 120, 3e-3)]
    assert schedule_order(points) == [3, 0, 1, 2]  # the longest starts first; ties keep their order


def test_bad_settings_fail_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="matched_steps and matched_epochs are both None"):
        _cfg(tmp_path, matched_steps=None)
    with pytest.raises(ConfigError, match="pool=.*is not a file"):
        _cfg(tmp_path, pool=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="lr"):  # a bad TrainConfig field of the base fails in the parent
        _cfg(tmp_path, base={**BASE, "lr": -1.0})
    with pytest.raises(ConfigError, match="variants="):
        _cfg(tmp_path, variants={"lr": 0.1})
    with pytest.raises(ConfigError, match="lr"):  # a variant's bad override fails in the parent too
        _cfg(tmp_path, variants={"lr": {"lr": 0.0}})
    with pytest.raises(ConfigError, match="fewer than the largest size"):
        write_subsets(tiny_data_path(), (10, 10_000), tmp_path, seed=0)


def test_scaling_runs_every_point_and_reports_tau(tmp_path):
    # a study split over two sessions: one point now, the rest on resume (the finished one kept as it was)
    first = run_scaling(_cfg(tmp_path), poll_s=0.2, only=("steps-n40-d1",))
    assert [p["status"] for p in first["points"]] == ["finished", "not run (only)"], first["points"]
    with pytest.raises(ConfigError, match="names no planned point"):
        run_scaling(_cfg(tmp_path), only=("steps-n41-d1",))
    with pytest.raises(ConfigError, match="another configuration"):
        run_scaling(_cfg(tmp_path, eval_new_tokens=9), resume=True)
    results = run_scaling(_cfg(tmp_path, devices=("cpu", "cpu")), poll_s=0.2, resume=True)  # other slots: same study
    assert [p["status"] for p in results["points"]] == ["finished", "finished"], results["points"]
    assert results["points"][0]["run_dir"] == first["points"][0]["run_dir"]
    saved = load_results(tmp_path / "scaling")
    assert saved["points"][1]["conversations"] == 400 and saved["points"][1]["train"]["status"] == "finished"
    rs = rows(saved)
    assert len(rs) == 2 and all(r["prompt_set"] == "tiny-heldout" and r["prompts"] == 2 for r in rs)
    assert all(1.0 <= r["tau"] <= 4.0 for r in rs)  # block size 4: at most 3 drafted + 1
    table = markdown_table(saved, "b4-t0")
    assert "steps-n40-d1" in table and "steps-n400-d1" in table
    png = save_curves(saved, tmp_path / "curves.png", "b4-t0")
    assert png.stat().st_size > 5_000
    point = json.loads((Path(saved["points"][0]["run_dir"]) / "scaling_point.json").read_text())
    fig = point["evals"]["b4-t0"]["tiny-heldout"]
    assert fig["batch"] == 2 and fig["tau_low"] is None  # 2 prompts: no interval
    assert len(fig["prompt_set_sha256"]) == 64
    assert saved["best"] in ("steps-n40-d1", "steps-n400-d1")
    # the batch-1 evaluation of the best point: the same tau as its batched one (fp32, same prompts), a speedup,
    # the lossless verdicts, and T=1; kept in scaling.json
    final = final_eval(tmp_path / "scaling", n_prompts=2, new_tokens=8, dtype="float32", sampled_sets=("tiny-heldout",))
    best = next(p for p in saved["points"] if p["name"] == saved["best"])
    t0 = final["evals"]["t0"]["tiny-heldout"]
    assert t0["tau"] == pytest.approx(best["evals"]["b4-t0"]["tiny-heldout"]["tau"], abs=1e-3)
    assert t0["identical_to_target"] == 2 and t0["speedup"] > 0
    assert 1.0 <= final["evals"]["t1"]["tiny-heldout"]["tau"] <= 4.0
    assert load_results(tmp_path / "scaling")["final"]["point"] == saved["best"]
    with pytest.raises(ConfigError, match="sampled_sets=.'general'. are not prompt sets"):
        final_eval(tmp_path / "scaling", sampled_sets=("general",))
    with pytest.raises(ConfigError, match="no finished point named 'nope'"):
        final_eval(tmp_path / "scaling", name="nope")
    # a call's time limit killed the study after a point's training and during its evaluation: resumed, it is
    # evaluated in the same run dir with the same drafter, not trained again
    study, run_dir = tmp_path / "scaling" / "scaling.json", Path(saved["points"][1]["run_dir"])
    cut = json.loads(study.read_text())
    cut["points"][1]["status"] = "running"
    study.write_text(json.dumps(cut))
    point = json.loads((run_dir / "scaling_point.json").read_text())
    evals = point.pop("evals")
    (run_dir / "scaling_point.json").write_text(json.dumps(point))
    drafter = run_dir / "checkpoints" / "drafter.safetensors"
    written = drafter.stat().st_mtime_ns
    again = run_scaling(_cfg(tmp_path), poll_s=0.2, resume=True)
    assert [p["status"] for p in again["points"]] == ["finished", "finished"]
    assert again["points"][1]["run_dir"] == str(run_dir) and drafter.stat().st_mtime_ns == written
    keys = ("tau", "tau_low", "tau_high", "prompt_set_sha256")
    same = lambda e: {k: e["b4-t0"]["tiny-heldout"][k] for k in keys}  # noqa: E731
    assert same(again["points"][1]["evals"]) == same(evals)  # the same drafter on the same prompts


def test_the_scaling_notebook_renders_a_study(tmp_path):
    """notebooks/scaling.ipynb reads only scaling.json: executed headless it shows the table and the curves."""
    from dflash_lab.runs.notebook_exec import execute

    state = run_scaling(_cfg(tmp_path, sizes=(40,)), poll_s=0.2)
    assert state["points"][0]["status"] == "finished", state["points"][0]
    results = tmp_path / "scaling" / "scaling.json"
    out = tmp_path / "scaling-executed.ipynb"
    execute(Path(__file__).resolve().parents[1] / "notebooks" / "scaling.ipynb", out,
            parameters={"results": str(results), "eval_keys": ["b4-t0"], "figures_dir": str(tmp_path / "figs")},
            cwd=tmp_path)
    text = out.read_text()
    assert "steps-n40-d1" in text and "tau tiny-heldout" in text and text.count('"image/png"') == 3
    assert all((tmp_path / "figs" / f"{n}.png").stat().st_size > 5_000 for n in ("curves", "steps", "training"))


def test_the_matched_epochs_line_ends_at_the_point_it_shares_with_matched_steps():
    """plan_points trains the largest size once when both series give it the same steps: the epochs curve must
    still end there, and only at the same epochs (a matched-steps point at other epochs is not on that line)."""
    from dflash_lab.workflows.scaling_report import _shared_largest

    def r(series, n, epochs, s="general"):
        return {"series": series, "conversations": n, "epochs": epochs, "prompt_set": s, "tau": 2.0}

    steps = [r("steps", 3000, 16.0), r("steps", 100000, 0.48), r("steps", 100000, 0.48, s="other")]
    epochs = [r("epochs", 3000, 1.067), r("epochs", 30000, 0.48)]
    assert _shared_largest(steps + epochs, "general", epochs) == [steps[1]]
    assert _shared_largest(steps + epochs, "general", [r("epochs", 30000, 1.92)]) == []  # other epochs
    assert _shared_largest(steps + epochs, "general", []) == []
    assert _shared_largest(steps + epochs + [r("epochs", 100000, 0.48)], "general",
                           epochs + [r("epochs", 100000, 0.48)]) == []  # the series has its own largest point


def test_the_steps_lever_keeps_only_points_that_change_the_steps(tmp_path):
    """steps_rows: the largest size at the base depth, the matched-steps point and the "more steps" variants; a
    learning-rate variant, a deeper drafter and a smaller size are other levers and stay out."""
    from dflash_lab.workflows.scaling_report import save_steps, steps_rows

    def point(name, series, n, steps, depth=3, overrides=None, tau=2.0, prompt_set="general"):
        fig = {"tau": tau, "tau_low": tau - 0.1, "tau_high": tau + 0.1, "prompts": 64}
        return {"name": name, "series": series, "conversations": n, "steps": steps, "epochs": 1.0, "depth": depth,
                "overrides": overrides or {}, "evals": {"b16-t0": {prompt_set: fig}}}

    study = {"points": [point("steps-n10-d3", "steps", 10, 1500), point("steps-n100-d3", "steps", 100, 1500, tau=2.0),
                        point("depth-n100-d5", "depth", 100, 1500, depth=5),
                        point("variant-lr", "variant", 100, 1500, overrides={"lr": 1e-3}),
                        point("variant-long", "variant", 100, 6000, overrides={"steps": 6000}, tau=2.5),
                        point("variant-long-first", "variant", 100, 3000, overrides={"steps": 3000},
                              prompt_set="general (first 64)")]}
    got = [(r["point"], r["steps"], r["prompt_set"], r["tau"]) for r in steps_rows(study)]
    assert got == [("steps-n100-d3", 1500, "general", 2.0), ("variant-long-first", 3000, "general (first 64)", 2.0),
                   ("variant-long", 6000, "general", 2.5)]
    assert save_steps(study, tmp_path / "steps.png").stat().st_size > 5_000  # one panel, two lines


def test_a_point_stopped_by_the_time_limit_resumes_from_its_checkpoint(tmp_path):
    """stop_after_s: the running point stops at a step boundary with a checkpoint ("stopped (resumable)", no
    evaluation); resumed, it continues from that step in the same run dir to its steps, joins its curves, and is
    evaluated."""
    cfg = _cfg(tmp_path, sizes=(40,), matched_steps=60)
    first = run_scaling(cfg, poll_s=0.2, stop_after_s=0.1)  # STOP is there before its first step (loading takes s)
    row = first["points"][0]
    assert row["status"] == "stopped (resumable)", row
    assert row["train"]["steps_done"] == 0 and row["train"]["status"] == "stopped" and "evals" not in row
    assert list(Path(row["run_dir"], "checkpoints").glob("step-*"))
    again = run_scaling(cfg, poll_s=0.2, resume=True)
    row2 = again["points"][0]
    assert row2["status"] == "finished" and row2["run_dir"] == row["run_dir"]
    assert row2["train"]["steps_done"] == 60 and row2["train"]["status"] == "finished"
    steps = [r["step"] for r in row2["train"]["loss_curve"]]
    assert steps == sorted(set(steps)) and steps[-1] == 60
    log = Path(row["run_dir"], "scaling.log").read_text()
    assert "resuming from" in log and "training from step 0 to 60" in log  # one log, both calls
    assert 1.0 <= row2["evals"]["b4-t0"]["tiny-heldout"]["tau"] <= 4.0


def test_resume_refuses_a_regenerated_pool_before_touching_the_subsets(tmp_path):
    """The pool is compared by content: the same path holding other conversations would give the finished points
    and the rest two different pools. The refusal names both sha256 and comes before a subset is rewritten."""
    pool = tmp_path / "pool.jsonl"
    pool.write_text(Path(tiny_data_path()).read_text())
    cfg = _cfg(tmp_path, pool=str(pool))
    state = run_scaling(cfg, only=(), log=lambda *a: None)  # plans and writes the study, trains nothing
    assert [p["status"] for p in state["points"]] == ["not run (only)"] * 2 and len(state["pool_sha256"]) == 64
    subset = tmp_path / "scaling" / "data" / "train-40.jsonl"
    before = subset.read_bytes()
    lines = pool.read_text().split("\n")
    pool.write_text("\n".join(lines[1:] + lines[:1]))  # regenerated: the same conversations in another order
    with pytest.raises(ConfigError) as e:
        run_scaling(cfg, resume=True, log=lambda *a: None)
    msg = str(e.value)
    assert f"sha256 {state['pool_sha256']} then" in msg and "Fix:" in msg
    from dflash_lab.workflows.scaling_plan import pool_sha256
    assert f"{pool_sha256(pool)} now" in msg
    assert subset.read_bytes() == before  # the finished points' data is left as it was


def test_subsets_split_records_at_newlines_only(tmp_path):
    """U+2028 / U+2029 / U+0085 inside a JSON string are legal raw (json.dumps(ensure_ascii=False) writes them so):
    a record holding them is one line of the subset, not three torn ones."""
    odd = [{"messages": [{"role": "user", "content": f"a\u2028b\u2029c\u0085d {i}"},
                         {"role": "assistant", "content": "ok"}]} for i in range(5)]
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in odd), encoding="utf-8")
    subsets = write_subsets(pool, (3, 5), tmp_path / "data", seed=0)
    got = [json.loads(line) for line in subsets[5].read_text(encoding="utf-8").split("\n") if line]
    assert len(got) == 5 and sorted(r["messages"][0]["content"] for r in got) == sorted(
        r["messages"][0]["content"] for r in odd)
    assert len(subsets[3].read_bytes().split(b"\n")) == 3 + 1  # three records, each ending in "\n"


def test_a_cut_off_study_file_is_one_clear_line(tmp_path, capsys):
    from dflash_lab.workflows.scaling import main

    cfg = _cfg(tmp_path)
    run_scaling(cfg, only=(), log=lambda *a: None)
    study = tmp_path / "scaling" / "scaling.json"
    study.write_text(study.read_text()[:200])  # the writer was killed mid-file
    with pytest.raises(ConfigError, match=r"scaling\.json cannot be read \(JSONDecodeError.*Fix: put back"):
        run_scaling(cfg, resume=True, log=lambda *a: None)
    with pytest.raises(ConfigError, match="scaling.json cannot be read"):
        load_results(tmp_path / "scaling")
    assert main(["--final", str(tmp_path / "scaling")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and str(study) in err
    assert main(["--final", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow  # two Python processes and a point's start: ~7 s on a 2-core CPU
def test_point_processes_die_with_a_killed_study(tmp_path):
    """SIGKILL of the study (a restarted kernel, a device call's time limit): its point process gets SIGTERM from
    the kernel instead of training on and holding its run dir against the resume (killed here as soon as the point
    has started: a point that is still starting up sees that its study is gone and ends too)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from dflash_lab.runs import lock

    cfg_kw = dict(sizes=(40,), matched_steps=100_000)
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_scaling, pathlib; "
              "from dflash_lab.workflows.scaling import run_scaling; "
              f"run_scaling(test_scaling._cfg(pathlib.Path({str(tmp_path)!r}), **{cfg_kw!r}), poll_s=0.1)")
    study = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results, row, deadline = tmp_path / "scaling" / "scaling.json", {}, time.monotonic() + 600  # hang bounds only
    while time.monotonic() < deadline and "pid" not in row:
        time.sleep(0.05)
        try:
            row = json.loads(results.read_text())["points"][0]
        except (OSError, ValueError, KeyError):
            pass
    try:
        assert row.get("status") == "running" and _alive(row["pid"]), row
        study.kill()
        study.wait()
        gone = time.monotonic() + 120
        while time.monotonic() < gone and _alive(row["pid"]):
            time.sleep(0.05)
        assert not _alive(row["pid"]), "the point process outlived its study"
        assert not lock.is_held(Path(row["run_dir"]) / lock.LOCK_FILE)  # a resume can take the run dir over
    finally:
        study.kill()
        if row.get("pid") and _alive(row["pid"]):
            os.kill(row["pid"], signal.SIGKILL)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a container's init may reap late)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False



@pytest.mark.slow  # one point trained to its budget (8 s on the shared 2-core machine)
def test_a_per_point_training_budget_in_base_stops_the_point_resumably(tmp_path):
    """base's time_budget_s reaches each point's TrainConfig: a point that spends it stops at a step boundary with a
    checkpoint, recorded as "stopped (resumable)" (a resume continues it, as after stop_after_s)."""
    cfg = _cfg(tmp_path, sizes=(40,), matched_steps=100_000, base={**BASE, "time_budget_s": 1.0})
    row = run_scaling(cfg, poll_s=0.2, log=lambda *a: None)["points"][0]
    assert row["status"] == "stopped (resumable)", row
    assert 0 <= row["train"]["steps_done"] < 100_000 and "evals" not in row
    assert json.loads(Path(row["run_dir"], "config.json").read_text())["time_budget_s"] == 1.0
    assert list(Path(row["run_dir"], "checkpoints").glob("step-*"))
