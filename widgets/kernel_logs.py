"""Quiet kernel logs: the two kernel messages every papermill run printed between our own lines, dropped at the source.

- "Kernel is running over TCP without encryption ...": a WARNING of every ipykernel started by a local client
  (papermill, JupyterLab) over the loopback interface; nothing to act on.
- "KeyboardInterrupt caught in kernel": jupyter_client sends SIGINT before every shutdown request; landing while
  ipykernel handles a late message (a widget comm, the last reply) it is logged as an ERROR although the notebook
  had finished.

`quiet_kernel_logs()` adds a filter for exactly these two messages to the kernel application's logger; every other
kernel warning and error still shows. `python -m widgets.kernel_logs install` (run by `make env`) writes a kernel
configuration into this environment (`<sys.prefix>/etc/ipython/ipython_kernel_config.py`) that calls it, so plain
`papermill ...` and JupyterLab kernels of the project's environment are quiet too. In-process runs
(dflash_lab.runs.notebook_exec) are quiet without it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

NOISE = ("Kernel is running over TCP without encryption", "KeyboardInterrupt caught in kernel")
KERNEL_LOGGER = "IPKernelApp"  # traitlets names an application's logger after its class
MARKER = "# dflash-lab: quiet kernel logs"
CONFIG_LINES = (MARKER, "from widgets.kernel_logs import quiet_kernel_logs", "quiet_kernel_logs()")


class DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NOISE)


def quiet_kernel_logs(logger: logging.Logger | None = None) -> logging.Logger:
    """Install the filter (once) on the kernel app's logger; returns the logger."""
    log = logger or logging.getLogger(KERNEL_LOGGER)
    if not any(isinstance(f, DropNoise) for f in log.filters):
        log.addFilter(DropNoise())
    return log


def install(config_dir: str | Path | None = None) -> Path:
    """Write (or extend) `ipython_kernel_config.py` in `config_dir` (default: this environment's etc/ipython) so that
    kernels started from this environment call quiet_kernel_logs(); idempotent. Returns the file."""
    folder = Path(config_dir) if config_dir else Path(sys.prefix) / "etc" / "ipython"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ipython_kernel_config.py"
    text = path.read_text() if path.is_file() else ""
    if MARKER not in text:
        path.write_text(text + ("\n" if text and not text.endswith("\n") else "") + "\n".join(CONFIG_LINES) + "\n")
    return path


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m widgets.kernel_logs install   (quiet kernels for this environment)")
    print(f"kernel logs: quiet ({install()})")
