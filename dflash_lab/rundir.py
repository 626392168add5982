"""Run directories: `runs/<UTC stamp>-<name>-<short id>/` holding config, env, metrics, checkpoints and notebooks."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SYSTEM_FILE = "system.jsonl"
ENV_FILE = "env.json"


def new_run_dir(runs_dir: str | Path, name: str) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    path = Path(runs_dir) / f"{stamp}-{safe}-{secrets.token_hex(3)}"
    (path / "checkpoints").mkdir(parents=True)
    (path / "plots").mkdir()
    return path


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment_info() -> dict:
    """git commit + dirty flag, package versions, driver, GPUs (names, UUIDs), CUDA_VISIBLE_DEVICES."""
    import torch
    import transformers

    info = {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "python": sys.version.split()[0], "platform": platform.platform(), "hostname": platform.node(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"index": i, "name": p.name, "uuid": str(getattr(p, "uuid", "")),
                                 "total_memory_gb": round(p.total_memory / 2**30, 1)})
        try:
            import pynvml

            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - driver version is informative only
            info["driver"] = None
    return info


def write_json(path: Path, obj: dict) -> None:
    """Atomic JSON write (temp file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def find_papermill_output() -> Path | None:
    """The output notebook of the papermill CLI run executing this kernel, if any (parent's command line)."""
    explicit = os.environ.get("DFLASH_NOTEBOOK_OUTPUT")
    if explicit:
        return Path(explicit)
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in argv if a]
    if not any("papermill" in a for a in args[:2]):
        return None
    notebooks = [a for a in args if a.endswith(".ipynb")]
    return Path(notebooks[1]) if len(notebooks) >= 2 else None


def save_executed_notebook(run_dir: str | Path, name: str = "train.ipynb") -> Path | None:
    """Copy the notebook papermill is writing into the run dir (complete up to the cell calling this)."""
    src = find_papermill_output()
    if src is None or not src.is_file():
        return None
    dst = Path(run_dir) / name
    shutil.copyfile(src, dst)
    return dst
