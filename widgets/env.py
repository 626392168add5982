"""Is this kernel watched by a person (live widgets) or executed headless (papermill / nbclient: static plots)?

Widgets in a headless run are useless (nobody renders them) and harmful: updates from threads are dropped from the
output notebook and saved widget state can stop GitHub from rendering it. Decision, first match wins:
1. DFLASH_DASHBOARD=live|static (explicit override);
2. not inside a Jupyter kernel (plain Python, terminal IPython) -> static;
3. papermill / nbconvert / nbclient / jupyter-execute on the command line of this process or an ancestor -> static;
4. the cell being executed does not allow stdin (nbclient always sends allow_stdin=False; JupyterLab, Notebook and
   VS Code send True) -> static;
5. otherwise live.
"""

from __future__ import annotations

import os
from pathlib import Path

HEADLESS_TOOLS = ("papermill", "nbconvert", "nbclient", "jupyter-execute", "jupyter_execute")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        try:
            import psutil

            return psutil.Process(pid).ppid()
        except Exception:  # noqa: BLE001
            return None


def headless_tool_in_ancestry(max_depth: int = 6) -> str | None:
    """Name of a headless notebook runner found on this process's or an ancestor's command line, else None."""
    pid: int | None = os.getpid()
    for _ in range(max_depth):
        if not pid or pid <= 1:
            break
        for arg in _cmdline(pid)[:4]:  # the program and its first arguments (`python -m papermill ...`)
            base = os.path.basename(arg)
            for tool in HEADLESS_TOOLS:
                if tool in base:
                    return tool
        pid = _parent(pid)
    return None


def _kernel():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return getattr(ip, "kernel", None) if ip is not None else None


def dashboard_mode() -> tuple[str, str]:
    """("live" | "static", why)."""
    forced = os.environ.get("DFLASH_DASHBOARD", "").strip().lower()
    if forced in ("live", "static"):
        return forced, f"DFLASH_DASHBOARD={forced}"
    if forced:
        raise ValueError(f"DFLASH_DASHBOARD={forced!r}: use 'live' or 'static' (or unset it to detect).")
    kernel = _kernel()
    if kernel is None:
        return "static", "not running in a Jupyter kernel"
    tool = headless_tool_in_ancestry()
    if tool:
        return "static", f"executed by {tool}"
    if getattr(kernel, "_allow_stdin", True) is False:
        return "static", "the executing client allows no stdin (nbclient-style headless execution)"
    return "live", "interactive Jupyter kernel"
