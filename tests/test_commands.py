"""Every `python -m dflash_lab.X` command that the README, the docs, the notebooks and the bench scripts tell a user
to run exists and answers `--help` (a moved module would otherwise leave the documentation pointing at nothing)."""

import contextlib
import io
import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"-m (dflash_lab(?:\.[a-z_]+)*)")


def documented_commands() -> dict[str, str]:
    """module -> the first file that documents it."""
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "notebooks").rglob("*.ipynb")), *sorted((ROOT / "bench").glob("*.sh")),
             *sorted((ROOT / "bench").glob("*.md"))]
    found = {}
    for f in files:
        if ".ipynb_checkpoints" in f.parts:
            continue
        for m in COMMAND.finditer(f.read_text()):
            found.setdefault(m.group(1), str(f.relative_to(ROOT)))
    return found


def test_the_documentation_names_the_main_commands():
    found = documented_commands()
    for module in ("dflash_lab.train", "dflash_lab.runs", "dflash_lab.benchmarks.step", "dflash_lab.target.models",
                   "dflash_lab.evaluation.evaluate", "dflash_lab.data.regenerate"):
        assert module in found, f"{module} is no longer documented anywhere"


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("module", sorted(documented_commands()))
def test_documented_command_answers_help(module, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    assert e.value.code in (0, None), f"{module} --help exited {e.value.code} (documented in " \
                                       f"{documented_commands()[module]})"
    assert "usage:" in out.getvalue().lower(), f"{module} --help printed no usage: {out.getvalue()[:300]!r}"
