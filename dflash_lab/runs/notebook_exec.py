"""Execute a notebook headless with papermill, quietly: no kernel noise between our own output lines.

Two lines of kernel stderr used to precede every result: "[IPKernelApp] WARNING | Kernel is running over TCP
without encryption" (a local kernel; nothing to act on) and "[IPKernelApp] ERROR | KeyboardInterrupt caught in
kernel." The second is jupyter_client's shutdown: it ALWAYS sends SIGINT before the shutdown request
(KernelManager._async_shutdown_kernel), and when that signal lands while ipykernel is still handling a message (a
late comm/widget message, the reply to the last cell) ipykernel logs it as an error. Nothing was interrupted that
matters: the notebook had finished. So the kernel manager below skips the interrupt while shutting down (the
shutdown request follows at once, and a kernel that does not exit is still killed), and the kernel logs at
ERROR level. Kernel errors and tracebacks of failing cells are unchanged. (The papermill command line gets the same
quiet through the kernel configuration that `make env` installs: notebooks/kernel_config.py.)

The executed notebook keeps no machine's folders: absolute paths under the project, the run's runs folder and the
home directory are rewritten relative (rundir.relative_paths), so a shared result names `runs/<run>/...`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import papermill
from jupyter_client.manager import AsyncKernelManager
from papermill.exceptions import PapermillExecutionError

from .rundir import relative_paths, share_bases

__all__ = ["PapermillExecutionError", "QuietShutdownKernelManager", "execute", "make_paths_relative"]


class QuietShutdownKernelManager(AsyncKernelManager):
    """AsyncKernelManager without the SIGINT that precedes a shutdown request."""

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()


def execute(notebook: str | Path, out: str | Path, *, parameters: dict, cwd: str | Path,
            log_output: bool = True, relative_to=()) -> Path:
    """papermill.execute_notebook(notebook -> out) with the quiet kernel manager, then `out` with relative paths
    (also when a cell failed: the notebook with its traceback is shared too); returns out. `relative_to`: more
    folders whose paths become relative (e.g. a runs folder outside the project)."""
    try:
        papermill.execute_notebook(str(notebook), str(out), parameters=parameters, cwd=str(cwd),
                                   log_output=log_output, progress_bar=False, kernel_name="python3",
                                   kernel_manager_class=QuietShutdownKernelManager,
                                   extra_arguments=["--IPKernelApp.log_level=ERROR"])
    finally:
        make_paths_relative(out, relative_to)
    return Path(out)


def make_paths_relative(path: str | Path, extra=()) -> None:
    """Rewrite an executed notebook in place (atomically) with rundir.relative_paths."""
    path = Path(path)
    try:
        nb = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # papermill wrote nothing (it failed before the first cell)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(relative_paths(nb, share_bases(path, extra)), indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
