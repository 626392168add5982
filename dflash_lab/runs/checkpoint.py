"""Full training checkpoints: atomic, rotated, safetensors + JSON only (never pickle), enough to resume exactly.

Layout of one checkpoint, `<run_dir>/checkpoints/step-0001200/`:

    drafter.safetensors     drafter weights in export names (what `save_drafter` writes)
    optimizer.safetensors   fp32 master weights + AdamW state (`master/<p>`, `exp_avg/<p>`, `exp_avg_sq/<p>`, `step/<p>`)
    rng.safetensors         torch CPU RNG state and one CUDA RNG state per device used
    state.json              step, data position, scheduler position, optimizer hyper-parameters, python/numpy RNG,
                            loss, the resolved TrainConfig and DrafterConfig (a checkpoint describes itself)

Atomicity is directory-level: everything is written into `step-XXXXXXX.tmp/`, fsynced, then renamed in one
`os.rename`. A crash or a full disk mid-write leaves at worst a `.tmp` folder (ignored and cleaned up later); a
folder named `step-*` is always complete. Rotation keeps the last K plus the best (lowest mean loss since the
previous checkpoint); a checkpoint whose state.json cannot be read is reported and never chosen as the best, and
never stops a save. Deletion is rename-then-remove (`step-N` -> `step-N.deleting` -> gone), so a kill at any moment
leaves either a complete `step-N` or a `.deleting` folder that the next save removes. Rewriting the same step moves
the old copy to `step-N.old` before renaming the new one in; a kill between the two renames leaves `step-N.old`,
which readers use as step N and the next save renames back, so one complete copy always survives.

Readers of a run that may still be training (evaluate, export) take the newest COMPLETE weights file and retry when
the one they chose was rotated away while they read it (weights.py).

What goes into the files (optimiser, RNG, replica state) is train_state.py; whether a checkpoint may be resumed
with the current settings is resume_checks.py.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from .run_files import RunFileError, read_json

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.json"
DRAFTER_FILE = "drafter.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d{7,})$")
REPLACED = ".old"  # suffix of the previous copy while the same step is being rewritten
DELETING = ".deleting"  # suffix of a checkpoint being removed (rename first, then remove)

class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what is still intact and what to do."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def checkpoint_step(path: Path) -> int | None:
    """N of `step-N` (or of `step-N.old`, a previous copy standing in for an interrupted same-step rewrite)."""
    name = Path(path).name
    m = _NAME.match(name.removesuffix(REPLACED))
    return int(m.group(1)) if m else None


def _root(run_dir: str | Path) -> Path:
    root = Path(run_dir)
    return root if root.name == CHECKPOINTS_DIR else root / CHECKPOINTS_DIR


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run directory (or of its `checkpoints/` folder), oldest step first.

    A `step-N.old` whose `step-N` is missing (a same-step rewrite killed between its two renames) stands in for
    step N; folders being deleted or written (`.deleting`, `.tmp`) never count."""
    root = _root(run_dir)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in sorted(root.iterdir(), key=lambda q: q.name.endswith(REPLACED)):  # step-N before step-N.old
        step = checkpoint_step(p)
        if step is not None and step not in found and p.is_dir() and (p / STATE_FILE).is_file():
            found[step] = p
    return [found[s] for s in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run directory (-> its newest complete checkpoint)."""
    p = Path(path).expanduser()
    if (p / STATE_FILE).is_file():
        return p
    if not p.exists():
        raise CheckpointError(f"resume_from={str(path)!r} does not exist. Fix: pass a run directory "
                              "(runs/<name>-<stamp>-<id>) or one of its checkpoints/step-XXXXXXX folders.")
    latest = latest_checkpoint(p)
    if latest is None:
        partial = sorted(q.name for q in (p / CHECKPOINTS_DIR).glob("*.tmp")) if (p / CHECKPOINTS_DIR).is_dir() else []
        extra = f" (only unfinished writes: {partial})" if partial else ""
        raise CheckpointError(f"resume_from={str(path)!r} holds no complete checkpoint{extra}. Fix: pass a run "
                              "directory trained with checkpoint_every > 0 (or stopped/finished cleanly), or a "
                              "checkpoints/step-XXXXXXX folder.")
    return latest


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint belongs to (`<run>/checkpoints/step-*`), if it has a config.json."""
    parent = checkpoint.resolve().parent
    if parent.name == CHECKPOINTS_DIR and (parent.parent / "config.json").is_file():
        return parent.parent
    return None


# ---------------------------------------------------------------------------------------------------------------
# Writers: every byte of a checkpoint goes through these two (tests replace them to simulate a full disk).
# ---------------------------------------------------------------------------------------------------------------
def _write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "dflash-lab", "version": str(FORMAT_VERSION)})
    respect_umask(path)
    _fsync_file(path)


def current_umask() -> int:
    """The process umask, read without changing it (Linux /proc), else by the set-and-restore idiom."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def respect_umask(path: str | Path) -> None:
    """Give a file the mode an ordinary `open(path, "w")` would: safetensors writes 0600 through a temp file, which
    a server running as another user (or group) cannot read."""
    os.chmod(path, 0o666 & ~current_umask())


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, allow_nan=True) + "\n")
    _fsync_file(path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync_file(path)
    except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
        pass


def write_checkpoint(root: str | Path, step: int, files: dict[str, dict[str, torch.Tensor]], state: dict) -> Path:
    """Write `files` (name -> tensors) and state.json into `root/step-XXXXXXX/` atomically; returns the folder.

    On any error the temp folder is removed and CheckpointError says which previous checkpoint is still intact.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / (final.name + ".tmp")
    try:
        restore_interrupted(root)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name, tensors in files.items():
            _write_tensors(tmp / name, {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()})
        _write_json(tmp / STATE_FILE, state)  # last: a folder with state.json has every other file
        _fsync_dir(tmp)
        if final.exists():  # same step written again (e.g. stop right after a periodic save): replace it
            old = root / (final.name + REPLACED)  # a kill before the next rename leaves this complete copy
            _remove(old)
            os.rename(final, old)
            os.rename(tmp, final)
            _remove(old)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
    except KeyboardInterrupt:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = [p for p in list_checkpoints(root) if p != final]
        intact = (f"the previous checkpoint {prev[-1]} (step {checkpoint_step(prev[-1])}) is intact"
                  if prev else "no earlier checkpoint exists")
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = "free disk space (or point runs_dir at a larger disk)" if full else "check the disk and permissions"
        raise CheckpointError(f"writing checkpoint step {step} into {root} failed ({type(e).__name__}: {e}); the "
                              f"partial write was removed and {intact}. Fix: {fix}; training state in memory is "
                              "unaffected, so the next save can succeed.") from e
    return final


def restore_interrupted(root: str | Path) -> list[Path]:
    """Rename `step-N.old` back to `step-N` where a same-step rewrite was killed between its two renames."""
    root = _root(root)
    back = []
    for old in root.glob(f"step-*{REPLACED}"):
        final = old.with_name(old.name.removesuffix(REPLACED))
        if checkpoint_step(final) is not None and not final.exists() and (old / STATE_FILE).is_file():
            os.rename(old, final)
            back.append(final)
    return back


def _remove(path: Path) -> None:
    """Rename to `<name>.deleting`, then remove: a kill mid-removal leaves only a `.deleting` folder (never a
    half-deleted `step-N` that looks like a checkpoint), which the next rotation removes."""
    if not path.exists():
        return
    doomed = path.with_name(path.name + DELETING)
    if doomed.exists():
        shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _loss_avg(path: Path) -> tuple[float | None, str | None]:
    """(the checkpoint's loss_avg if finite, else None; a reason if its state.json cannot be read)."""
    try:
        loss = read_state(path).get("loss_avg")
    except CheckpointError as e:
        return None, str(e)
    return (float(loss), None) if isinstance(loss, (int, float)) and math.isfinite(loss) else (None, None)


def rotate(root: str | Path, keep: int, *, log=print) -> list[Path]:
    """Keep the newest `keep` checkpoints plus the best (lowest `loss_avg`); delete the rest and stale temp folders.

    A checkpoint with an unreadable state.json is reported through `log`, never chosen as the best, and rotated like
    any other (kept while among the newest `keep`)."""
    restore_interrupted(root)
    ckpts = list_checkpoints(root)
    keep_set = set(ckpts[-keep:]) if keep > 0 else set()
    scored = []
    for p in ckpts:
        loss, bad = _loss_avg(p)
        if bad:
            log(f"WARNING: {bad} It is {'kept (among the newest)' if p in keep_set else 'removed by rotation'}.")
        elif loss is not None:
            scored.append((loss, checkpoint_step(p), p))
    if scored:
        keep_set.add(min(scored)[2])
    removed = []
    for p in ckpts:
        if p not in keep_set:
            _remove(p)
            removed.append(p)
    base = _root(root)
    for stale in [*base.glob("step-*.tmp"), *base.glob(f"step-*{REPLACED}"), *base.glob(f"*{DELETING}")]:
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def best_checkpoint(run_dir: str | Path) -> Path | None:
    scored = [(loss, checkpoint_step(p), p) for p in list_checkpoints(run_dir) if (loss := _loss_avg(p)[0]) is not None]
    return min(scored)[2] if scored else None


# ---------------------------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------------------------
def read_state(path: str | Path) -> dict:
    """state.json of a checkpoint; a cut-off or garbled file raises CheckpointError naming it."""
    try:
        return read_json(Path(path) / STATE_FILE)
    except RunFileError as e:
        raise CheckpointError(str(e)) from e


def read_tensors(path: str | Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    f = Path(path) / name
    if not f.is_file():
        raise CheckpointError(f"{f} is missing.")
    try:
        return load_file(str(f))
    except Exception as e:  # noqa: BLE001 - SafetensorError (truncated / garbled), OSError: all mean a bad file
        raise CheckpointError(f"{f} cannot be read ({type(e).__name__}: {e}).") from e


def _readable(path: Path) -> bool:
    """state.json parses and every safetensors header is intact (cheap: no tensor data is read)."""
    from safetensors import safe_open

    try:
        read_state(path)
        for name in (DRAFTER_FILE, OPTIMIZER_FILE, RNG_FILE):
            with safe_open(str(path / name), "pt") as f:
                f.keys()
            if (path / name).stat().st_size < data_end(path / name):
                return False
    except Exception:  # noqa: BLE001 - any failure means "not a good checkpoint"
        return False
    return True


def data_end(path: Path) -> int:
    """Byte size a safetensors file must have: 8 + header length + the largest data offset in its header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)


def _bad_checkpoint(p: Path, error: CheckpointError) -> CheckpointError:
    older = [q for q in list_checkpoints(p.parent) if (checkpoint_step(q) or 0) < (checkpoint_step(p) or 0)]
    good = next((q for q in reversed(older) if _readable(q)), None)
    fix = (f"resume from the previous good checkpoint: resume_from={str(good)!r} (step {checkpoint_step(good)})"
           if good else "no older readable checkpoint exists in this run; start a fresh run (resume_from=None)")
    return CheckpointError(f"cannot resume from checkpoint {p}: {error} The file is damaged (a killed write or a full "
                           f"disk). Fix: {fix}; or move {p.name} aside.")


@dataclass
class Checkpoint:
    path: Path
    state: dict
    drafter: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor]
    rng: dict[str, torch.Tensor]

    @property
    def step(self) -> int:
        return int(self.state["step"])


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Every file of a checkpoint; a damaged one raises CheckpointError naming it and the previous good checkpoint."""
    p = resolve_checkpoint(path)
    try:
        state = read_state(p)
    except CheckpointError as e:
        raise _bad_checkpoint(p, e) from e
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {p} has format_version={state.get('format_version')!r}; this dflash-lab "
                              f"reads {FORMAT_VERSION}. Fix: resume with the dflash-lab version that wrote it.")
    try:
        return Checkpoint(p, state, *(read_tensors(p, n) for n in (DRAFTER_FILE, OPTIMIZER_FILE, RNG_FILE)))
    except CheckpointError as e:
        raise _bad_checkpoint(p, e) from e

