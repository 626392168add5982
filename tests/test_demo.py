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


def test_readme_demo_table_is_what_the_demo_wrote():
    """The README's demo table is rendered from docs/demo-figures.json, the file `demo --write-figures` writes from
    its own evaluation: an edit by hand, or figures from another run, fail here."""
    from dflash_lab.workflows import demo_figures

    fig = demo_figures.load()
    block = demo_figures.readme_block((REPO / "README.md").read_text())
    assert block == demo_figures.render(fig)
    tau = fig["rows"]["trained/heldout"]["tau"]
    assert f"| trained by the demo | {tau:.2f} |" in block
    assert fig["rows"]["untrained/heldout"]["tau"] < tau  # the trained drafter accepts more than an untrained one
    assert fig["steps"] == 600 and fig["threads"] == 2  # what `make demo` runs


def test_rewrite_replaces_only_the_block():
    from dflash_lab.workflows import demo_figures

    fig = {"date": "2026-12-06", "commit": "abc1234", "steps": 600, "threads": 2, "torch": "2.13.0+cpu",
           "machine": {"cores": 2, "cpu": "Test CPU", "system": "Linux"}, "load_average": {"start": 3.0, "end": 5.5},
           "train_s": 480.0, "total_s": 728.0, "loss_first": 22.17, "loss_last": 0.7,
           "rows": {"trained/heldout": {"tau": 3.514, "speedup": 1.8}, "trained/train": {"tau": 4.6449, "speedup": 2.5},
                    "untrained/heldout": {"tau": 1.0, "speedup": 0.6}, "untrained/train": {"tau": 1.0, "speedup": 0.58}}}
    text = f"before\n{demo_figures.BEGIN}\nold table\n{demo_figures.END}\nafter\n"
    out = demo_figures.rewrite(text, fig)
    assert out.startswith("before\n") and out.endswith("\nafter\n") and "old table" not in out
    assert "| trained by the demo | 3.51 | 4.64 | 1.80x | 2.50x |" in out
    assert "12 min 08 s (8 min 00 s of training" in out and "2 cores of an Test CPU" in out
    with pytest.raises(ValueError, match="no demo-figures block"):
        demo_figures.rewrite("no markers", fig)


def _short_demo(tmp_path, omp_threads: str) -> tuple[bytes, list]:
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": omp_threads, "PATH": "/usr/bin:/bin"}
    runs = tmp_path / f"runs-{omp_threads}"
    out = subprocess.run([sys.executable, "-m", "dflash_lab.workflows.demo", "--steps", "12", "--runs-dir", str(runs),
                          "--eval-prompts", "2", "--eval-tokens", "16"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    (run,) = list(runs.iterdir())
    import json

    from dflash_lab.evaluation.evaluate import load_report

    report = load_report(run)
    rows = [(r["decoder"], r["prompt_set"], r["tau"]) for r in report["summary"]]
    weights = [p for p in (run / "checkpoints" / "drafter.safetensors",) if p.is_file()]  # the run end writes it
    assert weights, f"no drafter weights in {run}: {sorted(p.name for p in run.iterdir())}"
    return b"".join(p.read_bytes() for p in weights), json.loads(json.dumps(rows))


@pytest.mark.slow
def test_demo_is_the_same_whatever_threads_the_machine_sets(tmp_path):
    """A short demo under OMP_NUM_THREADS=1 and =3 trains the same drafter bit for bit and evaluates the same tau:
    the demo fixes its training threads (3 threads alone gave another loss at step 30 than 1, 2 or 8)."""
    w1, rows1 = _short_demo(tmp_path, "1")
    w3, rows3 = _short_demo(tmp_path, "3")
    assert w1 == w3
    assert rows1 == rows3


def test_demo_trains_the_tiny_targets_own_settings():
    """The demo's training shape is recipe_defaults.TINY, not a second copy of its numbers."""
    from dflash_lab.config.recipe_defaults import TINY
    from dflash_lab.workflows.demo import DEMO_PARAMETERS

    shared = {k: v for k, v in DEMO_PARAMETERS.items() if k in TINY}
    assert shared and shared == {k: TINY[k] for k in shared}
