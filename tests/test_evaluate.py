"""Evaluation: prompts files (formats, empty, too long), the eval CLI executing notebooks/eval.ipynb into its own
folder per evaluation (eval.json, PNG plots, lossless verdicts), one-line errors, and real tau on held-out prompts
during training (eval_every)."""

import json
from pathlib import Path

import pytest

from dflash_lab.evaluation import evaluate as ev
from dflash_lab.evaluation.speculative import PromptTooLongError
from tests.test_speculative import tiny_models, tiny_trained_run  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


def test_prompt_files_formats_and_errors(tmp_path):
    _, tok, _ = tiny_models()
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "Count from 3 to 9."},
                                          {"role": "assistant", "content": "3, 4, 5, 6, 7, 8, 9."}]}) + "\n\n"
                 + json.dumps({"prompt": "Count from 3 to 9."}) + "\n")
    # the trailing assistant turn is dropped and a bare prompt becomes one user turn: the same prompt, counted once
    (a,) = ev.load_prompts(f, tok)
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"prompt": "Count from 3 to 9."}) + "\n" + json.dumps({"prompt": "Say hi."}) + "\n")
    assert ev.load_prompts(bare, tok)[0] == a
    text = tok.decode(a)
    assert text.endswith("<|im_start|>assistant\n") and "Count from 3 to 9." in text
    assert len(ev.load_prompts(bare, tok, n_prompts=1)) == 1

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ev.EvalError, match="is empty: it holds no prompts"):
        ev.load_prompts(empty, tok)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(ev.EvalError, match=r"bad.jsonl:1: expected"):
        ev.load_prompts(bad, tok)
    with pytest.raises(ev.EvalError, match="does not exist"):
        ev.load_prompts(tmp_path / "missing.jsonl", tok)


def test_prompt_longer_than_the_context_is_reported_with_its_length(tmp_path):
    run = tiny_trained_run()
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "Count from 1 to 199. " * 200}) + "\n"
                    + json.dumps({"prompt": "Count from 3 to 9."}) + "\n")
    with pytest.raises(PromptTooLongError, match=r"long.jsonl prompt 1 \(\d+ tokens\).*context is 1024 positions"):
        ev.evaluate(run, prompts=str(long), max_new_tokens=16, untrained=False, log=lambda *a: None)


def test_eval_cli_writes_each_evaluation_into_its_own_folder(capsys):
    """Two evaluations (block size 8, then 4) land in two folders under <run>/evals/, each with its notebook, JSON and
    plots; neither overwrites the other, and latest_eval() / load_report(run) pick the newer one."""
    from dflash_lab.runs.evals import eval_dirs, latest_eval

    run = tiny_trained_run()
    before = set(eval_dirs(run))
    assert ev.main([str(run), "--n-prompts", "3", "--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert ev.main([str(run), "--n-prompts", "2", "--max-new-tokens", "12", "--block-size", "4",
                    "--no-untrained", "--no-notebook"]) == 0
    out2 = capsys.readouterr().out
    first, second = [d for d in eval_dirs(run) if d not in before]
    assert first.name.endswith("-b8-t0-fp32") and second.name.endswith("-b4-t0-fp32")
    assert f"eval folder: {first}" in out and f"eval folder: {second}" in out2
    # the tau line quotes rows of the table (per prompt set), not a pooled figure that matches no row
    saved = json.loads((first / "eval.json").read_text())
    rows = {(r["decoder"], r["prompt_set"]): r for r in saved["summary"]}
    assert f"trained heldout {rows[('trained', 'heldout')]['tau']:.2f}" in out
    assert set(rows) == {(d, s) for d in ("trained", "untrained", "target only") for s in ("heldout", "train")}
    for (d, s), r in rows.items():
        assert r["prompts"] == 3 and 1.0 <= r["tau"] <= 8.0
        if d != "target only":
            assert r["identical_to_target"] == 3 and r["real_mismatches"] == 0, (d, s)  # lossless at T=0 in fp32
            assert r["speedup"] > 0
    assert {v["verdict"] for v in saved["verdicts"]} == {"identical"} and len(saved["verdicts"]) == 12
    assert rows[("target only", "heldout")]["tau"] == 1.0
    assert len(saved["acceptance"]["trained"]["histogram"]) == 8
    assert len(saved["acceptance"]["trained"]["slot_rate"]) == 7
    assert json.loads((second / "eval.json").read_text())["block_size"] == 4  # the first one is untouched:
    assert saved["block_size"] == 8 and json.loads((first / "eval.json").read_text()) == saved
    for name in ("eval_tau.png", "eval_acceptance.png", "eval_speedup.png"):
        png = first / "plots" / name
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    nb = json.loads((first / "eval.ipynb").read_text())
    # relative to the folder holding the runs folder: the executed notebook names no folder of this machine
    assert nb["metadata"]["papermill"]["parameters"]["run"] == str(run.relative_to(run.parent.parent))
    images = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 3  # static PNGs: the notebook renders on GitHub
    shown = ["".join(o["data"]["text/plain"]) for c in nb["cells"]
             if "".join(c["source"]).startswith("pd.DataFrame(temperature_table")
             for o in c.get("outputs", []) if "text/plain" in o.get("data", {})]
    assert len(shown) == 1 and "temperature" in shown[0] and "heldout" in shown[0]  # T=0 here (T=1 beside it if run)
    assert saved["train_gpu_seconds"] > 0  # what the evaluated weights cost to train, from the run's metrics rows
    assert saved["draft_sampling"] == "argmax"  # recorded, not only said in the `decoding` prose
    assert latest_eval(run) == second / "eval.json" and ev.load_report(run)["block_size"] == 4


def test_expected_errors_are_one_line_and_leave_nothing_behind(tmp_path, capsys):
    """A drafter without its run (no target recorded) and no --target: one line naming the fix, exit code 2, and
    no evaluation folder or notebook written (checked before papermill starts)."""
    import shutil

    run = tiny_trained_run()
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run / "checkpoints" / "drafter.safetensors", bare)
    shutil.copy(run / "drafter_config.json", bare)
    assert ev.main([str(bare / "drafter.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Fix: pass --target" in err, err
    assert ev.main([str(bare / "drafter.safetensors"), "--target", "tiny", "--prompts", str(tmp_path / "no.jsonl")]) == 2
    assert "no.jsonl does not exist" in capsys.readouterr().err
    assert sorted(p.name for p in bare.iterdir()) == ["drafter.safetensors", "drafter_config.json"]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "eval.json").write_text("{}")
    assert ev.main([str(run), "--out", str(tmp_path / "taken")]) == 2
    assert "never overwritten" in capsys.readouterr().err


def test_lossless_verdicts_tell_a_near_tie_from_a_real_mismatch():
    from dflash_lab.evaluation.report import lossless_verdict

    base = {"output_ids": [5, 6, 7, 8], "margins": [3.0, 2.0, 0.25, 1.0], "runner_up": [1, 2, 9, 3]}
    tie = {"output_ids": [5, 6, 9, 4], "margins": [3.0, 2.0, 0.125, 1.0], "runner_up": [1, 2, 7, 3]}
    v = lossless_verdict(tie, base, near_tie_margin=1.0)
    assert v["verdict"] == "numerical near-tie (margin 0.25)" and v["index"] == 2
    assert (v["spec_token"], v["target_token"], v["margin_spec"], v["margin_target"]) == (9, 7, 0.125, 0.25)
    assert lossless_verdict(tie, base, near_tie_margin=1e-3)["verdict"] == "real mismatch (margin 0.125 / 0.25)"
    wrong = {"output_ids": [5, 6, 4, 4], "margins": [3.0, 2.0, 0.125, 1.0], "runner_up": [1, 2, 7, 3]}
    assert lossless_verdict(wrong, base, 1.0)["verdict"].startswith("real mismatch")  # 4 is not target's runner-up
    assert lossless_verdict(base, base, 1.0) == {"verdict": "identical", "index": None}
    assert lossless_verdict({**base, "output_ids": [5, 6]}, base, 1.0)["verdict"].startswith("real mismatch")


def test_heldout_tau_is_logged_every_eval_every_steps():
    run = tiny_trained_run()  # trained with eval_every=10, steps=20
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    taus = {r["step"]: r["eval_tau"] for r in rows if "eval_tau" in r}
    assert sorted(taus) == [10, 20]
    assert all(1.0 <= t <= 8.0 for t in taus.values())
    target, tok, drafter = tiny_models()
    tau = ev.heldout_tau((target, drafter, tok), block_size=8, max_new_tokens=32, n_prompts=4)
    assert 1.0 <= tau <= 8.0


def test_an_exported_folder_is_written_into_only_with_out(tmp_path):
    """Evaluating a serving folder puts the evaluation under runs/exports/<name>/evals/ unless --out names a folder."""
    from dflash_lab.evaluation.export import export_drafter

    exported = export_drafter(tiny_trained_run(), tmp_path / "serve", log=lambda *a: None)
    plan = ev.plan_eval(exported, target="tiny")
    from dflash_lab.runs.rundir import resolve_runs_dir

    assert plan.out_dir.parent == resolve_runs_dir("runs") / "exports" / "serve" / "evals"  # tests: $DFLASH_LAB_RUNS
    assert plan.out_dir.name.endswith("-b8-t0-fp32") and not plan.out_dir.exists()
    assert ev.plan_eval(exported, target="tiny", out_dir=exported / "my-eval").out_dir == exported / "my-eval"
    assert ev.plan_eval(exported, target="tiny", dtype="bfloat16", block_size=4).out_dir.name.endswith("-b4-t0-bf16")


def test_compare_decodes_other_runs_beside_the_trained_one_with_one_baseline():
    """An A/B in one evaluation: the compared run's rows equal evaluating it alone (same prompts and seed, T=0), and
    the target alone decodes once. Compared with itself under another name it must read the very same tau."""
    run = tiny_trained_run()
    kw = dict(prompts={"tiny-heldout": "tiny-heldout"}, n_prompts=2, max_new_tokens=16, device="cpu",
              untrained=False, log=lambda *a: None)
    alone = {r["decoder"]: r for r in ev.evaluate(run, **kw).rows()}
    both = {r["decoder"]: r for r in ev.evaluate(run, compare={"again": run}, **kw).rows()}
    assert set(both) == {"trained", "again", "target only"}
    assert both["again"]["tau"] == both["trained"]["tau"] == alone["trained"]["tau"] > 1.0
    with pytest.raises(ev.EvalError, match="is taken"):
        ev.evaluate(run, compare={"trained": run}, **kw)


def test_compared_drafters_decode_at_their_own_block_size_unless_one_is_set(tmp_path):
    """A drafter of block 4 compared beside one of block 8 drafts blocks of 4 (rows, acceptance histogram and the
    tau of evaluating it alone at 4); a block size that is set applies to all; one larger than a compared drafter's
    is refused with the fix. Without the baseline nothing decodes the target alone and no speedup is claimed."""
    import shutil

    run8 = tiny_trained_run()
    run4 = Path(shutil.copytree(run8, tmp_path / "b4"))
    for name in ("drafter_config.json", "config.json"):  # the same weights, drafting blocks of 4
        cfg = json.loads((run4 / name).read_text())
        cfg["block_size"] = 4
        (run4 / name).write_text(json.dumps(cfg))
    kw = dict(prompts={"tiny-heldout": "tiny-heldout"}, n_prompts=2, max_new_tokens=16, device="cpu",
              untrained=False, log=lambda *a: None)
    rep = ev.evaluate(run8, compare={"b4": run4}, **kw)
    rows = {r["decoder"]: r for r in rep.rows()}
    assert (rows["trained"]["block_size"], rows["b4"]["block_size"], rows["target only"]["block_size"]) == (8, 4, 1)
    assert len(rep.acceptance("b4")[0]) == 4 and len(rep.acceptance("trained")[0]) == 8
    at4 = {r["decoder"]: r for r in ev.evaluate(run8, block_size=4, **kw).rows()}
    assert rows["b4"]["tau"] == at4["trained"]["tau"] > 1.0
    assert ev.EvalReport.from_dict(json.loads(json.dumps(rep.to_dict()))).rows() == rep.rows()
    both4 = {r["decoder"]: r for r in ev.evaluate(run8, block_size=4, compare={"b4": run4}, **kw).rows()}
    assert both4["b4"]["block_size"] == both4["trained"]["block_size"] == 4
    assert both4["b4"]["tau"] == both4["trained"]["tau"]
    with pytest.raises(ev.EvalError, match=r"drafts blocks of 4, fewer than block_size=8. Fix: leave block_size"):
        ev.evaluate(run8, block_size=8, compare={"b4": run4}, **kw)
    alone = ev.evaluate(run8, compare={"b4": run4}, baseline=False, **kw)
    assert sorted(alone.results) == ["b4", "trained"]
    assert [r["speedup"] for r in alone.rows()] == [None, None]
    assert [r["tau"] for r in alone.rows()] == [rows["trained"]["tau"], rows["b4"]["tau"]]


def test_a_time_budget_keeps_whole_prompts_and_describes_the_cut_sets_by_them(monkeypatch):
    """A deadline stops before a prompt that would end past it (judged by the longest so far); the cut set is then
    described by exactly the prompts decoded (count and sha256 of that prefix), a set never reached is dropped, and
    the report says why. The clock is virtual (10 s per trained decode) so the cut falls at the same prompt on any
    machine; the decoding is real."""
    import types

    from dflash_lab.evaluation import measure
    from dflash_lab.evaluation.prompt_sets import prompts_sha256
    from dflash_lab.evaluation.prompts import load_prompts
    from dflash_lab.evaluation.report import EvalReport
    from dflash_lab.evaluation.static_decode import make_decoder

    run = tiny_trained_run()
    target, tok, drafter = tiny_models()
    plan = ev.plan_eval(run, prompts={"tiny-heldout": "tiny-heldout", "tiny-train": "tiny-train"}, n_prompts=3,
                        device="cpu")
    sets = {s: load_prompts(f, tok, messages=plan.selections[s].messages) for s, f in plan.prompt_files.items()}
    decoders = {name: make_decoder(target, d, block_size=8 if d is not None else 1, eos_token_id=tok.eos_token_id)
                for name, d in (("target only", None), ("trained", drafter))}
    clock = types.SimpleNamespace(now=0.0)
    real = decoders["trained"].generate

    def generate(*a, **kw):
        clock.now += 10.0
        return real(*a, **kw)

    monkeypatch.setattr(decoders["trained"], "generate", generate)
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    said = []
    # warm-up: 10 s; prompt 1 starts at 10 and takes 10; prompt 2 starts at 20 (20 + 10 <= 35); prompt 3 would
    # start at 30 and end at 40 > 35: not started
    results = measure.run_decoders(target, decoders, sets, max_new_tokens=12, temperature=0.0, log=said.append,
                                   progress_every_s=1e9, deadline=35.0)
    assert {n: {s: len(r) for s, r in per.items()} for n, per in results.items()} == \
        {n: {"tiny-heldout": 2, "tiny-train": 0} for n in decoders}
    assert said == ["eval stopped by its time budget after 2 of 6 prompts: the next one would end 5 s past it "
                    "(the longest so far took 10.0 s)"]
    kept, infos, cut = measure.cut_to_measured(results, plan.selections, plan.prompt_sets)
    assert cut == {"tiny-heldout": (2, 3), "tiny-train": (0, 3)} and list(infos) == ["tiny-heldout"]
    assert kept == {n: {"tiny-heldout": results[n]["tiny-heldout"]} for n in decoders}
    info, planned = infos["tiny-heldout"], plan.prompt_sets["tiny-heldout"]
    assert (info.prompts, planned.prompts, info.file_prompts) == (2, 3, planned.file_prompts)
    assert info.sha256 == prompts_sha256(plan.selections["tiny-heldout"].messages[:2]) != planned.sha256
    rep = EvalReport(run_dir=str(run), weights="", step=20, target="tiny", block_size=8, temperature=0.0,
                     max_new_tokens=12, results=kept, prompt_sets={"tiny-heldout": info.to_dict()},
                     stopped="stopped by its time budget of 35 s: tiny-heldout 2 of 3 prompts")
    assert [r["prompts"] for r in rep.rows()] == [2, 2]
    assert rep.table().endswith("NOTE: stopped by its time budget of 35 s: tiny-heldout 2 of 3 prompts")
    assert EvalReport.from_dict(rep.to_dict()).stopped == rep.stopped
    coupled = EvalReport.from_dict({**rep.to_dict(), "temperature": 1.0, "draft_sampling": "coupled"})
    assert coupled.draft_sampling == "coupled" and coupled.to_dict()["draft_sampling"] == "coupled"
    old = {k: v for k, v in rep.to_dict().items() if k != "draft_sampling"}  # an eval.json older than the field
    prose = "X: graphs; drafts sampled from the drafter at T=1.0, from one shared uniform (speculative sampling ...)"
    assert EvalReport.from_dict({**old, "decoding": prose}).draft_sampling == "coupled"


def test_a_time_budget_spent_before_the_first_prompt_is_one_error_with_the_fix(capsys):
    with pytest.raises(ev.EvalError, match=r"time_budget_s=1e-06 was spent before the first prompt .* Fix: a larger"):
        ev.evaluate(tiny_trained_run(), prompts="tiny-heldout", n_prompts=2, max_new_tokens=8, device="cpu",
                    untrained=False, time_budget_s=1e-6, log=lambda *a: None)
    with pytest.raises(ev.EvalError, match=r"time_budget_s=0 must be > 0 seconds"):
        ev.evaluate(tiny_trained_run(), time_budget_s=0, log=lambda *a: None)
    with pytest.raises(SystemExit):
        ev.main([str(tiny_trained_run()), "--time-budget-s", "-3", "--no-notebook"])
    assert "'-3' is not a number of seconds above 0" in capsys.readouterr().err


def test_a_temperature_that_is_no_number_is_one_line_and_writes_nothing(capsys):
    """nan and inf were accepted and written as a measurement (tau 1.00); now one error line, exit 2, and no new
    evaluation folder. (1e-40 is T -> 0: greedy, test_speculative covers every decoder.)"""
    run = tiny_trained_run()
    before = sorted((run / "evals").iterdir()) if (run / "evals").is_dir() else []
    for t in ("nan", "inf", "-1"):
        assert ev.main([str(run), "--temperature", t, "--n-prompts", "1", "--no-notebook"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: temperature={float(t)} must be") and err.count("\n") == 0, err
    after = sorted((run / "evals").iterdir()) if (run / "evals").is_dir() else []
    assert after == before


@pytest.mark.parametrize("line,words", [
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "not UTF-8 text"),
    (b'{"messages": ["hello"]}', "message 0 is not an object with a string 'role'"),
    (b'{"messages": [{"role": "user"}]}', "message 0 (user) has no 'content'"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]}',
     "content part of type 'image_url'"),
    (b'{"messages": [{"role": "narrator", "content": "hi"}]}', "message 0 has role 'narrator'"),
])
def test_a_bad_prompt_record_is_one_line_naming_the_file_and_line(tmp_path, capsys, line, words):
    """A prompts file whose third line is bad: one error line naming FILE:3 and what is wrong, exit 2, nothing
    written (each was a raw traceback naming no file or line, and an unknown role was accepted)."""
    run = tiny_trained_run()
    prompts = tmp_path / "mine.jsonl"
    good = b'{"messages": [{"role": "user", "content": "Count to 5."}]}\n'
    prompts.write_bytes(good + good.replace(b"5", b"7") + line + b"\n")
    before = sorted((run / "evals").iterdir()) if (run / "evals").is_dir() else []
    assert ev.main([str(run), "--prompts", str(prompts), "--no-notebook", "--no-untrained"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {prompts}:3: ") and words in err and err.count("\n") == 0, err
    assert (sorted((run / "evals").iterdir()) if (run / "evals").is_dir() else []) == before
