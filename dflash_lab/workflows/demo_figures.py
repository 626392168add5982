"""The demo's figures as the README quotes them: one JSON file written by the demo's own run, and the README's table
rendered from it, so the figures a reader is told to expect are the ones the command wrote at that commit.

    python -m dflash_lab.workflows.demo --write-figures     # run the demo, then write docs/demo-figures.json and
                                                            # rewrite the README's block between the two markers

`tests/test_demo.py` fails when the README's block differs from what `render` makes of the figures file, and runs a
short demo twice under different CPU thread settings to show the figures are the same bit for bit (the demo fixes
its thread count: torch splits a reduction by thread count, and 3 threads gave another loss than 1, 2 or 8).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs" / "demo-figures.json"
README = REPO / "README.md"
BEGIN = "<!-- demo-figures: written by `python -m dflash_lab.workflows.demo --write-figures`; do not edit -->"
END = "<!-- /demo-figures -->"


def machine() -> dict:
    """What the timing depends on: the cores this process may use, the CPU's model, the load around the run."""
    from dflash_lab.config.threads import cpu_cores

    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cores": cpu_cores(), "cpu": model or platform.processor() or platform.machine(),
            "system": f"{platform.system()} {platform.release()}"}


def commit() -> str:
    """The tree the figures came from: the commit, with '+changes' when files differed from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("+changes" if dirty else "")


def figures(report: dict, summary: dict, *, steps: int, threads: int, train_s: float, total_s: float,
            load: tuple[float, float], date: str, tree: str) -> dict:
    """The figures file's content: the evaluation's rows, the loss, the time and where it was measured."""
    import torch

    rows = {f"{r['decoder']}/{r['prompt_set']}": {"tau": r["tau"], "speedup": r.get("speedup")}
            for r in report["summary"] if r["decoder"] in ("trained", "untrained")}
    return {"date": date, "commit": tree, "steps": steps, "threads": threads, "torch": torch.__version__,
            "machine": machine(), "load_average": {"start": round(load[0], 2), "end": round(load[1], 2)},
            "train_s": round(train_s, 1), "total_s": round(total_s, 1),
            "loss_first": summary["loss_first"], "loss_last": summary["loss_last"], "rows": rows}


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s"


def render(fig: dict) -> str:
    """The README's block: the table a reader of `make demo` should get, and what the time includes."""
    rows = fig["rows"]

    def cell(key, field, fmt):
        v = rows.get(key, {}).get(field)
        return "-" if v is None else format(v, fmt)

    lines = [BEGIN,
             "| drafter (block 8) | tau held-out | tau train prompts | speedup held-out | speedup train prompts |",
             "|---|---|---|---|---|"]
    for who in ("trained", "untrained"):
        label = "trained by the demo" if who == "trained" else "untrained (same shape and seed)"
        lines.append(f"| {label} | {cell(f'{who}/heldout', 'tau', '.2f')} | {cell(f'{who}/train', 'tau', '.2f')} | "
                     f"{cell(f'{who}/heldout', 'speedup', '.2f')}x | {cell(f'{who}/train', 'speedup', '.2f')}x |")
    m, load = fig["machine"], fig["load_average"]
    lines += ["",
              f"Written by `python -m dflash_lab.workflows.demo --write-figures` at commit `{fig['commit']}` on "
              f"{fig['date']} ({fig['steps']} steps, torch {fig['torch']}, {fig['threads']} CPU threads; the loss "
              f"fell from {fig['loss_first']:.2f} to {fig['loss_last']:.2f}). The tau figures do not move with the "
              "machine's cores or load (greedy, fp32, training on a fixed thread count; tests/test_demo.py checks "
              "it), though a CPU with other vector instructions may round differently; the speedups are CPU timings "
              f"and move with the machine and its load. The demo itself took {_minutes(fig['total_s'])} "
              f"({_minutes(fig['train_s'])} of training, the rest the evaluation) on {m['cores']} cores of an "
              f"{m['cpu']} with a load average of {load['start']:.1f} at the start and {load['end']:.1f} at the "
              "end (other jobs shared the machine); a first `make demo` also creates `.venv` before it (see Start).",
              END]
    return "\n".join(lines)


def rewrite(text: str, fig: dict) -> str:
    """`text` (the README) with its block between the markers replaced by `render(fig)`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no demo-figures block: add the two lines {BEGIN!r} and {END!r} where the "
                         "table goes, then run the command again.")
    return text[:start] + render(fig) + text[end + len(END):]


def readme_block(text: str) -> str:
    """The block as the README holds it now (markers included)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError("README has no demo-figures block")
    return text[start:end + len(END)]


def write(fig: dict, figures_path: Path = FIGURES, readme: Path = README) -> None:
    figures_path.write_text(json.dumps(fig, indent=1) + "\n")
    readme.write_text(rewrite(readme.read_text(), fig))


def load(path: Path = FIGURES) -> dict:
    return json.loads(Path(path).read_text())


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")
