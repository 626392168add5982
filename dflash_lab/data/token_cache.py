"""Tokenized data kept on disk between runs, so a run, a resumed run or an A/B arm on the same data does not tokenize
it again: 59,453 SmolLM2 conversations take ~46 s to tokenize on an H100 host (1.3k conversations/s), a third of a
2-minute arm, and a million-conversation set ~15 minutes before every start.

An entry is `<cache_dir()>/<key>.pt`: the rows' real tokens and loss masks (padding is rebuilt), lengths, report
and sample ids. The key is a sha256 over everything the tokenized result depends on:
- the data's bytes (every file of a directory, by relative name), not its path or mtime: an edited file is new data;
- the tokenizer: its class, vocabulary, special tokens and chat template;
- the settings: seq_len, block_size, enable_thinking, data_format, on_error, mask_method;
- the code that reads and tokenizes (this package's files in _CODE, this one included), so a
  change to how data is read, masked or truncated never reads an entry written by the old code.
A missing, unreadable or foreign entry is tokenized again and rewritten (the log says why); entries are written to a
temporary file and renamed, so two runs that start together never read a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

import torch

from .chat_formats import DataReport
from .tokenize import TokenizedData, load_dataset, resolve_data_path

ENTRY_VERSION = 1  # the layout of an entry's dict; the code hash below covers how its contents are computed
_CODE = ("files.py", "chat_formats.py", "tokenize.py", "token_cache.py")
_CHUNK = 1 << 20
DIR_ENV = "DFLASH_LAB_TOKENIZED"


def cache_dir() -> Path:
    """`$DFLASH_LAB_TOKENIZED` if set (the test suite points it at a folder of its own), else
    `$DFLASH_LAB_CACHE/tokenized` (default `~/.cache/dflash-lab/tokenized`)."""
    from dflash_lab.target.models import cache_root

    own = os.environ.get(DIR_ENV)
    return Path(own).expanduser() if own else cache_root().parent / "tokenized"


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def data_digest(path: Path) -> str:
    """sha256 of a data file's bytes, or of a directory's files (relative name and bytes, in name order)."""
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(path)).encode() + b"\0")
            _hash_file(h, f)
    else:
        _hash_file(h, path)
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """sha256 of what a tokenizer brings to tokenization: class, vocabulary, special tokens, chat template."""
    template = getattr(tokenizer, "chat_template", None)
    parts = {
        "class": type(tokenizer).__name__,
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": sorted((str(k), str(v)) for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items()),
        "added": sorted((int(i), str(t)) for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()),
        "pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id,
        "template": template if isinstance(template, (str, dict)) or template is None else str(template),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _code_digest() -> str:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in _CODE:
        _hash_file(h, here / name)
    return h.hexdigest()


def cache_key(data_path: Path, tokenizer, **settings) -> str:
    parts = {"version": ENTRY_VERSION, "data": data_digest(data_path), "tokenizer": tokenizer_digest(tokenizer),
             "code": _code_digest(), "settings": settings}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _read(path: Path, key: str) -> TokenizedData:
    entry = torch.load(path, map_location="cpu", weights_only=True)
    if entry.get("key") != key or entry.get("version") != ENTRY_VERSION:
        raise ValueError(f"it holds key {entry.get('key')!r}, version {entry.get('version')!r}")
    (n, seq_len), lengths = entry["shape"], entry["lengths"]
    real = torch.arange(seq_len) < lengths[:, None]  # (n, S): the rows' real tokens; the rest is right padding
    if not (lengths.shape == (n,) and len(entry["sample_ids"]) == n
            and entry["ids"].numel() == entry["mask"].numel() == int(lengths.sum())):
        raise ValueError("its tensors disagree in shape")
    input_ids = torch.full((n, seq_len), entry["pad_id"], dtype=torch.int32)
    loss_mask = torch.zeros((n, seq_len), dtype=torch.bool)
    input_ids[real], loss_mask[real] = entry["ids"], entry["mask"]
    return TokenizedData(input_ids, loss_mask, lengths, DataReport(entry["report"]), list(entry["sample_ids"]))


def _write(path: Path, key: str, data: TokenizedData) -> None:
    """Only the rows' real tokens are stored (padding is rebuilt on reading): an entry grows with the data's tokens,
    not with rows x seq_len."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # runs in threads write apart
    n, seq_len = data.input_ids.shape
    real = torch.arange(seq_len) < data.lengths[:, None]
    pad = data.input_ids[~real][:1]
    try:
        torch.save({"version": ENTRY_VERSION, "key": key, "shape": [n, seq_len], "lengths": data.lengths,
                    "pad_id": int(pad[0]) if len(pad) else int(data.report.get("pad_id") or 0),
                    "ids": data.input_ids[real].clone(), "mask": data.loss_mask[real].clone(),
                    "report": json.loads(json.dumps(dict(data.report), default=str)),
                    "sample_ids": list(data.sample_ids)}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_dataset_cached(tokenizer, data: str, *, seq_len: int, block_size: int, enable_thinking: bool | None = None,
                        data_format: str = "auto", on_error: str = "skip", mask_method: str = "render", log=None,
                        root: str | Path | None = None) -> TokenizedData:
    """load_dataset, read from the cache when this data was tokenized so before (`root`: the cache folder, default
    cache_dir()). Failing to write an entry (a full or read-only disk) only costs the next run the tokenizing."""
    say = log or (lambda _msg: None)
    t0 = time.monotonic()
    key = cache_key(resolve_data_path(data), tokenizer, seq_len=seq_len, block_size=block_size,
                    enable_thinking=enable_thinking, data_format=data_format, on_error=on_error,
                    mask_method=mask_method)
    path = Path(root).expanduser() if root is not None else cache_dir()
    path = path / f"{key}.pt"
    if path.is_file():
        try:
            out = _read(path, key)
            say(f"tokenized data: {len(out):,} rows read from the cache {path} in {time.monotonic() - t0:.1f} s "
                "(token_cache=False tokenizes again)")
            return out
        except Exception as e:  # noqa: BLE001 - any unreadable entry is only a cache miss
            say(f"tokenized data: the cache entry {path} cannot be used ({type(e).__name__}: {e}); tokenizing again")
    out = load_dataset(tokenizer, data, seq_len=seq_len, block_size=block_size, enable_thinking=enable_thinking,
                       data_format=data_format, on_error=on_error, mask_method=mask_method, log=log)
    try:
        _write(path, key, out)
        say(f"tokenized data: {len(out):,} rows saved to the cache {path} ({path.stat().st_size / 1e6:,.1f} MB; "
            "`python -m dflash_lab.data.token_cache` lists and clears the entries)")
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written must never stop the run it serves
        say(f"tokenized data: not cached ({type(e).__name__}: {e}). Fix: free space in {path.parent} or point "
            f"${DIR_ENV} at a writable folder")
    return out


def entries(root: str | Path | None = None) -> list[tuple[Path, int, float]]:
    """(path, bytes, modified at) of every entry in `root` (default cache_dir()), newest first."""
    folder = Path(root).expanduser() if root is not None else cache_dir()
    found = [(p, p.stat().st_size, p.stat().st_mtime) for p in folder.glob("*.pt")] if folder.is_dir() else []
    return sorted(found, key=lambda e: -e[2])


def main(argv: list[str] | None = None) -> int:
    """`python -m dflash_lab.data.token_cache [--clear]`: the entries and their sizes, or remove them all."""
    import argparse

    p = argparse.ArgumentParser(description="The tokenized-data cache: list its entries, or --clear them.")
    p.add_argument("--dir", help="the cache folder (default: $DFLASH_LAB_TOKENIZED or $DFLASH_LAB_CACHE/tokenized)")
    p.add_argument("--clear", action="store_true", help="remove every entry (runs then tokenize again)")
    a = p.parse_args(argv)
    folder = Path(a.dir).expanduser() if a.dir else cache_dir()
    found = entries(folder)
    for path, size, mtime in found:
        print(f"{path.name}  {size / 1e6:10,.1f} MB  {time.strftime('%Y-%m-%d %H:%M', time.localtime(mtime))}")
    print(f"{len(found)} entries, {sum(e[1] for e in found) / 1e6:,.1f} MB in {folder}")
    if a.clear:
        for path in [e[0] for e in found] + list(folder.glob("*.tmp")):
            path.unlink(missing_ok=True)
        print(f"removed {len(found)} entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
