"""Evaluation: prompts files (formats, empty, too long), the eval CLI executing notebooks/eval.ipynb into the run dir
(eval.json, PNG plots, lossless column), and real tau on held-out prompts during training (eval_every)."""

import json

import pytest

from dflash_lab import evaluate as ev
from dflash_lab.speculative import PromptTooLongError
from tests.test_speculative import one_thread, tiny_models, tiny_trained_run  # noqa: F401 (autouse fixture)


def test_prompt_files_formats_and_errors(tmp_path):
    _, tok, _ = tiny_models()
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "Count from 3 to 9."},
                                          {"role": "assistant", "content": "3, 4, 5, 6, 7, 8, 9."}]}) + "\n\n"
                 + json.dumps({"prompt": "Count from 3 to 9."}) + "\n")
    a, b = ev.load_prompts(f, tok)
    assert a == b  # the trailing assistant turn is dropped; a bare prompt becomes one user turn
    text = tok.decode(a)
    assert text.endswith("<|im_start|>assistant\n") and "Count from 3 to 9." in text
    assert len(ev.load_prompts(f, tok, n_prompts=1)) == 1

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


def test_eval_cli_runs_the_notebook_into_the_run_dir(capsys):
    run = tiny_trained_run()
    rc = ev.main([str(run), "--n-prompts", "3", "--max-new-tokens", "24"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"eval notebook: {run / 'eval.ipynb'}" in out
    assert "tau trained" in out and "untrained" in out

    saved = json.loads((run / "eval.json").read_text())
    rows = {(r["decoder"], r["prompt_set"]): r for r in saved["summary"]}
    assert set(rows) == {(d, s) for d in ("trained", "untrained", "target only") for s in ("heldout", "train")}
    for (d, s), r in rows.items():
        assert r["prompts"] == 3 and 1.0 <= r["tau"] <= 8.0
        if d != "target only":
            assert r["identical_to_target"] == 3, (d, s)  # lossless at temperature 0
            assert r["speedup"] > 0
    assert rows[("target only", "heldout")]["tau"] == 1.0
    assert len(saved["acceptance"]["trained"]["histogram"]) == 8
    assert len(saved["acceptance"]["trained"]["slot_rate"]) == 7

    for name in ("eval_tau.png", "eval_acceptance.png", "eval_speedup.png"):
        png = run / "plots" / name
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    nb = json.loads((run / "eval.ipynb").read_text())
    assert nb["metadata"]["papermill"]["parameters"]["run"] == str(run)
    images = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 3  # static PNGs: the notebook renders on GitHub


def test_heldout_tau_is_logged_every_eval_every_steps():
    run = tiny_trained_run()  # trained with eval_every=10, steps=20
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    taus = {r["step"]: r["eval_tau"] for r in rows if "eval_tau" in r}
    assert sorted(taus) == [10, 20]
    assert all(1.0 <= t <= 8.0 for t in taus.values())
    target, tok, drafter = tiny_models()
    tau = ev.heldout_tau((target, drafter, tok), block_size=8, max_new_tokens=32, n_prompts=4)
    assert 1.0 <= tau <= 8.0
