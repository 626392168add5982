"""GPU time on every metrics row (runs/gpu_time.py), continued across resumed jobs, and the GPU-minutes to a tau that
`runs list`, compare's plot and the recipe's results read from it. Every clock is fed: nothing here depends on the
machine's speed."""

from __future__ import annotations

import itertools
import json

from dflash_lab import TrainConfig
from dflash_lab.runs import listing, plots
from dflash_lab.runs.gpu_time import TrainClock, best_tau, gpu_minutes_to, tau_points


def ticking(step: float):
    """A clock that moves `step` seconds each time it is read."""
    counter = itertools.count()
    return lambda: next(counter) * step


def test_the_clock_counts_devices_times_wall_time_and_continues_a_resumed_run():
    clock = ticking(30.0)
    c = TrainClock(devices=2, clock=clock)  # read once: started at 0
    assert c.fields() == {"train_wall_s": 30.0, "gpu_seconds": 60.0}
    assert c.fields() == {"train_wall_s": 60.0, "gpu_seconds": 120.0}
    later = TrainClock(devices=2, previous=[{"step": 5, "train_wall_s": 60.0}, {"step": 6}], clock=ticking(1.0))
    assert later.fields() == {"train_wall_s": 61.0, "gpu_seconds": 122.0}


def test_a_run_resumed_on_other_devices_keeps_the_earlier_jobs_gpu_seconds_as_logged():
    """60 s on 2 GPUs (120 GPU-s), then resumed on 4: the earlier minute stays 120 GPU-s (it was priced at 4, 240)."""
    earlier = [{"step": 5, "train_wall_s": 60.0, "gpu_seconds": 120.0}]
    c = TrainClock(devices=4, previous=earlier, clock=ticking(10.0))
    assert c.fields() == {"train_wall_s": 70.0, "gpu_seconds": 160.0}
    # rows from before gpu_seconds was logged: their wall time at this job's count, as before
    old = TrainClock(devices=3, previous=[{"step": 5, "train_wall_s": 20.0}], clock=ticking(1.0))
    assert old.fields() == {"train_wall_s": 21.0, "gpu_seconds": 63.0}


def test_minutes_to_a_tau_and_the_best_tau():
    rows = [{"step": 100, "gpu_seconds": 600.0, "real_tau": 2.5}, {"step": 150, "gpu_seconds": 900.0},
            {"step": 200, "gpu_seconds": 1200.0, "real_tau": 3.1}, {"step": 300, "gpu_seconds": 1800.0,
                                                                    "eval_tau": 3.1},
            {"step": 400, "real_tau": 3.5}]  # a row from before GPU time was logged: no cost, not counted
    assert [p["gpu_minutes"] for p in tau_points(rows)] == [10.0, 20.0, 30.0]
    assert gpu_minutes_to(rows, 3.0) == 20.0 and gpu_minutes_to(rows, 2.0) == 10.0 and gpu_minutes_to(rows, 4) is None
    assert best_tau(rows) == {"step": 200, "tau": 3.1, "gpu_minutes": 20.0}  # the earlier of two equal taus


def test_every_row_of_a_run_carries_its_gpu_time_and_runs_list_shows_minutes_to_the_best_tau(tmp_path, capsys):
    from dflash_lab.train.trainer import Trainer

    cfg = TrainConfig(target="tiny", steps=4, seq_len=64, batch_size=2, num_anchors=4, num_draft_layers=1,
                      log_every=1, runs_dir=str(tmp_path), val_every=0, real_tau_every=0)
    t = Trainer(cfg, log=lambda *a: None, clock=ticking(6.0))  # built at 0; each step's row reads it once
    try:
        t.train(progress_every_s=1e9)
        t.finish()
    finally:
        t.close()
    rows = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["gpu_seconds"] for r in rows] == [6.0, 12.0, 18.0, 24.0]  # one CPU device
    # a real tau measured at step 2 (as the validator logs it beside the row's GPU time)
    rows[1]["real_tau"] = 2.75
    (t.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = listing.runs_table([t.run_dir], log=None)
    assert table.iloc[0]["best_tau"] == 2.75 and table.iloc[0]["best_tau_gpu_minutes"] == 0.2
    assert listing.compact_table(table).iloc[0]["best"] == "2.75@0.2"
    assert listing.main(["list", "--runs-dir", str(tmp_path)]) == 0
    assert "2.75@0.2" in capsys.readouterr().out
    image = plots.plot_tau_cost(listing.load_metrics([t.run_dir], log=None))
    assert image.data.startswith(b"\x89PNG")


def test_t1_beside_t0_the_newest_evaluation_of_each_temperature(tmp_path):
    from dflash_lab.runs.evals import temperature_table

    def evaluation(stamp, temperature, tau, decoding="StaticSpeculativeDecoder: graphs"):
        d = tmp_path / "evals" / f"{stamp}-b16-t{temperature:g}-bf16"
        d.mkdir(parents=True)
        rows = [{"decoder": "trained", "prompt_set": "chitchat-heldout", "prompts": 64, "tau": tau, "tau_low": tau - .2,
                 "tau_high": tau + .2, "speedup": 2.0}, {"decoder": "target", "prompt_set": "chitchat-heldout"}]
        (d / "eval.json").write_text(json.dumps({"temperature": temperature, "block_size": 16, "step": 7500,
                                                 "decoding": decoding, "summary": rows}))

    evaluation("20261206T100000Z", 0.0, 3.0)
    evaluation("20261206T110000Z", 0.0, 3.25)  # newer at T=0: replaces the first
    evaluation("20261206T120000Z", 1.0, 1.67, "StaticSpeculativeDecoder: graphs; drafts sampled from the drafter at "
               "T=1.0, each slot independently (speculative sampling against the proposal)")
    (tmp_path / "evals" / "20261206T130000Z-b16-t1-bf16").mkdir()
    (tmp_path / "evals" / "20261206T130000Z-b16-t1-bf16" / "eval.json").write_text('{"temperature": 1')  # cut off
    rows = temperature_table(tmp_path)
    assert [(r["temperature"], r["drafts"], r["tau"]) for r in rows] == [(0.0, "argmax", 3.25), (1.0, "sample", 1.67)]
    # an eval.json that records draft_sampling is read by that field, whatever its `decoding` prose says
    evaluation("20261206T140000Z", 1.0, 1.80, "StaticSpeculativeDecoder: graphs")
    path = tmp_path / "evals" / "20261206T140000Z-b16-t1-bf16" / "eval.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "draft_sampling": "coupled"}))
    rows = temperature_table(tmp_path)
    assert [(r["temperature"], r["drafts"], r["tau"]) for r in rows] == [
        (0.0, "argmax", 3.25), (1.0, "coupled", 1.80), (1.0, "sample", 1.67)]


def test_an_evaluation_knows_what_the_weights_it_measured_cost_to_train(tmp_path):
    from dflash_lab.runs.gpu_time import gpu_seconds_at

    rows = [{"step": 10, "loss": 1.0, "gpu_seconds": 60.0}, {"step": 20, "loss": 1.0, "gpu_seconds": 120.0},
            {"step": 30, "loss": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_seconds_at(tmp_path, 20) == 120.0 and gpu_seconds_at(tmp_path, 25) == 120.0
    assert gpu_seconds_at(tmp_path, 5) is None and gpu_seconds_at(tmp_path, None) is None
    assert gpu_seconds_at(tmp_path / "no-run", 20) is None


def test_the_recipe_results_give_the_gpu_minutes_to_each_tau_it_measured(tmp_path):
    from dflash_lab.workflows.recipe_results import train_figures

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"steps": 7_500}))
    (run / "data_report.json").write_text(json.dumps({"records": 10, "kept": 9}))
    (run / "drafter_config.json").write_text(json.dumps({"hidden_size": 576}))
    rows = [{"step": 2_500, "loss": 2.0, "gpu_seconds": 339.2, "real_tau": 3.22},
            {"step": 5_000, "loss": 1.9, "gpu_seconds": 480.0, "real_tau": 3.57},
            {"step": 7_500, "loss": 1.8, "gpu_seconds": 687.7, "real_tau": 3.70}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = train_figures(run, {"status": "finished", "steps": 7_500}, log=lambda *a: None)
    assert [(p["step"], p["tau"], round(p["gpu_minutes"], 2)) for p in got["time_to_tau"]] == [
        (2_500, 3.22, 5.65), (5_000, 3.57, 8.0), (7_500, 3.70, 11.46)]
    assert got["best_tau"]["step"] == 7_500 and got["curve"][0]["gpu_seconds"] == 339.2
    json.dumps(got)  # results.json holds it as it is
