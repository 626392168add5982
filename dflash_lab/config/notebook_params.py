"""Which parameters of a driver notebook the user set, and a stop for parameters the notebook does not define.

    params = notebook_params.check(globals(), "train.ipynb")   # in the notebook's first code cell after `parameters`
    Trainer(config, explicit=params.config_fields(gpus="devices"))

The defaults are the literals of the notebook's `parameters` cell, read from notebooks/<name> in the project (not
from the kernel, where the injected values already replaced them). A parameter counts as set by the user when
papermill injected it (`-p name value`, even with the default's value) or when its value in the kernel differs
from that default (edited in JupyterLab). A papermill parameter the notebook does not define (`-p checkpoint_evry
1000`) stops the run with the list of known names instead of training silently with the default. Resume uses the
set names: only they override the checkpoint's config (resume.py).
"""

from __future__ import annotations

import ast
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .train_config import ConfigError, TrainConfig

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
PAPERMILL_HEADER = "# Parameters"  # the first line of the cell papermill injects after the `parameters` cell


class UnknownParameterError(ConfigError):
    """A papermill parameter that the notebook's `parameters` cell does not define."""


def parameter_defaults(notebook: str | Path) -> dict[str, object]:
    """name -> literal default of each assignment in the notebook's cell tagged `parameters`. A relative name of a
    project notebook ("eval.ipynb", "recipes/smollm2.ipynb") is the tracked one under notebooks/ whatever the working
    directory holds (a JupyterLab working copy, an executed copy in an evaluation folder): its defaults are the
    shipped ones, so a value edited in a working copy counts as set by the user."""
    path = Path(notebook)
    if not path.is_absolute() and (NOTEBOOKS_DIR / path).is_file():
        path = NOTEBOOKS_DIR / path
    nb = json.loads(path.read_text())
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise ConfigError(f"{path} has no cell tagged 'parameters'. Fix: tag the notebook's parameters cell.")
    return _assignments("".join(cells[0]["source"]))


def _assignments(source: str) -> dict[str, object]:
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = ast.literal_eval(node.value)
    return out


def injected_names(namespace: dict) -> list[str]:
    """Names papermill injected in this kernel (from its input history `In`); [] outside papermill."""
    names: list[str] = []
    for source in namespace.get("In", []) or []:
        if isinstance(source, str) and source.lstrip().startswith(PAPERMILL_HEADER):
            names += [n for n in _assigned_names(source) if n not in names]
    return names


def _assigned_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        out += [t.id for t in targets if isinstance(t, ast.Name)]
    return out


@dataclass(frozen=True)
class NotebookParameters:
    notebook: str
    defaults: dict
    values: dict
    set_by_user: tuple[str, ...]

    def config_fields(self, **renames: str) -> set[str]:
        """The TrainConfig fields the user set; `renames` maps notebook names to fields (gpus="devices")."""
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        names = {renames.get(n, n) for n in self.set_by_user}
        return names & fields


def check(namespace: dict, notebook: str | Path) -> NotebookParameters:
    """Refuse papermill parameters that `notebook` does not define; say which defined ones the user set."""
    defaults = parameter_defaults(notebook)
    injected = injected_names(namespace)
    unknown = [n for n in injected if n not in defaults]
    if unknown:
        import difflib

        guesses = {n: difflib.get_close_matches(n, list(defaults), n=1, cutoff=0.6) for n in unknown}
        meant = "; ".join(f"{n!r}: did you mean {g[0]!r}?" for n, g in guesses.items() if g)
        raise UnknownParameterError(
            f"{Path(notebook).name} does not define the parameter(s) {unknown}"
            + (f" ({meant})" if meant else "") + ": nothing would read them, so the run would silently use the "
            f"defaults. Fix: use one of the notebook's parameters: {sorted(defaults)} "
            "(`papermill --help-notebook` lists them with their meaning).")
    values = {n: namespace[n] for n in defaults if n in namespace}
    changed = [n for n in defaults if n in values and values[n] != defaults[n]]
    set_by_user = tuple(dict.fromkeys(injected + changed))
    return NotebookParameters(notebook=str(notebook), defaults=defaults, values=values, set_by_user=set_by_user)
