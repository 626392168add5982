"""Golden loss curves (tests/golden.py): a refactor that changes numerics fails here. Regenerate on purpose with
`PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m tests.golden --update`."""

import json

import pytest

from tests import golden


@pytest.fixture(scope="module")
def pinned():
    return json.loads(golden.GOLDEN_FILE.read_text())


def test_trainer_losses_match_the_golden_curve(tmp_path, pinned):
    assert golden.trainer_losses(tmp_path) == pytest.approx(pinned["trainer"], **golden.TOLERANCE)


def test_torchrun_rank_losses_match_the_golden_curve(tmp_path, pinned):
    assert golden.torchrun_losses(tmp_path) == pytest.approx(pinned["torchrun"], **golden.TOLERANCE)


def test_both_training_paths_follow_the_same_curve(pinned):
    assert len(pinned["trainer"]) == golden.STEPS
    assert pinned["torchrun"] == pytest.approx(pinned["trainer"], rel=1e-4)
