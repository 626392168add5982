"""Training metrics: warm-up-aware throughput, FLOP-model MFU, and two sinks (JSONL file, in-memory ring buffer).

Throughput has an explicit state: "warming_up" until the step times of the last `window` steps vary by less than
`tolerance` (relative spread), then "steady", with steady-state tokens/s = tokens / median step time over the steps
since warm-up ended. Loading, capture and compile happen before the first step and never enter these numbers.
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from dflash_lab.config.model_size import layer_matmul_parameters, text_config, variant_head_flops_per_row


class RingBuffer:
    """Thread-safe bounded history of metric dicts (the dashboard reads it; the engine never calls widgets)."""

    def __init__(self, capacity: int = 10_000):
        self._items = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._count = 0

    def append(self, item: dict) -> None:
        with self._lock:
            self._items.append(item)
            self._count += 1

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self._items)

    def last(self) -> dict | None:
        with self._lock:
            return self._items[-1] if self._items else None

    @property
    def total_appended(self) -> int:
        return self._count

    def __len__(self) -> int:
        return len(self._items)


class JsonlSink:
    """Append-only JSONL writer, one `os.write` per record so `tail -f` and an attached dashboard see it live.

    Disk-full policy (one for the whole run, see README "Faults"): a record that cannot be written (ENOSPC, EDQUOT,
    EIO, ...) is dropped from the file, a WARNING is printed (first failure, then every 100th), and training goes on;
    the in-memory ring buffer still holds it, and checkpoints follow their own policy (the last good one is kept).
    A partly written line is terminated by the next successful write, so readers skip just that one torn line.
    """

    def __init__(self, path: str | Path, *, warn=None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._lock = threading.Lock()
        self._warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.failed_writes = 0
        self._torn = False  # the last write failed, maybe half-way: start the next one on a fresh line

    def log(self, record: dict) -> None:
        line = (json.dumps(record, default=_jsonable) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                self._write(b"\n" + line if self._torn else line)
            except OSError as e:
                self.failed_writes += 1
                self._torn = True
                if self.failed_writes % 100 == 1:
                    self._warn(f"WARNING: could not append to {self.path} ({e}); {self.failed_writes} record(s) "
                               "dropped so far. Training goes on and the last good checkpoint is kept. Fix: free "
                               "disk space; later records are written again once it succeeds.")
                return
            if self._torn:
                self._torn = False
                self._warn(f"{self.path}: writing again after {self.failed_writes} dropped record(s)")

    def _write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _jsonable(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


class MetricsLogger:
    """Two methods, `log` and `close`: every record goes to the ring buffer and, if given, the JSONL file."""

    def __init__(self, path: str | Path | None = None, capacity: int = 10_000):
        self.ring = RingBuffer(capacity)
        self.sink = JsonlSink(path) if path else None

    def log(self, record: dict) -> None:
        record = {"time": time.time(), **record}
        self.ring.append(record)
        if self.sink:
            self.sink.log(record)

    def close(self) -> None:
        if self.sink:
            self.sink.close()


class Throughput:
    """Warm-up-aware step timer. `update(step_seconds, tokens)` after each step; read `.state`, `.steady_tps`."""

    def __init__(self, window: int = 8, tolerance: float = 0.10, min_warmup_steps: int = 3):
        self.window, self.tolerance, self.min_warmup_steps = window, tolerance, min_warmup_steps
        self.recent = collections.deque(maxlen=window)
        self.steady_times: list[float] = []
        self.tokens_per_step = 0
        self.steps = 0
        self.state = "warming_up"
        self.instant_tps = 0.0

    def update(self, step_seconds: float, tokens: int, steps: int = 1) -> None:
        per_step = step_seconds / max(steps, 1)
        self.steps += steps
        self.tokens_per_step = tokens / max(steps, 1)
        self.instant_tps = tokens / step_seconds if step_seconds > 0 else 0.0
        self.recent.append(per_step)
        if self.state == "warming_up":
            if self.steps >= self.min_warmup_steps and len(self.recent) == self.window:
                med = statistics.median(self.recent)
                spread = (max(self.recent) - min(self.recent)) / med if med > 0 else math.inf
                if spread < self.tolerance * 2 or statistics.pstdev(self.recent) / med < self.tolerance:
                    self.state = "steady"
                    self.steady_times.extend(self.recent)
        else:
            self.steady_times.append(per_step)
            if len(self.steady_times) > 10_000:
                self.steady_times = self.steady_times[-5_000:]

    @property
    def steady_step_time(self) -> float | None:
        return statistics.median(self.steady_times) if self.steady_times else None

    @property
    def steady_tps(self) -> float | None:
        t = self.steady_step_time
        return self.tokens_per_step / t if t else None

    def as_dict(self) -> dict:
        return {"throughput_state": self.state, "tokens_per_s": self.instant_tps,
                "steady_tokens_per_s": self.steady_tps, "steady_step_time_s": self.steady_step_time}


# ---------------------------------------------------------------------------------------------------------------
# FLOP model (docs/performance.md). Counted per sequence; MFU = FLOP/s / peak dense bf16 FLOP/s.
# ---------------------------------------------------------------------------------------------------------------
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def flops_per_sequence(*, target_cfg, drafter_cfg, seq_len: int, num_anchors: int, distill: bool = False) -> dict:
    """Model FLOPs for one training sequence: target forward up to max(ids) (with `distill`: every layer and its LM
    head over the sequence), drafter fwd+bwd (3x), head (2x fwd).
    Parameter counts come from model_size.py (the model preflight and placement use)."""
    tc = text_config(target_cfg)
    S, N, B = seq_len, num_anchors, drafter_cfg.block_size
    P = N * B
    t_head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    t_layer = layer_matmul_parameters(tc.hidden_size, tc.intermediate_size, tc.num_attention_heads,
                                      getattr(tc, "num_key_value_heads", tc.num_attention_heads), t_head_dim)
    layers_run = tc.num_hidden_layers if distill else max(drafter_cfg.target_layer_ids) + 1
    target = 2 * t_layer * layers_run * S + 2 * 2 * S * (S / 2) * (tc.num_attention_heads * t_head_dim) * layers_run
    if distill:
        target += 2 * tc.hidden_size * tc.vocab_size * S
    d = drafter_cfg
    H, D = d.hidden_size, d.num_hidden_layers
    d_layer = layer_matmul_parameters(H, d.intermediate_size, d.num_attention_heads, d.num_key_value_heads, d.head_dim)
    kv_params = 2 * H * d.num_key_value_heads * d.head_dim
    n = d.num_target_features
    drafter_fwd = (2 * d_layer * D * P + 2 * kv_params * D * S + 2 * n * H * H * S
                   + 2 * 2 * P * (S / 2 + B) * (d.num_attention_heads * d.head_dim) * D)
    head_fwd = 2 * H * (d.draft_vocab_size or d.vocab_size) * N * (B - 1)  # a pruned head is d rows
    heads = variant_head_flops_per_row(d) * N * (B - 1)  # a variant's heads (DSpark's Markov bias), fwd + bwd
    return {"target": target, "drafter": 3 * drafter_fwd, "head": 2 * head_fwd, "heads": heads,
            "total": target + 3 * drafter_fwd + 2 * head_fwd + heads}


def peak_flops(device_name: str) -> float | None:
    for key, val in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return val
    return None
