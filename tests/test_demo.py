"""`make demo` end to end on the CPU with few steps: no kernel noise in its output, and its final line quotes rows of
the evaluation table it printed."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_lab.workflows.demo import headline

REPO = Path(__file__).resolve().parent.parent


def test_headline_quotes_the_heldout_rows():
    saved = {"summary": [
        {"decoder": "trained", "prompt_set": "heldout", "tau": 3.674, "speedup": 2.104},
        {"decoder": "trained", "prompt_set": "train", "tau": 4.61, "speedup": 2.5},
        {"decoder": "untrained", "prompt_set": "heldout", "tau": 1.02, "speedup": 0.8},
        {"decoder": "target only", "prompt_set": "heldout", "tau": 1.0, "speedup": 1.0}]}
    assert headline(saved) == ("heldout prompts: tau trained 3.67 vs untrained 1.02, speedup 2.10x "
                               "(the table's 'heldout' rows)")


@pytest.mark.slow
def test_demo_output_is_quiet_and_its_summary_matches_the_table(tmp_path):
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "dflash_lab.workflows.demo", "--steps", "10", "--runs-dir", str(tmp_path),
                          "--eval-prompts", "2", "--eval-tokens", "12"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "[IPKernelApp]" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "<IPython.core.display.Image object>" not in text, text[-3000:]  # images print as what they show
    last = [line for line in out.stdout.splitlines() if line.startswith("[demo] done")][-1]
    m = re.search(r"tau trained (\d+\.\d\d) vs untrained (\d+\.\d\d)", last)
    assert m, last
    table = {tuple(line.split()[:2]): line.split() for line in out.stdout.splitlines()
             if line.startswith(("trained ", "untrained "))}
    assert table[("trained", "heldout")][4] == m.group(1) and table[("untrained", "heldout")][4] == m.group(2)
