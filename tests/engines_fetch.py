"""The serving engines' Python sources for the tests that run their config parsing and weight loading on the CPU.

    python tests/engines_fetch.py DIR      (make test runs it once, into .venv/engines)

Downloads the vLLM and SGLang wheels of the releases serving_engines.VERSIONS names from PyPI (pip download
--no-deps: nothing is installed, their CUDA builds never import here) and unzips only their .py files into DIR/vllm
and DIR/sglang, the layout tests/engine_source.py reads. Each folder's `.complete` marker records the pin it was
unzipped from: a folder of that pin is left as it is; one of another pin (VERSIONS moved on) is fetched again. The
wheels (~280 MB) are deleted afterwards.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def _versions() -> dict[str, str]:
    """serving_engines.VERSIONS, read from its file: importing the dflash_lab package would import torch, and this
    script runs before anything needs it (the module itself imports only the standard library)."""
    path = Path(__file__).resolve().parents[1] / "dflash_lab" / "evaluation" / "serving_engines.py"
    spec = importlib.util.spec_from_file_location("_serving_engines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VERSIONS


WHEELS = {name: f"{name}=={version}" for name, version in _versions().items() if name in ("vllm", "sglang")}
DONE = ".complete"


def fetched_pin(dest: Path) -> str | None:
    """The pin a folder was unzipped from (the marker's first field), None when it is not complete."""
    done = dest / DONE
    return done.read_text().split(":", 1)[0].strip() if done.is_file() else None


def fetch(root: Path, log=print) -> None:
    for name, pin in WHEELS.items():
        dest = root / name
        had = fetched_pin(dest)
        if had == pin:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            log(f"[engines] downloading {pin} (its sources only are kept, for the serving tests)"
                + (f"; replacing {had}" if had else ""))
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                            "-d", tmp, pin], check=True)
            wheel = next(Path(tmp).glob(f"{name}-*.whl"))
            if dest.exists():  # another release's files (or a partial unzip) must not mix with this one's
                shutil.rmtree(dest)
            with zipfile.ZipFile(wheel) as z:
                members = [m for m in z.namelist() if m.endswith(".py") and m.startswith(f"{name}/")]
                z.extractall(dest, members)
            (dest / DONE).write_text(f"{pin}: {len(members)} files from {wheel.name}\n")
            log(f"[engines] {pin}: {len(members)} source files in {dest}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/engines_fetch.py DIR")
    fetch(Path(sys.argv[1]))
