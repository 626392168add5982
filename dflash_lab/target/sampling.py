"""How the target picks its next token: the one sampling-settings type, and greedy or sampled from one counter-hashed
uniform per token.

Sampling must not depend on how prompts fall into batches or in which order rows are refilled, or a data set would
change with the batch size. So no RNG state is carried: the uniform of the token at position t of the prompt with
key k under seed s is a hash of (s, k, t), computed on the device (a few integer ops per ROW, not per vocabulary
entry), and the token is drawn by inverse CDF from the (temperature, top-k, top-p) filtered distribution in
vocabulary order. The same prompt then gets the same sample in any batch, on any device, as far as its logits are
the same. Filters follow Hugging Face `generate`: temperature, then top-k (ties with the k-th logit kept), then
top-p (the smallest set of most likely tokens whose mass reaches top_p, at least one).

Everything here is fixed-shape tensor work with no host sync: it runs inside the decode step's CUDA graph.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass

import torch

from dflash_lab.config.errors import fail

_M32 = 0xFFFFFFFF
# The lowest temperature the engine and Hugging Face generate are handed: their logits / T must stay finite
# (fp32 logits of ~20 overflow below T ~ 1e-37), and at 1e-6 sampling is already the argmax except between logits
# closer than ~1e-5. The evaluator's decoders take any T > 0 (tempered_probs subtracts the maximum first).
MIN_SAMPLING_TEMPERATURE = 1e-6


def temperature_problem(value) -> str | None:
    """Why `value` is no temperature (None when it is one): a finite number >= 0, 0 meaning greedy."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "must be a number"
    if not math.isfinite(value):
        return "must be a finite number (0 = greedy)"
    if value < 0:
        return "must be >= 0 (0 = greedy)"
    return None


def check_temperature(value) -> None:
    """Raise ValueError naming `value` when it is no temperature (the decoders' check of their argument)."""
    if problem := temperature_problem(value):
        raise ValueError(f"temperature={value} {problem}.")


def temperature_arg(text: str) -> float:
    """argparse type of every command's --temperature: the one check, as argparse's one-line error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (0 = greedy, e.g. 1.0 to sample)") from None
    problem = temperature_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}; use 0 for greedy or e.g. 1.0 to sample")
    return value


def tempered_probs(logits: torch.Tensor, temperature) -> torch.Tensor:
    """softmax(logits / T) over the last dim in fp32, computed as softmax((logits - max) / T): every exponent is
    <= 0, so no T > 0 overflows it (logits / 1e-40 is inf, and a softmax of infs is NaN, which drew the
    vocabulary's last id), and as T -> 0 it tends to the argmax (one-hot; exact ties share the mass). T is floored
    at fp32's smallest normal number, below which it would round to 0 in the division (0 / 0)."""
    z = logits.float()
    z = z - z.amax(-1, keepdim=True)
    if isinstance(temperature, torch.Tensor):
        return torch.softmax(z / temperature.float().clamp(min=torch.finfo(torch.float32).tiny), dim=-1)
    return torch.softmax(z / max(float(temperature), torch.finfo(torch.float32).tiny), dim=-1)


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """How the target answers: the one sampling-settings type of the generation engine, of regeneration (recorded in
    every record it writes, data/regenerate.py) and of target-written prompts (data/self_prompts.py: one for the
    user turns, one for the answers). Validated when built: a bad value names the field, the value and the fix."""

    max_new_tokens: int = 2048
    """Longest answer; an answer cut here finishes with "length"."""
    temperature: float = 0.0
    """0 = greedy (argmax, reproducible); > 0 samples."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 = off (only when sampling)."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off (only when sampling)."""
    seed: int = 0
    """Seed of the per-token counter hash (>= 0); Hugging Face generate seeds its RNG with it per batch."""
    enable_thinking: bool | None = None
    """Passed to the chat template (Qwen3-style thinking switch) where prompts are rendered; None = the template's
    default. The engine itself only sees token ids."""

    def __post_init__(self) -> None:
        def number(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        def integer(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        checks = (
            ("max_new_tokens", integer(self.max_new_tokens) and self.max_new_tokens >= 1, "must be an integer >= 1",
             "use e.g. 2048"),
            ("temperature", temperature_problem(self.temperature) is None, "must be a finite number >= 0",
             "use 0 for greedy or e.g. 1.0"),
            ("top_p", number(self.top_p) and 0 < self.top_p <= 1, "must be in (0, 1]", "use 1.0 (off) or e.g. 0.95"),
            ("top_k", integer(self.top_k) and self.top_k >= 0, "must be an integer >= 0", "use 0 (off) or e.g. 50"),
            ("seed", integer(self.seed) and 0 <= self.seed < 2 ** 63, "must be an integer in [0, 2**63)", "use e.g. 0"),
            ("enable_thinking", self.enable_thinking in (None, True, False), "must be True, False or None",
             "use None for the template's default"),
        )
        for name, ok, why, fix in checks:
            if not ok:
                fail("GenerationSettings", name, getattr(self, name), why, fix)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def mode(self) -> tuple:
        """What changes the decode step's kernels (and so its CUDA graph): greedy, or (top_k, top_p on)."""
        return ("greedy",) if self.greedy else ("sample", self.top_k, self.top_p < 1)

    def to_dict(self) -> dict:
        return asdict(self)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) in int64, split in 16-bit halves so no product overflows."""
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche finalizer (xorshift-multiply, constants of the 'lowbias32' hash)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seed: torch.Tensor, keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1) (float32, 24 random bits) of (seed (), keys (B,), counters (B,)) int64 -> (B,)."""
    h = _mix32((seed & _M32) ^ 0x9E3779B9)
    h = _mix32(h ^ ((seed >> 32) & _M32))
    h = _mix32(h ^ (keys & _M32))
    h = _mix32(h ^ ((keys >> 32) & _M32))
    h = _mix32(h ^ (counters & _M32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def filtered_probs(logits: torch.Tensor, mode: tuple, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Probabilities (B, V) fp32 after temperature, top-k and top-p (zeros outside the kept set)."""
    _, top_k, use_top_p = mode
    z = logits / temperature
    if top_k:
        kth = z.topk(min(top_k, z.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if use_top_p:
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # stable: ties in vocabulary order
        before = sorted_p.cumsum(-1) - sorted_p  # mass of the more likely tokens
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        probs = probs.masked_fill(drop, 0.0)
    return probs


def next_tokens(logits: torch.Tensor, mode: tuple, *, temperature: torch.Tensor, top_p: torch.Tensor,
                uniforms: torch.Tensor) -> torch.Tensor:
    """The next token per row (B,) long from logits (B, V) fp32: argmax, or inverse CDF at `uniforms` (B,)."""
    if mode[0] == "greedy":
        return logits.argmax(-1)
    probs = filtered_probs(logits, mode, temperature, top_p)
    cdf = probs.cumsum(-1)  # (B, V), non-decreasing
    drawn = (cdf <= uniforms[:, None] * cdf[:, -1:]).sum(-1)  # first index whose cdf passes u * total
    # u * total can round up to total: never step past the last token that has mass
    idx = torch.arange(probs.shape[-1], device=probs.device)
    last = torch.where(probs > 0, idx, 0).amax(-1)
    return torch.minimum(drawn, last)
