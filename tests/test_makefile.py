"""The first `make`: it says what it installs and roughly how long, and `make demo` installs no test extras."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(target: str, tmp_path) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed on this machine")
    out = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_first_make_demo_says_what_it_installs_and_skips_the_test_extras(tmp_path):
    text = _dry_run("demo", tmp_path)
    assert "installing torch" in text and "min" in text  # what and how long, before the silent pip install
    assert "pip install" in text and ".[test]" not in text
    assert text.index("installing torch") < text.index("pip install")


def test_make_test_adds_the_test_extras_on_the_base_environment(tmp_path):
    text = _dry_run("test", tmp_path)
    base, extras = text.index("-e ."), text.index("'.[test]'")
    assert base < extras and "test extras" in text


def test_makefile_pins_the_speculators_release_the_export_check_reads():
    """The Makefile installs speculators at a literal pin; it must be the release serving_engines.VERSIONS describes
    (the rules restated there, and export_check's install hint, are that release's)."""
    import re

    from dflash_lab.evaluation.serving_engines import VERSIONS

    pins = re.findall(r"speculators==([\w.]+)", (ROOT / "Makefile").read_text())
    assert pins and set(pins) == {VERSIONS["speculators"]}
