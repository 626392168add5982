"""What speculative_generate returns: one GenerationResult per prompt, with the pooled tau over them, its bootstrap
interval over prompts and the throughput, the figures the Trainer's periodic real tau and the benchmarks read."""

from __future__ import annotations

from dataclasses import dataclass

from .intervals import TauInterval, tau_interval
from .speculative import GenerationResult


@dataclass
class SpeculativeRun:
    """Results of speculative_generate: one GenerationResult per prompt, pooled tau, its interval and throughput."""

    results: list[GenerationResult]

    @property
    def tau(self) -> float:
        """Mean accepted + 1 over all iterations of all prompts (pooled)."""
        acc = [a for r in self.results for a in r.accepted]
        return sum(acc) / len(acc) + 1.0 if acc else 1.0

    def interval(self, seed: int = 0) -> TauInterval | None:
        """The 95% bootstrap interval of the pooled tau over the prompts (intervals.py)."""
        return tau_interval(self.results, seed=seed)

    @property
    def new_tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        secs = sum(r.total_s for r in self.results)
        return self.new_tokens / secs if secs > 0 else 0.0

    @property
    def ms_per_iteration(self) -> float:
        its = sum(r.iterations for r in self.results)
        return 1e3 * sum(r.decode_s for r in self.results) / its if its else 0.0
