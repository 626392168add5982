"""One process per run directory: an exclusive lock file `run.lock` naming its holder (pid, host, start time).

Two processes writing the same run directory interleave metrics.jsonl rows and overwrite each other's checkpoints,
so the process that opens a run directory (a notebook Trainer, or rank 0 of a torchrun job) takes this lock first and
keeps it until it exits. The lock is an OS advisory lock (`fcntl.flock`) on an open file, so the kernel drops it when
the holder dies in any way (SIGKILL included): a lock file left behind by a killed process is therefore detected as
stale simply because nobody holds the OS lock, and it is taken over without a race (whoever gets the OS lock first
owns it; the loser sees the new holder). The JSON inside is only there to name the holder in the error.
The same process may open the same run directory again (e.g. a new Trainer in the same notebook kernel). A clean
release (Trainer.close(), the training command's end, or this interpreter exiting) removes `run.lock`, so a run
folder that no process owns holds none; the holder unlinks it while it still holds the OS lock, and whoever takes a
lock checks that the file it locked is still the one at the path (else it retries), so no two owners can result.

`holding(lock_file, ...)` is the same lock for any one output file for the length of a `with` block: regeneration
takes `<out>.lock`, a sweep takes its folder's `sweep.lock`, so two processes never append to one output.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_FILE = "run.lock"
_held: dict[Path, int] = {}  # run dir (resolved) -> open fd holding the OS lock, for this process


class Busy(RuntimeError):
    """Another live process holds a lock (a run directory, an output file); the message names it and what to do."""


class RunDirLocked(Busy):
    """Another live process owns the run directory; the message names it and what to do."""


def acquire(run_dir: str | Path, *, log=print) -> dict:
    """Take the run directory's lock (or confirm this process holds it); returns the holder record written.

    Raises RunDirLocked naming the holder (pid, host, start time, command) when another live process holds it.
    A lock file whose holder is gone (killed process) is reported and taken over.
    """
    path = Path(run_dir).resolve()
    if path in _held:
        return read_holder(path) or {}
    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = _lock_current_file(path / LOCK_FILE)
    except BlockingIOError:
        raise RunDirLocked(f"run directory {path} is in use by {describe(read_holder(path))}. Two processes writing "
                           "one run directory mix their metrics and checkpoints. Fix: wait for that run to end (or "
                           "stop it: `touch <run dir>/STOP`), or use another run_dir / a fresh run; if it is a "
                           "finished notebook kernel, restart or shut down that kernel.") from None
    except OSError as e:  # a filesystem without advisory locks (some FUSE / old NFS mounts): say so, go on unlocked
        log(f"WARNING: cannot lock run directory {path} ({e}); another process could write into it too. Fix: keep "
            "runs_dir on a local disk or a filesystem with lock support.")
        return {}
    previous = _read_fd(fd)
    if previous and previous.get("pid") != os.getpid():
        log(f"run directory {path}: taking over the stale lock of {describe(previous)} (that process is gone)")
    record = _write_record(fd)
    _held[path] = fd
    return record


def _lock_current_file(lock_file: Path) -> int:
    """An fd of `lock_file` holding its OS lock (non-blocking: BlockingIOError when another process holds it). A
    file unlinked by its releasing holder between our open and our lock is not the lock any more: open it again."""
    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                current = os.stat(lock_file).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            return fd
        os.close(fd)


def _write_record(fd: int) -> dict:
    now = time.time()
    record = {"pid": os.getpid(), "host": socket.gethostname(), "start_time": now,
              "start_utc": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(timespec="seconds"),
              "command": _command_line()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fsync(fd)
    return record


@contextlib.contextmanager
def holding(lock_file: str | Path, *, what: str, fix: str, wait_s: float = 0.0, log=print):
    """Hold an exclusive lock on `lock_file` for the `with` block (the kernel drops it if this process dies, so a
    killed holder never blocks the next one). Another live holder raises Busy naming it, `what` it guards and `fix`,
    at once or after waiting up to `wait_s` seconds for it (said once through `log`). Within one process a second
    `holding` of the same file is refused too (flock locks an open file, not a pid)."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    deadline, said = time.monotonic() + wait_s, False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                if not said:
                    log(f"{what} is in use by {describe(read_holder_file(lock_file))}; waiting for it (up to "
                        f"{wait_s:.0f} s)")
                    said = True
                time.sleep(0.2)
    except BlockingIOError:
        os.close(fd)
        holder = describe(read_holder_file(lock_file))
        raise Busy(f"{what} is in use by {holder} (lock {lock_file}). Fix: {fix}") from None
    except OSError as e:  # no advisory locks on this filesystem: say so, go on unlocked
        os.close(fd)
        log(f"WARNING: cannot lock {lock_file} ({e}); another process could write {what} too. Fix: keep it on a "
            "local disk or a filesystem with lock support.")
        yield {}
        return
    try:
        yield _write_record(fd)
    finally:
        os.ftruncate(fd, 0)  # an empty record = released cleanly (left in place: unlinking a lock file races)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def is_held(lock_file: str | Path) -> bool:
    """Whether a live process holds `lock_file` now (tries the lock without waiting and gives it back)."""
    try:
        fd = os.open(lock_file, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def release(run_dir: str | Path) -> None:
    """Give the lock back and remove run.lock (a process killed without releasing leaves its record, then reported
    as stale by the next holder)."""
    path = Path(run_dir).resolve()
    fd = _held.pop(path, None)
    if fd is not None:
        try:
            (path / LOCK_FILE).unlink()  # still holding the OS lock: a newcomer sees the file gone and retries
        except OSError:
            os.ftruncate(fd, 0)  # cannot remove it: an empty record = released cleanly
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@atexit.register
def _release_all() -> None:
    """A process that ends normally (a papermill kernel after its last cell) releases what it still holds."""
    for path in list(_held):
        try:
            release(path)
        except OSError:
            pass


def read_holder(run_dir: str | Path) -> dict | None:
    """The holder record in the lock file (last holder if nobody holds it now), or None."""
    return read_holder_file(Path(run_dir) / LOCK_FILE)


def read_holder_file(lock_file: str | Path) -> dict | None:
    """The holder record in any lock file (`holding`), or None when it is empty or unreadable."""
    try:
        d = json.loads(Path(lock_file).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) else None


def describe(holder: dict | None) -> str:
    if not holder:
        return "another process (its lock record is unreadable)"
    return (f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('start_utc')} "
            f"({holder.get('command') or 'unknown command'})")


def _read_fd(fd: int) -> dict | None:
    try:
        d = json.loads(os.pread(fd, 1 << 16, 0).decode() or "null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) else None


def _command_line() -> str:
    try:
        argv = Path("/proc/self/cmdline").read_bytes().split(b"\0")
        return " ".join(a.decode(errors="replace") for a in argv if a)[:300]
    except OSError:
        return ""
