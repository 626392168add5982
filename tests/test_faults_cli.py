"""Command-line values that used to be accepted silently: `evaluate --block-size 0` (was `block_size or the
drafter's`), checked on a run folder without training anything."""

import json

import pytest

from dflash_lab.evaluation import evaluate as ev
from tests.test_faults_weights import _drafter, _run, _save_step


def test_evaluate_block_size_0_is_refused_not_replaced_by_the_drafters(tmp_path, capsys):
    dc, d = _drafter(seed=0)
    run = _run(tmp_path / "run", dc)
    _save_step(run, d, 2)
    assert ev.plan_eval(run, block_size=None, device="cpu").block_size == dc.block_size
    with pytest.raises(ev.EvalError, match=r"block_size=0 leaves no draft slot"):
        ev.plan_eval(run, block_size=0, device="cpu")
    assert ev.main([str(run), "--block-size", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: block_size=0 leaves no draft slot") and err.count("\n") == 1
    assert json.loads((run / "config.json").read_text())["target"] == "tiny" and not (run / "evals").exists()
