"""The README's "Your own model on a GPU" section, run as written on the tiny target (CPU): only its block of settings
(TARGET, PROMPTS, GPUS, ...) is replaced by tiny values; every command after it runs verbatim in bash: held-out
split -> regenerate -> data check -> train (papermill) -> evaluate -> export -> resume -> runs list."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # ~1.5 min on a busy 2-core CPU: eight commands, two papermill runs, one evaluation


def section_blocks() -> tuple[str, list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("<!-- section:own-model -->", 1)[1].split("<!-- /section:own-model -->", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    settings = next(b for b in blocks if b.startswith("TARGET="))
    return settings, blocks[blocks.index(settings) + 1:]


def test_the_readme_gpu_walkthrough_runs_on_the_tiny_target(tmp_path):
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.validation import heldout_source

    settings, commands = section_blocks()
    names = re.findall(r"(?:^|\s)([A-Z_]+)=", settings)
    tiny = {"TARGET": "tiny", "PROMPTS": str(tmp_path / "prompts.jsonl"), "GPUS": "'[]'", "DEVICE": "cpu",
            "NAME": "readme", "RUNS": str(tmp_path / "runs"), "DATA": str(tmp_path / "data"), "HELDOUT": "2",
            "STEPS": "8", "SEQ_LEN": "64", "BLOCK": "8", "ANSWER": "160",
            "SHAPE": '"-p seq_len 64 -p block_size 8 -p num_anchors 4 -p num_draft_layers 1 -p batch_size 2"'}
    assert sorted(names) == sorted(tiny), f"the README's settings changed: {names}"
    assert len(commands) == 2 and "regenerate" in commands[0] and "resume_from" in commands[1]
    lines = (ROOT / tiny_data_path()).read_text().splitlines()[:18]  # 2 held out, 16 to train on
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")  # the commands name notebooks/ from the repo root
    script = "set -euo pipefail\n" + "\n".join(f"{k}={v}" for k, v in tiny.items()) + "\n" + "\n".join(commands)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]

    data = tmp_path / "data"
    assert sum(1 for _ in open(data / "train.jsonl")) == 16 and sum(1 for _ in open(data / "heldout.jsonl")) == 2
    assert heldout_source(str(data / "train.jsonl"), None) == (data / "heldout.jsonl", None)  # found by itself
    (run,) = list((tmp_path / "runs").glob("*-readme-*"))
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("finished", 16)  # 8 steps, then resumed to 16
    assert json.loads((run / "config.json").read_text())["steps"] == 16
    (ev,) = list((run / "evals").glob("*/eval.json"))
    assert json.loads(ev.read_text())["block_size"] == 8
    exported = json.loads((tmp_path / "exports" / "readme" / "config.json").read_text())
    assert exported["architectures"] == ["DFlashDraftModel"]
    assert re.search(rf"{run.name}\s+finished\s+16/16", out.stdout), out.stdout[-2000:]
