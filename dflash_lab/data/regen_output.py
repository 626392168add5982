"""The resumable output of regenerate.py: where it may go, its lock, the settings every record carries and must match
on resume, and the append-only writer.

A regenerated file is training data, so nothing may be mixed into it: every record says what produced it under
"generation" (target and the sha256 of its weights, dtype, back end, every sampling knob) and which prompt it
answered (`prompt_sha256`: the conversation's system/user turns). A rerun appends only when every record already in
the file matches the current settings and its conversation is unchanged in the input; anything else is refused with
the record, the difference and the fix. One process at a time writes a file (`<out>.lock`, runs/lock.py), and the
output may never be the input or lie inside the input folder (it would be read back as data on the next run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from pathlib import Path

from dflash_lab.runs import lock as file_lock
from dflash_lab.target import models
from dflash_lab.target.load import is_bench_target, resolve_target_path

from .files import DataError

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_new_tokens", "enable_thinking", "seed")
# What produced an answer besides the sampling knobs; a record holding another value is refused on resume.
PRODUCER_KEYS = ("backend", "target", "target_sha256", "dtype", "model", "server_url")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def lock_path(out: Path) -> Path:
    return out.with_name(out.name + ".lock")


def check_output_path(data: Path | None, out: Path) -> None:
    """Refuse an output that is the input file, or that lies inside the input folder (with its .meta.json and lock,
    it would be read back as data by the next run), before anything is touched."""
    if data is None:
        return
    src, dst = Path(data).resolve(), Path(out).resolve()
    same = dst == src or (dst.exists() and src.is_file() and os.path.samefile(src, dst))
    if same:
        raise DataError(f"--out {out} is the input file --data {data}: regenerating into it would destroy the input "
                        "(and --overwrite would delete it). Fix: pass another --out, e.g. "
                        f"{dst.with_name(dst.stem + '.regen.jsonl')}.")
    if src.is_dir() and src in dst.parents:
        raise DataError(f"--out {out} lies inside the input folder --data {data}: the next run would read the output "
                        "and its .meta.json back as input, and records would grow on every rerun. Fix: pass an --out "
                        f"outside {src}, e.g. {src.parent / (src.name + '.regen.jsonl')}.")


@contextlib.contextmanager
def output_lock(out: Path, log=print):
    """One writer per output file: a second regenerate into the same --out is refused, naming the first."""
    try:
        with file_lock.holding(lock_path(out), what=f"regeneration output {out}", log=log,
                               fix="wait for that regeneration to end (it resumes the same file), or pass another "
                                   "--out.") as holder:
            yield holder
    except file_lock.Busy as e:
        raise DataError(str(e)) from None


def prompt_sha256(messages: list[dict]) -> str:
    """What an answer depends on in its conversation: the order of roles and every non-assistant turn's text."""
    keep = [[m["role"], None if m["role"] == "assistant" else m.get("content"), m.get("name")] for m in messages]
    return hashlib.sha256(json.dumps(keep, ensure_ascii=False).encode()).hexdigest()


_checksums: dict[tuple, str] = {}  # (file, size, mtime_ns) of every weights file -> digest, per process


def target_sha256(target: str, log=print) -> str | None:
    """One sha256 for the target's weights: the recorded per-file digests of a converted known model, else the
    files hashed once per process (and again when one changed). None for a hub id or a bench target (no files)."""
    if is_bench_target(target):
        return None
    if models.is_known(target):
        info = models.manifest(target) or {}
        digests = info.get("output_sha256")
        if isinstance(digests, dict) and digests:
            return _combine(digests)
    folder = Path(resolve_target_path(target))
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if key not in _checksums:
        t0 = time.perf_counter()
        gb = sum(k[1] for k in key) / 1e9
        if gb > 1:
            log(f"regenerate: sha256 of the target's weights ({gb:.1f} GB) to record with every answer ...")
        _checksums[key] = _combine({p.name: models.sha256_of(p) for p in files})
        if gb > 1:
            log(f"regenerate: target weights sha256 {_checksums[key][:16]}... ({time.perf_counter() - t0:.1f} s)")
    return _checksums[key]


def _combine(digests: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()


def read_output(out: Path, log=print) -> dict[str, tuple[int, dict]]:
    """{id: (line number, its "generation" dict)} of the records in `out`. A half-written last line (interrupted
    run) is cut off; any other line that is not a complete record raises DataError naming the line."""
    if not out.exists():
        return {}
    done, good_end = {}, 0
    with open(out, "rb") as f:
        lines = f.readlines()
    for lineno, raw in enumerate(lines, 1):
        try:
            rec = json.loads(raw)
            gen = rec.get("generation")
            done[str(rec["id"])] = (lineno, gen if isinstance(gen, dict) else {})
            good_end += len(raw)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            if lineno == len(lines) and not raw.endswith(b"\n"):
                with open(out, "r+b") as f:
                    f.truncate(good_end)
                log(f"regenerate: cut off a half-written last line of {out} (line {lineno}, interrupted run)")
                break
            problem = e if not isinstance(e, AttributeError) else "not a JSON object"
            raise DataError(f"{out}:{lineno}: not a complete output record ({problem}). The output file is corrupt. "
                            "Fix: remove that line, or start a new output file.") from None
    return done


def check_records(out: Path, records: dict[str, tuple[int, dict]], expected: dict, prompts: dict[str, str]) -> None:
    """Refuse to append when a record in `out` was produced otherwise (any of PRODUCER_KEYS / SAMPLING_KEYS it
    carries differs from `expected`) or answered another version of a conversation still in the input (`prompts`:
    id -> prompt_sha256). Keys a record lacks (files written before they were recorded) are not compared."""
    keys = PRODUCER_KEYS + SAMPLING_KEYS
    changed = []
    for cid, (lineno, gen) in records.items():
        diff = {k: (gen[k], expected.get(k)) for k in keys if k in gen and gen[k] != expected.get(k)}
        if diff:
            raise DataError(f"{out}:{lineno} (id {cid!r}) was generated with other settings {diff} (in the file, "
                            "now). Resuming would mix them in one file. Fix: rerun with the same settings, use a new "
                            "output file, or pass overwrite=True (--overwrite).")
        old = gen.get("prompt_sha256")
        if old is not None and cid in prompts and prompts[cid] != old:
            changed.append(cid)
    if changed:
        raise DataError(f"{len(changed)} conversation(s) changed in the input since {out} answered them (ids "
                        f"{changed[:5]}{' ...' if len(changed) > 5 else ''}): resuming would keep their old answers. "
                        "Fix: use a new output file, or pass overwrite=True (--overwrite) to answer them all again.")


def check_meta(out: Path, settings: dict) -> None:
    """Refuse to resume when `<out>.meta.json` names other settings (keys it lacks are not compared)."""
    mp = meta_path(out)
    if not mp.is_file():
        return
    try:
        old = json.loads(mp.read_text()).get("settings", {})
    except (OSError, ValueError, AttributeError) as e:
        raise DataError(f"{mp} cannot be read ({type(e).__name__}: {e}). Fix: delete it (every record of {out} "
                        "carries its own settings, which are still checked).") from None
    diff = {k: (old.get(k), v) for k, v in settings.items() if k in old and old.get(k) != v}
    if diff:
        raise DataError(f"{out} was written with other settings {diff} (old, new). Resuming would mix them in one "
                        "file. Fix: rerun with the same settings, use a new output file, or pass overwrite=True.")


def write_meta(out: Path, settings: dict, stats) -> None:
    mp = meta_path(out)
    tmp = mp.with_name(mp.name + ".tmp")
    tmp.write_text(json.dumps({"settings": settings, "last_run": stats.to_dict(),
                               "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
    os.replace(tmp, mp)


class Writer:
    """Append-only JSONL writer shared by worker threads; progress lines every `every_s` seconds.

    A write that fails (a full disk) stops the run with one DataError naming the file and how many complete
    conversations it keeps; nothing is written after it, and closing does not raise the same failure again."""

    def __init__(self, out: Path, stats, settings: dict, log, every_s: float, on_progress):
        self.f = open(out, "a", encoding="utf-8")
        self.out, self.stats, self.settings, self.log, self.every_s = out, stats, settings, log, every_s
        self.on_progress = on_progress
        self.lock = threading.Lock()
        self.t0 = self.last = time.monotonic()
        self.dropped = 0  # conversations skipped while running (never to be written)
        self.failed: DataError | None = None
        self._raised = False  # the failure has reached the caller once: closing keeps quiet about it

    def _failure(self, e: OSError, what: str) -> DataError:
        """The one error of a failed write (kept: the records counted so far, each a complete line)."""
        if self.failed is None:
            kept = self.stats.already_done + self.stats.samples
            why = e.strerror or type(e).__name__
            self.failed = DataError(f"regenerate: could not write {what} ({why}); {kept:,} complete conversations are "
                                    f"kept in {self.out} (a half-written last line is cut off on resume). Fix: free "
                                    "disk space, then rerun the same command: it resumes.")
        return self.failed

    def add(self, rec: dict) -> None:
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        with self.lock:
            if self.failed is not None:
                raise self.failed
            try:
                self.f.write(line)
                self.f.flush()
            except OSError as e:
                self._raised = True
                raise self._failure(e, str(self.out)) from None
            s = self.stats
            s.samples += 1
            s.turns += len(rec["generation"]["finish_reasons"])
            s.new_tokens += sum(rec["generation"]["new_tokens"])
            s.finish_reasons.update(rec["generation"]["finish_reasons"])
            self._tick()

    def skip(self, reason: str, conv_id: str, detail: str) -> None:
        """A conversation that cannot be answered (e.g. longer than the target's context): counted, not written."""
        with self.lock:
            s = self.stats
            s.skipped[reason] = s.skipped.get(reason, 0) + 1
            self.dropped += 1
            self.log(f"regenerate: conversation {conv_id!r} skipped: {detail}")
            self._tick()

    def _tick(self) -> None:
        s = self.stats
        now = time.monotonic()
        s.seconds = now - self.t0
        if now - self.last >= self.every_s or s.samples + s.already_done + self.dropped == s.total:
            self.last = now
            try:
                os.fsync(self.f.fileno())
                write_meta(self.out, self.settings, s)
            except OSError as e:
                self._raised = True
                raise self._failure(e, f"{self.out} and {meta_path(self.out)}") from None
            self.log(self.progress_line())
        if self.on_progress is not None:
            self.on_progress(s)

    def progress_line(self) -> str:
        s = self.stats
        done, left = s.samples + s.already_done, s.total - s.samples - s.already_done - self.dropped
        eta = int(left / s.samples_per_s) if s.samples_per_s > 0 else 0
        return (f"regenerate: {done}/{s.total} conversations | {s.samples_per_s:.2f} samples/s | "
                f"{s.tokens_per_s:,.0f} new tok/s | ETA {eta // 3600}h{eta % 3600 // 60:02d}m{eta % 60:02d}s")

    def close(self) -> None:
        """Flush, sync and close; a failure here is the same one line as in add(), raised once."""
        with self.lock:
            self.stats.seconds = time.monotonic() - self.t0
            try:
                self.f.flush()
                os.fsync(self.f.fileno())
            except OSError as e:
                self._failure(e, str(self.out))
            finally:
                try:
                    self.f.close()  # closes the file even when its last flush fails
                except OSError as e:
                    self._failure(e, str(self.out))
            if self.failed is None:
                try:
                    write_meta(self.out, self.settings, self.stats)
                except OSError as e:
                    self._failure(e, str(meta_path(self.out)))
            if self.failed is not None and not self._raised:
                self._raised = True
                raise self.failed from None
