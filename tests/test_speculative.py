"""Speculative decoding: cached drafting == the training forward, lossless greedy output on 20 held-out prompts of
the tiny target, speculative sampling reproduces the target's distribution, acceptance statistics, bad input."""

import atexit
import functools
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from dflash_lab.drafter.blocks import dense_mask
from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.evaluation.acceptance import (accept_block, coupled_drafts, coupled_slot, draw_rows,
                                             speculative_accept)
from dflash_lab.evaluation.speculative import (DraftCache, DrafterMismatchError, GenerationResult, PromptTooLongError,
                                    SpeculativeDecoder, check_compatible)
from dflash_lab.target.features import FeatureExtractor, embedding_of
from tests.conftest import make_tiny_qwen3

# The trained-drafter shape every speculative-decoding test shares (the demo's shape, trained only a few steps).
TINY_TRAIN = dict(target="tiny", data="tiny", block_size=8, num_anchors=24, seq_len=192, batch_size=8,
                  num_draft_layers=2, lr=3e-3, seed=0, log_every=5, run_name="spec-test")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


@functools.lru_cache(maxsize=1)
def tiny_trained_run() -> Path:
    """A run directory with a drafter trained 20 steps on the tiny target (eval_every=10 exercises heldout_tau).

    Cached per test process: test_evaluate / test_export reuse it."""
    from dflash_lab import TrainConfig, Trainer

    root = Path(tempfile.mkdtemp(prefix="dflash-spec-"))
    atexit.register(shutil.rmtree, root, True)
    trainer = Trainer(TrainConfig(**TINY_TRAIN, steps=20, eval_every=10, runs_dir=str(root)), log=lambda *a: None)
    try:
        trainer.step(20)
        trainer.save_drafter()
    finally:
        trainer.close()
    return trainer.run_dir


@functools.lru_cache(maxsize=1)
def tiny_models():
    """(target, tokenizer, trained drafter) of tiny_trained_run()."""
    from dflash_lab.evaluation.export import load_drafter
    from dflash_lab.target.load import load_target, load_tokenizer

    _, drafter = load_drafter(tiny_trained_run())
    return load_target("tiny"), load_tokenizer("tiny"), drafter


def heldout_prompt_ids(tokenizer, n: int) -> list[list[int]]:
    from dflash_lab.evaluation.evaluate import load_prompts
    from dflash_lab.tiny import tiny_heldout_path

    return load_prompts(tiny_heldout_path(), tokenizer, n_prompts=n)


# ---------------------------------------------------------------------------------------------------------------
# Drafting with a context KV cache is the training forward
# ---------------------------------------------------------------------------------------------------------------

def _drafter_and_features(B, layer_types, window):
    """A tiny Qwen3 target, a random 2-layer drafter of block size B, 30 token ids and their target features."""
    target = make_tiny_qwen3()
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=B, mask_token_id=255,
                                   layer_types=layer_types, sliding_window=window)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(3), std=0.1)
    drafter.eval()
    ids = torch.randint(0, 250, (1, 30), generator=torch.Generator().manual_seed(4))
    return target, dc, drafter, ids, FeatureExtractor(target, dc.target_layer_ids)(ids)  # feats (1, 30, n*H)


@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 5)])
def test_cached_drafting_equals_the_training_forward(layer_types, window):
    """Context K/V cached over 3 calls (features arriving 9 + 4 + 6 at a time) gives the same block output as one
    DFlashDrafter.forward with the training mask for an anchor at p: the inference path sees exactly what
    training saw (context < p, the whole block; sliding: window + causal)."""
    B = 6
    target, dc, drafter, ids, feats = _drafter_and_features(B, layer_types, window)
    dec = SpeculativeDecoder(target, drafter)
    cache = DraftCache()
    with torch.no_grad():
        for start, p in ((0, 9), (9, 13), (13, 19)):
            got = dec.draft_hidden(cache, feats[:, start:p], start, int(ids[0, p]), p)  # (1, B, H)
            S = p  # training: context = features 0..S-1, all strictly before the anchor p
            draft_ids = torch.full((1, B), 255)
            draft_ids[0, 0] = ids[0, p]
            masks = {t: dense_mask(torch.tensor([[p]]), torch.tensor([[True]]), seq_len=S, block_size=B,
                                   sliding_window=window if t == "sliding_attention" else None)
                     for t in set(dc.layer_types)}
            ref = drafter(feats[:, :S], embedding_of(target)(draft_ids), torch.arange(p, p + B)[None],
                          torch.arange(S)[None], masks)
            assert cache.length == p
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 5)])
def test_fused_static_drafting_equals_the_training_forward(layer_types, window):
    """The static path's fused step (the previous verify's B features ingested together with the block, both
    written into one cache, attention over a length bucket, query groups folded into the query length) gives
    the training forward's block output, after full and partial acceptances (p - p_prev = 4, then 6 = B)."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    B = 6
    target, dc, drafter, ids, feats = _drafter_and_features(B, layer_types, window)
    dec = StaticSpeculativeDecoder(target, drafter, block_size=B, graphs=False, max_length=40, min_bucket=8)
    assert dec.length == 64 and dec.buckets == [8, 16, 32, 64]  # rounded up to a multiple of 64
    with torch.no_grad():
        dec._ingest_prompt(feats[:, :9], torch.arange(9))
        stale = torch.randn(1, B, feats.shape[-1])  # the first step ingests whatever is there: masked or overwritten
        for p_prev, p, new in ((9, 9, stale), (9, 13, feats[:, 9:9 + B]), (13, 19, feats[:, 13:13 + B])):
            ctx = drafter.fuse_context(new)
            live = dec.bucket(p + B)
            got = dec._draft_hidden(ctx, ids[0, p:p + 1], torch.tensor(p_prev), torch.tensor(p), live)  # (B-1, H)
            draft_ids = torch.full((1, B), 255)
            draft_ids[0, 0] = ids[0, p]
            masks = {t: dense_mask(torch.tensor([[p]]), torch.tensor([[True]]), seq_len=p, block_size=B,
                                   sliding_window=window if t == "sliding_attention" else None)
                     for t in set(dc.layer_types)}
            ref = drafter(feats[:, :p], embedding_of(target)(draft_ids), torch.arange(p, p + B)[None],
                          torch.arange(p)[None], masks)
            torch.testing.assert_close(got, ref[0, 1:], atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Lossless at temperature 0
# ---------------------------------------------------------------------------------------------------------------

def test_greedy_speculative_output_equals_target_generate_on_20_heldout_prompts():
    target, tok, drafter = tiny_models()
    prompts = heldout_prompt_ids(tok, 20)
    assert len(prompts) == 20
    dec = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=tok.eos_token_id)
    accepted, mismatches = [], []
    for i, ids in enumerate(prompts):
        res = dec.generate(ids, max_new_tokens=48)
        ref = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=48, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
        if res.output_ids != ref:
            mismatches.append((i, res.output_ids, ref))
        accepted += res.accepted
        assert 1 <= res.tau <= 8
    assert not mismatches, f"speculative output differs from target.generate on prompts {[m[0] for m in mismatches]}"
    # The check means something only if drafts were accepted (cache cropping after partial acceptance exercised).
    assert sum(a > 0 for a in accepted) >= 10, f"only {sum(a > 0 for a in accepted)} iterations accepted a draft"
    assert any(0 < a < 7 for a in accepted)


def test_block_size_one_is_the_plain_target_loop():
    target, tok, _ = tiny_models()
    ids = heldout_prompt_ids(tok, 1)[0]
    res = SpeculativeDecoder(target, None, block_size=1, eos_token_id=tok.eos_token_id).generate(ids, max_new_tokens=30)
    ref = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=30, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
    assert res.output_ids == ref
    assert res.tau == 1.0 and res.iterations == len(ref) - 1  # the first token comes from the prefill


# ---------------------------------------------------------------------------------------------------------------
# Speculative sampling keeps the target's distribution
# ---------------------------------------------------------------------------------------------------------------

def _expected_tv(p: torch.Tensor, n: int) -> float:
    """E[TV(empirical of n samples, p)] ~ 0.5 * sum_i sqrt(2 p_i (1 - p_i) / (pi n)) (normal approximation)."""
    return 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())


def test_speculative_accept_emits_tokens_with_the_target_distribution():
    """Synthetic target probabilities, drafts of high, low and zero probability: the first emitted token follows
    p[0] and, given that the first draft was emitted, the second follows p[1] (TV within 3x its sampling noise)."""
    probs = torch.tensor([[0.50, 0.20, 0.15, 0.10, 0.05, 0.00],
                          [0.05, 0.10, 0.60, 0.20, 0.05, 0.00],
                          [0.20, 0.20, 0.20, 0.20, 0.10, 0.10]])
    drafts = [0, 5]  # slot 1: likely draft (p=0.5); slot 2: impossible draft (p=0) -> always resampled
    g = torch.Generator().manual_seed(0)
    n = 20000
    first = torch.zeros(6)
    second = torch.zeros(6)
    for _ in range(n):
        a, nxt = speculative_accept(probs, drafts, g)
        emitted = drafts[:a] + [nxt]
        first[emitted[0]] += 1
        if a >= 1:
            second[emitted[1]] += 1
            assert emitted[1] != 5  # an impossible draft is never accepted
    tv1 = 0.5 * float((first / n - probs[0]).abs().sum())
    m = int(second.sum())
    tv2 = 0.5 * float((second / m - probs[1]).abs().sum())
    assert tv1 < 3 * _expected_tv(probs[0], n), tv1
    assert tv2 < 3 * _expected_tv(probs[1], m), tv2
    assert abs(m / n - 0.5) < 0.02  # draft 0 accepted with probability p[0][0]
    # The wrong rule "accept if the draft is the target's argmax" would fail the first check badly:
    assert 0.5 * float((torch.eye(6)[0] - probs[0]).abs().sum()) > 10 * tv1


def _first_two_tokens_tv(dec, ids: list[int], T: float, n: int = 400) -> tuple[float, float, int]:
    """(TV between the first two generated tokens over n seeded runs and the exact p(t1) p(t2 | t1) of the
    decoder's target at temperature T, its expected sampling noise, drafts accepted in all)."""
    counts: dict[tuple[int, int], int] = {}
    g = torch.Generator().manual_seed(1)
    accepted = 0
    for _ in range(n):
        res = dec.generate(ids, max_new_tokens=3, temperature=T, generator=g)
        key = tuple(res.output_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(res.accepted)
    with torch.no_grad():
        p1 = torch.softmax(dec.target(torch.tensor([ids])).logits[0, -1] / T, -1)
        top = torch.nonzero(p1 > 1e-4).flatten()
        p2 = torch.softmax(dec.target(torch.tensor([ids + [int(t)] for t in top])).logits[:, -1] / T, -1)
    joint = (p1[top, None] * p2).flatten()
    V = p2.shape[1]
    exact = {(int(top[i // V]), i % V): float(joint[i]) for i in torch.nonzero(joint > 1e-6).flatten().tolist()}
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in set(exact) | set(counts))
    return tv, _expected_tv(torch.tensor(list(exact.values())), n), accepted


def test_sampled_speculative_decoding_matches_target_distribution():
    """End to end on the tiny target at T=1.3: the joint distribution of the first two generated tokens over 400
    runs matches the exact target distribution p(t1) p(t2 | t1) (TV within 3x sampling noise + 0.02)."""
    target, tok, drafter = tiny_models()
    ids = heldout_prompt_ids(tok, 3)[2]
    tv, expected, accepted = _first_two_tokens_tv(SpeculativeDecoder(target, drafter, block_size=8,
                                                                     eos_token_id=tok.eos_token_id), ids, 1.3)
    assert accepted > 0  # drafts were accepted, so the acceptance rule is in play
    assert tv < 3 * expected + 0.02, (tv, expected)


def _accept_block(probs: torch.Tensor, q: torch.Tensor, drafts: list[int], g: torch.Generator) -> tuple[int, int]:
    """accept_block with its K + 1 uniforms drawn from g, as the decoders draw them."""
    u = torch.rand(len(drafts) + 1, generator=g, dtype=torch.float64)
    a, nxt = accept_block(probs, q, torch.tensor(drafts, dtype=torch.long), u).tolist()
    return a, nxt


def test_accept_block_is_the_slot_by_slot_rule_with_the_same_uniforms():
    """The block verified at once equals the rule written out slot by slot (keep x_k while u_k q_k(x_k) <
    p_k(x_k); at the first rejection draw from max(0, p_k - q_k) by inverse CDF with u_K; after all, from p_K),
    on 300 random cases of peaked, flat and sparse p and q, argmax (one-hot) and drawn drafts; no drafts at all
    (the target alone) draws from p_0."""
    def by_slot(p, q, drafts, u):
        for k, x in enumerate(drafts):
            if not float(u[k]) * float(q[k, x]) < float(p[k, x]):
                r = (p[k] - q[k]).clamp(min=0.0)
                r = r if float(r.sum()) > 0 else p[k]
                return k, int(draw_rows(r[None], u[-1:])[0])
        return len(drafts), int(draw_rows(p[len(drafts)][None], u[-1:])[0])

    g = torch.Generator().manual_seed(0)
    K, V = 5, 12
    for case in range(300):
        sharp = (0.3, 3.0, 12.0)[case % 3]
        p = torch.softmax(sharp * torch.randn(K + 1, V, generator=g), -1)
        p[:, case % V] = 0.0  # an id the target never emits
        p = p / p.sum(-1, keepdim=True)
        if case % 2:
            drafts = [int(x) for x in torch.randint(0, V, (K,), generator=g)]
            q = torch.zeros(K, V).scatter_(1, torch.tensor(drafts)[:, None], 1.0)  # argmax drafts
        else:
            q = torch.softmax(sharp * torch.randn(K, V, generator=g), -1)
            drafts = [int(torch.multinomial(q[k], 1, generator=g)) for k in range(K)]
        u = torch.rand(K + 1, generator=g, dtype=torch.float64)
        assert tuple(accept_block(p, q, torch.tensor(drafts), u).tolist()) == by_slot(p, q, drafts, u), case
    p = torch.tensor([[0.0, 0.25, 0.75]])
    assert [int(accept_block(p, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), torch.tensor([x]))[1])
            for x in (0.0, 0.24, 0.25, 0.99)] == [1, 1, 2, 2]  # [0, 0.25) -> id 1, [0.25, 1) -> id 2; id 0 never
    assert accept_block(p, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), torch.tensor([0.5]))[0] == 0


def test_sampled_drafts_are_accepted_with_the_overlap_of_p_and_q_and_emit_the_target_distribution():
    """Drafts drawn from q: the first emitted token follows p[0], slot 0 is accepted with probability
    sum min(p0, q0), and a q equal to p is always accepted; argmax drafts of the same q would be accepted with
    p0[argmax q0] only (the ceiling sampled drafts go past)."""
    probs = torch.tensor([[0.40, 0.30, 0.15, 0.10, 0.05, 0.00],
                          [0.05, 0.10, 0.60, 0.20, 0.05, 0.00],
                          [0.20, 0.20, 0.20, 0.20, 0.10, 0.10]])
    q = torch.tensor([[0.30, 0.35, 0.10, 0.10, 0.05, 0.10],
                      [0.05, 0.10, 0.60, 0.20, 0.05, 0.00]])  # slot 1: q == p
    g = torch.Generator().manual_seed(0)
    n = 20000
    first = torch.zeros(6)
    took0 = took1 = 0
    for _ in range(n):
        drafts = [int(torch.multinomial(q[k], 1, generator=g)) for k in range(2)]
        a, nxt = _accept_block(probs, q, drafts, g)
        first[(drafts[:a] + [nxt])[0]] += 1
        took0 += a >= 1
        took1 += a >= 2
    tv1 = 0.5 * float((first / n - probs[0]).abs().sum())
    assert tv1 < 3 * _expected_tv(probs[0], n), tv1
    overlap = float(torch.minimum(probs[0], q[0]).sum())  # 0.85
    assert abs(took0 / n - overlap) < 0.015
    assert took1 == took0  # slot 1's q equals p there: every draft that reaches it is accepted
    assert overlap > float(probs[0][q[0].argmax()]) + 0.5  # argmax of q (id 1): accepted with p = 0.30


def test_coupled_drafts_keep_each_slots_marginal_and_report_the_exact_conditional_proposal():
    """One shared uniform: each slot's drafts follow its q_k, slot 2's drafts given slot 1's follow the proposal
    coupled_drafts returns for it, and two slots with the same q always agree (independent draws: 0.46 of the
    time); with those proposals speculative sampling emits the target's distribution, with slot 2's marginal q it
    does not."""
    q = torch.tensor([[0.50, 0.25, 0.15, 0.10, 0.00],
                      [0.10, 0.60, 0.20, 0.05, 0.05],
                      [0.50, 0.25, 0.15, 0.10, 0.00]])
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.zeros(3, 5)
    given: dict[int, torch.Tensor] = {}
    proposal_of: dict[int, torch.Tensor] = {}
    agree = 0
    for _ in range(n):
        drafts, prop = coupled_drafts(q, g)
        assert torch.allclose(prop.sum(-1), torch.ones(3), atol=1e-6)
        assert bool((prop[torch.arange(3), drafts] > 0).all())  # the drawn tokens are possible under their proposals
        for k, x in enumerate(drafts):
            counts[k, x] += 1
        given.setdefault(drafts[0], torch.zeros(5))[drafts[1]] += 1
        if drafts[0] in proposal_of:
            assert torch.equal(proposal_of[drafts[0]], prop[1])  # the proposal depends on slot 1's draft only
        proposal_of[drafts[0]] = prop[1]
        agree += drafts[0] == drafts[2]
    for k in range(3):
        assert 0.5 * float((counts[k] / n - q[k]).abs().sum()) < 3 * _expected_tv(q[k], n)
    for x1, c in given.items():
        m = int(c.sum())
        assert 0.5 * float((c / m - proposal_of[x1]).abs().sum()) < 3 * _expected_tv(proposal_of[x1], m) + 1e-3
    assert agree == n
    # slot 1 took id 0: u < 0.5, inside slot 2's top interval [0, 0.6) (id 1); id 1: u in [0.5, 0.75), which
    # slot 2 splits into [0.5, 0.6) (id 1) and [0.6, 0.75) (id 2, its second)
    assert torch.allclose(proposal_of[0], torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(proposal_of[1], torch.tensor([0.0, 0.4, 0.6, 0.0, 0.0]))
    probs = torch.tensor([[0.30, 0.30, 0.20, 0.10, 0.10],
                          [0.40, 0.10, 0.10, 0.30, 0.10],
                          [0.20, 0.20, 0.20, 0.20, 0.20]])

    def second_token_tv(use_marginal: bool) -> tuple[float, float]:
        second, g2 = torch.zeros(5), torch.Generator().manual_seed(1)
        for _ in range(n):
            drafts, prop = coupled_drafts(q[:2], g2)
            a, nxt = _accept_block(probs, q[:2] if use_marginal else prop, drafts, g2)
            if a >= 1:
                second[(drafts[:a] + [nxt])[1]] += 1
        m = int(second.sum())
        return 0.5 * float((second / m - probs[1]).abs().sum()), _expected_tv(probs[1], m)

    tv, noise = second_token_tv(False)
    assert tv < 3 * noise, (tv, noise)
    tv_wrong, _ = second_token_tv(True)
    assert tv_wrong > 5 * noise, (tv_wrong, noise)  # 0.032 against noise 0.006


def _coupled_drafts_loop(q: torch.Tensor, generator: torch.Generator | None = None
                         ) -> tuple[list[int], torch.Tensor]:
    """coupled_drafts slot by slot (coupled_slot from the interval the drafts before it left): the reference the
    batched form must equal bit for bit."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    lo, hi, drafts, proposals = 0.0, 1.0, [], torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for k in range(q.shape[0]):
        x, proposals[k], lo, hi = coupled_slot(q[k], u, lo, hi)
        drafts.append(x)
    return drafts, proposals


@pytest.mark.parametrize("V", [7, 960, 16384])
@pytest.mark.parametrize("K", [1, 4, 15])
def test_coupled_drafts_equal_the_slot_by_slot_loop_bit_for_bit(K, V):
    """All slots searched at once (no per-slot host syncs) gives the slot-by-slot loop's drafts and exactly its
    proposals from the same generator state: peaked and flat q, q with exact ties and zeros (the last slot one-hot),
    a uniform q (every token tied), and a u that lands exactly on an interval's edge."""
    for seed in range(3):
        make = torch.Generator().manual_seed(100 + seed)
        ties = torch.randint(0, 3, (K, V), generator=make).float()  # a third of the tokens at q = 0
        ties[:, V // 2] += 1.0
        ties[-1] = 0.0
        ties[-1, V // 3] = 1.0
        qs = {"peaked": torch.softmax(8.0 * torch.randn(K, V, generator=make), dim=-1),
              "flat": torch.softmax(0.05 * torch.randn(K, V, generator=make), dim=-1),
              "ties and zeros": ties / ties.sum(-1, keepdim=True),
              "uniform": torch.full((K, V), 1.0 / V)}
        for kind, q in qs.items():
            g_new, g_old = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            for _ in range(4):
                drafts, prop = coupled_drafts(q, g_new)
                want_drafts, want_prop = _coupled_drafts_loop(q, g_old)
                assert drafts == want_drafts, (kind, seed)
                assert prop.dtype == torch.float32 and torch.equal(prop, want_prop), (kind, seed)
    # u exactly on every slot's first edge: it belongs to the interval above it, in both forms
    u = float(torch.rand((), generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    assert u >= 0.5  # so [u, 1 - u] keeps u first and its first edge is exactly u
    q = torch.zeros(K, V, dtype=torch.float64)
    q[:, 0], q[:, V - 1] = u, 1.0 - u
    drafts, prop = coupled_drafts(q, torch.Generator().manual_seed(5))
    want_drafts, want_prop = _coupled_drafts_loop(q, torch.Generator().manual_seed(5))
    assert drafts == want_drafts == [V - 1] * K and torch.equal(prop, want_prop)


@pytest.mark.parametrize("mode", ["sample", "coupled"])
def test_sampled_drafts_end_to_end_keep_the_target_distribution_and_greedy_output(mode):
    """The tiny target at T=1.3 with drafts sampled from the drafter (each slot independently, or the block from
    one shared uniform): the first two tokens' joint distribution over 400 runs is the target's (as for argmax
    drafts above); at T=0 the output is the argmax drafts' output."""
    target, tok, drafter = tiny_models()
    ids = heldout_prompt_ids(tok, 3)[2]
    T = 1.3
    dec = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=tok.eos_token_id, draft_sampling=mode)
    greedy = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=tok.eos_token_id)
    assert dec.generate(ids, max_new_tokens=24).output_ids == greedy.generate(ids, max_new_tokens=24).output_ids
    tv, expected, accepted = _first_two_tokens_tv(dec, ids, T)
    assert accepted > 0 and tv < 3 * expected + 0.02, (tv, expected)
    a = dec.generate(ids, max_new_tokens=16, temperature=T, generator=torch.Generator().manual_seed(5))
    b = dec.generate(ids, max_new_tokens=16, temperature=T, generator=torch.Generator().manual_seed(5))
    assert a.output_ids == b.output_ids and a.accepted == b.accepted  # seeded: reproducible


# ---------------------------------------------------------------------------------------------------------------
# Statistics and bad input
# ---------------------------------------------------------------------------------------------------------------

def test_tau_histogram_and_position_acceptance_numbers():
    r = GenerationResult(prompt_len=5, output_ids=[1] * 8, accepted=[0, 3, 1], block_size=4, prefill_s=0.5,
                         decode_s=1.5, stopped="max_new_tokens")
    assert r.tau == pytest.approx(1 + 4 / 3)
    assert r.accept_histogram == [1, 1, 0, 1]
    assert r.position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert r.tokens_per_s == pytest.approx(4.0)


def test_drafter_that_does_not_fit_the_target_names_both_values():
    target = make_tiny_qwen3(hidden=64, vocab=256, layers=8)
    other = make_tiny_qwen3(hidden=32, vocab=300, layers=6)
    cfg = DrafterConfig.from_target(other.config, num_draft_layers=1, block_size=4, mask_token_id=299,
                                    num_target_features=2)
    with pytest.raises(DrafterMismatchError) as e:
        check_compatible(target, cfg)
    msg = str(e.value)
    assert "hidden size: drafter 32 vs target 64" in msg
    assert "vocabulary: drafter 300 vs target 256" in msg
    assert "drafter was built for 6 vs target has 8" in msg
    # layer ids out of range for a shallower target
    deep = DrafterConfig.from_target(make_tiny_qwen3(layers=12).config, num_draft_layers=1, block_size=4,
                                     mask_token_id=255, target_layer_ids=(2, 10))
    with pytest.raises(DrafterMismatchError, match=r"target_layer_ids: drafter \[2, 10\] vs target layers 0..7"):
        SpeculativeDecoder(target, DFlashDrafter(deep))


def test_prompt_longer_than_the_context_says_so():
    target = make_tiny_qwen3()  # max_position_embeddings 512
    dc = DrafterConfig.from_target(target.config, num_draft_layers=1, block_size=4, mask_token_id=255)
    dec = SpeculativeDecoder(target, DFlashDrafter(dc))
    with pytest.raises(PromptTooLongError, match=r"prompt has 500 tokens.*needs 536 positions.*context is 512"):
        dec.generate(list(range(1, 250)) * 2 + [1, 2], max_new_tokens=32)
    with pytest.raises(ValueError, match="empty"):
        dec.generate([], max_new_tokens=4)


# ---------------------------------------------------------------------------------------------------------------
# Static caches + CUDA graphs (static_decode.py): the same tokens as the dynamic loop and as target greedy
# ---------------------------------------------------------------------------------------------------------------

def _greedy(target, ids, n, eos):
    dev = next(target.parameters()).device
    return target.generate(torch.tensor([ids], device=dev), do_sample=False, max_new_tokens=n, eos_token_id=eos,
                           pad_token_id=0)[0, len(ids):].tolist()


def _tiny_llama(device="cpu", dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def test_static_decoder_equals_dynamic_loop_and_greedy_on_cpu():
    """Static caches (eager on the CPU), starting with a cache too short so it grows: same tokens, same accepted
    counts and same top-2 margins as the dynamic loop, and the target's greedy output."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    target, tok, drafter = tiny_models()
    eos = tok.eos_token_id
    dyn = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos)
    static = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, max_length=32)
    accepted = []
    for ids in heldout_prompt_ids(tok, 6):
        a, b = dyn.generate(ids, max_new_tokens=40), static.generate(ids, max_new_tokens=40)
        assert b.output_ids == a.output_ids == _greedy(target, ids, 40, eos)
        assert b.accepted == a.accepted and b.runner_up == a.runner_up
        assert b.margins == pytest.approx(a.margins, abs=1e-3)
        accepted += b.accepted
    assert static.length >= 32 and any(x > 0 for x in accepted)
    # attention over length buckets (8, 16, 32, ...): every prompt crosses several, same tokens and acceptance
    bucketed = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, min_bucket=8)
    assert bucketed.buckets[:3] == [8, 16, 32]
    for ids in heldout_prompt_ids(tok, 3):
        a, b = dyn.generate(ids, max_new_tokens=40), bucketed.generate(ids, max_new_tokens=40)
        assert b.output_ids == a.output_ids and b.accepted == a.accepted
    # sampling: the same generator stream gives the same tokens
    ids = heldout_prompt_ids(tok, 1)[0]
    a = dyn.generate(ids, max_new_tokens=30, temperature=1.0, generator=torch.Generator().manual_seed(5))
    b = static.generate(ids, max_new_tokens=30, temperature=1.0, generator=torch.Generator().manual_seed(5))
    assert a.output_ids == b.output_ids


@pytest.mark.parametrize("mode", ["sample", "coupled"])
def test_static_decoder_draws_sampled_drafts_exactly_as_the_dynamic_loop(mode):
    """Sampled drafts on the static path (the draft stage, the draws on the host, then verify; eager on the CPU,
    attention buckets crossed): the same generator stream gives the very same tokens and accepted counts as the
    dynamic loop at T=1, and argmax drafts (lossless greedy output) at T=0; make_decoder takes it when asked."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder, make_decoder

    target, tok, drafter = tiny_models()
    eos = tok.eos_token_id
    dyn = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, draft_sampling=mode)
    static = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, max_length=32, min_bucket=8,
                                      draft_sampling=mode)
    accepted = []
    for i, ids in enumerate(heldout_prompt_ids(tok, 4)):
        a, b = (d.generate(ids, max_new_tokens=40, temperature=1.0, generator=torch.Generator().manual_seed(i))
                for d in (dyn, static))
        assert b.output_ids == a.output_ids and b.accepted == a.accepted
        accepted += b.accepted
        greedy = static.generate(ids, max_new_tokens=24, temperature=0.0)
        assert greedy.output_ids == _greedy(target, ids, 24, eos)
    assert sum(accepted) > 0 and static.sampled
    made = make_decoder(target, drafter, block_size=8, eos_token_id=eos, fast=True, draft_sampling=mode)
    assert isinstance(made, StaticSpeculativeDecoder) and made.draft_sampling == mode


def test_batched_decoding_gives_every_prompt_its_batch_1_tokens_and_tau():
    """7 prompts of different lengths through 3 rows (rows refilled as prompts finish, some at eos): each prompt's
    tokens and accepted counts are those of batch-1 decoding, so tau is too."""
    from dflash_lab.evaluation.static_decode import speculative_generate

    target, tok, drafter = tiny_models()
    prompts = heldout_prompt_ids(tok, 7)
    free = speculative_generate(target, drafter, prompts[:1], block_size=8, max_new_tokens=12)
    eos = [tok.eos_token_id, free.results[0].output_ids[10]]  # a token some outputs reach early: rows end early
    one = speculative_generate(target, drafter, prompts, block_size=8, max_new_tokens=40, eos_token_id=eos)
    many = speculative_generate(target, drafter, prompts, block_size=8, max_new_tokens=40, eos_token_id=eos, batch=3)
    assert [r.output_ids for r in many.results] == [r.output_ids for r in one.results]
    assert [r.accepted for r in many.results] == [r.accepted for r in one.results]
    assert many.tau == one.tau > 1.1  # drafts were accepted (a drafter trained 20 steps)
    assert {r.stopped for r in one.results} == {"eos", "max_new_tokens"}  # both ends of a row were exercised


def test_static_decoder_runs_a_llama_target_losslessly_on_cpu():
    """Architecture-agnostic: a Llama target (no q_norm/k_norm, tied head) with a random drafter."""
    from dflash_lab.evaluation.static_decode import speculative_generate

    target = _tiny_llama()
    dc = DrafterConfig.from_target(target.config, num_draft_layers=1, block_size=4, mask_token_id=255,
                                   num_target_features=2)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(0))
    prompts = [list(range(5, 25)), [7, 3, 9, 100, 42]]
    run = speculative_generate(target, drafter.eval(), prompts, block_size=4, max_new_tokens=20, fast=True)
    for p, r in zip(prompts, run.results):
        assert r.output_ids == _greedy(target, p, 20, None)
    assert 1.0 <= run.tau <= 4.0 and run.new_tokens == 40
    only = speculative_generate(target, None, prompts, block_size=1, max_new_tokens=20, fast=True)
    assert [r.output_ids for r in only.results] == [r.output_ids for r in run.results] and only.tau == 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_path_equals_eager_path_and_is_lossless_in_fp32(dtype):
    """On the GPU: the graphed iteration gives token for token what the same step gives eagerly (both dtypes), and
    in fp32 the output equals the target's own greedy generate() (exact check; bf16 may differ at near-ties)."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    target, tok, drafter = tiny_models()
    dev = torch.device("cuda")
    target = target.to(dev, dtype)
    drafter = drafter.to(dev, dtype)
    eos = tok.eos_token_id
    graphed = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, graphs=True)
    eager = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, graphs=False)
    only = StaticSpeculativeDecoder(target, None, block_size=1, eos_token_id=eos, graphs=True)
    accepted = []
    try:
        for ids in heldout_prompt_ids(tok, 10):
            g, e = graphed.generate(ids, max_new_tokens=48), eager.generate(ids, max_new_tokens=48)
            assert g.output_ids == e.output_ids and g.accepted == e.accepted
            accepted += g.accepted
            if dtype == torch.float32:
                assert g.output_ids == _greedy(target, ids, 48, eos) == only.generate(ids, max_new_tokens=48).output_ids
        assert graphed.graph_status.startswith("graphs: captured"), graphed.graph_status
        if dtype == torch.float32:  # the target-only decoder runs (and captures) in the fp32 exact check only
            assert only.graph_status.startswith("graphs: captured"), only.graph_status
        assert sum(a > 0 for a in accepted) >= 5
    finally:
        target.to("cpu", torch.float32)
        drafter.to("cpu", torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sample", "coupled"])
def test_cuda_graphs_with_sampled_drafts_equal_the_eager_static_step_in_fp32(mode):
    """On the GPU, sampled drafts between two graphs (draft stage | verify): token for token the eager static step
    with the same generator stream at T=1, both graphs captured."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    target, tok, drafter = tiny_models()
    target, drafter = target.to("cuda"), drafter.to("cuda")
    eos = tok.eos_token_id
    kw = dict(block_size=8, eos_token_id=eos, draft_sampling=mode)
    graphed = StaticSpeculativeDecoder(target, drafter, graphs=True, **kw)
    eager = StaticSpeculativeDecoder(target, drafter, graphs=False, **kw)
    try:
        for i, ids in enumerate(heldout_prompt_ids(tok, 6)):
            g, e = (d.generate(ids, max_new_tokens=48, temperature=1.0, generator=torch.Generator().manual_seed(i))
                    for d in (graphed, eager))
            assert g.output_ids == e.output_ids and g.accepted == e.accepted
        assert graphed.graph_status.startswith("graphs: captured") and "drafts sampled" in graphed.graph_status
        assert set(graphed._draft_graphs) == set(graphed._graphs)
    finally:
        target.to("cpu")
        drafter.to("cpu")


@pytest.mark.gpu
def test_cuda_graph_path_on_a_llama_target_equals_greedy_in_fp32():
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    target = _tiny_llama("cuda")
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=16, mask_token_id=255,
                                   num_target_features=3)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(0))
    drafter = drafter.to("cuda").eval()
    dec = StaticSpeculativeDecoder(target, drafter, block_size=16, eos_token_id=None, graphs=True)
    for ids in ([1, 2, 3, 4, 5, 6, 7, 8], list(range(30, 90))):
        assert dec.generate(ids, max_new_tokens=64).output_ids == _greedy(target, ids, 64, None)
    assert dec.graph_status.startswith("graphs: captured"), dec.graph_status


def test_tau_counts_the_tokens_of_the_budget_on_every_decoder():
    """The last block may accept drafts past max_new_tokens: they are cut from the output AND from the accepted
    counts, so every decoder's tau is delivered tokens / iterations (1 + accepted + iterations == new tokens).
    This drafter's first two blocks accept 2 drafts each on these prompts: budgets 3 and 5 end inside them."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder, speculative_generate

    target, tok, drafter = tiny_models()
    prompts = heldout_prompt_ids(tok, 6)
    eos = tok.eos_token_id
    dyn = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos)
    static = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos)
    for budget in (3, 5):
        runs = {"dynamic": [dyn.generate(p, max_new_tokens=budget) for p in prompts],
                "static": [static.generate(p, max_new_tokens=budget) for p in prompts],
                "batched": speculative_generate(target, drafter, prompts, block_size=8, max_new_tokens=budget,
                                                batch=3).results}
        for name, results in runs.items():
            for r in results:
                assert 1 + sum(r.accepted) + r.iterations == len(r.output_ids) == budget, (name, r.accepted)
                assert r.tau == pytest.approx((budget - 1) / r.iterations)
            # the cut blocks: 1 accepted draft of each prompt but the first past budget 3, 2 past budget 5
            assert sum(r.accepted_past_budget for r in results) == {3: 5, 5: 10}[budget], (name, budget)
        assert [r.accepted for r in runs["batched"]] == [r.accepted for r in runs["dynamic"]]


def test_a_vanishing_temperature_samples_the_argmax_on_every_decoder():
    """T -> 0 is greedy: sampling uses softmax((logits - max) / T), whose exponents never overflow. At T = 1e-40
    logits / T were inf, their softmax NaN, and every decoder (the target alone included) drew the vocabulary's
    last id. Here the target alone, argmax drafts, sampled and coupled drafts, dynamic and static, all give the
    target's greedy output."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    target, tok, drafter = tiny_models()
    eos = tok.eos_token_id
    ids = heldout_prompt_ids(tok, 2)[1]
    want = _greedy(target, ids, 24, eos)
    decoders = [SpeculativeDecoder(target, None, block_size=1, eos_token_id=eos)]
    for mode in ("argmax", "sample", "coupled"):
        decoders += [SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, draft_sampling=mode),
                     StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, draft_sampling=mode)]
    for d in decoders:
        got = d.generate(ids, max_new_tokens=24, temperature=1e-40, generator=torch.Generator().manual_seed(0))
        assert got.output_ids == want, (type(d).__name__, d.draft_sampling)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match=f"temperature={bad} must be"):
            decoders[0].generate(ids, max_new_tokens=4, temperature=bad)


def test_tempered_probabilities_tend_to_the_argmax_as_the_temperature_vanishes():
    from dflash_lab.target.sampling import tempered_probs

    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, -1.0, 0.5]])
    assert torch.equal(tempered_probs(logits, 1e-40), torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]))  # ties share
    assert torch.equal(tempered_probs(logits, 1e-300), tempered_probs(logits, 1e-40))  # below fp32's range too
    assert torch.equal(tempered_probs(logits, torch.tensor([[1e-40], [1e-40]])), tempered_probs(logits, 1e-40))
    assert torch.allclose(tempered_probs(logits, 0.7), torch.softmax(logits / 0.7, dim=-1))
