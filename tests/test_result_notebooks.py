"""Every result notebook (notebooks/results/, notebooks/recipes/results/) opens with what it is, what it ran on and how
to read it, and that header explains every column of every table the notebook shows."""

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "results"))
import result_headers  # noqa: E402  (bench/results/result_headers.py)

NOTEBOOKS = result_headers.notebooks()


def _columns(nb) -> set[str]:
    """Column names of the tables the notebook shows: markdown tables (cells and outputs) and HTML <th> rows. In a
    `setting` table the other columns are the arms' names, so only `setting` counts."""
    texts = []
    for c in nb.cells[1:]:
        if c.cell_type == "markdown":
            texts.append(c.source)
        for o in c.get("outputs", []):
            for k in ("text/markdown", "text/html"):
                v = o.get("data", {}).get(k)
                if v:
                    texts.append("".join(v) if isinstance(v, list) else v)
    cols = set()
    for t in texts:
        lines = t.splitlines()
        for i, line in enumerate(lines[:-1]):
            if line.startswith("|") and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip()):
                names = [n.strip() for n in line.strip().strip("|").split("|")]
                cols.update([names[0]] if names[0] == "setting" else [n for n in names if n])
        for row in re.findall(r"<tr>((?:\s*<th[^>]*>.*?</th>)+)", t, re.S):
            names = [re.sub(r"<[^>]+>", "", n).strip() for n in re.findall(r"<th[^>]*>(.*?)</th>", row, re.S)]
            cols.update([names[0]] if names[0] == "setting" else [n for n in names if n])
    return {c for c in cols if not c.isdigit()}  # a number is a row's index value (a step), not a column's name


def test_every_result_notebook_has_a_header_written():
    assert NOTEBOOKS, "no result notebooks found"
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(result_headers.HEADERS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_result_notebook_opens_with_what_it_is_where_it_ran_and_how_to_read_it(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and result_headers.TAG in first.metadata.get("tags", [])
    assert first.source == result_headers.header_text(path.stem), "run: python bench/results/result_headers.py"
    assert "**What it is**" in first.source and "**Ran on**" in first.source and "**How to read it**" in first.source
    assert re.search(r"NVIDIA H[12]00|CPU", first.source)  # the machine
    unexplained = sorted(c for c in _columns(nb) if f"**{c}**" not in first.source)
    assert not unexplained, f"{path.name}: columns without a word in the header: {unexplained}"


def test_the_tiny_sweep_says_it_ranks_nothing():
    text = nbformat.read(ROOT / "notebooks" / "results" / "sweep-tiny-cpu.ipynb", as_version=4).cells[0].source
    assert "Not a ranking of the knobs" in text and "8 steps" in text and "2 prompts of 12" in text
    assert "never ran SmolLM2" in text


def test_recipe_table_gives_identical_its_denominator():
    from dflash_lab.workflows.recipe_results import _identical

    assert _identical({"identical_to_target": 21, "prompts": 64, "temperature": 0.0}) == "21 / 64"
    assert _identical({"identical_to_target": 3, "prompts": 64, "temperature": 1.0}) == "-"
    assert _identical({"identical_to_target": None, "prompts": 8, "temperature": 0.0}) == "-"
