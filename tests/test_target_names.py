"""A target that is not known, not a folder and not a reachable hub id fails AT ONCE with one line naming what a target
can be: from Python, from `python -m dflash_lab.evaluation.evaluate --target`, and from `papermill -p target`.

Before, a misspelled name went to the hub: transformers retried for ~55 s on a machine without internet, then raised
a traceback whose hint (tokenizer.json) had nothing to do with the typo."""

import socket
from pathlib import Path

import pytest

from dflash_lab.target import load
from dflash_lab.target.load import TargetLoadError, load_tokenizer, resolve_target_path

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def connects(monkeypatch):
    """Every TCP connect this process tries, as (address, timeout): a hub wait begins with one, so "at once" is
    counted in connects, not in seconds a loaded machine would stretch."""
    seen = []
    real = socket.socket.connect

    def connect(self, address):
        seen.append((address, self.gettimeout()))
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return seen


def _names_every_kind(msg: str) -> None:
    assert "Known names: tiny, smollm2-135m-instruct" in msg, msg
    assert "local Hugging Face folder" in msg and "hub id like 'Qwen/Qwen3-8B' when online" in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize("name", ["smollm2", "nosuch-model", "Tiny"])
def test_a_bare_unknown_name_fails_at_once(name, connects):
    with pytest.raises(TargetLoadError) as e:
        load_tokenizer(name)  # the call that used to wait for the hub
    assert connects == []  # nothing asked of the network
    msg = str(e.value)
    assert msg.startswith(f"unknown target {name!r}")
    _names_every_kind(msg)
    if name == "smollm2":
        assert "did you mean 'smollm2-135m-instruct'?" in msg


def test_an_org_name_id_fails_at_once_when_the_hub_cannot_be_reached(monkeypatch, connects):
    with socket.socket() as s:  # a local port nobody listens on: connection refused, as on a machine offline
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    load._hub_reachable.cache_clear()
    with pytest.raises(TargetLoadError, match=r"'nosuch-org/nosuch-model': not in the Hugging Face cache, and "
                                              rf"http://127.0.0.1:{port} cannot be reached"):
        resolve_target_path("nosuch-org/nosuch-model")
    assert connects == [(("127.0.0.1", port), 3.0)]  # one refused connect, bounded at 3 s, no retries
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TargetLoadError, match="HF_HUB_OFFLINE is set"):
        resolve_target_path("nosuch-org/nosuch-model")
    load._hub_reachable.cache_clear()


def test_folders_still_resolve(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_target_path(str(tmp_path)) == str(tmp_path)


def test_evaluate_names_the_unknown_target_before_looking_for_prompts(tmp_path, capsys, connects):
    from dflash_lab import TrainConfig, Trainer
    from dflash_lab.evaluation import evaluate as ev
    from tests.test_speculative import TINY_TRAIN

    trainer = Trainer(TrainConfig(**TINY_TRAIN, steps=1, runs_dir=str(tmp_path)), log=lambda *a: None)
    try:
        trainer.step(1)
        trainer.save_drafter()
    finally:
        trainer.close()
    run = trainer.run_dir
    assert ev.main([str(run), "--target", "nosuch-model"]) == 2
    assert connects == []
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown target 'nosuch-model'") and "no default prompts" not in err, err
    _names_every_kind(err)
    assert not (run / "evals").exists()  # nothing written


def test_train_notebook_with_a_misspelled_target_stops_in_seconds(tmp_path):
    """The notebook's kernel stops on the name's own error (the bare-name path above, which asks nothing of the
    network); no bound in seconds here: a kernel's start on a loaded machine is no measure of a hub wait."""
    from dflash_lab.runs.notebook_exec import PapermillExecutionError, execute

    with pytest.raises(PapermillExecutionError) as e:
        execute(REPO / "notebooks" / "train.ipynb", tmp_path / "out.ipynb", cwd=REPO, log_output=False,
                parameters={"target": "smollm2", "runs_dir": str(tmp_path / "runs")})
    assert e.value.ename == "TargetLoadError"
    assert e.value.evalue.startswith("unknown target 'smollm2' (did you mean 'smollm2-135m-instruct'?)")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
