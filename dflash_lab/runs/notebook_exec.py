"""Execute a notebook headless with papermill, quietly: no kernel noise between our own output lines.

Two lines of kernel stderr used to precede every result: "[IPKernelApp] WARNING | Kernel is running over TCP
without encryption" (a local kernel; nothing to act on) and "[IPKernelApp] ERROR | KeyboardInterrupt caught in
kernel." The second is jupyter_client's shutdown: it ALWAYS sends SIGINT before the shutdown request
(KernelManager._async_shutdown_kernel), and when that signal lands while ipykernel is still handling a message (a
late comm/widget message, the reply to the last cell) ipykernel logs it as an error. Nothing was interrupted that
matters: the notebook had finished. So the kernel manager below skips the interrupt while shutting down (the
shutdown request follows at once, and a kernel that does not exit is still killed), and the kernel logs at
ERROR level. Kernel errors and tracebacks of failing cells are unchanged.
"""

from __future__ import annotations

from pathlib import Path

import papermill
from jupyter_client.manager import AsyncKernelManager
from papermill.exceptions import PapermillExecutionError

__all__ = ["PapermillExecutionError", "QuietShutdownKernelManager", "execute"]


class QuietShutdownKernelManager(AsyncKernelManager):
    """AsyncKernelManager without the SIGINT that precedes a shutdown request."""

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()


def execute(notebook: str | Path, out: str | Path, *, parameters: dict, cwd: str | Path,
            log_output: bool = True) -> Path:
    """papermill.execute_notebook(notebook -> out) with the quiet kernel manager; returns out."""
    papermill.execute_notebook(str(notebook), str(out), parameters=parameters, cwd=str(cwd), log_output=log_output,
                               progress_bar=False, kernel_name="python3",
                               kernel_manager_class=QuietShutdownKernelManager,
                               extra_arguments=["--IPKernelApp.log_level=ERROR"])
    return Path(out)
