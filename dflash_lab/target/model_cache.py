"""A converted model folder checked against its manifest: every file of the right size, a safetensors file as long
as its own header says, config.json readable, and the sha256 of a file whose mtime changed (or of all of them).

A cached folder whose weights were cut short (a full disk, a killed copy) or edited afterwards would otherwise load
as a raw SafetensorError far from the cause, or silently as another model; models.py refuses it by name instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "dflash_lab_model.json"


class ModelNotReady(RuntimeError):
    """A known model is not converted yet, is damaged, or its package cannot be installed; the message names the
    command."""


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_manifest(folder: Path, *, fix: str) -> dict | None:
    """The manifest in `folder`, None when there is none; a garbled one raises ModelNotReady naming it and `fix`."""
    p = folder / MANIFEST
    if not p.is_file():
        return None
    try:
        info = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelNotReady(f"{p} cannot be read ({type(e).__name__}: {e}), so the converted model in {folder} "
                            f"cannot be trusted. Fix: {fix}.") from None
    if not isinstance(info, dict):
        raise ModelNotReady(f"{p} holds a JSON {type(info).__name__}, not the manifest object. Fix: {fix}.")
    return info


def write_manifest(folder: Path, info: dict) -> None:
    """Rewrite the manifest atomically; a read-only cache keeps the old one (it still serves)."""
    tmp = folder / (MANIFEST + ".tmp")
    try:
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, folder / MANIFEST)
    except OSError:
        tmp.unlink(missing_ok=True)


def file_records(folder: Path, known: dict[str, str] | None = None) -> dict[str, dict]:
    """{file: {"bytes", "mtime_ns", "sha256"}} of every file in a folder (the manifest's "files"); `known` digests
    are taken as given instead of hashing again."""
    return {p.name: {"bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns,
                     "sha256": (known or {}).get(p.name) or sha256_of(p)}
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}


def recorded_files(info: dict) -> dict[str, dict]:
    """{file: {"bytes", "sha256", "mtime_ns"}} of a manifest; older manifests record only the weights' sha256."""
    files = info.get("files")
    if not isinstance(files, dict):
        digests = info.get("output_sha256")
        files = {k: {"sha256": v} for k, v in digests.items()} if isinstance(digests, dict) else {}
        if files:
            info["files"] = files  # so what a hash finds out (size, mtime) is kept when the manifest is written back
    return {k: v for k, v in files.items() if isinstance(v, dict)}


def safetensors_short(path: Path) -> str | None:
    """Why a safetensors file is cut short or unreadable (its header names more bytes than the file has), or None.
    Reads only the header."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n < (100 << 20) else None
        if not isinstance(header, dict):
            return "its header is unreadable"
        end = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return "its header is unreadable"
    size = path.stat().st_size
    return f"it is {size:,} bytes, its header needs {end:,}" if size < end else None


def check_folder(folder: Path, info: dict, *, hash_all: bool = False, hash_changed: bool = False) -> list[str]:
    """What is wrong with a converted folder, as sentences ([] = intact): a recorded file missing or of another size,
    a cut-off safetensors file, an unreadable config.json; with `hash_changed`, a file whose mtime changed since it
    was last hashed is hashed again (with `hash_all`, every file) and compared with its recorded sha256. Files found
    intact by hash get their mtime recorded in `info` (the caller may write it back)."""
    problems = []
    for fname, rec in recorded_files(info).items():
        p = folder / fname
        if not p.is_file():
            problems.append(f"{fname} is missing")
            continue
        st = p.stat()
        if isinstance(rec.get("bytes"), int) and st.st_size != rec["bytes"]:
            problems.append(f"{fname} is {st.st_size:,} bytes, the conversion wrote {rec['bytes']:,}")
            continue
        short = safetensors_short(p) if fname.endswith(".safetensors") else None
        if short:
            problems.append(f"{fname} is cut short ({short})")
            continue
        if rec.get("sha256") and (hash_all or (hash_changed and rec.get("mtime_ns") != st.st_mtime_ns)):
            if sha256_of(p) != rec["sha256"]:
                problems.append(f"{fname} changed since the conversion (its sha256 differs from the manifest's)")
            else:
                rec.update(bytes=st.st_size, mtime_ns=st.st_mtime_ns)
    if not any(p.startswith("config.json ") for p in problems):
        try:
            config = json.loads((folder / "config.json").read_text())
            if not isinstance(config, dict):
                problems.append("config.json is not a JSON object")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append(f"config.json cannot be read ({type(e).__name__})")
    return problems
