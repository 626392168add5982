"""Bootstrap intervals over prompts for a real tau, and which measurements they cannot tell apart.

Real tau is pooled: accepted drafts over all iterations of all prompts, + 1. Its noise is between prompts (a counting
prompt accepts 6 drafts per block, a chat greeting 0), so the interval resamples PROMPTS with replacement: each of
`resamples` resamples draws n prompts out of n and computes the pooled tau of the draw, and the interval is the
(1 - level) / 2 and (1 + level) / 2 quantiles of those taus. Seeded (torch.Generator): the same results give the
same interval. With 8 prompts a drafter read 2.28 in training and 1.83 on 64 others; intervals of 8-prompt
measurements are about 3x wider than of 64-prompt ones (1 / sqrt(n)), which is how a reader sees that 8 decide little.

Below MIN_PROMPTS prompts there is no interval: one prompt resampled is itself (a zero-width "interval" that made
two one-prompt measurements 0.01 apart look separated), and two to four give a handful of distinct resamples.
Such a TauInterval has low = high = None (rendered "n/a"), and it overlaps everything.

Two measurements are "separated" only when both intervals are defined and do not overlap; a ranking says so beside
every row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

LEVEL = 0.95
RESAMPLES = 2000
MIN_PROMPTS = 5  # fewer prompts: the interval is undefined and separation is never claimed


@dataclass(frozen=True)
class TauInterval:
    """A pooled tau over `prompts` prompts and its bootstrap interval [low, high] at `level` (None, None: fewer
    than MIN_PROMPTS prompts, no interval)."""

    tau: float
    low: float | None
    high: float | None
    prompts: int
    level: float = LEVEL
    resamples: int = RESAMPLES
    seed: int = 0

    @property
    def defined(self) -> bool:
        return self.low is not None and self.high is not None

    def overlaps(self, other: "TauInterval") -> bool:
        """True unless both intervals are defined and apart (an undefined one cannot be told apart from any)."""
        if not (self.defined and other.defined):
            return True
        return self.low <= other.high and other.low <= self.high

    def text(self, spec: str = ".2f") -> str:
        """`2.31 [2.10, 2.52]`, or `2.31 [n/a]` without an interval."""
        if not self.defined:
            return f"{self.tau:{spec}} [n/a]"
        return f"{self.tau:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        if not self.defined:
            return f"{self.text()} ({self.prompts} prompts: no interval below {MIN_PROMPTS})"
        return f"{self.text()} ({self.prompts} prompts, {self.level:.0%} bootstrap)"


def stored_interval(tau: float | None, low: float | None, high: float | None, prompts: int | None
                    ) -> TauInterval | None:
    """The interval of a figure read back from a file (eval.json, metrics, a sweep): None without a tau or without
    recorded bounds (measured before intervals were); undefined when it counts fewer than MIN_PROMPTS prompts,
    whatever bounds an older version wrote for it."""
    if tau is None:
        return None
    if prompts is not None and prompts < MIN_PROMPTS:
        return TauInterval(tau, None, None, prompts, resamples=0)
    if low is None or high is None:
        return None
    return TauInterval(tau, low, high, prompts or 0)


def bootstrap_tau(accepted: list[int], iterations: list[int], *, level: float = LEVEL, resamples: int = RESAMPLES,
                  seed: int = 0, min_prompts: int = MIN_PROMPTS) -> TauInterval | None:
    """Pooled tau and its bootstrap interval from per-prompt sums: accepted[i] drafts over iterations[i] iterations.

    None when there is no prompt; fewer than `min_prompts` prompts give the tau with an undefined interval."""
    if len(accepted) != len(iterations):
        raise ValueError(f"accepted has {len(accepted)} prompts but iterations has {len(iterations)}.")
    if not 0 < level < 1:
        raise ValueError(f"level={level} must be in (0, 1), e.g. 0.95.")
    n = len(accepted)
    if n == 0:
        return None
    acc = torch.tensor(accepted, dtype=torch.float64)
    its = torch.tensor(iterations, dtype=torch.float64)
    tau = float(acc.sum() / its.sum()) + 1.0 if its.sum() > 0 else 1.0
    if n < max(min_prompts, 2) or resamples < 1:
        return TauInterval(tau, None, None, n, level, 0, seed)
    g = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n, (resamples, n), generator=g)  # (R, n) prompt indices, with replacement
    counts = torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(1, draws, torch.ones(resamples, n,
                                                                                              dtype=torch.float64))
    its_r = counts @ its  # (R,)
    taus = torch.where(its_r > 0, (counts @ acc) / its_r.clamp_min(1e-12) + 1.0, torch.ones_like(its_r))
    lo, hi = torch.quantile(taus, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    return TauInterval(tau, lo, hi, n, level, resamples, seed)


def tau_interval(results, **kw) -> TauInterval | None:
    """The interval of per-prompt results: GenerationResult objects or result dicts (`accepted` a list or a sum,
    `iterations`)."""
    acc, its = [], []
    for r in results:
        a = r.accepted if hasattr(r, "accepted") else r["accepted"]
        acc.append(a if isinstance(a, int) else sum(a))
        its.append(r.iterations if hasattr(r, "iterations") else r["iterations"])
    return bootstrap_tau(acc, its, **kw)


def not_separated(intervals: dict[str, TauInterval | None]) -> dict[str, list[str]]:
    """For each name with an interval, the other names whose intervals overlap it (in the given order); names
    without an interval (None) map to []. An empty list means separated from every other measured one; an
    undefined interval (fewer than MIN_PROMPTS prompts) overlaps every other, so it is never separated."""
    out = {}
    for name, iv in intervals.items():
        out[name] = [] if iv is None else [o for o, jv in intervals.items()
                                           if o != name and jv is not None and iv.overlaps(jv)]
    return out
