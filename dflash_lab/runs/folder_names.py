"""Run folder names: `<name>-<UTC stamp>-<short id>`, and the parts of a name in this or the earlier layout.

The name comes first so that a file browser that cuts long names (JupyterLab shows ~20 characters) still tells runs
apart; folders made before read `<UTC stamp>-<name>-<id>` and still list, sort by their stamp and resume.
"""

from __future__ import annotations

import datetime as _dt
import re
import secrets
from pathlib import Path

RUN_FOLDER = re.compile(r"^(?P<name>.+)-(?P<stamp>\d{8}T\d{6}Z)-(?P<id>[0-9a-f]+)$")
OLD_RUN_FOLDER = re.compile(r"^(?P<stamp>\d{8}T\d{6}Z)-(?P<name>.+)-(?P<id>[0-9a-f]+)$")


def new_folder_name(name: str, now: _dt.datetime) -> str:
    """`<name>-<UTC stamp>-<6 hex>` for a run named `name` (characters a shell or URL would mangle become '-')."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    return f"{safe}-{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def run_folder_parts(folder: str | Path) -> dict[str, str] | None:
    """{"name", "stamp", "id"} of a run folder's name in either layout; None for a name in neither."""
    text = Path(folder).name
    m = OLD_RUN_FOLDER.match(text) or RUN_FOLDER.match(text)
    return m.groupdict() if m else None
