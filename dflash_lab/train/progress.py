"""The compact progress line both training loops print (notebook Trainer and torchrun rank 0), and the memory
figures of a step: each GPU's allocator and the process's resident memory (the CPU-side memory figure)."""

from __future__ import annotations

import torch

_PROCESS = None


def progress_line(m: dict, *, step: int, target: int, steady_step_time: float | None, ranks: int | None = None,
                  phase: str | None = None) -> str:
    """`step 120/400 | 51.2k tok/s | loss 2.1234 | acc 0.412 | sim tau 3.10 | cuda:0 41.0 GiB | ETA 0h03m12s`.

    `m`: the last metrics record; `ranks`: the torchrun world size (shows the largest rank memory and the feature
    wait instead of per-device memory); `phase`: the trainer's phase. Warm-up and ETA describe a run that is
    training: a line printed once it stopped, finished or paused has neither, only its phase. An ETA from warm-up
    step times (no steady median yet) is marked `~`."""
    training = phase is None or phase == "training"
    tps = m.get("steady_tokens_per_s") or m.get("tokens_per_s") or 0.0
    state = "" if m.get("throughput_state") == "steady" or not training else " (warming up)"
    eta = ""
    st = steady_step_time or m.get("step_time_s")
    if st and training:
        secs = int(st * max(0, target - step))  # past the target (hand steps): ETA 0
        eta = f" | ETA {'' if steady_step_time else '~'}{secs // 3600}h{secs % 3600 // 60:02d}m{secs % 60:02d}s"
    elif not training:
        eta = f" | {phase}"
    if ranks is None:
        mem = "".join(f" | {k.split('/')[1]} {v:.1f} GiB" for k, v in m.items() if k.startswith("mem_gb/"))
        if not mem and m.get("rss_gb") is not None:
            mem = f" | rss {m['rss_gb']:.1f} GiB"
        where = ""
    else:
        top = max((v for k, v in m.items() if k.startswith("mem_gb/")), default=None)
        mem = (f" | max mem {top:.1f} GiB" if top is not None else "")
        mem += f" | feature wait {m['feature_wait_frac']:.0%}" if "feature_wait_frac" in m else ""
        where = f" on {ranks} ranks"
    return (f"step {step}/{target} | {tps / 1e3:.1f}k tok/s{state}{where} | loss {m.get('loss', float('nan')):.4f}"
            f" | acc {m.get('acc', 0):.3f} | sim tau {m.get('sim_tau', 1):.2f}{mem}{eta}")


def device_memory(devices) -> dict:
    """`mem_gb/<device>` (GiB allocated by this process's torch allocator) per CUDA device, and `rss_gb`."""
    mem = {f"mem_gb/{d}": round(torch.cuda.memory_allocated(d) / 2**30, 3) for d in dict.fromkeys(devices)
           if d.type == "cuda"}
    rss = process_rss_gb()
    if rss is not None:
        mem["rss_gb"] = rss
    return mem


def process_rss_gb() -> float | None:
    """Resident memory of this process in GiB (~20 us per call); None without psutil."""
    global _PROCESS
    if _PROCESS is None:
        try:
            import psutil
        except ImportError:
            return None
        _PROCESS = psutil.Process()
    return round(_PROCESS.memory_info().rss / 2**30, 3)
