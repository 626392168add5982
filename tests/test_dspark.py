"""The DSpark heads and the variant seam: names and shapes as vLLM loads them, the table against the config."""

from __future__ import annotations

import pytest
import torch

from dflash_lab.config import ConfigError, DrafterConfig, TrainConfig
from dflash_lab.config.drafter_config import DRAFTER_VARIANTS
from dflash_lab.drafter.dspark import DSparkHeads
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.drafter.variants import VARIANTS, variant_of
from tests.conftest import make_tiny_qwen3


def _dc(**over) -> DrafterConfig:
    kw = dict(num_draft_layers=2, block_size=8, mask_token_id=255, drafter_variant="dspark", markov_rank=16)
    kw.update(over)
    return DrafterConfig.from_target(make_tiny_qwen3().config, **kw)


def test_table_names_match_the_config():
    assert tuple(VARIANTS) == DRAFTER_VARIANTS
    assert all(v.name == k for k, v in VARIANTS.items())
    assert variant_of(_dc()).heads is DSparkHeads and variant_of(_dc(drafter_variant="dflash")).heads is None


def test_heads_have_the_names_and_shapes_vllm_loads():
    full = DFlashDrafter(_dc())
    shapes = {k: tuple(v.shape) for k, v in full.heads.state_dict().items()}
    assert shapes == {"markov_head.markov_w1.weight": (256, 16), "markov_head.markov_w2.weight": (256, 16),
                      "confidence_head.proj.weight": (1, 64 + 16), "confidence_head.proj.bias": (1,)}
    pruned = DFlashDrafter(_dc(draft_vocab_size=100, confidence_head_with_markov=False))
    shapes = {k: tuple(v.shape) for k, v in pruned.heads.state_dict().items()}
    # markov_w1 embeds the previous token in TARGET ids; markov_w2 projects to the DRAFT vocabulary
    assert shapes["markov_head.markov_w1.weight"] == (256, 16) and shapes["markov_head.markov_w2.weight"] == (100, 16)
    assert shapes["confidence_head.proj.weight"] == (1, 64)
    assert DFlashDrafter(_dc(enable_confidence_head=False)).heads.confidence_head is None
    assert DFlashDrafter(_dc(drafter_variant="dflash")).heads is None


def test_backbone_init_is_unchanged_by_the_heads():
    dflash, dspark = DFlashDrafter(_dc(drafter_variant="dflash")), DFlashDrafter(_dc())
    for m in (dflash, dspark):
        m.init_weights(torch.Generator().manual_seed(3))
    for name, p in dflash.named_parameters():
        assert torch.equal(p, dspark.get_parameter(name)), name
    assert torch.count_nonzero(dspark.heads.confidence_head.proj.bias) == 0
    assert 0.015 < float(dspark.heads.markov_head.markov_w1.weight.detach().std()) < 0.025


def test_head_methods_compute_the_published_maps():
    heads = DSparkHeads(_dc(draft_vocab_size=100))
    torch.manual_seed(0)
    for p in heads.parameters():
        p.data.normal_()
    prev = torch.tensor([[3, 7], [250, 0]])
    e = heads.markov_embed(prev)
    assert e.shape == (2, 2, 16) and torch.equal(e[1, 0], heads.markov_head.markov_w1.weight[250])
    bias = heads.markov_bias(e)
    assert bias.shape == (2, 2, 100)
    torch.testing.assert_close(bias[0, 1], heads.markov_head.markov_w2.weight @ e[0, 1])
    hidden = torch.randn(2, 2, 64)
    logit = heads.confidence_logit(hidden, e)
    w, b = heads.confidence_head.proj.weight[0], heads.confidence_head.proj.bias[0]
    torch.testing.assert_close(logit[1, 1], torch.cat([hidden[1, 1], e[1, 1]]) @ w + b)
    assert logit.dtype == torch.float32 and logit.shape == (2, 2)


@pytest.mark.parametrize("over,needle", [
    ({"drafter_variant": "dspark2"}, "unknown drafter variant"),
    ({"markov_rank": 0}, "markov_rank=0"),
])
def test_drafter_config_rejects(over, needle):
    with pytest.raises(ConfigError, match=needle):
        _dc(**over)


@pytest.mark.parametrize("over,needle", [
    ({"drafter_variant": "eagle"}, "unknown drafter variant"),
    ({"drafter_variant": "dspark", "loss_weighting": "dpace"}, "decayed slot weights"),
    ({"drafter_variant": "dspark", "distill_weight": 0.5}, "distill_weight=0.5"),
    ({"dspark_l1_weight": -1.0}, "dspark_l1_weight=-1.0"),
])
def test_train_config_rejects(over, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainConfig(**over)


# -- the loss against a reference written from the published description ------------------------------------------
# DeepSpec (deepspec/modeling/dspark): the drafter's logits at a slot are lm_head(h) + W2 W1[previous token], the
# previous token being the TRUE one in training (the anchor for the first prediction, then each target label); the
# loss is 0.1 CE + 0.9 ||softmax - q||_1 + 1.0 BCE(confidence, 1 - ||softmax - q||_1 / 2) under the decayed weights.

def _reference_loss(hidden, W, W1, W2, proj_w, proj_b, labels, weights, prev, q, with_markov=True,
                    terms=(0.1, 0.9, 1.0)):
    """Dense (every row's full logits at once), plain autograd; q (M, V) the target distribution."""
    e = W1[prev]
    logits = hidden @ W.t() + e @ W2.t()
    logp = torch.log_softmax(logits.float(), -1)
    p = logp.exp()
    ce = -logp.gather(1, labels[:, None]).squeeze(1)
    l1 = (p - q).abs().sum(-1)
    accept = (1 - l1 / 2).detach()
    x = torch.cat([hidden, e], -1) if with_markov else hidden
    logit = x @ proj_w[0] + proj_b[0]
    bce = -(accept * torch.nn.functional.logsigmoid(logit) + (1 - accept) * torch.nn.functional.logsigmoid(-logit))
    loss = terms[0] * (ce * weights).sum() + terms[1] * (l1 * weights).sum() + terms[2] * (bce * weights).sum()
    return loss, logits.argmax(-1)


def _heads(V=256, H=64, r=16, V_draft=None, **kw):
    heads = DSparkHeads(_dc(markov_rank=r, draft_vocab_size=V_draft, **kw))
    g = torch.Generator().manual_seed(5)
    for p in heads.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return heads


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("v_draft", [None, 100])
def test_chunked_markov_loss_and_gradients_equal_the_dense_reference(soft, v_draft):
    from dflash_lab.drafter.dspark import dspark_head_loss

    torch.manual_seed(0)
    M, H, V = 23, 64, 256
    Vd = v_draft or V
    heads = _heads(V_draft=v_draft)
    W = torch.randn(Vd, H) * 0.3
    hidden = torch.randn(M, H, requires_grad=True)
    labels = torch.randint(0, Vd, (M,))
    weights = torch.rand(M) * (torch.rand(M) > 0.2)
    weights = weights / weights.sum()
    prev = torch.randint(0, V, (M,))  # target ids, also past the draft vocabulary
    q = torch.nn.functional.one_hot(labels, Vd).float()
    rows = None
    if soft:  # soft_row_targets' form with distill_weight=1: hard share 0, the top-4 renormalised (one row: no soft)
        ids = torch.stack([torch.randperm(Vd)[:4] for _ in range(M)])
        p = torch.softmax(torch.randn(M, 4), -1)
        hard = torch.zeros(M)
        hard[3], p[3] = 1.0, 0.0
        rows = (hard, ids, p)
        q = torch.zeros(M, Vd).scatter_add(1, ids, p) + hard[:, None] * torch.nn.functional.one_hot(labels, Vd)
    loss, preds, terms = dspark_head_loss(heads, hidden, W, labels, weights, prev, 5, rows, DECAY_TERMS)
    loss.backward()
    got = [hidden.grad.clone()] + [p.grad.clone() for p in heads.parameters()]
    hidden.grad = None
    for p in heads.parameters():
        p.grad = None
    mh, ch = heads.markov_head, heads.confidence_head
    ref, ref_preds = _reference_loss(hidden, W, mh.markov_w1.weight, mh.markov_w2.weight, ch.proj.weight,
                                     ch.proj.bias, labels, weights, prev, q)
    ref.backward()
    want = [hidden.grad] + [p.grad for p in heads.parameters()]
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(preds, ref_preds)
    for name, a, b in zip(["hidden"] + [n for n, _ in heads.named_parameters()], got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    assert terms.shape == (5,) and 0 < float(terms[0]) and 0 < float(terms[1]) <= 2


DECAY_TERMS = (("ce", 0.1), ("l1", 0.9), ("confidence", 1.0))


def _tiny_batch(dc, seed=7, b=2, S=48, N=20):
    from dflash_lab.drafter.blocks import build_block_batch, sample_anchors

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 250, (b, S), generator=g)
    mask = torch.ones(b, S, dtype=torch.bool)
    mask[:, :6] = False
    mask[0, 20:23] = False  # a hole inside blocks: the slot after it still reads its TRUE previous token
    anchors, valid = sample_anchors(mask, N, g)
    return build_block_batch(ids, mask, anchors, valid, block_size=dc.block_size, mask_token_id=dc.mask_token_id,
                             gamma=4.0)


def _setup(**over):
    from dflash_lab.drafter.step import DraftInputs, build_masks, context_positions
    from dflash_lab.target.features import embedding_of, lm_head_weight

    target = make_tiny_qwen3()
    dc = _dc(**over)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(1), std=0.1)
    for p in drafter.heads.parameters():  # larger heads than their init, so the bias moves argmaxes
        p.data.mul_(20)
    bb = _tiny_batch(dc)
    S = bb.input_ids.shape[1]
    feats = torch.randn(bb.input_ids.shape[0], S, 64 * dc.num_target_features, generator=torch.Generator().manual_seed(2))
    inputs = DraftInputs(bb, build_masks(bb, seq_len=S, backend="sdpa", layer_types=dc.layer_types,
                                         sliding_window=dc.sliding_window), context_positions(bb, S, "cpu"))
    return target, dc, drafter, bb, feats, inputs, embedding_of(target), lm_head_weight(target)


def test_drafter_loss_is_the_published_loss_with_the_true_previous_token_at_every_slot():
    """The whole step's loss and per-slot argmaxes against the reference: the previous token of slot k of the block
    at anchor p is token[p + k - 1] gathered here from the input ids (the anchor for slot 1), whatever the loss mask
    says about it; the Markov bias is added at every slot 1..B-1."""
    from dflash_lab.drafter.step import drafter_loss

    target, dc, drafter, bb, feats, inputs, embed, W = _setup()
    loss, raw = drafter_loss(drafter, embed, W, feats, inputs, chunk_size=7)
    b, N, B = bb.anchors.shape[0], bb.num_anchors, dc.block_size
    hidden = drafter(feats, embed(bb.draft_ids), bb.position_ids, inputs.context_position_ids, inputs.masks)
    h = hidden.view(b, N, B, -1)[:, :, 1:].reshape(-1, 64)
    k = torch.arange(1, B)
    prev = bb.input_ids.gather(1, (bb.anchors[:, :, None] + k - 1).clamp(max=47).flatten(1)).reshape(-1)
    assert bool((prev.view(b, N, B - 1)[:, :, 0] == bb.input_ids.gather(1, bb.anchors)).all())
    labels = bb.labels.view(b, N, B)[:, :, 1:].reshape(-1)
    weights = bb.loss_weights.view(b, N, B)[:, :, 1:].reshape(-1)
    mh, ch = drafter.heads.markov_head, drafter.heads.confidence_head
    q = torch.nn.functional.one_hot(labels, 256).float()
    ref, ref_preds = _reference_loss(h, W, mh.markov_w1.weight, mh.markov_w2.weight, ch.proj.weight, ch.proj.bias,
                                     labels, weights, prev, q)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    has_loss = raw["has_loss"].flatten()
    assert torch.equal(raw["correct"].flatten(), (ref_preds == labels) & has_loss)
    # the bias matters: without it (the DFlash logits) some supervised slot's argmax differs
    assert bool(((h @ W.t()).argmax(-1) != ref_preds)[has_loss].any())
    # the hole at positions 20..22 of row 0: a supervised slot right after it reads the unsupervised token before
    # (this batch keeps every supervised slot; DSpark training drops the ones after a hole, tested below)
    after_hole = (bb.position_ids.view(b, N, B)[0, :, 1:] == 23) & raw["has_loss"][0]
    assert after_hole.any(), "the batch's anchors changed: pick a seed whose blocks cross the hole"
    assert int(prev.view(b, N, B - 1)[0][after_hole][0]) == int(bb.input_ids[0, 22])


def test_training_feeds_the_true_token_and_decoding_the_drafted_one():
    """Slot after slot as the engines draft (vLLM's DSpark speculator: prev = the anchor, then each drafted token):
    where a draft differs from the data's token, the next slot's decoding logits differ from training's by exactly
    bias(drafted) - bias(true); where every draft before a slot is right, the two are the same numbers."""
    target, dc, drafter, bb, feats, inputs, embed, W = _setup()
    b, N, B = bb.anchors.shape[0], bb.num_anchors, dc.block_size
    with torch.no_grad():
        hidden = drafter(feats, embed(bb.draft_ids), bb.position_ids, inputs.context_position_ids, inputs.masks)
        base = (hidden @ W.t()).view(b, N, B, -1)
        heads = drafter.heads
        true_prev = bb.prev_ids.view(b, N, B)
        train_logits = base + heads.markov_bias(heads.markov_embed(true_prev))  # every slot in one batched call
        prev = bb.input_ids.gather(1, bb.anchors)  # (b, N) the anchor token
        decode_logits, same_prefix, differs = [], torch.ones(b, N, dtype=torch.bool), 0
        for k in range(1, B):
            logits_k = base[:, :, k] + heads.markov_bias(heads.markov_embed(prev))
            decode_logits.append(logits_k)
            if k > 1:
                torch.testing.assert_close(logits_k[same_prefix], train_logits[:, :, k][same_prefix])
                wrong = ~same_prefix
                diff = heads.markov_bias(heads.markov_embed(prev)) - heads.markov_bias(heads.markov_embed(true_prev[:, :, k]))
                torch.testing.assert_close((logits_k - train_logits[:, :, k])[wrong], diff[wrong])
                differs += int(((logits_k - train_logits[:, :, k]).abs().amax(-1) > 1e-3)[wrong].sum())
            drafted = logits_k.argmax(-1)
            same_prefix &= drafted == bb.input_ids.gather(1, (bb.anchors + k).clamp(max=47))
            prev = drafted
    torch.testing.assert_close(decode_logits[0], train_logits[:, :, 1])  # slot 1 reads the anchor either way
    assert differs > 0  # the case that tells teacher forcing from decoding occurred


@pytest.mark.parametrize("over", [{}, {"draft_vocab_size": 100}, {"confidence_head_with_markov": False},
                                  {"enable_confidence_head": False}])
def test_parameter_and_flop_models_count_the_heads(over):
    from dflash_lab.config.model_size import drafter_parameters, variant_head_flops_per_row, variant_head_parameters

    for name in VARIANTS:  # every variant of the table: the config floor's count is the real module's
        d = DFlashDrafter(_dc(drafter_variant=name, **over))
        assert drafter_parameters(d.config) == d.num_parameters(), name
        heads = 0 if d.heads is None else sum(p.numel() for p in d.heads.parameters())
        assert variant_head_parameters(d.config) == heads, name
    dc = _dc(**over)
    v_draft = dc.draft_vocab_size or 256
    # the confidence head reads H = 64, and the Markov embedding (r = 16) beside it only when told to
    conf = (64 + (16 if dc.confidence_head_with_markov else 0)) if dc.enable_confidence_head else 0
    assert conf == {(): 80, ("draft_vocab_size",): 80, ("confidence_head_with_markov",): 64,
                    ("enable_confidence_head",): 0}[tuple(over)]
    assert variant_head_flops_per_row(dc) == 6 * (16 * v_draft + conf)
    assert variant_head_flops_per_row(_dc(drafter_variant="dflash")) == 0


def test_memory_and_flops_grow_by_the_heads():
    from dflash_lab.runs.metrics import flops_per_sequence
    from dflash_lab.train.memory_model import drafter_activation_bytes

    kw = dict(batch=2, seq_len=256, num_anchors=16, dtype_bytes=2, chunk_size=64, backend="flex", fused_norms=True)
    dflash, dspark = _dc(drafter_variant="dflash"), _dc(markov_rank=16)
    rows = 2 * 16 * 7
    extra = rows * (2 * 16 * 2 + 4 * (64 + 16 + 2)) + 256 * 16 * 6 + 64 * 256 * 8
    assert drafter_activation_bytes(dspark, **kw) - drafter_activation_bytes(dflash, **kw) == extra
    tc = make_tiny_qwen3().config
    f0, f1 = (flops_per_sequence(target_cfg=tc, drafter_cfg=d, seq_len=256, num_anchors=16) for d in (dflash, dspark))
    assert f0["heads"] == 0 and f1["heads"] == 16 * 7 * 6 * (16 * 256 + 80)
    assert f1["total"] - f0["total"] == f1["heads"]
    # without the Markov embedding the confidence head's input is H alone: 16 fewer fp32 per row, 16 fewer weights
    alone = _dc(markov_rank=16, confidence_head_with_markov=False)
    assert drafter_activation_bytes(dspark, **kw) - drafter_activation_bytes(alone, **kw) == rows * 4 * 16
    f2 = flops_per_sequence(target_cfg=tc, drafter_cfg=alone, seq_len=256, num_anchors=16)
    assert f2["heads"] == 16 * 7 * 6 * (16 * 256 + 64)


def test_preflight_counts_the_heads_of_a_dspark_config():
    from dflash_lab.workflows.preflight import estimate
    from tests.test_preflight import PAPER, fake_data, qwen3_8b_config

    plain, dspark = (estimate(TrainConfig(**PAPER, **kw), data=fake_data(100, 3072, 1500, 1000),
                              target_config=qwen3_8b_config(), gpu_memory_gib=139.8)
                     for kw in ({}, {"drafter_variant": "dspark"}))
    V, H, r = 151936, 4096, 256
    assert dspark.drafter_params - plain.drafter_params == 2 * V * r + H + r + 1
    (a,), (b,) = plain.devices, dspark.devices
    assert b.items["fp32 master + AdamW m, v"] - a.items["fp32 master + AdamW m, v"] == 12 * (2 * V * r + H + r + 1)


@pytest.mark.parametrize("over", [{"confidence_head_with_markov": False}, {"enable_confidence_head": False}])
def test_the_confidence_head_options_change_only_its_term(over):
    """Without the Markov embedding the confidence head reads the hidden state alone; without the head its term is
    gone and the loss is the two Markov terms (DeepSpec's loss with confidence_head_alpha 0)."""
    from dflash_lab.drafter.dspark import dspark_head_loss

    torch.manual_seed(1)
    M, H, V = 17, 64, 256
    heads = _heads(**over)
    W = torch.randn(V, H) * 0.3
    hidden = torch.randn(M, H)
    labels, prev = torch.randint(0, V, (M,)), torch.randint(0, V, (M,))
    weights = torch.full((M,), 1 / M)
    loss, _, terms = dspark_head_loss(heads, hidden, W, labels, weights, prev, 4, None, DECAY_TERMS)
    mh, ch = heads.markov_head, heads.confidence_head
    if ch is None:
        q = torch.nn.functional.one_hot(labels, V).float()
        e = mh.markov_w1.weight[prev]
        p = torch.softmax(hidden @ W.t() + e @ mh.markov_w2.weight.t(), -1)
        ce = -(p.log().gather(1, labels[:, None]).squeeze(1) * weights).sum()
        l1 = ((p - q).abs().sum(-1) * weights).sum()
        torch.testing.assert_close(loss, 0.1 * ce + 0.9 * l1, rtol=1e-5, atol=1e-6)
        assert torch.equal(terms[2:], torch.zeros(3))
    else:
        ref, _ = _reference_loss(hidden, W, mh.markov_w1.weight, mh.markov_w2.weight, ch.proj.weight, ch.proj.bias,
                                 labels, weights, prev, torch.nn.functional.one_hot(labels, V).float(),
                                 with_markov=False)
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
        assert ch.proj.weight.shape == (1, H)


def test_dspark_supervises_each_blocks_contiguous_prefix():
    """DeepSpec's eval mask is a cumulative product over the block: a slot after a hole carries no loss (a draft
    after a rejected one is never accepted). The variant asks for it (Variant.prefix_only), the batch builder and the
    global normaliser apply it; DFlash keeps every supervised slot."""
    from dflash_lab.drafter.blocks import build_block_batch, raw_weight_total, sample_anchors
    from dflash_lab.drafter.loss_weights import loss_weighting_of

    assert loss_weighting_of(TrainConfig(drafter_variant="dspark")).prefix_only
    assert not loss_weighting_of(TrainConfig()).prefix_only
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 250, (2, 48), generator=g)
    mask = torch.ones(2, 48, dtype=torch.bool)
    mask[:, :6] = False
    mask[0, 20:23] = False
    anchors, valid = sample_anchors(mask, 20, g)
    kw = dict(block_size=8, mask_token_id=255, gamma=4.0)
    every = build_block_batch(ids, mask, anchors, valid, **kw)
    total = raw_weight_total(mask, anchors, valid, block_size=8, gamma=4.0, prefix_only=True)
    prefix = build_block_batch(ids, mask, anchors, valid, **kw, weight_total=total, prefix_only=True)
    assert float(prefix.loss_weights.sum()) == pytest.approx(1.0, abs=1e-6)  # the normaliser counts the same slots
    has_every = (every.loss_weights > 0).view(2, 20, 8)
    has_prefix = (prefix.loss_weights > 0).view(2, 20, 8)
    want = has_every.clone()
    want[:, :, 1:] = has_every[:, :, 1:].long().cumprod(-1).bool()
    assert torch.equal(has_prefix, want)
    dropped = has_every & ~has_prefix
    assert dropped.sum() > 0 and bool((prefix.position_ids.view(2, 20, 8)[dropped] >= 23).all())
    assert torch.equal(every.prev_ids, prefix.prev_ids) and torch.equal(every.draft_ids, prefix.draft_ids)
