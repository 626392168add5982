"""run_taus.py (compare.ipynb's real-tau table): a damaged eval.json costs only its own rows, with a note naming it."""

import json

from dflash_lab.evaluation.run_taus import run_taus, tau_table
from dflash_lab.runs import rundir


def _eval(run, name, tau, *, sha="s1"):
    (run / "evals" / name).mkdir(parents=True)
    rundir.write_json(run / "evals" / name / "eval.json", {"step": 30, "max_new_tokens": 128, "summary": [
        {"decoder": "trained", "prompt_set": "general", "prompts": 64, "prompt_set_sha256": sha, "block_size": 16,
         "tau": tau, "tau_low": tau - 0.2, "tau_high": tau + 0.2},
        {"decoder": "target only", "prompt_set": "general", "prompts": 64, "block_size": 1, "tau": 1.0}]})
    return run / "evals" / name / "eval.json"


def test_a_cut_off_eval_json_is_skipped_with_a_note_and_the_older_evaluation_shown(tmp_path):
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    _eval(a, "20260101T000000Z-b16-t0-bf16", 2.4)
    newest = _eval(a, "20260102T000000Z-b16-t0-bf16", 2.9)
    newest.write_text(newest.read_text()[:90])  # the evaluation was killed while writing it
    _eval(b, "20260101T000000Z-b16-t0-bf16", 2.5)
    only = _eval(c, "20260101T000000Z-b16-t0-bf16", 3.5)
    d = json.loads(only.read_text())
    d["summary"][0].pop("tau")  # a summary row without its figure
    only.write_text(json.dumps(d))
    notes = []
    rows = run_taus([a, b, c], log=notes.append)
    assert [(r["run"], r["measured"], r["tau"]) for r in rows] == [
        ("a", "evaluation 20260101T000000Z-b16-t0-bf16", 2.4), ("b", "evaluation 20260101T000000Z-b16-t0-bf16", 2.5)]
    assert rows[0]["not_separated_from"] == ["b"]  # 2.4 [2.2, 2.6] and 2.5 [2.3, 2.7] overlap
    assert len(notes) == 2 and str(newest) in notes[0] and "JSONDecodeError" in notes[0]
    assert str(only) in notes[1] and "'tau'" in notes[1]
    frame = tau_table([a, b, c], log=notes.append)
    assert frame["tau"].tolist() == [2.4, 2.5] and len(notes) == 4


def test_one_prompt_figures_are_never_separated_even_with_the_zero_width_interval_an_older_version_wrote(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for run, tau in ((a, 2.40), (b, 2.41)):
        path = _eval(run, "20260101T000000Z-b16-t0-bf16", tau)
        d = json.loads(path.read_text())
        d["summary"][0].update(prompts=1, tau_low=tau, tau_high=tau)  # [2.40, 2.40] and [2.41, 2.41]
        path.write_text(json.dumps(d))
    rows = run_taus([a, b], log=lambda *x: None)
    assert [r["not_separated_from"] for r in rows] == [["b"], ["a"]]
