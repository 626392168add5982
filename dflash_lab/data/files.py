"""Which files a data path means, and their raw records: every file is either read or reported as skipped, with why.

A data path is a file, a Hugging Face `datasets` save_to_disk directory, or a directory. A directory is searched
recursively (symlinked folders are not followed) in sorted path order; a subfolder that is a `datasets` directory is
read as one. Names are matched case-insensitively:

    .jsonl / .json / .parquet          read
    + .gz / .bz2 / .xz                 read through the stdlib decompressor (e.g. data.JSONL.GZ)
    + .zst / .lz4 / .zip / .tar / ...  skipped: "decompress it first" (no stdlib reader)
    .parquet.gz etc.                   skipped: Parquet compresses internally; decompress it first
    hidden files and folders (.name)   skipped
    held-out files                     skipped: heldout.jsonl, <stem>.heldout.jsonl, <stem>-heldout.jsonl
    the data tools' own files          skipped: <stem>.report.json, <out>.meta.json (reports, regeneration settings)
    anything else                      skipped: not a data file

A held-out file beside the training file (self_prompts.py writes `<stem>.heldout.jsonl` next to `<stem>.jsonl`)
must never train: a folder read would make the held-out prompts training data and every evaluation on them
flattering. A file named explicitly is read whatever its name.

A file that turns out unreadable while reading (corrupt or empty Parquet, a broken gzip stream, a JSON file that is
not valid JSON) yields a `FileIssue` instead of aborting: records already read from it are kept.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
from collections.abc import Iterator
from pathlib import Path

DATA_KINDS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
COMPRESSIONS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
NO_READER = (".zst", ".zstd", ".lz4", ".zip", ".7z", ".tar", ".tgz", ".rar", ".br", ".snappy")


class DataError(ValueError):
    """Bad data or a bad data setting; the message names the file, the line and the fix."""


class RecordIssue(Exception):
    """One unusable record: a reason code (chat_formats.REASONS) plus what exactly is wrong."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class FileIssue(RecordIssue):
    """A whole file (or the rest of it) could not be read; `where` says which file and how far reading got."""


def classify(path: Path) -> tuple[str | None, str | None]:
    """(kind "jsonl"|"json"|"parquet", None) for a readable data file, else (None, why it is skipped)."""
    name = path.name.lower()
    if name.startswith("."):
        return None, "hidden file"
    stem, ext = os.path.splitext(name)
    if ext in NO_READER:
        return None, f"{ext} compression has no reader in the Python standard library; decompress it first"
    compressed = ext in COMPRESSIONS
    if compressed:
        stem, ext = os.path.splitext(stem)
    kind = DATA_KINDS.get(ext)
    if kind is None:
        return None, f"not a data file (extension {ext or '(none)'}; read: {sorted(DATA_KINDS)}, optionally " \
                     f"{'/'.join(COMPRESSIONS)}-compressed)"
    if kind == "parquet" and compressed:
        return None, "a compressed Parquet file (Parquet compresses internally); decompress it first"
    return kind, None


HELDOUT_SUFFIX = ".heldout.jsonl"  # self_prompts.py's held-out file beside <stem>.jsonl
NOT_DATA_SUFFIXES = (".report.json", ".meta.json")  # reports and regeneration settings beside their data


def not_training_data(name: str) -> str | None:
    """Why a file found in a data folder is left out although its extension is a data file's: a held-out file, or a
    report / settings file a data tool writes beside its output. None for a data file."""
    name = name.lower()
    stem, ext = os.path.splitext(name)
    if ext in COMPRESSIONS:
        name = stem
    if name == "heldout.jsonl" or name.endswith((HELDOUT_SUFFIX, "-heldout.jsonl")):
        return "a held-out file: never training data (evaluate on it with --prompts FILE)"
    if name.endswith(NOT_DATA_SUFFIXES):
        return "a data tool's report or settings file, not data"
    return None


def heldout_path(out: str | Path) -> Path:
    """The held-out file of the run whose training file is `out`: `<stem>.heldout.jsonl` beside it."""
    out = Path(out)
    return out.with_name(out.with_suffix("").name + HELDOUT_SUFFIX)


def heldout_files(data: str | Path) -> list[Path]:
    """The held-out files that belong to training data `data`: a training file's own, or every run's in a data
    folder (sorted); the ones that exist. Evaluation's `self-heldout` takes exactly one of them."""
    p = Path(data).expanduser()
    if p.is_dir():
        return sorted(f for f in p.iterdir() if f.name.endswith(HELDOUT_SUFFIX) and f.is_file())
    return [h for h in [heldout_path(p)] if h.is_file()] if p.suffix.lower() == ".jsonl" else []


def is_hf_dataset_dir(p: Path) -> bool:
    return p.is_dir() and any((p / f).is_file() for f in ("state.json", "dataset_dict.json", "dataset_info.json"))


def find_data_files(path: str | Path) -> tuple[list[Path], dict[str, str]]:
    """(files and `datasets` dirs to read, in order; {skipped path: reason}) for a data path."""
    p = Path(path).expanduser()
    if is_hf_dataset_dir(p):
        return [p], {}
    if p.is_file():
        kind, why = classify(p)
        if kind is None and why.startswith(("hidden", "not a data file")):
            return [p], {}  # a file named explicitly is read as JSONL whatever its name
        if kind is None:
            raise DataError(f"data file {p} cannot be read: {why}.")
        return [p], {}
    if not p.is_dir():
        raise DataError(f"data path {p} does not exist. Expected a JSONL/JSON/Parquet file or a `datasets` directory "
                        'with one conversation per record, e.g. {"messages": [{"role": "user", "content": "..."}, '
                        '{"role": "assistant", "content": "..."}]}.')
    files, skipped = [], {}
    for root, dirs, names in os.walk(p, followlinks=False):
        here = Path(root)
        keep = []
        for d in sorted(dirs):
            sub = here / d
            if d.startswith("."):
                skipped[str(sub)] = "hidden folder"
            elif is_hf_dataset_dir(sub):
                files.append(sub)
            else:
                keep.append(d)
        dirs[:] = keep  # os.walk descends only into these
        for n in names:
            f = here / n
            kind, why = classify(f)
            why = why or not_training_data(n)
            if why is not None:
                skipped[str(f)] = why
            elif f.is_file():
                files.append(f)
    files.sort(key=lambda f: f.relative_to(p).parts)
    if not files:
        raise DataError(f"directory {p} holds no .jsonl/.json/.parquet file (optionally .gz/.bz2/.xz) and is not a "
                        f"Hugging Face dataset saved with save_to_disk(); skipped: {dict(list(skipped.items())[:10])}. "
                        "Fix: point data at a file or such a directory.")
    return files, skipped


def iter_records(path: Path, *, split: str | None = None) -> Iterator[tuple[str, object]]:
    """(where, record) per record; `record` is a RecordIssue for a line that could not be parsed, or a FileIssue
    when the file (or its remainder) cannot be read."""
    kind, _ = classify(path)
    try:
        if path.is_dir():
            yield from _iter_hf_dataset(path, split)
        elif kind == "parquet":
            yield from _iter_parquet(path)
        else:
            yield from _iter_json_lines(path, array_ok=kind == "json")
    except DataError:  # a setting to fix (e.g. which split of a DatasetDict), not a damaged file
        raise
    except (OSError, EOFError, ValueError, lzma.LZMAError) as e:  # corrupt Parquet / Arrow / gzip / bz2 / xz
        yield str(path), FileIssue("unreadable_file", f"{type(e).__name__}: {e}")


def _open(path: Path):
    ext = os.path.splitext(path.name.lower())[1]
    return COMPRESSIONS.get(ext, open)(path, "rb")


def _iter_json_lines(path: Path, *, array_ok: bool) -> Iterator[tuple[str, object]]:
    with _open(path) as f:
        head = f.read(4096).lstrip()
    if array_ok and head.startswith(b"["):  # one JSON array
        with _open(path) as f:
            raw = f.read()
        try:
            items = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            yield str(path), FileIssue("unreadable_file", f"not a valid JSON array ({e}); fix the file or write it "
                                                          "as JSONL")
            return
        for i, item in enumerate(items):
            yield f"{path}:item {i}", item
        return
    lineno = 0
    try:
        with _open(path) as f:
            for lineno, raw in enumerate(f, 1):
                rec = _parse_line(raw)
                if rec is not _BLANK:
                    yield f"{path}:{lineno}", rec
    except (OSError, EOFError, lzma.LZMAError) as e:  # e.g. a truncated .gz: the lines before it are kept
        yield f"{path}:{lineno + 1}", FileIssue("unreadable_file", f"cannot be read from line {lineno + 1} on "
                                                                   f"({type(e).__name__}: {e})")


_BLANK = object()


def _parse_line(raw: bytes) -> object:
    """One JSONL line -> its record (any JSON value), a RecordIssue, or _BLANK for an empty line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return RecordIssue("unreadable", f"byte {e.start} is not valid UTF-8")
    if not line.strip():
        return _BLANK
    # Without its line ending: inside a string cut off by the end of the line, json reads the newline as an
    # "Invalid control character"; the line is unterminated, and that is what the report should say.
    line = line.rstrip("\r\n")
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        if e.pos >= len(line.rstrip()) or e.msg.startswith("Unterminated"):
            return RecordIssue("malformed_json", f"not valid JSON: the line ends before the record does "
                                                 f"({e.msg.lower()} column {e.colno}): a cut-off (truncated) line")
        # json's own message may end in "at" ("Unterminated string starting at"): the column completes it
        at = "" if e.msg.endswith(" at") else " at"
        return RecordIssue("malformed_json", f"not valid JSON: {e.msg}{at} column {e.colno}")
    except RecursionError:
        return RecordIssue("malformed_json", "nested too deeply to parse")


def _iter_parquet(path: Path) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    row = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                yield f"{path}:row {row}", rec
                row += 1
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError/... for a corrupt or empty file
        yield f"{path}:row {row}", FileIssue("unreadable_file", f"Parquet cannot be read from row {row} on "
                                                                f"({type(e).__name__}: {e})")


def _iter_hf_dataset(path: Path, split: str | None) -> Iterator[tuple[str, object]]:
    """A `datasets` save_to_disk directory: through `datasets.load_from_disk` when it is installed, else by reading
    its Arrow stream files with pyarrow (the format save_to_disk writes: state.json lists the data files)."""
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        pick = split or ("train" if "train" in splits else (splits[0] if len(splits) == 1 else None))
        if pick is None or pick not in splits:
            raise DataError(f"{path} is a DatasetDict with splits {splits}; choose one with split=... "
                            f"(got {split!r}).")
        path = path / pick
    try:
        import datasets  # optional: not a dependency of dflash-lab
    except ImportError:
        datasets = None
    if datasets is not None:
        ds = datasets.load_from_disk(str(path))
        for i, rec in enumerate(ds):
            yield f"{path}:row {i}", rec
        return
    import pyarrow as pa

    state = path / "state.json"
    if not state.is_file():
        raise DataError(f"{path} has no state.json: not a dataset written by save_to_disk(). Fix: save it with "
                        "Dataset.save_to_disk(), or `pip install datasets`.")
    files = [path / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    row = 0
    for fpath in files:
        with pa.memory_map(str(fpath)) as src:
            for batch in pa.ipc.open_stream(src):
                for rec in batch.to_pylist():
                    yield f"{path}:row {row}", rec
                    row += 1
