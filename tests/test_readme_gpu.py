"""The README's "Your own model on a GPU" section, run as written on the tiny target (CPU): only its block of settings
(TARGET, PROMPTS, GPUS, ...) is replaced by tiny values (SHAPE keeps the README's anchors rule, with a smaller drafter);
every command after it runs verbatim in bash: held-out split -> regenerate -> data check -> train (papermill) ->
evaluate -> export -> resume -> runs list. Each block of steps stops at its first failing command."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def section_blocks() -> tuple[str, list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("<!-- section:own-model -->", 1)[1].split("<!-- /section:own-model -->", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    settings = next(b for b in blocks if b.startswith("TARGET="))
    return settings, blocks[blocks.index(settings) + 1:]


def tiny_settings(settings: str, tmp_path: Path) -> dict[str, str]:
    """The README's settings with tiny values; SHAPE is the README's own with a 1-layer drafter at batch 2."""
    names = re.findall(r"(?:^|\s)([A-Z_]+)=", settings)
    shape = re.search(r'^SHAPE=(".*")$', settings, flags=re.M).group(1)
    assert "-p num_anchors $((SEQ_LEN / 6))" in shape, shape  # the anchors follow SEQ_LEN (the paper's 512 at 3072)
    for big, small in (("-p num_draft_layers 5", "-p num_draft_layers 1"), ("-p batch_size 1", "-p batch_size 2")):
        assert big in shape, f"the README's SHAPE changed: {shape}"
        shape = shape.replace(big, small)
    tiny = {"TARGET": "tiny", "PROMPTS": str(tmp_path / "prompts.jsonl"), "GPUS": "'[]'", "DEVICE": "cpu",
            "NAME": "readme", "RUNS": str(tmp_path / "runs"), "DATA": str(tmp_path / "data"), "HELDOUT": "2",
            "STEPS": "8", "SEQ_LEN": "64", "BLOCK": "8", "ANSWER": "160", "SHAPE": shape}
    assert sorted(names) == sorted(tiny), f"the README's settings changed: {names}"
    return tiny


def run_bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_the_readme_anchors_rule_is_valid_at_every_seq_len():
    from dflash_lab import ConfigError, TrainConfig

    for seq_len in (32, 64, 192, 320, 512, 3072, 8192):
        assert TrainConfig(seq_len=seq_len, block_size=16, num_anchors=seq_len // 6).num_anchors == seq_len // 6
    assert TrainConfig(seq_len=3072, num_anchors=3072 // 6).num_anchors == 512  # the paper's shape
    with pytest.raises(ConfigError, match="num_anchors"):  # the value the README used to hard-code, at SEQ_LEN=192
        TrainConfig(seq_len=192, num_anchors=512)


@pytest.mark.parametrize("broken", ["prompts", "run"])
def test_each_readme_block_stops_at_its_first_failing_command(tmp_path, broken):
    """A missing prompts file stops the steps at `head` (nothing is regenerated or trained); a RUNS folder without a
    run of that NAME stops the resume block at `ls` (papermill never starts with an empty resume_from)."""
    settings, commands = section_blocks()
    tiny = tiny_settings(settings, tmp_path)
    (tmp_path / "runs").mkdir()
    block = commands[0] if broken == "prompts" else commands[1]
    out = run_bash("\n".join(f"{k}={v}" for k, v in tiny.items()) + "\n" + block + "\necho AFTER-THE-BLOCK", tmp_path)
    assert out.returncode == 0 and out.stdout.strip().endswith("AFTER-THE-BLOCK")  # the user's shell goes on
    first = "head:" if broken == "prompts" else "ls:"
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(first), out.stderr
    assert not (tmp_path / "data" / "train.jsonl").exists() and "papermill" not in out.stderr.lower()


@pytest.mark.slow  # ~1.5 min on a busy 2-core CPU: eight commands, two papermill runs, one evaluation
def test_the_readme_gpu_walkthrough_runs_on_the_tiny_target(tmp_path):
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.validation import heldout_source

    settings, commands = section_blocks()
    tiny = tiny_settings(settings, tmp_path)
    assert len(commands) == 2 and "regenerate" in commands[0] and "resume_from" in commands[1]
    lines = (ROOT / tiny_data_path()).read_text().splitlines()[:18]  # 2 held out, 16 to train on
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")  # the commands name notebooks/ from the repo root
    script = "set -euo pipefail\n" + "\n".join(f"{k}={v}" for k, v in tiny.items()) + "\n" + "\n".join(commands)
    out = run_bash(script, tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]

    data = tmp_path / "data"
    assert sum(1 for _ in open(data / "train.jsonl")) == 16 and sum(1 for _ in open(data / "heldout.jsonl")) == 2
    assert heldout_source(str(data / "train.jsonl"), None) == (data / "heldout.jsonl", None)  # found by itself
    (run,) = list((tmp_path / "runs").glob("readme-2*"))
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("finished", 16)  # 8 steps, then resumed to 16
    config = json.loads((run / "config.json").read_text())
    assert (config["steps"], config["seq_len"], config["num_anchors"]) == (16, 64, 64 // 6)  # anchors from SEQ_LEN
    (ev,) = list((run / "evals").glob("*/eval.json"))
    assert json.loads(ev.read_text())["block_size"] == 8
    exported = json.loads((tmp_path / "exports" / "readme" / "config.json").read_text())
    assert exported["architectures"] == ["DFlashDraftModel"]
    assert re.search(rf"{run.name}\s+finished\s+16/16", out.stdout), out.stdout[-2000:]
