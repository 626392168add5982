"""Timing marks on a device's timeline that never sync: a timing CUDA event on a GPU, a host timestamp on the CPU;
read a pair once its end has completed. The trainer's per-stream timelines and the generation engine's work counts
both time device work with them. And the one way a small host tensor goes to a GPU without waiting for the work
queued there (to_device_async).
"""

from __future__ import annotations

import time

import torch


def mark(device: torch.device, stream=None):
    """A point on a device's timeline: a timing CUDA event on the (current) stream, or a host timestamp on CPU."""
    if device.type != "cuda":
        return time.perf_counter()
    e = torch.cuda.Event(enable_timing=True)
    e.record(stream)
    return e


def ready(m) -> bool:
    return m.query() if isinstance(m, torch.cuda.Event) else True


def elapsed_ms(a, b) -> float:
    return a.elapsed_time(b) if isinstance(a, torch.cuda.Event) else (b - a) * 1e3


def to_device_async(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the work queued there: through pinned memory (a copy from
    pageable memory waits for the stream) on CUDA, as it is elsewhere."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
