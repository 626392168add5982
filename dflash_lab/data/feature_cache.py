"""Optional offline feature cache: run the target once over the tokenized data, store its features in safetensors
shards, then train from the shards instead of running the target every step.

Trade-off, with numbers: the cache holds num_features * hidden values per real token, 5 * 4096 * 2 bytes = 40 KiB per
token for Qwen3-8B in bf16, so 1M samples of 1.5k tokens need ~57 TiB: only small data sets or small targets are
worth caching. It saves the target forward (~40% of a step's FLOPs at the paper shape) and lets several drafter
variants train on the same features; the target is still loaded for its frozen embedding and LM head.

    cache = write_feature_cache("cache/", data, target="tiny", layer_ids=(1, 2, 3, 4, 5))   # shows the disk estimate
    extractor = CachedFeatureExtractor(FeatureCache("cache/"), layer_ids=(1, 2, 3, 4, 5))   # FeatureExtractor-like
    TrainConfig(..., feature_cache="cache/")                                                # the Trainer uses it

Layout: `index.json` (target, layer ids, hidden size, dtype, seq_len, shard list) and `features-00000.safetensors`,
... each holding `f.<sample index>` (length, n*H) for the real tokens of each row plus `row_hash` (k, 16) uint8,
`sample_index` (k,) and `length` (k,). Rows are found by a hash of their padded token ids, so the reader needs no
sample indices: it is called exactly like FeatureExtractor, with the batch's input_ids. Writing is resumable at shard
granularity (finished shards are kept and skipped).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch

from .chat_formats import DataError

INDEX_FILE = "index.json"
CACHE_VERSION = 1
GIB = 2**30


def row_hash(row: torch.Tensor, doc_ids: torch.Tensor | None = None) -> bytes:
    """16-byte digest of one padded row of token ids (as int32, so int32 and int64 rows hash alike), and of its
    document ids when the row is a packed window (the same tokens in other documents have other features)."""
    h = hashlib.blake2b(row.to(torch.int32).contiguous().numpy().tobytes(), digest_size=16)
    if doc_ids is not None:
        h.update(doc_ids.to(torch.int32).contiguous().numpy().tobytes())
    return h.digest()


def cache_size_bytes(data, *, num_features: int, hidden_size: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Disk bytes of a cache of `data` (TokenizedData): real tokens x n*H x dtype (+ small per-row metadata)."""
    tokens = int(data.lengths.sum())
    return tokens * num_features * hidden_size * torch.empty((), dtype=dtype).element_size() + len(data) * 40


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def write_feature_cache(out_dir: str | Path, data, *, target="tiny", layer_ids: tuple[int, ...], device="cpu",
                        batch_size: int = 8, dtype: torch.dtype | None = None, shard_gib: float = 2.0,
                        log=print, progress_every_s: float = 10.0, check_disk: bool = True) -> "FeatureCache":
    """Run the target over every row of `data` and write the selected layers' outputs to `out_dir`.

    `target`: a target name/path (loaded on `device`) or an already loaded model. `dtype`: storage dtype; default
    the compute dtype of `device` (bf16 on CUDA, fp32 on CPU), i.e. exactly what the live target would produce.
    Prints the disk estimate first and refuses to start when the disk has too little free space.
    """
    from dflash_lab.target.load import load_target
    from dflash_lab.target.features import FeatureExtractor

    out = Path(out_dir)
    dev = torch.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if isinstance(target, str):
        model = load_target(target, device=dev, dtype=dtype if dtype != torch.float16 else torch.bfloat16)
        target_name = target
    else:
        model, target_name = target, getattr(getattr(target, "config", None), "name_or_path", "model")
    extractor = FeatureExtractor(model, layer_ids)
    hidden = model.config.get_text_config().hidden_size
    n = len(extractor.layer_ids)
    estimate = cache_size_bytes(data, num_features=n, hidden_size=hidden, dtype=dtype)
    out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out).free
    log(f"feature cache: {len(data):,} samples, {int(data.lengths.sum()):,} tokens x {n} layers x {hidden} "
        f"({_dtype_name(dtype)}) -> ~{estimate / GIB:.3f} GiB in {out} (free: {free / GIB:.1f} GiB)")
    meta = {"version": CACHE_VERSION, "target": str(target_name), "layer_ids": list(extractor.layer_ids),
            "hidden_size": hidden, "num_features": n, "dtype": _dtype_name(dtype),
            "seq_len": int(data.input_ids.shape[1]), "num_samples": len(data), "shards": []}
    index_path = out / INDEX_FILE
    if index_path.is_file():
        old = json.loads(index_path.read_text())
        if any(old.get(k) != meta[k] for k in ("layer_ids", "hidden_size", "dtype", "seq_len", "num_samples")):
            raise DataError(f"{out} holds a feature cache built with other settings ({ {k: old.get(k) for k in meta} }"
                            "). Fix: use a new directory or delete this one.")
        meta["shards"] = old["shards"]
    done = {i for s in meta["shards"] for i in s["samples"]}
    todo = [i for i in range(len(data)) if i not in done]
    left = estimate * len(todo) / max(1, len(data))
    if check_disk and free < left * 1.05:
        raise DataError(f"the feature cache needs ~{left / GIB:.2f} GiB more but {out} has {free / GIB:.2f} GiB free. "
                        "Fix: free disk space, choose another directory, or train without a cache (the default).")
    if done:
        log(f"feature cache: resuming, {len(done)} samples already in {len(meta['shards'])} shards")
    shard_limit = int(shard_gib * GIB)
    pending: dict[str, torch.Tensor] = {}
    pend_idx, pend_len, pend_hash, pend_bytes = [], [], [], 0
    t0 = last = time.monotonic()
    tokens_done = written = 0

    def flush() -> None:
        nonlocal pending, pend_idx, pend_len, pend_hash, pend_bytes, written
        if not pend_idx:
            return
        from safetensors.torch import save_file

        name = f"features-{len(meta['shards']):05d}.safetensors"
        tensors = {**pending, "sample_index": torch.tensor(pend_idx, dtype=torch.int64),
                   "length": torch.tensor(pend_len, dtype=torch.int64),
                   "row_hash": torch.frombuffer(bytearray(b"".join(pend_hash)), dtype=torch.uint8).view(-1, 16)}
        tmp = out / (name + ".tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, out / name)
        written += pend_bytes
        meta["shards"].append({"file": name, "samples": list(pend_idx)})
        _write_index(index_path, meta)  # a shard counts as done only once the index names it
        pending, pend_idx, pend_len, pend_hash, pend_bytes = {}, [], [], [], 0

    with torch.no_grad():
        for b0 in range(0, len(todo), batch_size):
            rows = todo[b0:b0 + batch_size]
            lens = data.lengths[rows]
            crop = int(lens.max())
            ids = data.input_ids[rows, :crop].long().to(dev)
            feats = extractor(ids).to("cpu", dtype)  # (b, crop, n*H)
            for r, i in enumerate(rows):
                L = int(lens[r])
                pending[f"f.{i}"] = feats[r, :L].clone()
                pend_idx.append(i)
                pend_len.append(L)
                pend_hash.append(row_hash(data.input_ids[i]))
                pend_bytes += pending[f"f.{i}"].numel() * pending[f"f.{i}"].element_size()
                tokens_done += L
            if pend_bytes >= shard_limit:
                flush()
            now = time.monotonic()
            if now - last >= progress_every_s:
                last = now
                k = b0 + len(rows)
                log(f"feature cache: {len(done) + k}/{len(data)} samples | {tokens_done / (now - t0):,.0f} tok/s | "
                    f"{(written + pend_bytes) / GIB:.2f}/{left / GIB:.2f} GiB | "
                    f"ETA {(len(todo) - k) * (now - t0) / k:.0f}s")
        flush()
    log(f"feature cache: wrote {written / GIB:.3f} GiB ({len(todo)} samples) in {time.monotonic() - t0:.1f}s to {out}")
    return FeatureCache(out)


def _write_index(path: Path, meta: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, path)


class FeatureCache:
    """Reader of a cache directory: features by sample index or by row content (memory-mapped shards)."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        index = self.path / INDEX_FILE
        if not index.is_file():
            raise DataError(f"{self.path} is not a feature cache (no {INDEX_FILE}). Fix: build one with "
                            "write_feature_cache(), or unset feature_cache.")
        self.meta = json.loads(index.read_text())
        if self.meta.get("version") != CACHE_VERSION:
            raise DataError(f"{self.path}: cache version {self.meta.get('version')} != {CACHE_VERSION}. Fix: rebuild.")
        self.layer_ids = tuple(self.meta["layer_ids"])
        self.seq_len, self.hidden_size = self.meta["seq_len"], self.meta["hidden_size"]
        self.width = self.meta["num_features"] * self.hidden_size
        self._files = [safe_open(str(self.path / s["file"]), framework="pt") for s in self.meta["shards"]]
        self._where: dict[int, int] = {}
        self._by_hash: dict[bytes, int] = {}
        for k, f in enumerate(self._files):
            idx = f.get_tensor("sample_index").tolist()
            hashes = f.get_tensor("row_hash").numpy()
            for i, h in zip(idx, hashes):
                self._where[i] = k
                self._by_hash[h.tobytes()] = i

    def __len__(self) -> int:
        return len(self._where)

    def get(self, sample_index: int) -> torch.Tensor:
        """(length, n*H) features of one sample, in the stored dtype."""
        k = self._where.get(sample_index)
        if k is None:
            raise DataError(f"sample {sample_index} is not in the feature cache {self.path}. Fix: finish the cache "
                            "(rerun write_feature_cache) or train without it.")
        return self._files[k].get_tensor(f"f.{sample_index}")

    def index_of(self, row: torch.Tensor) -> int | None:
        return self._by_hash.get(row_hash(row.cpu()))

    def missing(self, data) -> int:
        """How many rows of `data` (TokenizedData) are not in the cache."""
        return sum(self.index_of(data.input_ids[i]) is None for i in range(len(data)))

    def lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (b, S) -> features (b, S, n*H), zero beyond each row's length (never attended to)."""
        b, S = input_ids.shape
        if S != self.seq_len:
            raise DataError(f"the feature cache {self.path} was built for seq_len={self.seq_len}, the batch has {S}. "
                            "Fix: use the same seq_len, or rebuild the cache.")
        out = torch.zeros(b, S, self.width, dtype=getattr(torch, self.meta["dtype"]))
        rows = input_ids.cpu()
        for r in range(b):
            i = self.index_of(rows[r])
            if i is None:
                raise DataError(f"batch row {r} is not in the feature cache {self.path}: the cache was built from "
                                "other data, template, thinking mode or seq_len. Fix: rebuild it from this data.")
            f = self.get(i)
            out[r, :f.shape[0]] = f
        return out


class CachedFeatureExtractor:
    """Drop-in for targets.FeatureExtractor: `(input_ids (b, S)) -> (b, S, n*H)` read from a FeatureCache."""

    def __init__(self, cache: FeatureCache | str | Path, *, layer_ids: tuple[int, ...],
                 dtype: torch.dtype | None = None):
        self.cache = cache if isinstance(cache, FeatureCache) else FeatureCache(cache)
        if tuple(layer_ids) != self.cache.layer_ids:
            raise DataError(f"the feature cache {self.cache.path} holds layers {self.cache.layer_ids}, the drafter "
                            f"needs {tuple(layer_ids)}. Fix: rebuild the cache with layer_ids={tuple(layer_ids)}.")
        self.layer_ids = tuple(layer_ids)
        self.num_layers_run = 0  # no target layer runs
        self.dtype = dtype

    def __call__(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        if doc_ids is not None:  # TrainConfig refuses pack_sequences with a cache (config/feature_checks.py)
            raise ValueError("a feature cache holds unpacked rows; packed windows need online features")
        feats = self.cache.lookup(input_ids)
        return feats.to(input_ids.device, self.dtype or feats.dtype, non_blocking=True)
