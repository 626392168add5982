"""Per-device execution for the engine: one thread (+ CUDA stream) per device role, timing marks that never sync,
per-stream busy timelines, and static device buffers (same address every step, as a CUDA graph needs)."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import statistics
import threading

import torch

from dflash_lab.target.device_time import elapsed_ms, ready

# ---------------------------------------------------------------------------------------------------------------
# Threads, timing marks and per-stream timelines
# ---------------------------------------------------------------------------------------------------------------

class DeviceThread:
    """One thread, and on a GPU one CUDA stream, that runs everything submitted for one device role, in order."""

    def __init__(self, device: torch.device, role: str):
        self.device, self.role = device, role
        self.pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dflash-{role}-{device}")
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def submit(self, fn, *args) -> cf.Future:
        return self.pool.submit(self._run, fn, args)

    def _run(self, fn, args):
        if self.stream is None:
            return fn(*args)
        torch.cuda.set_device(self.device)
        with torch.cuda.stream(self.stream):
            return fn(*args)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class Timeline:
    """Busy intervals of one stream (phase, start, end), read back once their events completed (no sync)."""

    def __init__(self, keep: int = 96):
        self._pending: collections.deque = collections.deque()
        self.done: collections.deque = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, step: int, phase: str, start, end) -> None:
        with self._lock:
            self._pending.append((step, phase, start, end))

    def harvest(self) -> None:
        with self._lock:
            while self._pending and ready(self._pending[0][3]):
                step, phase, a, b = self._pending.popleft()
                self.done.append((step, phase, a, b, elapsed_ms(a, b)))

    def phase_ms(self, phase: str) -> float | None:
        xs = [ms for _, p, _, _, ms in self.done if p == phase]
        return statistics.median(xs) if xs else None

    def busy_fraction(self, last_steps: int = 16) -> float | None:
        """Share of wall time this stream was busy over its last `last_steps` steps (None before 3 steps)."""
        steps = sorted({s for s, *_ in self.done})[-last_steps:]
        if len(steps) < 3:
            return None
        first = steps[1]  # skip the oldest step: its start may precede a gap we did not see
        rows = [r for r in self.done if r[0] >= first]
        span = elapsed_ms(rows[0][2], rows[-1][3])
        return min(1.0, sum(r[4] for r in rows) / span) if span > 0 else None


# ---------------------------------------------------------------------------------------------------------------
# Static buffers
# ---------------------------------------------------------------------------------------------------------------

class StaticBuffers:
    """Persistent device tensors keyed by name. `stage` copies a host tensor into the kept buffer when the shape and
    dtype match (same address every step: what a CUDA graph needs); otherwise it returns a fresh device tensor,
    which the graph wrapper then reports as a mismatch and runs eagerly."""

    def __init__(self, device: torch.device):
        self.device, self.bufs = device, {}

    def stage(self, name: str, src: torch.Tensor) -> torch.Tensor:
        buf = self.bufs.get(name)
        if buf is not None and buf.shape == src.shape and buf.dtype == src.dtype:
            buf.copy_(src, non_blocking=True)
            return buf
        fresh = src.to(self.device, non_blocking=True)
        if buf is None:
            self.bufs[name] = fresh
        return fresh
