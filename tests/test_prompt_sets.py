"""Named prompt sets: the shipped general set, the tiny sets, chitchat-heldout and self-heldout resolved to files
(or an error naming the command that makes them), any JSONL file; every set's size and sha256 in the evaluation."""

import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from dflash_lab.data.heldout_overlap import TrainingPrompts
from dflash_lab.evaluation import prompt_sets as ps
from dflash_lab.evaluation.prompts import EvalError, read_prompt_messages

ROOT = Path(__file__).resolve().parent.parent


def test_the_general_set_is_varied_and_shipped_as_package_data():
    rows = [json.loads(line) for line in ps.GENERAL.read_text().splitlines()]
    assert len(rows) >= 64
    cats = Counter(r["category"] for r in rows)
    assert set(cats) == {"question", "instruction", "arithmetic", "code", "advice", "chit-chat", "summary",
                         "multi-step"} and min(cats.values()) >= 8
    texts = [r["prompt"] for r in rows]
    assert len(set(texts)) == len(texts) and len({t.split()[0] for t in texts}) >= 25  # varied openings
    assert len({r["id"] for r in rows}) == len(rows)
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "evaluation/prompt_sets/*.jsonl" in patterns["dflash_lab"]


def test_set_info_is_the_checksum_of_exactly_the_evaluated_prompts(tmp_path):
    info = ps.set_info("general", ps.GENERAL, 64)
    assert (info.prompts, info.file_prompts) == (64, len(read_prompt_messages(ps.GENERAL)))
    assert info.sha256 == ps.prompts_sha256(read_prompt_messages(ps.GENERAL, 64))
    assert ps.set_info("general", ps.GENERAL, 63).sha256 != info.sha256
    # the same prompts in another file format (messages vs prompt) are the same set; another prompt is not
    f = tmp_path / "same.jsonl"
    f.write_text("".join(json.dumps({"messages": m + [{"role": "assistant", "content": "an answer, dropped"}]}) + "\n"
                         for m in read_prompt_messages(ps.GENERAL, 64)))
    assert ps.set_info("mine", f).sha256 == info.sha256
    assert "general: 64 of" in info.text() and info.short in info.text()


def test_a_set_is_its_distinct_prompts_spread_over_the_file_not_the_first_lines(tmp_path):
    """A regenerated held-out file lists the shortest answers first and repeats greetings; a hand-written one is
    grouped by kind. n prompts of a set are its distinct prompts taken evenly over the file."""
    f = tmp_path / "ordered.jsonl"
    lines = ["hello?"] * 6 + [f"short {i}" for i in range(4)] + [f"long question number {i}" for i in range(10)]
    f.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in lines))
    every = [m[0]["content"] for m in read_prompt_messages(f)]
    assert every == ["hello?"] + [f"short {i}" for i in range(4)] + [f"long question number {i}" for i in range(10)]
    picked = [m[0]["content"] for m in read_prompt_messages(f, 5)]
    assert picked == ["hello?", "short 2", "long question number 1", "long question number 4",
                      "long question number 7"]  # indices 0, 3, 6, 9, 12 of the 15 distinct prompts
    info = ps.set_info("ordered", f, 5)
    assert (info.prompts, info.file_prompts) == (5, 15)
    assert info.sha256 == ps.prompts_sha256(read_prompt_messages(f, 5))
    general = read_prompt_messages(ps.GENERAL, 64)  # the last kinds of the shipped set are in its 64 too
    kinds = {json.loads(line)["prompt"]: json.loads(line)["category"] for line in ps.GENERAL.read_text().splitlines()}
    assert Counter(kinds[m[0]["content"]] for m in general)["multi-step"] >= 7


def test_names_resolve_to_files_and_unknown_ones_say_what_exists(tmp_path, monkeypatch):
    from dflash_lab.tiny import tiny_data_path, tiny_heldout_path

    got = ps.resolve_sets(["general", "tiny-heldout", "tiny-train"], "tiny")
    assert got == {"general": ps.GENERAL, "tiny-heldout": Path(tiny_heldout_path()),
                   "tiny-train": Path(tiny_data_path())}
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert ps.resolve_sets({"x": str(mine), "g": "general"}, "tiny") == {"x": mine, "g": ps.GENERAL}
    assert ps.resolve_sets([str(mine), str(mine)], "tiny") == {"mine": mine, "mine'": mine}
    with pytest.raises(EvalError, match=r"nosuch.jsonl does not exist.*general, chitchat-heldout, self-heldout"):
        ps.resolve_sets([str(tmp_path / "nosuch.jsonl")], "tiny")
    # defaults: the tiny target's held-out + train; a real target's held-out JSONL (next to its data) + general
    assert list(ps.resolve_sets(None, "tiny")) == ["heldout", "train"]
    data = tmp_path / "d" / "train.jsonl"
    data.parent.mkdir()
    data.write_text(mine.read_text())
    assert ps.resolve_sets(None, "smollm2-135m-instruct", str(data)) == {"general": ps.GENERAL}
    (data.parent / "heldout.jsonl").write_text(mine.read_text())
    assert ps.resolve_sets(None, "smollm2-135m-instruct", str(data)) == {"heldout": data.parent / "heldout.jsonl",
                                                                         "general": ps.GENERAL}
    assert ps.default_sets("smollm2-135m-instruct", str(data), heldout_data=str(mine))["heldout"] == mine


def test_chitchat_heldout_is_built_into_the_cache_or_names_the_command(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("DFLASH_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # the chitchat wheel is not installed
    with pytest.raises(EvalError, match=r"not built yet .*chitchat-heldout.jsonl.*python -m "
                                        r"dflash_lab.evaluation.prompt_sets build chitchat-heldout"):
        ps.resolve_sets(["chitchat-heldout"], "smollm2-135m-instruct")
    built = tmp_path / "cache" / "prompt_sets" / "chitchat-heldout.jsonl"
    assert ps.chitchat_heldout_path() == built
    built.parent.mkdir(parents=True)
    built.write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": "hey there"}]}) + "\n")
    assert ps.resolve_sets(["chitchat-heldout"], "smollm2-135m-instruct") == {"chitchat-heldout": built}


def test_self_heldout_is_the_training_files_own_then_its_folders_then_runs_datas(tmp_path, monkeypatch):
    """data/self_prompts.py names its held-out file after --out (<stem>.heldout.jsonl): `self-heldout` takes the
    training file's own, else the one beside it, else the one in runs/data/; two in one folder are ambiguous."""
    monkeypatch.setenv("DFLASH_LAB_RUNS", str(tmp_path / "runs"))  # where `runs/` means
    data = tmp_path / "self" / "self.jsonl"
    data.parent.mkdir()
    shared = tmp_path / "runs" / "data" / "other.heldout.jsonl"
    with pytest.raises(EvalError) as e:
        ps.resolve_sets(["self-heldout"], "smollm2-135m-instruct", str(data))
    msg = str(e.value)
    assert f"no *.heldout.jsonl for {data} or in {data.parent} or in {shared.parent}" in msg
    assert "python -m dflash_lab.data.self_prompts --target smollm2-135m-instruct" in msg
    shared.parent.mkdir(parents=True)
    record = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    shared.write_text(record + "\n")
    assert ps.resolve_sets(["self-heldout"], "t", str(data)) == {"self-heldout": shared}
    (data.parent / "b.heldout.jsonl").write_text(record + "\n")  # another run's, beside the training file
    assert ps.resolve_sets(["self-heldout"], "t", str(data)) == {"self-heldout": data.parent / "b.heldout.jsonl"}
    (data.parent / "a.heldout.jsonl").write_text(record + "\n")
    with pytest.raises(EvalError, match=r"'self-heldout' is ambiguous: .* holds 2 held-out files \(a.heldout.jsonl, "
                                        r"b.heldout.jsonl\)\. Fix: pass the one"):
        ps.resolve_sets(["self-heldout"], "t", str(data))
    (data.parent / "self.heldout.jsonl").write_text(record + "\n")  # the training file's own comes first
    assert ps.resolve_sets(["self-heldout"], "t", str(data)) == {"self-heldout": data.parent / "self.heldout.jsonl"}


def test_the_evaluation_reports_each_set_with_its_size_and_checksum(capsys):
    from dflash_lab.evaluation import evaluate as ev
    from tests.test_speculative import tiny_trained_run

    run = tiny_trained_run()
    plan = ev.plan_eval(run, prompts=["general", "tiny-heldout"], n_prompts=3)
    trained = TrainingPrompts.read("tiny")  # the run's training data: its prompts are left out of tiny-heldout
    assert {k: (v.prompts, v.sha256) for k, v in plan.prompt_sets.items()} == {
        "general": (3, ps.set_info("general", ps.GENERAL, 3).sha256),
        "tiny-heldout": (3, ps.set_info("x", ps.named_set_path("tiny-heldout"), 3, train=trained).sha256)}
    assert ev.plan_eval(run).n_prompts == ev.DEFAULT_PROMPTS["tiny"] == 20  # the tiny target stays fast
    report = ev.evaluate(run, prompts=["general"], n_prompts=2, max_new_tokens=6, untrained=False,
                         log=lambda *a: None)
    saved = report.to_dict()
    assert saved["prompt_sets"]["general"]["sha256"] == ps.set_info("g", ps.GENERAL, 2).sha256
    row = next(r for r in saved["summary"] if r["decoder"] == "trained")
    assert row["prompt_set_sha256"] == saved["prompt_sets"]["general"]["sha256"]
    assert row["tau_low"] is None and row["tau_high"] is None  # 2 prompts: too few for an interval
    table = report.table()
    assert f"{row['tau']:.2f} [n/a]" in table
    assert f"prompt set general: 2 of {ps.set_info('g', ps.GENERAL).file_prompts} prompts, sha256 " \
           f"{saved['prompt_sets']['general']['sha256'][:12]}" in table
    assert "none of its prompts in the training data (tiny)" in table
    assert ps.main(["list"]) == 0 and "general: " in capsys.readouterr().out


def test_held_out_sets_leave_out_the_prompts_the_run_trains_on_and_a_given_file_counts_them(tmp_path):
    """15 of tiny-heldout's 100 prompts are first turns of the tiny training data: evaluation leaves them out of
    the held-out set (and says so), evaluates a file given as is with the count beside it, and counts a training
    set as wholly trained on."""
    from dflash_lab.evaluation import evaluate as ev
    from dflash_lab.tiny import tiny_heldout_path
    from tests.test_speculative import tiny_trained_run

    mine = tmp_path / "mine.jsonl"
    mine.write_text(tiny_heldout_path().read_text())
    plan = ev.plan_eval(tiny_trained_run(), prompts={"held": "tiny-heldout", "train": "tiny-train", "mine": mine},
                        n_prompts=None)
    held, train, given = (plan.prompt_sets[k] for k in ("held", "train", "mine"))
    assert (held.file_prompts, held.in_training, held.overlap_removed, held.prompts) == (100, 15, True, 85)
    assert (given.file_prompts, given.in_training, given.overlap_removed, given.prompts) == (100, 15, False, 100)
    assert (train.in_training, train.overlap_removed, train.prompts) == (3200, False, 3200)
    assert "15 of its distinct prompts also in the training data (tiny), left out" in held.text()
    assert "15 of its distinct prompts also in the training data (tiny), evaluated as given" in given.text()
    trained = TrainingPrompts.read("tiny")
    assert not any(trained.has_prompt(m) for m in plan.selections["held"].messages)
    # a file of nothing but training prompts has nothing held out left
    only = tmp_path / "only-heldout.jsonl"
    only.write_text(json.dumps({"prompt": "List 12 months starting from October."}) + "\n")
    with pytest.raises(EvalError, match="also occurs in the training data"):
        ev.plan_eval(tiny_trained_run(), prompts=[only])


def test_chitchat_heldout_is_built_without_the_prompts_of_chitchats_training_split(tmp_path, monkeypatch):
    """The split by conversation id left 71 of the 200 held-out first turns (30 of 159 distinct prompts: "Hello?",
    "hello?", "Hello!", ...) among the training first turns; the set is built without them, and a set built before
    (no such count in its meta) is built again when the wheel is there."""
    pytest.importorskip("chitchat_dataset")
    from dflash_lab.data import real_data

    monkeypatch.setenv("DFLASH_LAB_CACHE", str(tmp_path / "cache"))
    old = ps.chitchat_heldout_path()
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"prompt": "Hello?"}) + "\n")  # an earlier build: no train_overlap_removed
    notes = []
    path = ps.named_set_path("chitchat-heldout", log=notes.append)
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    assert (meta["train_overlap_removed"], meta["lines"]) == (71, 129) and "again" in notes[0]
    split = tmp_path / "split"
    real_data.build_chitchat(split, heldout=ps.CHITCHAT_HELDOUT, install=False, log=lambda *a: None)
    train = TrainingPrompts.read(split / "train-all.jsonl")
    held = read_prompt_messages(path)
    assert len(held) == 129 and not any(train.has_prompt(m) for m in held)
    assert ps.named_set_path("chitchat-heldout") == path and path.stat().st_size > 0  # built once: kept
