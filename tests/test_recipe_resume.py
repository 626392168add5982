"""A recipe longer than one job (dflash_lab/workflows/recipe_reuse.py, recipe.py, the "long" preset of
recipe_config.py) on the tiny target: a recipe whose training stops on its time budget skips evaluation and export
saying how to continue; run again with the same work_dir it reuses every data phase (files untouched, figures
kept), resumes the same run to its last step, and its loss curve equals an uninterrupted recipe's number for number;
a third run reuses the finished run. A changed data setting redoes the data it touches and trains a new run; an
output cut short is made again. The presets and how the notebook's explicit parameters win over them."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_lab.config import ConfigError
from dflash_lab.train import stopping
from dflash_lab.train import trainer as trainer_module
from dflash_lab.workflows.recipe import CONTINUE, Recipe, RecipeConfig
from dflash_lab.workflows.recipe_config import PRESETS
from tests.test_recipe import PHASES, TINY_SIZES

pytest.importorskip("chitchat_dataset", reason="the recipe's human prompts come from the chitchat-dataset wheel")

DATA_PHASES = ["self_prompts", "build_data", "regenerate", "mix_data"]
STEPS = 8
BUDGET_S = 35.0  # 10 s of simulated wall time per step (the clock below): spent after step 4 of 8
SELF = dict(n_self=24, self_heldout=3, self_heldout_fraction=0.3, eval_block_sizes=(8,), eval_temperatures=(0.0,),
            eval_untrained=False)
MARKS = ("reused", "made_by_run", "earlier_run", "earlier_settings_differ")


def _config(work_dir: Path, **changes) -> RecipeConfig:
    return RecipeConfig(**{**TINY_SIZES, **SELF, "steps": STEPS, "work_dir": str(work_dir), **changes})


def _run(config: RecipeConfig, phases=PHASES) -> tuple[dict, list[str]]:
    """results.json's phases (and the run's start, as "started") after `phases`, and every line logged."""
    said: list[str] = []
    rec = Recipe(config, log=lambda *a: said.append(" ".join(map(str, a))))
    for phase in phases:
        getattr(rec, phase)()
    results = json.loads((Path(config.work_dir) / "results.json").read_text())
    return {**results["phases"], "started": results["started"]}, said


def _losses(figures: dict) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in figures["curve"]}


def _stamps(figures: dict) -> dict[str, int]:
    return {p: Path(p).stat().st_mtime_ns for p in figures["files"]}


def _without_marks(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if k not in MARKS}


def _still_call_clock(mp) -> None:
    """The call's clock stands still (recipe_clock.now): the call's seconds left are what a test sets with
    `clock.started`, not what a loaded machine took to run the phases before (a 5 s slack was not enough)."""
    from dflash_lab.workflows import recipe_clock

    mp.setattr(recipe_clock, "now", lambda: 0.0)


def _ten_seconds_a_step(mp, seconds: float = 10.0) -> None:
    """The training budget's clock moves 10 s (`seconds`) per step started on the device, and nothing else."""
    clock = {"t": 0.0}
    plain_launch = trainer_module.launch

    def launch(trainer, index):
        clock["t"] += seconds
        return plain_launch(trainer, index)

    mp.setattr(stopping, "now", lambda: clock["t"])
    mp.setattr(trainer_module, "launch", launch)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """An uninterrupted recipe, then the same recipe with a training budget over three jobs in one work_dir."""
    root = tmp_path_factory.mktemp("resume")
    reference, _ = _run(_config(root / "straight"))
    with pytest.MonkeyPatch.context() as mp:
        _ten_seconds_a_step(mp)
        cfg = _config(root / "work", train_time_budget_s=BUDGET_S)
        first, said_first = _run(cfg)
        stamps = {ph: _stamps(first[ph]) for ph in DATA_PHASES}
        second, said_second = _run(cfg)
        third, said_third = _run(cfg)  # everything is there: a rerun of a complete recipe
    return dict(root=root, reference=reference, first=first, second=second, third=third, stamps=stamps,
                said=(said_first, said_second, said_third))


def test_a_recipe_stopped_on_its_budget_skips_evaluation_and_export_and_says_how_to_continue(jobs):
    first, said = jobs["first"], jobs["said"][0]
    tr = first["train"]
    assert (tr["status"], tr["steps"], tr["target_steps"], tr["resumed_at"]) == ("stopped (resumable)", 4, STEPS, None)
    assert sorted(_losses(tr)) == [1, 2, 3, 4]
    for phase in ("evaluate", "export"):
        assert "stopped (resumable) at step 4 of 8" in first[phase]["skipped_because"]
        assert CONTINUE in first[phase]["skipped_because"] and "rows" not in first[phase]
    assert any(CONTINUE in line and line.startswith("[recipe] train: stopped (resumable)") for line in said)
    assert not any(first[ph].get("reused") for ph in DATA_PHASES)  # the first job made everything


def test_the_rerun_reuses_every_data_phase_without_touching_its_files(jobs):
    first, second, said = jobs["first"], jobs["second"], jobs["said"][1]
    for phase in DATA_PHASES:
        assert second[phase]["reused"] is True, phase
        assert _without_marks(second[phase]) == _without_marks(first[phase]), phase  # its figures are kept
        assert second[phase]["made_by_run"] == first["started"], phase  # the job that made it
        assert _stamps(second[phase]) == jobs["stamps"][phase], phase  # not one file written again
        assert any(line.startswith(f"[recipe] {phase}: reused") for line in said), phase
    assert len(first["self_prompts"]["files"]) == 3 and len(first["regenerate"]["files"]) == 6  # inputs too
    assert second["mix_data"]["n"] == first["mix_data"]["n"] > 8


def test_the_rerun_resumes_the_same_run_to_its_last_step_with_the_uninterrupted_curve(jobs):
    first, second, reference = jobs["first"]["train"], jobs["second"]["train"], jobs["reference"]["train"]
    assert second["run_dir"] == first["run_dir"]
    assert (second["status"], second["steps"], second["resumed_at"]) == ("finished", STEPS, 4)
    assert len(list((jobs["root"] / "work" / "runs").iterdir())) == 1  # no second run
    assert any(line.startswith("[recipe] train: resuming") for line in jobs["said"][1])
    got, want = _losses(second), _losses(reference)
    assert sorted(got) == list(range(1, STEPS + 1)) == sorted(want)
    assert got == want  # the same numbers: the resume is exact
    assert {k: got[k] for k in (1, 2, 3, 4)} == _losses(first)
    # the finished run is evaluated and exported in the job that finished it
    rows = jobs["second"]["evaluate"]["rows"]
    assert {r["prompt_set"] for r in rows} == {"chitchat-heldout", "self-heldout", "general"}
    assert all(r["prompts"] == 2 for r in rows if r["decoder"] == "trained")
    assert (jobs["root"] / "work" / "export" / "config.json").is_file()


def test_a_third_run_reuses_the_finished_training_run(jobs):
    third, second = jobs["third"], jobs["second"]
    assert third["train"]["reused"] is True and third["train"]["run_dir"] == second["train"]["run_dir"]
    assert _losses(third["train"]) == _losses(second["train"]) and third["train"]["status"] == "finished"
    assert all(third[ph]["reused"] for ph in DATA_PHASES)
    assert any(line.startswith("[recipe] train: reused") for line in jobs["said"][2])
    assert len(list((jobs["root"] / "work" / "runs").iterdir())) == 1
    # evaluated and exported again from the same run: the same greedy decoding, the same tau
    assert [r["tau"] for r in third["evaluate"]["rows"]] == [r["tau"] for r in second["evaluate"]["rows"]]
    assert third["export"]["out"] == second["export"]["out"] and third["export"]["config"] == second["export"]["config"]


def test_another_feature_store_size_continues_the_same_run_and_another_lr_does_not(jobs):
    """The store's size is the machine's (every window on an H200's GPU, some in host memory on an 80 GB card) and
    changes no number the drafter sees: a call on another GPU continues the run; a training setting starts anew."""
    from dflash_lab.config import TrainConfig
    from dflash_lab.runs.listing import run_config
    from dflash_lab.workflows import recipe_reuse

    run = Path(jobs["second"]["train"]["run_dir"])
    saved, _ = run_config(run)
    cfg, said = TrainConfig.from_dict(saved), []
    files = [Path(saved["data"]), Path(saved["heldout_data"])]
    elsewhere = cfg.replace(feature_store_gib=40.0, feature_store_host_gib=48.0, time_budget_s=99.0)
    assert recipe_reuse.run_to_continue(elsewhere, files, said.append) == ("reuse", run) and not said
    assert recipe_reuse.run_to_continue(cfg.replace(lr=cfg.lr * 2), files, said.append) == ("new", None)
    assert said and said[0].endswith("trained other settings: lr")


def test_a_changed_data_setting_redoes_the_data_it_touches_and_trains_a_new_run(tmp_path):
    cfg = RecipeConfig(**{**TINY_SIZES, "n_self": 0, "steps": 2, "work_dir": str(tmp_path / "r")})
    first, _ = _run(cfg, PHASES[:6])
    built = _stamps(first["build_data"])
    second, said = _run(dataclasses.replace(cfg, regen_max_new_tokens=24), PHASES[:6])
    assert second["build_data"]["reused"] is True and _stamps(second["build_data"]) == built  # not its setting
    regen = second["regenerate"]
    assert "reused" not in regen and regen["settings"]["regen_max_new_tokens"] == 24
    assert any("regenerate: made again (settings differ: regen_max_new_tokens 16 -> 24)" in s for s in said)
    assert regen["files"][regen["out"]]["sha256"] != first["regenerate"]["files"][regen["out"]]["sha256"]
    answers = [json.loads(ln) for ln in Path(regen["out"]).read_text().splitlines()]
    per_answer = [sum(a["generation"]["new_tokens"]) for a in answers]  # one count per turn: one turn each here
    assert len(answers) == 8 and 16 < max(per_answer) <= 24  # longer than the old limit allowed
    assert regen["new_tokens"] == sum(per_answer) > first["regenerate"]["new_tokens"]
    assert second["train"]["run_dir"] != first["train"]["run_dir"]  # trained on other data: a new run
    assert second["train"]["status"] == "finished" and len(list((tmp_path / "r" / "runs").iterdir())) == 2
    assert any("a new run: the newest run" in s and "trained on other data" in s for s in said)


def test_an_output_cut_short_is_made_again_and_one_made_again_identically_leaves_its_users_reused(tmp_path):
    cfg = _config(tmp_path / "r")
    first, _ = _run(cfg, PHASES[:5])
    self_out = Path(first["self_prompts"]["out"])
    whole = self_out.read_bytes()
    self_out.write_bytes(whole[: len(whole) // 2])  # a job killed while writing it
    mix_out = Path(first["mix_data"]["out"])
    mix_out.write_bytes(mix_out.read_bytes()[:-40])
    second, said = _run(cfg, PHASES[:5])
    assert "reused" not in second["self_prompts"] and self_out.read_bytes() == whole  # sampled again, the same
    assert any(f"self_prompts: made again ({self_out} has {len(whole) // 2} bytes" in s for s in said)
    assert second["self_prompts"]["train"] == first["self_prompts"]["train"]
    assert second["build_data"]["reused"] is True and second["regenerate"]["reused"] is True
    assert "reused" not in second["mix_data"] and second["mix_data"]["n"] == first["mix_data"]["n"]
    assert second["mix_data"]["files"] == first["mix_data"]["files"]  # the same bytes again
    # a phase with no record of its files (a results.json from before reuse) is made again, never trusted
    results = tmp_path / "r" / "results.json"
    res = json.loads(results.read_text())
    del res["phases"]["build_data"]["files"]
    results.write_text(json.dumps(res))
    third, said = _run(cfg, PHASES[:3])
    assert "reused" not in third["build_data"] and third["self_prompts"]["reused"] is True
    assert any("build_data: made again (the earlier figures do not record" in s for s in said)
    # answers cut short (a job killed while regenerating): the complete records are kept and the rest answered
    regen_out = Path(first["regenerate"]["out"])
    answers = {json.loads(ln)["id"]: json.loads(ln)["messages"] for ln in regen_out.read_text().splitlines()}
    regen_out.write_text("".join(ln + "\n" for ln in regen_out.read_text().splitlines()[:3]))
    fourth, said = _run(cfg, PHASES[:4])
    assert "reused" not in fourth["regenerate"] and any("regenerate: made again" in s for s in said)
    assert fourth["regenerate"]["conversations"] == 5  # only the 5 answers that were cut off are written again
    assert fourth["regenerate"]["new_tokens"] < first["regenerate"]["new_tokens"]
    again = {json.loads(ln)["id"]: json.loads(ln)["messages"] for ln in regen_out.read_text().splitlines()}
    assert len(answers) == 8 and again == answers  # every conversation once, the same greedy answers


def test_evaluate_partial_evaluates_a_stopped_run_instead_of_waiting(tmp_path):
    rec = Recipe(RecipeConfig(**TINY_SIZES, n_self=0, work_dir=str(tmp_path / "r"), evaluate_partial=True),
                 log=lambda *a: None)
    rec.results["phases"]["train"] = {"status": "stopped (resumable)", "steps": 4, "target_steps": 8}
    assert rec._training_unfinished() is None
    said = []
    waits = Recipe(RecipeConfig(**TINY_SIZES, n_self=0, work_dir=str(tmp_path / "r")), log=said.append)
    waits.results["phases"]["train"] = {"status": "stopped (resumable)", "steps": 4, "target_steps": 8}
    assert waits._training_unfinished().startswith("training is stopped (resumable) at step 4 of 8")
    assert CONTINUE in said[-1]


def test_the_long_preset_and_the_parameters_set_by_the_user_on_top():
    assert PRESETS["10min"] == {} and RecipeConfig.from_preset("10min") == RecipeConfig()
    long = RecipeConfig.from_preset("long", device="cuda:0")
    assert (long.n_self, long.feature_store_gib, long.feature_store_host_gib, long.steps, long.batch_size, long.lr,
            long.train_time_budget_s, long.real_tau_every, long.compile_drafter, long.num_draft_layers,
            long.device) == (60_000, 100.0, 48.0, 7_500, 64, 8.5e-4, None, 2_500, True, 5, "cuda:0")
    assert long.call_time_budget_s == 480.0  # each lent 10-minute call: the recipe fits what it does to it
    assert long.steps * long.batch_size == 2.5 * RecipeConfig().steps * RecipeConfig().batch_size  # 2.5x the tokens
    assert dataclasses.replace(long, n_self=26000, feature_store_gib=60.0, feature_store_host_gib=0.0, steps=6000,
                               batch_size=32, lr=6e-4,
                               call_time_budget_s=None, real_tau_every=2000, compile_drafter=False,
                               num_draft_layers=3, device="cpu") == RecipeConfig()  # nothing else differs
    assert long.train_config(Path("d.jsonl")).num_draft_layers == 5
    assert long.train_config(Path("d.jsonl")).time_budget_s is None  # the call's clock sets it at train time
    assert long.train_config(Path("d.jsonl")).feature_store_host_gib == 48.0  # used only where the GPU lacks room
    # from Python every setting passed wins; from the notebook (every parameter passed) only those the user set
    assert RecipeConfig.from_preset("long", steps=9000).steps == 9000
    nb = dict(steps=6000, train_time_budget_s=None, real_tau_every=2000, device="cuda:0")
    from_nb = RecipeConfig.from_preset("long", explicit=("preset", "device", "train_time_budget_s"), **nb)
    assert (from_nb.steps, from_nb.train_time_budget_s, from_nb.real_tau_every) == (7_500, None, 2_500)
    with pytest.raises(ConfigError) as e:
        RecipeConfig.from_preset("1h")
    assert "RecipeConfig.preset='1h' is invalid: unknown preset" in str(e.value) and "'long'" in str(e.value)


@pytest.mark.slow  # a kernel's start (~5 s); it stops in the first call, before anything is written
def test_the_notebook_takes_the_preset_with_the_parameters_set_on_top(tmp_path):
    """`-p preset long -p batch_size 2` on the CPU: the refusal counts 7,500 steps (the preset's) of 2 windows (the
    user's) of 320 tokens, so the notebook passed the preset and only the parameter that was set."""
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-m", "papermill", str(repo / "notebooks" / "recipes" / "smollm2.ipynb"),
                          str(tmp_path / "out.ipynb"), "--cwd", str(tmp_path), "--no-progress-bar", "-p", "preset",
                          "long", "-p", "batch_size", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "allow_cpu_full_size" in out.stderr
    assert f"{7_500 * 2 * 320:,} train tokens" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ipynb"]


def _answers(path) -> dict[str, tuple[float, str]]:
    recs = [json.loads(ln) for ln in Path(path).read_text().splitlines()]
    return {r["id"]: (r["generation"]["temperature"], r["messages"][-1]["content"]) for r in recs}


def test_answers_at_the_serving_temperature_train_and_the_heldout_answers_stay_greedy(tmp_path):
    greedy_cfg = RecipeConfig(**{**TINY_SIZES, "n_self": 0, "steps": 2, "work_dir": str(tmp_path / "r")})
    greedy, _ = _run(greedy_cfg, PHASES[:4])
    before, held_before = _answers(greedy["regenerate"]["out"]), _answers(greedy["regenerate"]["heldout_out"])
    sampled, said = _run(dataclasses.replace(greedy_cfg, regen_temperature=1.0), PHASES[:4])
    regen = sampled["regenerate"]
    assert regen["settings"]["regen_temperature"] == 1.0
    assert any("regenerate: made again (settings differ: regen_temperature 0.0 -> 1.0)" in s for s in said)
    after, held_after = _answers(regen["out"]), _answers(regen["heldout_out"])
    assert set(before) == set(after) and len(after) == 8
    assert {t for t, _ in after.values()} == {1.0} and {t for t, _ in before.values()} == {0.0}
    assert sum(after[i][1] != before[i][1] for i in after) >= 4  # sampled continuations of a tiny target differ
    assert held_after == held_before and {t for t, _ in held_after.values()} == {0.0}
    # seeded per conversation: the same settings answer the same way again
    again, _ = _run(dataclasses.replace(greedy_cfg, regen_temperature=1.0, work_dir=str(tmp_path / "again")),
                    PHASES[:4])
    assert _answers(again["regenerate"]["out"]) == after
    with pytest.raises(ConfigError, match="regen_temperature"):
        dataclasses.replace(greedy_cfg, regen_temperature=-1.0)


def test_a_call_budget_keeps_evaluation_its_time_and_the_next_call_trains(tmp_path, monkeypatch):
    """call_time_budget_s (a lent GPU's call): training gets what the call has left less evaluation's budget and the
    margin, and does not start with less than MIN_TRAIN_S (the data of a long preset's first call took the time);
    the next call in the same work_dir trains with the cut budget and evaluates; evaluation starts no pass once
    the call has less than the margin left."""
    from dflash_lab.workflows.recipe_clock import CALL_MARGIN_S, MIN_TRAIN_S

    _still_call_clock(monkeypatch)
    cfg = _config(tmp_path / "w", call_time_budget_s=400.0, eval_budget_s=180.0)
    said: list[str] = []
    first = Recipe(cfg, log=said.append)
    for phase in PHASES[:5]:  # the model and the data phases
        getattr(first, phase)()
    first.clock.started -= 200.0  # as if the data had taken 200 s of the call: 400 - 200 - 180 - 60 = -40 s to train
    room = first.clock.train_share()[0]
    assert room == 400 - 200 - 180 - CALL_MARGIN_S and room < MIN_TRAIN_S
    tr = first.train()
    assert (tr["status"], tr["steps"], tr["target_steps"]) == ("not started (call budget)", 0, STEPS)
    assert not (tmp_path / "w" / "runs").exists() or not any((tmp_path / "w" / "runs").iterdir())
    for phase in ("evaluate", "export"):
        why = getattr(first, phase)()["skipped_because"]
        assert why.startswith("training is not started (call budget) at step 0 of 8") and CONTINUE in why
        assert "evaluate_partial" not in why  # nothing trained yet: nothing partial to evaluate
    assert any(line.startswith("[recipe] train: not started: ") and "call_time_budget_s=400" in line
               for line in said)
    assert first.training_plot() is None and said[-1].startswith("[recipe] no training curves yet")

    second, said = _run(cfg)  # a fresh call: 400 - 240 s for training, which the tiny run needs a fraction of
    assert all(second[ph].get("reused") for ph in DATA_PHASES)
    assert (second["train"]["status"], second["train"]["steps"]) == ("finished", STEPS)
    budget = json.loads((Path(second["train"]["run_dir"]) / "config.json").read_text())["time_budget_s"]
    # the call's cut, not None: evaluation's 180 s are in it as the budget's reserve (the tiny run finished first)
    assert budget == 400 - CALL_MARGIN_S
    assert second["evaluate"]["rows"] and not second["evaluate"]["skipped"]

    late = Recipe(cfg, log=lambda *a: None)
    for phase in PHASES[:6]:  # everything reused, training too
        getattr(late, phase)()
    late.clock.started -= 400.0 - CALL_MARGIN_S + 10.0  # 50 s of the call left: no evaluation pass starts
    ev = late.evaluate()
    assert ev["rows"] == [] and [(s["block_size"], s["temperature"]) for s in ev["skipped"]] == [(8, 0.0)]


def test_a_stopped_run_the_call_has_no_room_for_waits_with_its_steps_and_curves(tmp_path, monkeypatch):
    """A run stopped on its budget at step 4 of 8, then a call whose clock leaves training no room: the train phase
    says "not started (call budget)" at the run's own step, keeps the run (its curves plot, evaluate_partial could
    evaluate it), and evaluate waits offering evaluate_partial."""
    from dflash_lab.workflows.recipe_clock import CALL_MARGIN_S

    _ten_seconds_a_step(monkeypatch)
    first, _ = _run(_config(tmp_path / "w", train_time_budget_s=BUDGET_S))
    assert (first["train"]["status"], first["train"]["steps"]) == ("stopped (resumable)", 4)

    cfg = _config(tmp_path / "w", train_time_budget_s=BUDGET_S, call_time_budget_s=400.0, eval_budget_s=180.0)
    _still_call_clock(monkeypatch)
    said: list[str] = []
    rec = Recipe(cfg, log=said.append)
    for phase in PHASES[:5]:
        getattr(rec, phase)()
    rec.clock.started -= 400.0 - CALL_MARGIN_S - 30.0  # 90 s left: 30 s for training once the margin is kept
    tr = rec.train()
    assert (tr["status"], tr["steps"], tr["target_steps"]) == ("not started (call budget)", 4, STEPS)
    assert tr["run_dir"] == first["train"]["run_dir"] and rec.training_plot() is not None
    why = rec.evaluate()["skipped_because"]
    assert why.startswith("training is not started (call budget) at step 4 of 8") and "evaluate_partial" in why


def test_a_new_run_that_cannot_finish_in_the_call_trains_through_evaluations_share(tmp_path, monkeypatch):
    """A call leaving a new run 65 s of training and 30 s for evaluation (call_time_budget_s 400, eval_budget_s 30),
    20 s a step started: when step 3 is booked, step 4 has started (80 s) and the 5 steps left need 100 s, more than
    the 15 s the call has, so nothing would be evaluated in this call anyway and training takes evaluation's share:
    it stops at step 5, not 4, and the next call continues there."""
    from dflash_lab.workflows.recipe_clock import CALL_MARGIN_S

    _ten_seconds_a_step(monkeypatch, 20.0)
    _still_call_clock(monkeypatch)
    monkeypatch.setattr(trainer_module.Trainer, "seconds_to_finish",
                        lambda self: 20.0 * (self.config.steps - self.step_count))  # this clock's speed
    cfg = _config(tmp_path / "w", call_time_budget_s=400.0, eval_budget_s=30.0)
    said: list[str] = []
    rec = Recipe(cfg, log=said.append)
    for phase in PHASES[:5]:
        getattr(rec, phase)()
    rec.clock.started -= 400.0 - (65.0 + CALL_MARGIN_S + 30.0)  # 155 s left: 65 s to train, 30 s kept to evaluate
    tr = rec.train()
    assert (tr["status"], tr["steps"]) == ("stopped (resumable)", 5)
    run = Path(tr["run_dir"])
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["reserve_s"], e["finish_s"]) for e in events if e["event"] == "budget_reserve_released"] \
        == [(3, 30.0, 100.0)]
    assert json.loads((run / "config.json").read_text())["time_budget_s"] == 95.0
    assert any("the run cannot finish in this job, so it trains on" in line for line in said)
    assert rec.evaluate()["skipped_because"].startswith("training is stopped (resumable) at step 5 of 8")



def test_the_train_figures_give_this_jobs_steady_rate_and_the_fastest_job_of_the_run(tmp_path):
    """A run over three jobs whose last one was resumed while the feature store refilled (the long preset on
    2026-12-06: ~196k tokens/s there, 366k in the job before): results.json's train phase carries both."""
    from dflash_lab.workflows.recipe_results import train_figures

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"steps": 7_500}))
    (run / "data_report.json").write_text(json.dumps({"records": 10, "kept": 9}))
    (run / "drafter_config.json").write_text(json.dumps({"hidden_size": 576}))
    rows = [{"step": s, "loss": 12.0, "steady_tokens_per_s": r}
            for s, r in ((450, 195_700.0), (3_000, 366_300.0), (6_900, 366_100.0), (7_500, 195_900.0))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = train_figures(run, {"status": "finished", "steps": 7_500, "target_steps": 7_500,
                              "steady_tokens_per_s": 195_900.0}, log=lambda *a: None)
    assert (got["tokens_per_s"], got["tokens_per_s_fastest_job"]) == (195_900.0, 366_300.0)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 3.0}) + "\n")  # never steady: nothing to say
    assert train_figures(run, {"status": "finished", "steps": 5}, log=lambda *a: None)["tokens_per_s_fastest_job"] \
        is None
