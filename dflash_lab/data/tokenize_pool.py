"""Tokenizing a large data set on several CPU cores: its chunks go to worker processes and come back in order.

Rendering a chat template is Python (Jinja) and holds the GIL, so threads do not help: one process tokenized the long
recipe's 59,453 conversations at ~1,550 a second on an H100 host (~38 s before the first step, every GPU idle), and
a million-conversation set takes minutes. `ordered_map` sends the chunks to `workers` spawned processes (each starts
with its own copy of the tokenizer: ~3 s, ~300 MB) and yields their results in the chunks' order, so the data is
the same as one process's to the byte (tests/test_tokenize_pool.py). Spawned, not forked: a notebook's process has
threads (the dashboard's sampler, the engine's workers) whose locks a forked child could inherit held.

Workers: `DFLASH_LAB_TOKENIZE_WORKERS` (0 or 1 = this process), else one per core but one, at most MAX_WORKERS, for
data of at least MIN_CONVERSATIONS on at least four cores (below that the workers' start costs more than they save).
A pool that cannot start or breaks (e.g. a script without an `if __name__ == "__main__":` guard, which spawned
processes re-import) is logged and the chunks left are done in this process: the data is the same either way.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from dflash_lab.config.threads import cpu_cores

from .chat_formats import DataError

WORKERS_ENV = "DFLASH_LAB_TOKENIZE_WORKERS"
MIN_CONVERSATIONS = 20_000
MAX_WORKERS = 8


def workers_for(n_conversations: int) -> int:
    """How many processes tokenize `n_conversations` (1 = this process alone)."""
    env = os.environ.get(WORKERS_ENV, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise DataError(f"{WORKERS_ENV}={env!r} is not a number of processes. Fix: set it to e.g. 8, or to 1 to "
                            "tokenize in this process, or unset it to choose by the data's size.") from None
        return max(1, n)
    cores = cpu_cores()
    return min(MAX_WORKERS, cores - 1) if n_conversations >= MIN_CONVERSATIONS and cores >= 4 else 1


def ordered_map(fn, items: list, *, here, workers: int, initializer, initargs: tuple, keep: tuple = (), log=None):
    """fn(item) for every item, in order, from `workers` spawned processes started with initializer(*initargs);
    `here(item)` computes the same in this process: with one worker, one item, or for the items a failed pool left.
    Exceptions of the types in `keep` (a refused record) reach the caller as they would from `here`."""
    done = 0
    if workers > 1 and len(items) > 1:
        n = min(workers, len(items))
        pool = None
        try:
            pool = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=initializer, initargs=initargs)
            if log is not None:
                log(f"tokenizing in {n} processes ({WORKERS_ENV} sets how many)")
            for result in pool.map(fn, items):
                yield result
                done += 1
            return
        except keep:
            raise
        except Exception as e:  # noqa: BLE001 - a pool that cannot start or broke: the rest is done here
            if log is not None:
                log(f"tokenizing in worker processes failed ({type(e).__name__}: {str(e)[:200]}); tokenizing the "
                    f"{len(items) - done} chunks left in this process")
        finally:  # also when the caller stops early (an interrupt): chunks not started are dropped, not awaited
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
    for item in items[done:]:
        yield here(item)
