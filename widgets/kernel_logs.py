"""What a kernel of this environment prints: its log noise dropped at the source, the project's own errors in one line.

- "Kernel is running over TCP without encryption ...": a WARNING of every ipykernel started by a local client
  (papermill, JupyterLab) over the loopback interface; nothing to act on.
- "KeyboardInterrupt caught in kernel": jupyter_client sends SIGINT before every shutdown request; landing while
  ipykernel handles a late message (a widget comm, the last reply) it is logged as an ERROR although the notebook
  had finished.
- "Exception in message handler" for a `ZMQError: Socket operation on non-socket`: the reply to a cell that papermill
  stopped waiting for (Ctrl-C ends papermill first); 20 lines about a client that is gone.

The project's own errors (ConfigError with its "did you mean", an unknown notebook parameter, not a run directory)
say what is wrong and the fix in one line; under papermill that line came last, after 60-89 lines of traceback
through the library. `short_project_errors()` shows an error raised by the project's code as that one line
(`ConfigError: TrainConfig.lr=-1 is invalid: ... Fix: ...`); the cell still fails (papermill exits non-zero) and
`%tb` prints the full traceback. Every other error keeps IPython's usual traceback.

`quiet_kernel_logs()` adds a filter for exactly these messages to the kernel application's logger; every other
kernel warning and error still shows. `python -m widgets.kernel_logs install` (run by `make env`) writes a kernel
configuration into this environment (`<sys.prefix>/etc/ipython/ipython_kernel_config.py`) that calls both, so plain
`papermill ...` and JupyterLab kernels of the project's environment are quiet too. In-process runs
(dflash_lab.runs.notebook_exec) are quiet without it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

NOISE = ("Kernel is running over TCP without encryption", "KeyboardInterrupt caught in kernel")
CLIENT_GONE = "Socket operation on non-socket"  # the ZMQError of a reply sent after papermill closed its sockets
KERNEL_LOGGER = "IPKernelApp"  # traitlets names an application's logger after its class
MARKER = "# dflash-lab: quiet kernel logs, short project errors"
OLD_LINES = ("# dflash-lab: quiet kernel logs", "from widgets.kernel_logs import quiet_kernel_logs", "quiet_kernel_logs()")
CONFIG_LINES = (MARKER, "from widgets.kernel_logs import quiet_kernel_logs", "quiet_kernel_logs()",
                "c.InteractiveShellApp.exec_lines.append(\"__import__('widgets.kernel_logs').kernel_logs"
                ".short_project_errors()\")")
PROJECT_PACKAGES = ("dflash_lab", "widgets")


class DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(NOISE):
            return False
        error = record.exc_info[1] if record.exc_info else None
        return not (type(error).__name__ == "ZMQError" and CLIENT_GONE in str(error))


def is_project_error(value: BaseException) -> bool:
    """Raised by the project's own code with its own message: an error type of the project, or a built-in one
    (FileNotFoundError, ValueError) that the project raised naming the fix."""
    if type(value).__module__.split(".")[0] in PROJECT_PACKAGES:
        return True
    tb = value.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return where.split(".")[0] in PROJECT_PACKAGES and "Fix:" in str(value)


def short_project_errors(shell=None) -> None:
    """In this IPython kernel, show the project's own errors as their one line (the full traceback: `%tb`)."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None:
        return

    def handler(self, etype, value, tb, tb_offset=None):
        if not is_project_error(value):
            self.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return None
        sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # %tb and %debug still work
        line = f"{etype.__name__}: {value}"
        self._showtraceback(etype, value, [line])
        if headless:  # papermill's own traceback follows on its terminal: this line comes first, as it happens
            print("\n" + line, file=sys.__stderr__, flush=True)
        return None

    from dflash_lab.runs.rundir import find_papermill_output

    headless = find_papermill_output() is not None

    shell.set_custom_exc((Exception,), handler)


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
    if MARKER not in text and "\n".join(OLD_LINES) in text:  # an earlier install: replaced, not doubled
        text = text.replace("\n".join(OLD_LINES) + "\n", "")
    if MARKER not in text:
        path.write_text(text + ("\n" if text and not text.endswith("\n") else "") + "\n".join(CONFIG_LINES) + "\n")
    return path


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m widgets.kernel_logs install   (quiet kernels for this environment)")
    print(f"kernel logs: quiet ({install()})")
