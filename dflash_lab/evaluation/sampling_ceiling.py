"""How much acceptance sampled serving leaves to any drafter that drafts argmax tokens: the sampled-tau ceiling.

    python -m dflash_lab.evaluation.sampling_ceiling --target smollm2-135m-instruct --prompts chitchat-heldout general \
        --n-prompts 32 --temperature 1.0 --block-size 16 --max-new-tokens 128 --out ceiling.json

Serving stacks draft argmax tokens at every temperature (vLLM, SGLang and TensorRT-LLM by default; our evaluator,
speculative.py, the same): the draft's q is one-hot, so draft x is accepted with probability p_T(x), the target's
probability of x at temperature T. A drafter trained to predict the target's tokens at best drafts the target's own
greedy continuation (a perfect T=0 drafter: each draft the most acceptable one given the drafts before it), and its
acceptance is then bounded by how peaked the target's distribution is at T. This module measures that bound by
running the evaluator's loop with that oracle as the drafter: each block drafts the target's greedy chain from the
current text, the target's T-probabilities at those positions decide acceptance (acceptance.speculative_accept, the
same function the evaluator uses), and the text continues with what was accepted; tau is counted exactly as the
evaluator counts it (finish_result: cut at eos and at max_new_tokens), with its 95% bootstrap interval over prompts.

With --full-chain each block's EXPECTED accepted length is summed beside it from the same probabilities (1 + the
sum over k of the product of the first k drafts' p_T), a lower-variance figure of the same quantity. A trained
drafter's sampled tau on the same prompts, target, T and block size sits below the realised ceiling; an aim above
the ceiling needs drafts sampled from a coherent draft distribution, not a better argmax drafter.

--drafts coupled measures the next bound: a PARALLEL drafter that knows the target's distribution perfectly, with
drafts drawn from it (acceptance.coupled_slot: one uniform per block; --drafts sample draws each slot on its own). A
DFlash drafter drafts every slot in one pass from mask tokens, so slot k cannot see the drafts before it: the best
it can learn from the target's greedy answers (distillation: the target's T-distribution at each position of them)
is the target's distribution after the context and the target's GREEDY tokens for slots < k. The oracle drafts from
exactly that (a second cache runs the greedy chain) and the target verifies the drafts actually drawn, so the
ceiling counts both what sampling costs and what drafting in parallel costs.

--answers sampled measures the bound for the other T=1 lever, a drafter trained with hard labels on answers the
target SAMPLED at T: cross-entropy on sampled continuations teaches slot k the target's marginal after the context,
q_k = E over x_<k ~ p_T of p_T(. | context, x_<k), since slot k never sees the tokens before it. The oracle estimates
that marginal each block from --samples continuations the target samples (the mean of their next-token
distributions: unbiased for each id; a slot's acceptance of a sampled draft, sum_x min(p, q), is concave in q, so
the estimate's noise lowers it on average and the sampled-draft figures lean low), then drafts argmax, coupled or
independent draws from it, verified as above.

--top-k K: the oracle's q_k kept as its K most probable ids, renormalised: what a drafter distilled with
TrainConfig.distill_top_k=K (and distill_weight=1) learns at best. A sampled draft is then accepted with probability
at most the target's top-K mass at that slot (sum_x min(p, q) over the K ids), so K bounds the sampled-draft ceiling.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dflash_lab.target.sampling import temperature_arg, tempered_probs

from .acceptance import accept_drawn, coupled_slot, speculative_accept
from .intervals import tau_interval
from .speculative import GenerationResult, finish_result

DRAWS = ("argmax", "coupled", "sample")  # how the oracle drafts from its q_k
ANSWERS = ("greedy", "sampled")  # what the oracle drafter was trained on: its q_k (module docstring)


@dataclass
class CeilingResult:
    """One prompt: the oracle's generation (its tau as the evaluator counts it) and each block's expected length."""

    result: GenerationResult
    expected: list[float] = field(default_factory=list)  # per block: 1 + sum_k prod_{j<k} p_T(draft_j)
    first_p: list[float] = field(default_factory=list)  # per block: p_T of the first draft (the target's top-1 mass)


def eos_ids_of(model) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return set([eos] if isinstance(eos, int) else (eos or []))


@torch.no_grad()
def oracle_decode(model, prompt_ids: list[int], *, block_size: int, temperature: float, max_new_tokens: int,
                  generator: torch.Generator, eos_ids: set[int], full_chain: bool = False) -> CeilingResult:
    """Speculative sampling at `temperature` with the target's greedy chain as the (argmax) drafter, one prompt.

    The target's cache holds the prompt and every emitted token but the last. A block feeds the last token, then its
    own greedy choices one by one; row k (the distribution after the last token and the first k drafts) decides
    draft k exactly as speculative_accept does (u < p_T(draft k), else a draw from p_T without it; the bonus token
    from the last row), with the random draws in the same order. By default a draft is only computed once the
    previous one is accepted (~tau forwards a block instead of block_size: the output is the same token for token);
    `full_chain` computes every block's whole chain, which the expected length (1 + sum_k prod_{j<k} p_T(draft j))
    needs."""
    from transformers import DynamicCache

    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: the ceiling is for sampled serving (T > 0); at T=0 the oracle "
                         f"accepts every draft and tau is the block size ({block_size}).")
    if block_size < 2:
        raise ValueError(f"block_size={block_size}: a block needs at least one draft (use e.g. 16).")
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)

    def step(tokens: list[int]) -> torch.Tensor:  # p_T after feeding `tokens` (cached)
        logits = model(torch.tensor([tokens], device=device), past_key_values=cache, use_cache=True).logits[0, -1]
        return tempered_probs(logits.cpu(), temperature)

    t0 = time.perf_counter()
    out = [int(torch.multinomial(step(prompt_ids), 1, generator=generator))]
    t1 = time.perf_counter()
    accepted, expected, first_p = [], [], []
    done = out[-1] in eos_ids
    while len(out) < max_new_tokens and not done:
        if full_chain:
            rows, chain, token = [], [], out[-1]
            for j in range(block_size):
                rows.append(step([token]))
                if j < block_size - 1:
                    token = int(rows[-1].argmax())
                    chain.append(token)
            probs = torch.stack(rows)
            p_drafts = probs[torch.arange(len(chain)), torch.tensor(chain)]
            expected.append(1.0 + float(torch.cumprod(p_drafts, 0).sum()))
            first_p.append(float(p_drafts[0]))
            a, nxt = speculative_accept(probs, chain, generator)
            keep = len(prompt_ids) + len(out) + a  # prompt, the emitted tokens, the accepted drafts: all verified
            cache.crop(keep - cache.get_seq_length())  # negative: the rejected drafts' entries go
        else:
            chain, row, nxt = [], step([out[-1]]), None
            first_p.append(float(row.max()))
            while len(chain) < block_size - 1:
                x = int(row.argmax())
                if not torch.rand((), generator=generator) < row[x]:  # rejected: the residual p_T without x
                    residual = row.clone()
                    residual[x] = 0.0
                    nxt = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
                    break
                chain.append(x)
                row = step([x])
            if nxt is None:  # every draft accepted: the bonus token from the last row
                nxt = int(torch.multinomial(row, 1, generator=generator))
            a = len(chain)
        accepted.append(a)
        out.extend(chain[:a])
        out.append(nxt)
        done = any(t in eos_ids for t in out[-(a + 1):])
    t2 = time.perf_counter()
    result = finish_result(len(prompt_ids), out, accepted, block_size, t1 - t0, t2 - t1, eos_ids, max_new_tokens,
                           [], [], [])
    return CeilingResult(result, expected[: result.iterations], first_p[: result.iterations])


def _proposal(q_row: torch.Tensor, draws: str, u: float, lo: float, hi: float, generator: torch.Generator
              ) -> tuple[int, torch.Tensor, float, float]:
    """One slot's draft from the oracle's q_k and the proposal it was drawn from (given the drafts before it)."""
    if draws == "coupled":
        return coupled_slot(q_row, u, lo, hi)
    if draws == "sample":
        return int(torch.multinomial(q_row, 1, generator=generator)), q_row, lo, hi
    x = int(q_row.argmax())  # argmax: a one-hot proposal, kept with probability p_T(x) as servers verify
    return x, torch.zeros_like(q_row).index_fill_(0, torch.tensor([x]), 1.0), lo, hi


def keep_top_k(q_row: torch.Tensor, k: int | None) -> torch.Tensor:
    """q_row kept as its k most probable ids, renormalised (None: q_row itself): the distribution a drafter
    distilled on the target's top-k learns."""
    if k is None or k >= q_row.numel():
        return q_row
    top, idx = q_row.topk(k)
    return torch.zeros_like(q_row).index_copy_(0, idx, top / top.sum())


def advance_marginal(step, cache, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The target's sampled continuations one token further: each of the (M, V) `rows` draws its next token, which
    `step` feeds into the M-row `cache`; returns the M new next-token distributions (their mean estimates the
    marginal of the next slot)."""
    tokens = torch.multinomial(rows, 1, generator=generator)
    return step(cache, tokens)


@torch.no_grad()
def oracle_decode_parallel(model, prompt_ids: list[int], *, block_size: int, temperature: float,
                           max_new_tokens: int, generator: torch.Generator, eos_ids: set[int],
                           draws: str = "coupled", answers: str = "greedy", samples: int = 16,
                           top_k: int | None = None) -> CeilingResult:
    """Speculative sampling at `temperature` with a perfect PARALLEL drafter, one prompt (module docstring).

    answers="greedy": slot k's q_k is the target's distribution after the context and its greedy tokens for the
    slots before it (a second cache runs the greedy chain): the best a drafter distilled on greedy answers learns.
    answers="sampled": q_k is the target's marginal at slot k, estimated from `samples` continuations it samples (a
    second, M-row cache): the best a drafter trained on sampled answers learns. `draws`: "coupled" (one uniform per
    block), "sample" (each slot on its own) or "argmax" (q_k's top id, one-hot). The target's cache holds the
    prompt and every emitted token but the last and is fed the drafts actually drawn (p_k after the drafts x_<k);
    a draft is kept with probability min(1, p_k / q~_k) (q~_k: its proposal given the drafts before it). Slot k is
    drafted only once slot k-1 was kept, so both caches advance ~tau tokens a block. `top_k`: q_k kept as its
    top_k ids, renormalised (a drafter distilled on the target's top-k; None = all of q_k)."""
    from transformers import DynamicCache

    if temperature <= 0 or block_size < 2:
        raise ValueError(f"temperature={temperature}, block_size={block_size}: the parallel ceiling needs T > 0 and a "
                         "block with at least one draft (e.g. T=1, block_size=16).")
    if draws not in DRAWS or answers not in ANSWERS or samples < 1 or (top_k is not None and top_k < 1):
        raise ValueError(f"draws={draws!r}, answers={answers!r}, samples={samples}, top_k={top_k}: draws is one of "
                         f"{DRAWS}, answers one of {ANSWERS}, samples >= 1 (e.g. 16), top_k None or >= 1 (e.g. 16).")
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)

    def step(c, tokens) -> torch.Tensor:  # p_T of each row after feeding `tokens` ((rows, n) ids) into cache c
        logits = model(tokens.to(device), past_key_values=c, use_cache=True).logits[:, -1]
        return tempered_probs(logits.cpu(), temperature)

    def one(c, tokens: list[int]) -> torch.Tensor:
        return step(c, torch.tensor([tokens]))[0]

    t0 = time.perf_counter()
    out = [int(torch.multinomial(one(cache, prompt_ids), 1, generator=generator))]
    t1 = time.perf_counter()
    accepted, first_p = [], []
    done = out[-1] in eos_ids
    while len(out) < max_new_tokens and not done:
        p_row = one(cache, [out[-1]])
        side, q_row = copy.deepcopy(cache), p_row  # slot 1's q is the target's own distribution on either side
        if answers == "sampled":
            side.batch_repeat_interleave(samples)
            paths = p_row.expand(samples, -1)
        first_p.append(float(p_row.max()))
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        lo, hi, chain, nxt = 0.0, 1.0, [], None
        while len(chain) < block_size - 1:
            x, proposal, lo, hi = _proposal(keep_top_k(q_row, top_k), draws, u, lo, hi, generator)
            nxt = accept_drawn(p_row, proposal, x, generator)
            if nxt is not None:  # rejected: the target's token from the residual
                break
            chain.append(x)
            p_row = one(cache, [x])
            if len(chain) < block_size - 1:
                if answers == "greedy":
                    q_row = one(side, [int(q_row.argmax())])
                else:
                    paths = advance_marginal(step, side, paths, generator)
                    q_row = paths.mean(0)
        if nxt is None:  # every draft kept: the bonus token from the target after the last one
            nxt = int(torch.multinomial(p_row, 1, generator=generator))
        accepted.append(len(chain))
        out.extend(chain)
        out.append(nxt)
        done = any(t in eos_ids for t in out[-(len(chain) + 1):])
    t2 = time.perf_counter()
    result = finish_result(len(prompt_ids), out, accepted, block_size, t1 - t0, t2 - t1, eos_ids, max_new_tokens,
                           [], [], [])
    return CeilingResult(result, [], first_p[: result.iterations])


@dataclass(frozen=True)
class CeilingRow:
    """One prompt set's ceiling: tau as the evaluator counts it, its interval, and the lower-variance figures."""

    prompt_set: str
    prompts: int
    sha256: str
    temperature: float
    block_size: int
    max_new_tokens: int
    tau: float
    tau_low: float | None
    tau_high: float | None
    expected_tau: float | None  # mean over blocks of the expected accepted length + 1 (full chains only)
    first_draft_p: float  # mean p_T of the first draft: the top-1 mass of the target at T
    seconds: float
    drafts: str = "argmax"  # the oracle's drafts: "argmax" (the greedy chain), "coupled" or "sample" (docstring)
    answers: str = "greedy"  # what the oracle drafter learned from: "greedy" or "sampled" answers (docstring)
    samples: int | None = None  # with sampled answers: the continuations each slot's marginal is estimated from
    top_k: int | None = None  # the oracle's q_k kept as its top-k ids (a drafter distilled on the target's top-k)

    def line(self) -> str:
        ci = f"[{self.tau_low:.2f}, {self.tau_high:.2f}]" if self.tau_low is not None else "[no interval]"
        exp = f"  expected {self.expected_tau:.2f}" if self.expected_tau is not None else ""
        who = f"sampled-answers ({self.samples} samples) " if self.answers == "sampled" else ""
        who += f"top-{self.top_k} " if self.top_k is not None else ""
        return (f"{self.prompt_set:<18} {self.prompts:>4}  T={self.temperature:g}  B={self.block_size}  "
                f"{who}{self.drafts} ceiling tau {self.tau:.2f} {ci}{exp}  top-1 mass {self.first_draft_p:.3f}  "
                f"({self.seconds:.0f} s)")


def ceiling(model, tokenizer, name: str, path: str | Path, *, n_prompts: int, temperature: float, block_size: int,
            max_new_tokens: int, seed: int = 0, full_chain: bool = False, drafts: str = "argmax",
            answers: str = "greedy", samples: int = 16, top_k: int | None = None, log=print) -> CeilingRow:
    """The ceiling on `n_prompts` prompts of one set (prompts.select_prompts picks them, as the evaluator does)."""
    if drafts not in DRAWS or answers not in ANSWERS:
        raise ValueError(f"drafts={drafts!r}, answers={answers!r}: drafts is \"argmax\", \"coupled\" or \"sample\" "
                         "(the oracle's argmax, coupled or independent draws), answers \"greedy\" or \"sampled\" "
                         "(what the oracle drafter learned from).")
    from .prompt_sets import info_of
    from .prompts import load_prompts, select_prompts

    chosen = select_prompts(path, n_prompts)
    info = info_of(name, path, chosen)
    ids = load_prompts(path, tokenizer, messages=chosen.messages)
    generator = torch.Generator().manual_seed(seed)
    eos = eos_ids_of(model)
    results, t0, last = [], time.perf_counter(), 0.0
    for i, prompt in enumerate(ids, 1):
        if drafts != "argmax" or answers != "greedy" or top_k is not None:
            results.append(oracle_decode_parallel(model, prompt, block_size=block_size, temperature=temperature,
                                                  max_new_tokens=max_new_tokens, generator=generator, eos_ids=eos,
                                                  draws=drafts, answers=answers, samples=samples, top_k=top_k))
        else:  # the greedy chain itself: any argmax drafter's bound
            results.append(oracle_decode(model, prompt, block_size=block_size, temperature=temperature,
                                         max_new_tokens=max_new_tokens, generator=generator, eos_ids=eos,
                                         full_chain=full_chain))
        now = time.perf_counter()
        if now - last >= 15 or i == len(ids):
            last = now
            running = tau_interval([r.result for r in results])
            log(f"[ceiling] {name}: {i}/{len(ids)} prompts, tau so far {running.tau:.2f}, {now - t0:.0f} s")
    interval = tau_interval([r.result for r in results])
    blocks = [e for r in results for e in r.expected]
    firsts = [p for r in results for p in r.first_p]
    return CeilingRow(name, info.prompts, info.sha256, temperature, block_size, max_new_tokens, interval.tau,
                      interval.low, interval.high, sum(blocks) / len(blocks) if blocks else None,
                      sum(firsts) / max(1, len(firsts)), time.perf_counter() - t0, drafts, answers,
                      samples if answers == "sampled" else None, top_k)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.sampling_ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target name (e.g. smollm2-135m-instruct, tiny) or folder")
    p.add_argument("--prompts", nargs="+", default=["general"], help="prompt set names or JSONL files")
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--temperature", type=temperature_arg, nargs="+", default=[1.0])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--full-chain", action="store_true", help="draft every block's whole chain (block_size forwards "
                   "a block instead of ~tau) for the expected length beside the realised tau")
    p.add_argument("--drafts", nargs="+", default=["argmax"], choices=list(DRAWS),
                   help="the oracle's drafts: argmax (the greedy chain), coupled or sample (a perfectly distilled "
                   "parallel drafter's coupled or independent draws); several for several rows")
    p.add_argument("--answers", nargs="+", default=["greedy"], choices=list(ANSWERS),
                   help="what the oracle drafter learned from: greedy answers (with distillation) or answers sampled "
                   "at T (its q_k is the target's marginal at slot k); several for several rows")
    p.add_argument("--samples", type=int, default=16,
                   help="with --answers sampled: the continuations each block's marginals are estimated from")
    p.add_argument("--top-k", type=int, nargs="+", default=[None], metavar="K",
                   help="keep the oracle's q_k as its K most probable ids, renormalised (a drafter distilled on the "
                   "target's top-K, TrainConfig.distill_top_k); several for several rows; default: all of q_k")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    a = p.parse_args(argv)
    if a.n_prompts < 1 or a.max_new_tokens < 1 or a.samples < 1 or any(t <= 0 for t in a.temperature) \
            or any(k is not None and k < 1 for k in a.top_k):
        p.error("--n-prompts, --max-new-tokens, --samples and every --top-k must be >= 1 and every --temperature > 0 "
                "(at T=0 the oracle accepts every draft)")
    from dflash_lab.target.load import load_target, load_tokenizer
    from .prompt_sets import named_set_path

    model = load_target(a.target, device=a.device, dtype=getattr(torch, a.dtype)).eval()
    tokenizer = load_tokenizer(a.target)
    rows = []
    for t in a.temperature:
        for s in a.prompts:
            for answers, drafts, k in ((an, d, k) for an in a.answers for d in a.drafts for k in a.top_k):
                path = Path(s) if s.endswith(".jsonl") else named_set_path(s, target=a.target)
                rows.append(ceiling(model, tokenizer, s, path, n_prompts=a.n_prompts, temperature=t,
                                    block_size=a.block_size, max_new_tokens=a.max_new_tokens, seed=a.seed,
                                    full_chain=a.full_chain, drafts=drafts, answers=answers, samples=a.samples,
                                    top_k=k))
                print(rows[-1].line(), flush=True)
                if a.out:  # after every row: a run cut short keeps what it measured
                    Path(a.out).write_text(json.dumps({"target": a.target, "dtype": a.dtype, "device": a.device,
                                                       "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
