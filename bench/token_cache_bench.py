"""Tokenizing a training file against reading it back from the tokenized-data cache (TrainConfig.token_cache), on
this machine's CPU: the seconds a run on the same data saves before its first step.

    python bench/token_cache_bench.py DATA --target smollm2-135m-instruct --seq-len 320 --block-size 16

Prints one JSON line: rows, tokenize_s (load_dataset, no cache), miss_s (the first cached load: hashing the data,
tokenizing, writing the entry), read_s (the next run's hit, best of --repeats), entry_mb. The entry goes to a
temporary folder, removed at the end. `--workers N` (repeat for several) also times tokenizing with N worker
processes (dflash_lab/data/tokenize_pool.py) as `tokenize_s_workers` and checks the rows equal one process's:

    python bench/token_cache_bench.py DATA --target smollm2-135m-instruct --workers 1 --workers 8
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from dflash_lab.config.threads import cpu_cores
from dflash_lab.data import token_cache
from dflash_lab.data.tokenize_pool import WORKERS_ENV
from dflash_lab.data.tokenize import load_dataset
from dflash_lab.target.load import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--target", default="tiny")
    p.add_argument("--seq-len", type=int, default=320)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, action="append", default=[],
                   help="also time tokenizing with this many worker processes (repeat for several)")
    a = p.parse_args()
    tok = load_tokenizer(a.target)
    shape = dict(seq_len=a.seq_len, block_size=a.block_size)
    t0 = time.perf_counter()
    data = load_dataset(tok, a.data, **shape)
    tokenize_s = time.perf_counter() - t0
    by_workers, before = {}, os.environ.get(WORKERS_ENV)
    for w in a.workers:
        os.environ[WORKERS_ENV] = str(w)
        t0 = time.perf_counter()
        d = load_dataset(tok, a.data, **shape)
        by_workers[w] = round(time.perf_counter() - t0, 2)
        assert d.input_ids.equal(data.input_ids) and d.loss_mask.equal(data.loss_mask) and \
            d.sample_ids == data.sample_ids, f"{w} workers tokenized other rows than the first run"
    if a.workers:  # the cached loads below choose their workers as a run would
        os.environ.pop(WORKERS_ENV) if before is None else os.environ.update({WORKERS_ENV: before})
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        token_cache.load_dataset_cached(tok, a.data, **shape, root=root)  # a miss: tokenizes again, then writes
        miss_s = time.perf_counter() - t0
        reads = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            hit = token_cache.load_dataset_cached(tok, a.data, **shape, root=root)
            reads.append(time.perf_counter() - t0)
        assert hit.input_ids.equal(data.input_ids) and hit.loss_mask.equal(data.loss_mask)
        entry_mb = sum(f.stat().st_size for f in Path(root).glob("*.pt")) / 1e6
    print(json.dumps({"data": a.data, "target": a.target, **shape, "rows": len(data),
                      "tokenize_s": round(tokenize_s, 2),
                      "miss_s": round(miss_s, 2), "read_s": round(min(reads), 2), "entry_mb": round(entry_mb, 1),
                      "tokenize_s_workers": by_workers, "cores": cpu_cores()}))


if __name__ == "__main__":
    main()
