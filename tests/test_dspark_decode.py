"""DSpark decoding: the Markov chain drafts slot after slot as the engines draft it (greedy, sampled, top-k
candidates), both decoders stay lossless and agree token for token, sampled drafts are verified against the very
distribution they were drawn from, and the confidence head's verify policies choose the engines' counts."""

import dataclasses
import functools
import math

import pytest
import torch

from dflash_lab.drafter.dspark import DSparkHeads
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.evaluation.acceptance import draw_rows
from dflash_lab.evaluation.markov_draft import markov_block, slot_confidence
from dflash_lab.evaluation.speculative import SpeculativeDecoder
from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder, speculative_generate
from dflash_lab.evaluation.verify_budget import VerifyPolicy
from tests.test_speculative import _greedy, heldout_prompt_ids, tiny_models

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _heads(vocab=50, draft_vocab=50, rank=6, hidden=8, seed=0, confidence=True) -> DSparkHeads:
    from dflash_lab.config import DrafterConfig

    cfg = DrafterConfig(hidden_size=hidden, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=4, vocab_size=vocab, block_size=5, mask_token_id=vocab - 1,
                        target_hidden_size=hidden,
                        num_target_layers=4, target_layer_ids=(0, 1), draft_vocab_size=(draft_vocab if draft_vocab
                                                                                         < vocab else None),
                        drafter_variant="dspark", markov_rank=rank, enable_confidence_head=confidence)
    torch.manual_seed(seed)
    heads = DSparkHeads(cfg)
    with torch.no_grad():  # a bias as large as the logits, so the chain changes drafts
        heads.markov_head.markov_w2.weight.mul_(3.0)
    return heads


def _reference_chain(heads, base, anchor, to_target, topk=None, temperature=0.0, u=None):
    """The engines' loop written out per slot: bias from the previous token's embedding (w2 @ w1[prev]), top-k
    candidates of the base logits only, argmax or the inverse-CDF draw at T."""
    w1, w2 = heads.markov_head.markov_w1.weight, heads.markov_head.markov_w2.weight
    prev, drafts = int(anchor), []
    for k in range(base.shape[0]):
        row = base[k] + w2 @ w1[prev]
        if topk is not None:
            keep = base[k].topk(topk).indices
            row = torch.full_like(row, -math.inf).index_copy(0, keep, row[keep])
        pick = (int(row.argmax()) if temperature == 0 else
                int(draw_rows(torch.softmax(row / temperature, -1)[None], u[k:k + 1])[0]))
        prev = int(to_target(torch.tensor([pick]))[0])
        drafts.append(prev)
    return drafts


@pytest.mark.parametrize("topk", [None, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_markov_chain_drafts_slot_after_slot_from_the_token_drafted_before(topk, temperature):
    """Slot 1 reads the anchor, slot k the draft of slot k-1 (a target id, through d2t for a pruned vocabulary);
    top-k draws only among the base logits' top k; the rows returned are the distributions the drafts came from."""
    heads = _heads(vocab=50, draft_vocab=30)
    offsets = torch.arange(30) % 3  # a pruned vocabulary: draft id i is target id i + offsets[i]
    to_target = lambda ids: ids + offsets[ids]  # noqa: E731
    base = torch.randn(6, 30, generator=torch.Generator().manual_seed(1))
    u = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        block = markov_block(heads, base, torch.tensor([41]), to_target, temperature=temperature, uniforms=u,
                             topk=topk)
        expected = _reference_chain(heads, base, 41, to_target, topk=topk, temperature=temperature, u=u)
    assert block.drafts.tolist() == expected
    assert block.drafts.tolist() != _reference_chain(_heads(seed=5, draft_vocab=30, vocab=50), base, 41, to_target,
                                                     topk=topk, temperature=temperature, u=u)  # the bias matters
    prevs = [41] + expected[:-1]
    assert torch.equal(block.embeds, heads.markov_head.markov_w1.weight[prevs].detach())
    if topk is not None:  # exactly k finite logits per slot, the base's top k
        assert (block.logits.isfinite().sum(-1) == topk).all()
        assert torch.equal(block.logits.isfinite(), torch.zeros_like(base, dtype=torch.bool).scatter(
            1, base.topk(topk).indices, True))
    if temperature > 0:  # the same uniform through the returned row gives the same draft: it is the proposal
        again = draw_rows(torch.softmax(block.logits / temperature, -1), u)
        assert to_target(again).tolist() == expected


def test_confidence_is_the_sigmoid_of_the_head_on_hidden_and_the_slots_embedding():
    heads = _heads(hidden=8, rank=6)
    hidden = torch.randn(4, 8)
    with torch.no_grad():
        block = markov_block(heads, torch.randn(4, 50), torch.tensor([3]), lambda i: i)
        conf = slot_confidence(heads, hidden, block.embeds)
        w, b = heads.confidence_head.proj.weight, heads.confidence_head.proj.bias
        expected = torch.sigmoid(torch.cat([hidden, block.embeds], -1) @ w[0] + b)
    assert conf == pytest.approx(expected.tolist(), abs=1e-6)
    assert slot_confidence(_heads(confidence=False), hidden, block.embeds) is None


def test_markov_chain_refuses_a_draw_without_uniforms():
    with pytest.raises(ValueError, match="needs 3 uniforms"):
        markov_block(_heads(), torch.randn(3, 50), torch.tensor([1]), lambda i: i, temperature=1.0)


# ---------------------------------------------------------------------------------------------------------------
# Verify policies: the engines' rules on numbers
# ---------------------------------------------------------------------------------------------------------------

def test_cost_rule_maximises_expected_tokens_per_ms_over_the_running_product():
    """Confidences 0.9, 0.5, 0.2: survival 0.9, 0.45, 0.09; expected tokens 1, 1.9, 2.35, 2.44 for k = 0..3.
    Flat costs verify everything; a verify that costs 1 ms a token beyond a 1 ms floor stops where the marginal
    token is not worth it: rates 1/2, 1.9/3, 2.35/4, 2.44/5 -> k = 1."""
    conf = [0.9, 0.5, 0.2]
    flat = VerifyPolicy(rule="cost", verify_ms=(1.0, 1.0, 1.0, 1.0), draft_ms=0.5)
    assert flat.drafts_to_verify(conf, 3) == 3
    steep = VerifyPolicy(rule="cost", verify_ms=(1.0, 2.0, 3.0, 4.0), draft_ms=1.0)
    assert steep.drafts_to_verify(conf, 3) == 1
    assert steep.modeled_ms([1, 3, 0]) == pytest.approx((1 + 2) + (1 + 4) + (1 + 1))
    # brute force over every k on random confidences and costs
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        c = torch.rand(7, generator=g).tolist()
        costs = torch.cumsum(torch.rand(8, generator=g), 0).tolist()
        pol = VerifyPolicy(rule="cost", verify_ms=tuple(costs), draft_ms=0.3)
        rates = [(1 + sum(math.prod(c[:j + 1]) for j in range(k))) / (0.3 + costs[k]) for k in range(8)]
        assert pol.drafts_to_verify(c, 7) == rates.index(max(rates))


def test_threshold_rule_verifies_the_prefix_before_the_first_unconfident_slot():
    pol = VerifyPolicy(rule="threshold", threshold=0.6, lag=0)
    assert pol.drafts_to_verify([0.9, 0.7, 0.5, 0.99], 4) == 2
    assert pol.drafts_to_verify([0.3, 0.9], 2) == 0
    assert pol.drafts_to_verify([0.8, 0.9], 2) == 2
    assert pol.drafts_to_verify(None, 5) == 5


@pytest.mark.parametrize("bad, match", [(dict(rule="often"), "not one of"), (dict(rule="cost"), "needs verify_ms"),
                                        (dict(rule="threshold", threshold=1.5), "must lie in"),
                                        (dict(rule="threshold", lag=2), "lag=2")])
def test_verify_policy_refuses_bad_settings(bad, match):
    with pytest.raises(ValueError, match=match):
        VerifyPolicy(**bad)


# ---------------------------------------------------------------------------------------------------------------
# Decoding a DSpark drafter: lossless, both decoders alike
# ---------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def dspark_models(confidence: bool = True):
    """(target, tokenizer, DSpark drafter): the tiny trained DFlash backbone with random DSpark heads of rank 16
    whose bias (std ~0.8) changes some drafts while acceptance stays above 1."""
    target, tok, drafter = tiny_models()
    cfg = dataclasses.replace(drafter.config, drafter_variant="dspark", markov_rank=16,
                              enable_confidence_head=confidence)
    torch.manual_seed(0)  # the heads' default init (the confidence head keeps it) the same in any test order
    d = DFlashDrafter(cfg)
    missing, unexpected = d.load_state_dict(drafter.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("heads.") for k in missing)
    with torch.no_grad():
        d.heads.markov_head.markov_w1.weight.normal_(0, 1.0)
        d.heads.markov_head.markov_w2.weight.normal_(0, 0.2)
    return target, tok, d.eval()


def test_dspark_greedy_decoding_is_lossless_and_static_equals_dynamic():
    """Greedy output equals the target's own; the static decoder (eager, buckets crossed) gives the dynamic loop's
    tokens, accepted counts and confidences' verify counts; the drafts differ from the backbone's argmax."""
    target, tok, drafter = dspark_models()
    eos = tok.eos_token_id
    dyn = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos)
    static = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, max_length=32, min_bucket=8)
    plain = SpeculativeDecoder(target, tiny_models()[2], block_size=8, eos_token_id=eos)
    accepted, differs = [], False
    for ids in heldout_prompt_ids(tok, 4):
        a, b = dyn.generate(ids, max_new_tokens=32), static.generate(ids, max_new_tokens=32)
        assert a.output_ids == b.output_ids == _greedy(target, ids, 32, eos)
        assert a.accepted == b.accepted and a.verified == b.verified == [7] * len(a.accepted)
        accepted += a.accepted
        differs |= a.accepted != plain.generate(ids, max_new_tokens=32).accepted
    assert sum(accepted) > 0 and differs
    with pytest.raises(ValueError, match="batched decoding drafts DFlash blocks"):
        from dflash_lab.evaluation.batched_decode import BatchedSpeculativeDecoder
        BatchedSpeculativeDecoder(target, drafter, rows=2, length=64, block_size=8)
    one = speculative_generate(target, drafter, heldout_prompt_ids(tok, 2), block_size=8, max_new_tokens=16, batch=2)
    assert len(one.results) == 2  # batch > 1 falls back to one prompt at a time for a Markov-head drafter


@pytest.mark.parametrize("topk", [None, 5])
def test_dspark_sampled_drafts_static_equals_dynamic_and_greedy_stays_lossless(topk):
    """T=1 with drafts drawn from the biased rows (the engines' sampled drafting), top-k candidates or not: the same
    generator stream gives the same tokens on both decoders; at T=0 the output is the target's greedy."""
    target, tok, drafter = dspark_models()
    eos = tok.eos_token_id
    kw = dict(block_size=8, eos_token_id=eos, draft_sampling="sample", draft_topk=topk)
    dyn = SpeculativeDecoder(target, drafter, **kw)
    static = StaticSpeculativeDecoder(target, drafter, max_length=32, min_bucket=8, **kw)
    accepted = []
    for i, ids in enumerate(heldout_prompt_ids(tok, 3)):
        a, b = (d.generate(ids, max_new_tokens=32, temperature=1.0, generator=torch.Generator().manual_seed(i))
                for d in (dyn, static))
        assert a.output_ids == b.output_ids and a.accepted == b.accepted
        accepted += a.accepted
        assert static.generate(ids, max_new_tokens=20).output_ids == _greedy(target, ids, 20, eos)
    assert sum(accepted) > 0


def test_dspark_sampled_block_keeps_the_target_distribution():
    """Speculative sampling with Markov-chain proposals: over many seeds, the first two emitted tokens after a
    prompt are distributed as the target's own (T=1.3, 400 runs: TV within 3x sampling noise + 0.02, as for DFlash)."""
    from tests.test_speculative import _first_two_tokens_tv

    target, tok, drafter = dspark_models()
    dec = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=tok.eos_token_id, draft_sampling="sample")
    tv, expected, accepted = _first_two_tokens_tv(dec, heldout_prompt_ids(tok, 3)[2], 1.3)
    assert accepted > 0
    assert tv < 3 * expected + 0.02, (tv, expected)


@pytest.mark.parametrize("policy", [VerifyPolicy(rule="threshold", threshold=0.5, lag=0),
                                    VerifyPolicy(rule="cost", verify_ms=tuple(1.0 + 0.4 * i for i in range(8)),
                                                 draft_ms=0.5, lag=1)])
def test_verify_policy_verifies_fewer_drafts_losslessly_on_both_decoders(policy):
    """The confidence head chooses k per block: output still the target's greedy, accepted <= verified <= 7, the
    static decoder (verify all, keep k) equals the dynamic one (verify k) in tokens, accepted and verified counts,
    and some blocks verified fewer than all drafts; T=1 too (same stream, same tokens)."""
    target, tok, drafter = dspark_models()
    eos = tok.eos_token_id
    dyn = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, verify_policy=policy)
    static = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, max_length=32, min_bucket=8,
                                      verify_policy=policy)
    verified = []
    for i, ids in enumerate(heldout_prompt_ids(tok, 3)):
        a, b = dyn.generate(ids, max_new_tokens=32), static.generate(ids, max_new_tokens=32)
        assert a.output_ids == b.output_ids == _greedy(target, ids, 32, eos)
        assert a.accepted == b.accepted and a.verified == b.verified
        assert all(x <= v <= 7 for x, v in zip(a.accepted, a.verified))
        verified += a.verified
        assert a.verify_tokens_per_token == pytest.approx(sum(1 + v for v in a.verified) /
                                                          (sum(a.accepted) + len(a.accepted)))
        s1, s2 = (d.generate(ids, max_new_tokens=24, temperature=1.0, generator=torch.Generator().manual_seed(i))
                  for d in (dyn, static))
        assert s1.output_ids == s2.output_ids and s1.verified == s2.verified
    assert min(verified) < 7


def test_decoding_options_a_drafter_cannot_honour_are_refused():
    target, tok, drafter = dspark_models()
    plain = tiny_models()[2]
    with pytest.raises(ValueError, match="has none"):
        SpeculativeDecoder(target, plain, draft_topk=4)
    with pytest.raises(ValueError, match="coupled"):
        SpeculativeDecoder(target, drafter, draft_sampling="coupled")
    with pytest.raises(ValueError, match="must lie in"):
        SpeculativeDecoder(target, drafter, draft_topk=10 ** 6)
    with pytest.raises(ValueError, match="confidence head"):
        SpeculativeDecoder(target, dspark_models(False)[2], verify_policy=VerifyPolicy(rule="threshold", lag=0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dspark_cuda_graphs_equal_the_eager_static_step_and_fp32_is_lossless(dtype):
    """On the GPU: the Markov chain inside the captured iteration gives the eager step's tokens, accepted and
    verified counts (greedy with a cost policy, sampled top-k drafts at T=1 between two graphs), and in fp32 the
    greedy output is the target's own."""
    target, tok, drafter = dspark_models()
    target, drafter = target.to("cuda", dtype), drafter.to("cuda", dtype)
    eos = tok.eos_token_id
    policy = VerifyPolicy(rule="cost", verify_ms=tuple(1.0 + 0.4 * i for i in range(8)), draft_ms=0.5)
    try:
        for kw, temperature in ((dict(verify_policy=policy), 0.0), (dict(draft_sampling="sample", draft_topk=8), 1.0)):
            graphed, eager = (StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, graphs=g, **kw)
                              for g in (True, False))
            for i, ids in enumerate(heldout_prompt_ids(tok, 6)):
                g, e = (d.generate(ids, max_new_tokens=48, temperature=temperature,
                                   generator=torch.Generator().manual_seed(i)) for d in (graphed, eager))
                assert g.output_ids == e.output_ids and g.accepted == e.accepted and g.verified == e.verified
                if dtype == torch.float32 and temperature == 0:
                    assert g.output_ids == _greedy(target, ids, 48, eos)
            assert graphed.graph_status.startswith("graphs: captured"), graphed.graph_status
    finally:
        target.to("cpu", torch.float32)
        drafter.to("cpu", torch.float32)
