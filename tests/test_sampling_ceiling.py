"""The sampled-tau ceiling (evaluation/sampling_ceiling.py) on the tiny target: the oracle argmax drafter's blocks
against the expected length summed from the same probabilities, the T -> 0 limit, the CLI's JSON, bad input; the
parallel oracles (a drafter distilled on greedy answers, or trained on sampled ones) emit exactly the target's
samples in every draw mode, and the sampled-answers oracle's marginals are the target's."""

import itertools
import json
import math
import types

import pytest
import torch

from dflash_lab.evaluation.prompts import load_prompts
from dflash_lab.evaluation import sampling_ceiling
from dflash_lab.evaluation.sampling_ceiling import (advance_marginal, ceiling, eos_ids_of, keep_top_k, main,
                                                    oracle_decode, oracle_decode_parallel)
from dflash_lab.target.load import load_target, load_tokenizer
from dflash_lab.tiny import tiny_heldout_path


@pytest.fixture(scope="module")
def tiny():
    tok = load_tokenizer("tiny")
    model = load_target("tiny").eval()
    return model, tok, load_prompts(tiny_heldout_path(), tok, n_prompts=12)


def test_realised_blocks_match_their_expected_length(tiny):
    """At T=1.6 the tiny target is far from peaked: every block's accepted count is a draw whose mean is 1 + the sum
    over k of the product of the first k drafts' probabilities; over ~300 blocks the two agree within 4 standard
    errors, and a formula off by one draft (the product one term short or long) would not."""
    model, _, prompts = tiny
    g = torch.Generator().manual_seed(1)
    realised, expected, shifted = [], [], []
    for ids in prompts:
        r = oracle_decode(model, ids, block_size=6, temperature=1.6, max_new_tokens=96, generator=g,
                          eos_ids=set(), full_chain=True)  # no eos: every prompt runs its whole budget
        full = r.result.accepted[:-1]  # the last block is cut by the budget
        realised += [a + 1 for a in full]
        expected += r.expected[: len(full)]
    n = len(realised)
    mean_r, mean_e = sum(realised) / n, sum(expected) / n
    var = sum((x - mean_r) ** 2 for x in realised) / (n - 1)
    assert n > 150 and 2.0 < mean_r < 5.0  # neither all-accept nor all-reject: the test has something to compare
    assert abs(mean_r - mean_e) < 4 * math.sqrt(var / n), (mean_r, mean_e)
    for ids in prompts[:4]:  # the same probabilities summed one draft short: 1 + sum_k prod_{j<=k-1}
        r = oracle_decode(model, ids, block_size=6, temperature=1.6, max_new_tokens=96,
                          generator=torch.Generator().manual_seed(2), eos_ids=set(), full_chain=True)
        shifted += [e - 1 for e in r.expected]  # the expected accepted drafts, without the bonus token
    assert sum(shifted) / len(shifted) < mean_r - 0.5


def test_drafting_only_what_may_be_accepted_gives_the_same_tokens(tiny):
    """The default computes a draft only once the previous one is accepted; with the random draws in
    speculative_accept's order the output equals the full-chain run's token for token."""
    model, _, prompts = tiny
    for ids in prompts[:4]:
        lazy, full = (oracle_decode(model, ids, block_size=6, temperature=1.6, max_new_tokens=64, eos_ids=set(),
                                    generator=torch.Generator().manual_seed(3), full_chain=f) for f in (False, True))
        assert lazy.result.output_ids == full.result.output_ids and lazy.result.accepted == full.result.accepted
        assert lazy.first_p == pytest.approx(full.first_p) and lazy.expected == [] and len(full.expected) > 0


def test_near_greedy_the_oracle_accepts_every_draft(tiny):
    model, _, prompts = tiny
    r = oracle_decode(model, prompts[0], block_size=8, temperature=1e-4, max_new_tokens=65,
                      generator=torch.Generator().manual_seed(0), eos_ids=set())
    assert r.result.accepted == [7] * 8  # 1 + 8 blocks x (7 drafts + the bonus) = 65 tokens
    assert r.result.tau == 8.0 and all(p > 0.999 for p in r.first_p)


@pytest.mark.parametrize("answers", ["greedy", "sampled"])
def test_near_greedy_the_parallel_oracles_accept_every_draft_too(tiny, answers):
    """Near T=0 the sampled continuations are the greedy chain, so both parallel oracles draft it whole."""
    model, _, prompts = tiny
    r = oracle_decode_parallel(model, prompts[0], block_size=8, temperature=1e-4, max_new_tokens=65,
                               generator=torch.Generator().manual_seed(0), eos_ids=set(), answers=answers, samples=4)
    assert r.result.accepted == [7] * 8 and r.result.tau == 8.0 and all(p > 0.999 for p in r.first_p)


class _Bigram(torch.nn.Module):
    """A target whose next-token distribution depends only on the last token: the exact distribution of any
    continuation is a product of table rows, and its greedy chain differs from its samples often."""

    def __init__(self, table: torch.Tensor, config):
        super().__init__()
        self.table, self.config = table, config
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the oracle reads the device from the parameters

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        return types.SimpleNamespace(logits=self.table[input_ids])


def _bigram(tiny) -> _Bigram:
    return _Bigram(torch.randn(6, 6, generator=torch.Generator().manual_seed(4)) * 1.5, tiny[0].config)


@pytest.mark.parametrize("answers,draws,top_k", [("greedy", "coupled", None), ("greedy", "sample", None),
                                                 ("greedy", "sample", 2), ("sampled", "coupled", None),
                                                 ("sampled", "sample", None), ("sampled", "argmax", None)])
def test_the_parallel_oracle_emits_exactly_the_targets_samples(tiny, monkeypatch, answers, draws, top_k):
    """8,000 generations of 3 tokens from a 6-token bigram target at T=1, for each oracle and draw mode: the joint
    of the three tokens matches the target's own (total variation within sampling noise), although slot 2 is drafted
    from the greedy token or from the marginal over sampled ones (or from its top 2 ids only) while the target
    verifies it after the token actually drawn. Verifying coupled drafts against q_k itself instead of the proposal
    given the drafts before it (the easy mistake) is 0.27 away."""
    model = _bigram(tiny)
    rows = torch.softmax(model.table, dim=-1)
    exact = {seq: float(rows[0, seq[0]] * rows[seq[0], seq[1]] * rows[seq[1], seq[2]])
             for seq in itertools.product(range(6), repeat=3)}

    def tv() -> float:
        counts: dict = {}
        for seed in range(8000):
            r = oracle_decode_parallel(model, [0], block_size=4, temperature=1.0, max_new_tokens=3, eos_ids=set(),
                                       generator=torch.Generator().manual_seed(seed), draws=draws, answers=answers,
                                       samples=4, top_k=top_k)
            seq = tuple(r.result.output_ids[:3])
            counts[seq] = counts.get(seq, 0) + 1
        return 0.5 * sum(abs(counts.get(k, 0) / 8000 - v) for k, v in exact.items())

    assert tv() < 0.06  # 0.024 at 20,000 draws
    if (answers, draws) != ("greedy", "coupled"):
        return
    right = sampling_ceiling.coupled_slot
    monkeypatch.setattr(sampling_ceiling, "coupled_slot",
                        lambda q, u, lo, hi: (lambda d: (d[0], q.clone(), d[2], d[3]))(right(q, u, lo, hi)))
    assert tv() > 0.15


def test_a_top_k_drafter_accepts_a_sampled_draft_with_at_most_the_targets_top_k_mass():
    """keep_top_k renormalises the k most probable ids; a draft sampled from it is accepted with probability
    sum_x min(p, q) = the target's top-k mass when q is p's own top k (1.0 when nothing is cut)."""
    p = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(6)) * 2, dim=-1)
    for k in (1, 4, 16):
        q = keep_top_k(p, k)
        top = p.topk(k).values.sum()
        assert int((q > 0).sum()) == k and float(q.sum()) == pytest.approx(1.0)
        assert float(torch.minimum(p, q).sum()) == pytest.approx(float(top), abs=1e-6) and float(top) < 1.0
    assert keep_top_k(p, None) is p and keep_top_k(p, 50) is p


def test_the_sampled_answers_oracle_drafts_from_the_targets_marginals(tiny):
    """Slot k's q for a drafter trained on sampled answers is the target's marginal k-1 tokens ahead: for a bigram
    target the start row times the transition matrix k-1 times. 20,000 sampled continuations advanced twice give it
    to within 0.01 per id, and differ from the row after the greedy tokens (what distillation on greedy answers
    teaches) by more than 0.1."""
    model = _bigram(tiny)
    P = torch.softmax(model.table, dim=-1)

    def step(cache, tokens):
        return torch.softmax(model(tokens).logits[:, -1], dim=-1)

    g = torch.Generator().manual_seed(5)
    paths = P[0].expand(20_000, -1)
    for k in (2, 3):
        paths = advance_marginal(step, None, paths, g)
        exact = P[0] @ torch.linalg.matrix_power(P, k - 1)
        assert (paths.mean(0) - exact).abs().max() < 0.01
    greedy = P[int(P[int(P[0].argmax())].argmax())]
    assert (paths.mean(0) - greedy).abs().max() > 0.1


def test_a_set_row_and_the_command(tiny, tmp_path, capsys):
    model, tok, _ = tiny
    row = ceiling(model, tok, "tiny-heldout", tiny_heldout_path(), n_prompts=6, temperature=1.0, block_size=8,
                  max_new_tokens=32, log=lambda *a: None)
    assert row.prompts == 6 and len(row.sha256) == 64 and 1.0 <= row.tau <= 8.0 and row.expected_tau is None
    assert row.tau_low <= row.tau <= row.tau_high and 0.0 < row.first_draft_p <= 1.0
    out = tmp_path / "c.json"
    assert main(["--target", "tiny", "--prompts", "tiny-heldout", "--n-prompts", "6", "--block-size", "8",
                 "--max-new-tokens", "32", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())["rows"]
    assert len(saved) == 1 and saved[0]["tau"] == pytest.approx(row.tau)  # same prompts, same seed, same figure
    assert "argmax ceiling tau" in capsys.readouterr().out
    assert main(["--target", "tiny", "--prompts", "tiny-heldout", "--n-prompts", "6", "--block-size", "8",
                 "--max-new-tokens", "32", "--drafts", "argmax", "coupled", "sample", "--out", str(out)]) == 0
    both = json.loads(out.read_text())["rows"]
    assert [r["drafts"] for r in both] == ["argmax", "coupled", "sample"] and both[0]["tau"] == pytest.approx(row.tau)
    assert all(1.0 <= r["tau"] <= 8.0 and r["expected_tau"] is None for r in both[1:])
    assert "coupled ceiling tau" in capsys.readouterr().out
    assert main(["--target", "tiny", "--prompts", "tiny-heldout", "--n-prompts", "6", "--block-size", "8",
                 "--max-new-tokens", "32", "--answers", "sampled", "--drafts", "argmax", "coupled", "--samples", "4",
                 "--out", str(out)]) == 0
    sampled = json.loads(out.read_text())["rows"]
    assert [(r["answers"], r["drafts"], r["samples"]) for r in sampled] == [("sampled", "argmax", 4),
                                                                             ("sampled", "coupled", 4)]
    assert all(1.0 <= r["tau"] <= 8.0 for r in sampled) and sampled[0]["tau"] != pytest.approx(row.tau)
    assert "sampled-answers (4 samples) coupled ceiling tau" in capsys.readouterr().out
    assert main(["--target", "tiny", "--prompts", "tiny-heldout", "--n-prompts", "6", "--block-size", "8",
                 "--max-new-tokens", "32", "--drafts", "sample", "--top-k", "1", "--out", str(out)]) == 0
    (one,) = json.loads(out.read_text())["rows"]
    # one id kept: every sampled draft is q's top id, accepted with its probability, as argmax drafts are
    assert one["top_k"] == 1 and 1.0 <= one["tau"] <= 8.0 and one["tau"] == pytest.approx(row.tau, abs=0.6)
    assert "top-1 sample ceiling tau" in capsys.readouterr().out


def test_bad_settings_name_the_value(tiny):
    model, _, prompts = tiny
    g = torch.Generator()
    with pytest.raises(ValueError, match="temperature=0"):
        oracle_decode(model, prompts[0], block_size=8, temperature=0.0, max_new_tokens=8, generator=g,
                      eos_ids=eos_ids_of(model))
    with pytest.raises(ValueError, match="block_size=1"):
        oracle_decode(model, prompts[0], block_size=1, temperature=1.0, max_new_tokens=8, generator=g, eos_ids=set())
    with pytest.raises(SystemExit):
        main(["--target", "tiny", "--temperature", "0"])
    with pytest.raises(ValueError, match="temperature=0.0, block_size=8: the parallel ceiling needs T > 0"):
        oracle_decode_parallel(model, prompts[0], block_size=8, temperature=0.0, max_new_tokens=8, generator=g,
                               eos_ids=set())
    with pytest.raises(ValueError, match="answers='sample', samples=16, top_k=None: draws is one of"):
        oracle_decode_parallel(model, prompts[0], block_size=8, temperature=1.0, max_new_tokens=8, generator=g,
                               eos_ids=set(), answers="sample")
    with pytest.raises(SystemExit):
        main(["--target", "tiny", "--answers", "sampled", "--samples", "0"])
    with pytest.raises(SystemExit):
        main(["--target", "tiny", "--drafts", "sample", "--top-k", "0"])
    with pytest.raises(ValueError, match="top_k=0: draws is one of"):
        oracle_decode_parallel(model, prompts[0], block_size=8, temperature=1.0, max_new_tokens=8, generator=g,
                               eos_ids=set(), top_k=0)
    with pytest.raises(ValueError, match="drafts='sampled'"):
        ceiling(model, None, "x", "x.jsonl", n_prompts=1, temperature=1.0, block_size=8, max_new_tokens=8,
                drafts="sampled")
