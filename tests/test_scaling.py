"""The data-scaling workflow on the tiny target: nested subsets, the planned points (matched steps / epochs /
depth), every point trained and evaluated in its own process, and the table and curves read back from scaling.json."""

import json
from pathlib import Path

import pytest

from dflash_lab.config import ConfigError
from dflash_lab.scaling import ScalingConfig, plan_points, run_scaling, write_subsets
from dflash_lab.scaling_report import load_results, markdown_table, rows, save_curves
from dflash_lab.tiny import tiny_data_path, tiny_heldout_path

BASE = {"block_size": 4, "num_anchors": 8, "seq_len": 96, "batch_size": 4, "num_draft_layers": 1, "lr": 3e-3,
        "log_every": 1, "val_every": 0, "real_tau_every": 0}


def _cfg(tmp_path, **kw):
    fields = dict(target="tiny", pool=str(tiny_data_path()), heldout_data=str(tiny_heldout_path()),
                  prompt_sets={"tiny-heldout": str(tiny_heldout_path())}, sizes=(40, 400), matched_steps=3,
                  matched_epochs=None, extra_depths=(), base=BASE, block_sizes=(4,), eval_new_tokens=8,
                  eval_prompts=2, eval_dtype="float32", sampled_eval=False, out=str(tmp_path / "scaling"))
    return ScalingConfig(**{**fields, **kw})


def test_subsets_are_nested_and_points_planned(tmp_path):
    subsets = write_subsets(tiny_data_path(), (10, 100, 1000), tmp_path, seed=0)
    small, mid, big = ([line for line in subsets[n].read_text().splitlines()] for n in (10, 100, 1000))
    assert (len(small), len(mid), len(big)) == (10, 100, 1000)
    assert mid[:10] == small and big[:100] == mid  # every larger set holds the smaller ones
    cfg = _cfg(tmp_path, sizes=(40, 400), matched_steps=50, matched_epochs=1.0, min_steps=20, extra_depths=(2,))
    points = plan_points(cfg, {40: subsets[10], 400: subsets[100]})
    got = [(p["series"], p["conversations"], p["steps"], p["depth"]) for p in points]
    # batch 4: one epoch of 40 conversations is 10 steps -> min_steps 20; of 400 it is 100 steps
    assert got == [("steps", 40, 50, 1), ("epochs", 40, 20, 1), ("steps", 400, 50, 1), ("epochs", 400, 100, 1),
                   ("depth", 400, 50, 2)]
    assert [p["epochs"] for p in points] == [5.0, 2.0, 0.5, 1.0, 0.5]


def test_bad_settings_fail_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="matched_steps and matched_epochs are both None"):
        _cfg(tmp_path, matched_steps=None)
    with pytest.raises(ConfigError, match="pool=.*is not a file"):
        _cfg(tmp_path, pool=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="lr"):  # a bad TrainConfig field of the base fails in the parent
        _cfg(tmp_path, base={**BASE, "lr": -1.0})
    with pytest.raises(ConfigError, match="fewer than the largest size"):
        write_subsets(tiny_data_path(), (10, 10_000), tmp_path, seed=0)


def test_scaling_runs_every_point_and_reports_tau(tmp_path):
    results = run_scaling(_cfg(tmp_path), poll_s=0.2)
    assert [p["status"] for p in results["points"]] == ["finished", "finished"], results["points"]
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
    assert Path(point["evals"]["b4-t0"]["eval_dir"], "eval.json").is_file()


def test_the_scaling_notebook_renders_a_study(tmp_path):
    """notebooks/scaling.ipynb reads only scaling.json: executed headless it shows the table and the curves."""
    from dflash_lab.runs.notebook_exec import execute

    run_scaling(_cfg(tmp_path, sizes=(40,)), poll_s=0.2)
    results = tmp_path / "scaling" / "scaling.json"
    out = tmp_path / "scaling-executed.ipynb"
    execute(Path(__file__).resolve().parents[1] / "notebooks" / "scaling.ipynb", out,
            parameters={"results": str(results), "eval_keys": ["b4-t0"], "curves_png": str(tmp_path / "c.png")},
            cwd=tmp_path)
    text = out.read_text()
    assert "steps-n40-d1" in text and "tau tiny-heldout" in text and "image/png" in text
    assert (tmp_path / "c.png").stat().st_size > 5_000
