"""Engine metrics for a metrics.jsonl record: phase times, GPU idle fractions, supply vs demand of split placements
(and which side limits), MFU from the FLOP model, memory, graph modes and compile counters."""

from __future__ import annotations

import statistics

import torch

from dflash_lab.runs.metrics import flops_per_sequence, peak_flops


def engine_metrics(engine, tokens_per_s: float | None = None) -> dict:
    """Metrics of `engine` (engine.Engine) for one record. `tokens_per_s` (the caller's steady or instant rate)
    drives MFU."""
    for x in [*engine.targets, *engine.workers]:
        x.timeline.harvest()
    m: dict = {"placement": "colocated" if engine.colocated else "split"}

    def med(xs):
        xs = [x for x in xs if x is not None]
        return round(statistics.median(xs), 3) if xs else None

    m["target_ms"] = med([r.timeline.phase_ms("target") for r in engine.targets])
    m["drafter_ms"] = med([w.timeline.phase_ms("drafter") for w in engine.workers])
    m["optimizer_ms"] = med([w.timeline.phase_ms("optimizer") for w in engine.workers])
    if len(engine.workers) > 1:
        m["reduce_ms"] = med([w.timeline.phase_ms("reduce") for w in engine.workers])
    if engine.shape is not None:
        b, S, N, B = engine.shape
        if not engine.colocated:
            tw = [r.timeline.busy_fraction() for r in engine.targets]
            dw = [w.timeline.busy_fraction() for w in engine.workers]
            if all(x is not None for x in tw + dw):
                m["target_wait_frac"] = round(1 - statistics.mean(tw), 4)
                m["drafter_wait_frac"] = round(1 - statistics.mean(dw), 4)
            d_busy = sum(x or 0 for x in (m["drafter_ms"], m["optimizer_ms"], m.get("reduce_ms")))
            if m["target_ms"] and d_busy:
                m["supply_tokens_per_s"] = round(b * S / (m["target_ms"] / 1e3), 1)  # all replicas together
                m["demand_tokens_per_s"] = round(b * S / (d_busy / 1e3), 1)
                m.update(balance(m))
        if tokens_per_s:
            n_dev = len({str(d) for d in [*(r.device for r in engine.targets), *(w.device for w in engine.workers)]})
            m["tokens_per_s_per_gpu" if engine.workers[0].device.type == "cuda" else "tokens_per_s_per_device"] = \
                round(tokens_per_s / n_dev, 1)
            m["draft_positions_per_s"] = round(tokens_per_s * N * B / S, 1)
            flops = engine_flops(engine)
            peak = engine_peak_flops(engine)
            if flops and peak:
                # Windows served from a feature store ran no target layer: only the FLOPs done count.
                stores = [r.store for r in engine.targets if r.store is not None]
                hit = statistics.mean(s.report()["feature_store_hit_rate"] for s in stores) if stores else 0.0
                done = flops["total"] - flops.get("target", 0.0) * hit
                m["mfu"] = round(tokens_per_s / S * done / (peak * n_dev), 4)
    for d in dict.fromkeys([*(r.device for r in engine.targets), *(w.device for w in engine.workers)]):
        if d.type == "cuda":
            m[f"mem_gb/{d}"] = round(torch.cuda.memory_allocated(d) / 2**30, 3)
            m[f"peak_mem_gb/{d}"] = round(torch.cuda.max_memory_allocated(d) / 2**30, 3)
    for x in [*engine.targets, *engine.workers]:
        m[f"graph/{x.graphed.name}"] = x.graphed.describe()
    stores = [r.store for r in engine.targets if r.store is not None]
    if stores:  # summed over replicas; the hit rate is the share of windows that skipped the target
        reports = [s.report() for s in stores]
        m.update({k: sum(r[k] for r in reports) for k in ("feature_store_rows", "feature_store_stored")})
        m["feature_store_gib"] = round(sum(r["feature_store_gib"] for r in reports), 3)
        m["feature_store_hit_rate"] = round(statistics.mean(r["feature_store_hit_rate"] for r in reports), 4)
        m["feature_store_storage"] = reports[0]["feature_store_storage"]  # one TrainConfig: alike on every replica
        if any("feature_store_host_rows" in r for r in reports):  # the host tier, where the GPU had no room
            m["feature_store_host_rows"] = sum(r.get("feature_store_host_rows", 0) for r in reports)
            m["feature_store_host_gib"] = round(sum(r.get("feature_store_host_gib", 0.0) for r in reports), 3)
            m["feature_store_host_share"] = round(statistics.mean(r.get("feature_store_host_share", 0.0)
                                                                  for r in reports), 4)
    now = dynamo_counts()
    if now:
        m["compiled_graphs"] = now["graphs"] - engine.dynamo_start["graphs"]
        m["graph_breaks"] = now["graph_breaks"] - engine.dynamo_start["graph_breaks"]
        if engine.dynamo_after_first is not None:
            m["recompiles_after_first_step"] = now["graphs"] - engine.dynamo_after_first["graphs"]
    if engine.first_step_seconds is not None:
        m["first_step_s"] = round(engine.first_step_seconds, 3)
    return m


def engine_flops(engine) -> dict | None:
    """The FLOP model of docs/performance.md for the current shape (target, drafter, head, total)."""
    if engine.flops is None and engine.shape is not None and engine.target_config is not None:
        _, S, N, _ = engine.shape
        engine.flops = flops_per_sequence(target_cfg=engine.target_config, drafter_cfg=engine.drafter_config,
                                         seq_len=S, num_anchors=N,
                                         distill=any(w.distill_weight > 0 for w in engine.workers))
    return engine.flops


def engine_peak_flops(engine) -> float | None:
    d = engine.workers[0].device
    if d.type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(d))



def balance(m: dict) -> dict:
    """Which side of a split placement limits throughput, in words a user acts on."""
    dw, tw = m.get("drafter_wait_frac"), m.get("target_wait_frac")
    supply, demand = m["supply_tokens_per_s"], m["demand_tokens_per_s"]
    rates = f"targets can supply {supply / 1e3:.1f}k tok/s, drafters can consume {demand / 1e3:.1f}k tok/s"
    if supply < 0.9 * demand:
        side = "target"
        hint = (f"drafter GPUs wait {dw:.0%} of the time for features: " if dw is not None else "") + \
               f"{rates}; give the target side more GPUs (more replicas)"
    elif demand < 0.9 * supply:
        side = "drafter"
        hint = (f"target GPUs wait {tw:.0%} of the time for the drafters: " if tw is not None else "") + \
               f"{rates}; give the drafter side more GPUs"
    else:
        side, hint = "balanced", f"balanced: {rates}"
    return {"bottleneck": side, "balance_hint": hint}


def dynamo_counts() -> dict:
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - no dynamo: nothing to count
        return {}
    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}
