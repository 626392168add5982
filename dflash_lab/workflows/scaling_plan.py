"""A scaling study's plan: nested subsets of one pool, and the points (series, size, steps, epochs, depth, variant)
trained on them; scaling.py runs them.

The subsets are one seeded shuffle of the pool cut at each size, so a larger set holds every conversation of a
smaller one and two points differ by how much data they saw, not by which.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from pathlib import Path

from dflash_lab.config import ConfigError
from dflash_lab.train.prepare import resolve_settings


def count_lines(path: str | Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def pool_sha256(pool: str | Path) -> str:
    """The pool's content: a study resumed on a regenerated pool at the same path would mix two pools in one curve."""
    h = hashlib.sha256()
    with open(pool, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_subsets(pool: str | Path, sizes: tuple, out_dir: Path, seed: int) -> dict[int, Path]:
    """Nested subsets of the pool: one seeded shuffle, then its first N lines for each size (so a larger set holds
    every conversation of a smaller one and the curves differ by data, not by which data). Records end at "\n"
    only: str.splitlines() would also cut at U+2028 / U+2029 / U+0085, which JSON writers leave raw in strings."""
    lines = [line for line in Path(pool).read_text(encoding="utf-8").split("\n") if line.strip()]
    if len(lines) < max(sizes):
        raise ConfigError(f"the pool {pool} holds {len(lines)} conversations, fewer than the largest size "
                          f"{max(sizes)}. Fix: generate more (--n) or drop that size.")
    random.Random(seed).shuffle(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for n in sizes:
        p = out_dir / f"train-{n}.jsonl"
        p.write_text("\n".join(lines[:n]) + "\n")
        paths[n] = p
    return paths


def plan_points(cfg, subsets: dict[int, Path]) -> list[dict]:
    """Every point of a study (cfg: scaling.ScalingConfig): its series, size, steps, epochs and depth (validated
    TrainConfigs)."""
    pool = cfg.train_config(size=1, steps=1, data=cfg.pool)
    shape = [f for f in pool.unresolved if f not in ("feature_store_gib", "feature_store_host_gib")]
    if shape:  # every point trains at one shape, chosen once on the whole pool (each run still sizes its own store)
        chosen = resolve_settings(pool, log=None)[0].config
        cfg = dataclasses.replace(cfg, base={**cfg.base, **{f: getattr(chosen, f) for f in shape}})
        pool = cfg.train_config(size=1, steps=1, data=cfg.pool)
    batch, base_depth = pool.batch_size, pool.num_draft_layers
    points = []

    def add(series, n, steps, depth, name=None, overrides=None):
        name = name or f"{series}-n{n}-d{depth}"
        tc = cfg.train_config(size=n, steps=steps, data=str(subsets[n]), depth=depth, name=name,
                              overrides=overrides)
        points.append({"name": name, "series": series, "conversations": n, "steps": steps,
                       "depth": tc.num_draft_layers, "epochs": round(steps * batch / n, 3),
                       "overrides": dict(overrides or {}), "config": tc})

    for n in cfg.sizes:
        if cfg.matched_steps is not None:
            add("steps", n, cfg.matched_steps, base_depth)
        if cfg.matched_epochs is not None:
            steps = max(cfg.min_steps, math.ceil(cfg.matched_epochs * n / batch))
            if cfg.matched_steps is None or steps != cfg.matched_steps:
                add("epochs", n, steps, base_depth)
    largest_steps = cfg.matched_steps or points[-1]["steps"]
    for depth in cfg.extra_depths:
        if depth != base_depth:
            add("depth", cfg.sizes[-1], largest_steps, depth)
    for name, over in cfg.variants.items():
        add("variant", cfg.sizes[-1], int(over.get("steps", largest_steps)), None, name=f"variant-{name}",
            overrides=over)
    return points


def schedule_order(points: list[dict]) -> list[int]:
    """Longest points first (steps x depth): with several slots the longest run sets the study's wall time, so it
    starts at once instead of last."""
    return sorted(range(len(points)), key=lambda i: -points[i]["steps"] * points[i]["depth"])
