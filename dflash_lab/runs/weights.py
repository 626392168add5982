"""Weights files of a run that may still be training: the newest COMPLETE one, read again when the one chosen was
rotated away while it was read, and every damaged one named together with the file used instead.

evaluate and export read a run's weights while its trainer may be writing and rotating checkpoints (keep the last
K): a listing can name a folder that is renamed to `.deleting` before it is opened. A file cut short (a killed write,
a full disk) is never skipped silently and never surfaces as a raw SafetensorError naming no file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from .checkpoint import CheckpointError, data_end

ROTATION_RETRIES = 5  # re-listings when the chosen file vanished (a training run rotates one checkpoint per save)


def weights_problem(path: str | Path) -> str | None:
    """Why a safetensors file cannot be read in full ("missing", "cut short: ..."), or None. Reads only its header."""
    p = Path(path)
    try:
        size = p.stat().st_size
        end = data_end(p)
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, KeyError, TypeError, IndexError):  # no JSON header: garbled or cut inside it
        return "its header is unreadable"
    return f"cut short: {size:,} of {end:,} bytes" if size < end else None


def _load_weights(p: Path) -> tuple[dict[str, torch.Tensor] | None, str | None]:
    """(tensors, None), or (None, why it is damaged); FileNotFoundError when it vanished."""
    from safetensors.torch import load_file

    problem = weights_problem(p)
    if problem == "missing":
        raise FileNotFoundError(f"{p} is missing")
    if problem is None:
        try:
            return load_file(str(p)), None
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001 - SafetensorError and OSError both mean a bad file
            problem = f"{type(e).__name__}: {e}"
    return None, problem


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of one weights file; a damaged one raises CheckpointError naming it (never a raw SafetensorError)."""
    tensors, problem = _load_weights(Path(path))
    if problem:
        raise CheckpointError(f"{path} is damaged ({problem}; a killed write or a full disk). Fix: use another "
                              "checkpoint of the run (pass the run directory: its newest complete one is taken).")
    return tensors


def read_newest_weights(candidates: Callable[[], list[Path]], *, log=print,
                        retries: int = ROTATION_RETRIES) -> tuple[Path, dict[str, torch.Tensor]]:
    """(file, tensors) of the first complete file of `candidates()` (best first). A file that vanished was rotated
    away by a run still training: the candidates are listed again. Damaged files are skipped and named through `log`
    together with the file used; when none is readable, CheckpointError names each."""
    damaged: dict[Path, str] = {}
    for attempt in range(retries + 1):
        listed = [p for p in candidates() if p not in damaged]
        p = None
        try:
            for p in listed:
                tensors, damaged[p] = _load_weights(p)
                if tensors is None:
                    continue
                del damaged[p]  # also name a damaged file listed later (a cut-off final file has no readable step)
                later = {q: weights_problem(q) for q in listed if q != p}
                damaged.update({q: why for q, why in later.items() if why not in (None, "missing")})
                if damaged:
                    log("WARNING: " + "; ".join(f"{q} is damaged ({why})" for q, why in damaged.items())
                        + f"; using {p} instead.")
                return p, tensors
            break
        except FileNotFoundError:
            damaged.pop(p, None)
            time.sleep(0.05 * (attempt + 1))
    if damaged:
        raise CheckpointError("no readable weights: " + "; ".join(f"{q} is damaged ({why})" for q, why in
                                                                 damaged.items())
                              + " (a killed write or a full disk). Fix: resume the run from a good checkpoint, or "
                              "train again, to write new weights.")
    raise CheckpointError(f"no weights file could be read: each vanished while read ({retries + 1} listings of a run "
                          "rotating its checkpoints). Fix: read again, or once the run has ended.")


def retry_rotated(fn: Callable, retries: int = ROTATION_RETRIES):
    """fn() again when it hit a file that vanished (plain FileNotFoundError: a checkpoint rotated away while read);
    subclasses (e.g. "no drafter here") are real answers and pass through."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except FileNotFoundError as e:
            if type(e) is not FileNotFoundError or attempt == retries:
                raise
            time.sleep(0.05 * (attempt + 1))
