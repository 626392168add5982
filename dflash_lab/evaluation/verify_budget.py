"""How many of a block's drafts the target verifies, chosen from the confidence head's per-slot acceptance
probabilities the way the engines choose it (adaptive verification).

Two rules, each an engine's:
- "cost" (vLLM 0.34.0's AdaptiveVerificationManager.get_num_tokens, served with `enable_adaptive_verification`):
  draft j survives with probability S_j = c_1 * ... * c_j (the running product of the slots' confidences: a draft
  counts only if every draft before it is accepted); verifying k drafts is expected to emit 1 + S_1 + ... + S_k
  tokens (the bonus token always comes) and costs draft_ms + verify_ms(1 + k), so k maximises expected tokens per
  millisecond. At batch 1 the winners are a prefix of the block, so that k is the count verified. vLLM prices the
  choice with the confidences of the PREVIOUS block (its host copy lags a step behind the device; a new request
  starts at all ones): `lag=1`; `lag=0` is the rule with fresh confidences. SGLang 0.5.23's planner
  (speculative/dspark_components/dspark_planner.py, only in its non-static SGLANG_RAGGED_VERIFY_MODE) follows the
  same survival idea but differs: confidences two steps old, survivals under 1e-6 dropped, and prices from measured
  throughput tables instead of draft + verify milliseconds, so this rule is not what SGLang serves.
- "threshold" (DeepSpec's evaluator, eval/dspark/draft_ops.py): verify the drafts before the first slot whose own
  confidence is below `threshold`, with this block's confidences.

The costs are a table measured on the device that decodes (verify_ms[i] = one target forward over i + 1 tokens at
batch 1), so a target whose forward costs the same for 1 and 16 tokens verifies every draft: the rule only pays
where verifying is dear (large targets, large batches).
"""

from __future__ import annotations

from dataclasses import dataclass

RULES = ("cost", "threshold")


@dataclass(frozen=True, kw_only=True)
class VerifyPolicy:
    """rule: "cost" or "threshold" (module docstring); threshold: the "threshold" rule's confidence in (0, 1);
    verify_ms: the "cost" rule's table, ms of one target forward over 1, 2, ... tokens (at least block_size
    entries); draft_ms: ms of drafting one block; lag: 0 = this block's confidences, 1 = the previous block's."""

    rule: str
    threshold: float = 0.5
    verify_ms: tuple[float, ...] = ()
    draft_ms: float = 0.0
    lag: int = 1

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"VerifyPolicy.rule={self.rule!r} is not one of {list(RULES)}.")
        if self.lag not in (0, 1):
            raise ValueError(f"VerifyPolicy.lag={self.lag} must be 0 (this block's confidences) or 1 (the previous "
                             "block's, as vLLM prices the choice).")
        if self.rule == "threshold" and not 0 < self.threshold < 1:
            raise ValueError(f"VerifyPolicy.threshold={self.threshold} must lie in (0, 1).")
        if self.rule == "cost":
            if not self.verify_ms or min(self.verify_ms) <= 0 or self.draft_ms < 0:
                raise ValueError(f"VerifyPolicy(rule='cost') needs verify_ms, the positive ms of one target forward "
                                 f"over 1, 2, ... tokens, and draft_ms >= 0; got verify_ms={self.verify_ms}, "
                                 f"draft_ms={self.draft_ms}. Fix: measure them on the decoding device "
                                 "(bench/dspark_ab.py does) or use rule='threshold'.")
        object.__setattr__(self, "verify_ms", tuple(float(v) for v in self.verify_ms))

    def drafts_to_verify(self, confidence: list[float] | None, drafts: int) -> int:
        """How many of `drafts` drafts to verify given the slots' confidences (None: no information yet, all
        verified, as a new request starts in vLLM)."""
        if confidence is None:
            return drafts
        conf = list(confidence)[:drafts]
        if self.rule == "threshold":
            return next((j for j, c in enumerate(conf) if c < self.threshold), len(conf))
        if len(self.verify_ms) < len(conf) + 1:
            raise ValueError(f"VerifyPolicy.verify_ms has {len(self.verify_ms)} entries; verifying {len(conf)} drafts "
                             f"needs the cost of up to {len(conf) + 1} tokens. Fix: measure the verify cost of 1 to "
                             f"{len(conf) + 1} tokens (bench/dspark_verify.py's cost table) or verify fewer drafts.")
        best_k, best, expected, survival = 0, 1.0 / (self.draft_ms + self.verify_ms[0]), 1.0, 1.0
        for k, c in enumerate(conf, start=1):
            survival *= c
            expected += survival
            rate = expected / (self.draft_ms + self.verify_ms[k])
            if rate > best:  # the first maximum, as np.argmax takes it
                best_k, best = k, rate
        return best_k

    def modeled_ms(self, verified: list[int]) -> float:
        """The "cost" table's ms for blocks that verified `verified` drafts each (draft + verify per block)."""
        return sum(self.draft_ms + self.verify_ms[k] for k in verified)
