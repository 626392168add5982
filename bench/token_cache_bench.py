"""Tokenizing a training file against reading it back from the tokenized-data cache (TrainConfig.token_cache), on
this machine's CPU: the seconds a run on the same data saves before its first step.

    python bench/token_cache_bench.py DATA --target smollm2-135m-instruct --seq-len 320 --block-size 16

Prints one JSON line: rows, tokenize_s (load_dataset, no cache), miss_s (the first cached load: hashing the data,
tokenizing, writing the entry), read_s (the next run's hit, best of --repeats), entry_mb, cores, and
tokenizers_parallelism: the TOKENIZERS_PARALLELISM it ran under ("unset" = the fast tokenizer's own threads on), since
tokenizing on a many-core host is ~3x faster with those threads than without. The entry goes to a temporary folder,
removed at the end.
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from dflash_lab.config.threads import cpu_cores
from dflash_lab.data import token_cache
from dflash_lab.data.tokenize import load_dataset
from dflash_lab.target.load import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--target", default="tiny")
    p.add_argument("--seq-len", type=int, default=320)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    tok = load_tokenizer(a.target)
    shape = dict(seq_len=a.seq_len, block_size=a.block_size)
    t0 = time.perf_counter()
    data = load_dataset(tok, a.data, **shape)
    tokenize_s = time.perf_counter() - t0
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
                      "cores": cpu_cores(),
                      "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "unset")}))


if __name__ == "__main__":
    main()
