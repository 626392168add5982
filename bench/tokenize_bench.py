"""Tokenizing a training file in this process against worker processes (dflash_lab/data/tokenize_pool.py), on this
machine's CPU cores: the seconds before a run's first step on new data, and that the rows are the same.

    python bench/tokenize_bench.py DATA --target smollm2-135m-instruct --workers 1 --workers 8

Prints one JSON line: rows, cores, seconds per worker count (reading the file included), and `identical` (every
count's input_ids, loss masks, lengths, sample ids and report equal to the first's).
"""
import argparse
import json
import os
import time

import torch

from dflash_lab.data.tokenize import load_dataset
from dflash_lab.data.tokenize_pool import WORKERS_ENV
from dflash_lab.target.load import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--target", default="tiny")
    p.add_argument("--seq-len", type=int, default=320)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--workers", type=int, action="append", help="repeat for several counts (default 1 and 8)")
    a = p.parse_args()
    tok = load_tokenizer(a.target)
    seconds, first, identical = {}, None, True
    for w in a.workers or [1, 8]:
        os.environ[WORKERS_ENV] = str(w)
        t0 = time.perf_counter()
        d = load_dataset(tok, a.data, seq_len=a.seq_len, block_size=a.block_size)
        seconds[w] = round(time.perf_counter() - t0, 2)
        if first is None:
            first = d
        else:
            identical &= (torch.equal(d.input_ids, first.input_ids) and torch.equal(d.loss_mask, first.loss_mask)
                          and torch.equal(d.lengths, first.lengths) and d.sample_ids == first.sample_ids
                          and json.dumps(d.report, sort_keys=True, default=str)
                          == json.dumps(first.report, sort_keys=True, default=str))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(json.dumps({"rows": len(first), "cores": cores, "seconds": seconds, "identical": identical}))


if __name__ == "__main__":
    main()
