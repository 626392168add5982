"""The serving engines' Python sources for the tests that run their config parsing and weight loading on the CPU.

    python tests/engines_fetch.py DIR      (make test runs it once, into .venv/engines)

Downloads the vLLM 0.34.0 and SGLang 0.5.23 wheels from PyPI (pip download --no-deps: nothing is installed, their
CUDA builds never import here) and unzips only their .py files into DIR/vllm and DIR/sglang, the layout
tests/engine_source.py reads. Already unzipped: nothing is done. The wheels (~280 MB) are deleted afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEELS = {"vllm": "vllm==0.34.0", "sglang": "sglang==0.5.23"}
DONE = ".complete"


def fetch(root: Path, log=print) -> None:
    for name, pin in WHEELS.items():
        dest = root / name
        if (dest / DONE).is_file():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            log(f"[engines] downloading {pin} (its sources only are kept, for the serving tests)")
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                            "-d", tmp, pin], check=True)
            wheel = next(Path(tmp).glob(f"{name}-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                members = [m for m in z.namelist() if m.endswith(".py") and m.startswith(f"{name}/")]
                z.extractall(dest, members)
            (dest / DONE).write_text(f"{pin}: {len(members)} files from {wheel.name}\n")
            log(f"[engines] {pin}: {len(members)} source files in {dest}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/engines_fetch.py DIR")
    fetch(Path(sys.argv[1]))
