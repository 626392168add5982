"""The traps of docs/dflash-method.md, each as a test that would have caught it, plus loss/optimiser numerics."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from dflash_lab.drafter.blocks import build_block_batch, dense_mask, flex_block_mask, sample_anchors
from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.train.optim import lr_at
from dflash_lab.drafter.step import DraftInputs, build_masks, chunked_head_ce, drafter_loss
from dflash_lab.target.features import FeatureExtractor, embedding_of, lm_head_weight
from tests.conftest import make_tiny_qwen3

S, B = 48, 8


def _setup(tie=True, layer_types=(), window=None, seed=0):
    target = make_tiny_qwen3(tie=tie, seed=seed)
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=B, mask_token_id=255,
                                   layer_types=layer_types, sliding_window=window)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(1), std=0.1)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 250, (2, S), generator=g)
    loss_mask = torch.zeros(2, S, dtype=torch.bool)
    loss_mask[:, 8:44] = True
    return target, dc, drafter, ids, loss_mask


def _forward(drafter, target, dc, bb, features, backend="sdpa"):
    masks = build_masks(bb, seq_len=S, backend=backend, layer_types=dc.layer_types, sliding_window=dc.sliding_window)
    ctx_pos = torch.arange(S)[None].expand(bb.input_ids.shape[0], -1)
    emb = embedding_of(target)(bb.draft_ids)
    return drafter(features, emb, bb.position_ids, ctx_pos, masks)


def _batch(ids, loss_mask, anchors, valid, gamma=4.0):
    return build_block_batch(ids, loss_mask, anchors, valid, block_size=B, mask_token_id=255, gamma=gamma)


@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 6)])
def test_a_overlapping_blocks_cannot_see_the_future(layer_types, window):
    target, dc, drafter, ids, lm = _setup(layer_types=layer_types, window=window)
    # Overlapping blocks: anchors closer than B.
    anchors = torch.tensor([[10, 13, 16, 30], [9, 12, 20, 21]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    bb = _batch(ids, lm, anchors, valid)
    feats = FeatureExtractor(target, dc.target_layer_ids)(ids)
    with torch.no_grad():
        base = _forward(drafter, target, dc, bb, feats).view(2, 4, B, -1)
        for blk in range(4):
            for seq in range(2):
                p = int(anchors[seq, blk])
                perturbed = feats.clone()
                perturbed[seq, p:] += 5.0 * torch.randn_like(perturbed[seq, p:])
                out = _forward(drafter, target, dc, bb, perturbed).view(2, 4, B, -1)
                torch.testing.assert_close(out[seq, blk], base[seq, blk], rtol=0, atol=1e-6)
                # ...while features strictly before the anchor DO matter (the test can fail).
                earlier = feats.clone()
                earlier[seq, p - 1] += 5.0
                out2 = _forward(drafter, target, dc, bb, earlier).view(2, 4, B, -1)
                assert (out2[seq, blk] - base[seq, blk]).abs().max() > 1e-4


def test_b_features_are_not_shifted():
    target, dc, *_ = _setup()
    ids = torch.randint(0, 250, (2, S))
    feats = FeatureExtractor(target, dc.target_layer_ids)(ids)
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    H = target.config.hidden_size
    for j, layer_id in enumerate(dc.target_layer_ids):
        torch.testing.assert_close(feats[..., j * H:(j + 1) * H], hs[layer_id + 1], rtol=1e-5, atol=1e-5)


def test_feature_extractor_runs_no_layer_above_the_last_id():
    target, dc, *_ = _setup()
    called = []
    for i, layer in enumerate(target.model.layers):
        layer.register_forward_hook(lambda m, a, o, i=i: called.append(i))
    target.lm_head.register_forward_hook(lambda *a: called.append("lm_head"))
    FeatureExtractor(target, dc.target_layer_ids)(torch.randint(0, 250, (1, 16)))
    assert called == list(range(max(dc.target_layer_ids) + 1))


def test_c_labels_are_same_position():
    _, _, _, ids, lm = _setup()
    anchors = torch.tensor([[10, 20, 30, 40], [8, 9, 10, 11]])
    bb = _batch(ids, lm, anchors, torch.ones_like(anchors, dtype=torch.bool))
    labels = bb.labels.view(2, 4, B)
    w = bb.loss_weights.view(2, 4, B)
    draft = bb.draft_ids.view(2, 4, B)
    for s in range(2):
        for n in range(4):
            p = int(anchors[s, n])
            assert draft[s, n, 0] == ids[s, p] and (draft[s, n, 1:] == 255).all()
            assert w[s, n, 0] == 0
            for k in range(1, B):
                if p + k < 44:  # supervised
                    assert labels[s, n, k] == ids[s, p + k] and w[s, n, k] > 0
                else:
                    assert w[s, n, k] == 0
    assert bb.position_ids.view(2, 4, B)[0, 1].tolist() == list(range(20, 28))
    assert torch.isclose(bb.loss_weights.sum(), torch.tensor(1.0))
    # decay: w_k / w_1 = exp(-(k-1)/gamma)
    row = w[0, 0]
    assert torch.allclose(row[2:] / row[1], torch.exp(-torch.arange(1, B - 1) / 4.0))


@pytest.mark.parametrize("tie", [True, False])
def test_d_tied_and_untied_heads(tie):
    target, dc, drafter, ids, lm = _setup(tie=tie)
    head = lm_head_weight(target)
    if tie:
        assert head.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    else:
        assert head.data_ptr() != target.model.embed_tokens.weight.data_ptr()
        assert torch.equal(head, target.lm_head.weight)
    anchors, valid = sample_anchors(lm, 4, torch.Generator().manual_seed(0))
    bb = _batch(ids, lm, anchors, valid)
    feats = FeatureExtractor(target, dc.target_layer_ids)(ids)
    masks = build_masks(bb, seq_len=S, backend="sdpa", layer_types=dc.layer_types, sliding_window=None)
    loss, _ = drafter_loss(drafter, embedding_of(target), head, feats,
                           DraftInputs(bb, masks, torch.arange(S)[None].expand(2, -1)), chunk_size=7)
    # the reference: full logits through the target's own output layer
    hidden = _forward(drafter, target, dc, bb, feats)
    logits = target.get_output_embeddings()(hidden)
    ce = F.cross_entropy(logits.flatten(0, 1), bb.labels.flatten(), reduction="none")
    ref = (ce * bb.loss_weights.flatten()).sum()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    loss.backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in target.parameters())
    assert drafter.fc.weight.grad.abs().sum() > 0


def test_e_padding_blocks_carry_no_loss_and_see_nothing():
    target, dc, drafter, ids, lm = _setup()
    anchors = torch.tensor([[10, 20, 0, 0], [12, 0, 0, 0]])
    valid = torch.tensor([[True, True, False, False], [True, False, False, False]])
    bb = _batch(ids, lm, anchors, valid)
    assert bb.loss_weights.view(2, 4, B)[~valid].abs().sum() == 0
    m = dense_mask(anchors, valid, seq_len=S, block_size=B)
    assert not m[0, 0, 2 * B:].any() and not m[1, 0, B:].any()
    # no query of a valid block sees any key of a padding block
    assert not m[0, 0, :2 * B, S + 2 * B:].any()
    feats = FeatureExtractor(target, dc.target_layer_ids)(ids)

    def loss_and_grad(batch):
        drafter.zero_grad()
        masks = build_masks(batch, seq_len=S, backend="sdpa", layer_types=dc.layer_types, sliding_window=None)
        loss, _ = drafter_loss(drafter, embedding_of(target), lm_head_weight(target), feats,
                               DraftInputs(batch, masks, torch.arange(S)[None].expand(2, -1)), 64)
        loss.backward()
        return loss.detach(), drafter.fc.weight.grad.clone()

    l1, g1 = loss_and_grad(bb)
    # Change what the padding blocks contain: loss and gradients must not move.
    anchors2 = torch.tensor([[10, 20, 30, 5], [12, 40, 3, 7]])
    bb2 = _batch(ids, lm, anchors2, valid)
    l2, g2 = loss_and_grad(bb2)
    torch.testing.assert_close(l1, l2, rtol=0, atol=1e-7)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-7)
    with torch.no_grad():
        out = _forward(drafter, target, dc, bb, feats).view(2, 4, B, -1)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 5)])
def test_f_flex_and_dense_masks_agree(layer_types, window, split, monkeypatch):
    """Both flex formulations (the context alone + each block's own slots beside it, as short windows run; one
    call over [context | blocks], as long windows run) against the dense mask, mask and drafter output."""
    from torch.nn.attention.flex_attention import create_mask

    from dflash_lab.drafter import blocks
    from dflash_lab.drafter.blocks import flex_mask_mod

    monkeypatch.setattr(blocks, "SPLIT_MAX_SEQ_LEN", S if split else S - 1)
    target, dc, drafter, ids, lm = _setup(layer_types=layer_types, window=window)
    anchors = torch.tensor([[10, 13, 16, 0], [9, 12, 20, 21]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    bb = _batch(ids, lm, anchors, valid)
    # The masks themselves, element by element: the split's covers the context keys, the dense mask's first S
    mod = flex_mask_mod(anchors, valid, seq_len=S, block_size=B, sliding_window=window)
    keys = S if split else S + 4 * B
    flex_dense = create_mask(mod, 2, None, 4 * B, keys, device="cpu")
    dense = dense_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=window)
    torch.testing.assert_close(flex_dense, dense[..., :keys])
    seen = 10 if window is None else window - 1  # the anchor slot of anchor 10: positions 0..9, or 10-w+1..9
    assert int(flex_dense[0, 0, 0, :S].sum()) == seen and int(flex_dense[0, 0, 3 * B:].sum()) == 0  # padding
    feats = FeatureExtractor(target, dc.target_layer_ids)(ids)
    with torch.no_grad():  # FlexAttention has no backward on CPU: gradients are compared in tests/test_gpu.py
        out_dense = _forward(drafter, target, dc, bb, feats, "sdpa")
        out_flex = _forward(drafter, target, dc, bb, feats, "flex")
    # every row of a real block agrees; padding blocks carry no loss and no row reads them (zeros on the single
    # call as on the dense path; the split's show what their own slots give)
    rows = valid.repeat_interleave(B, dim=1) | (not split)
    torch.testing.assert_close(out_flex[rows], out_dense[rows], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [True, False])
def test_f_the_drafter_traces_whole_on_either_flex_formulation(split, monkeypatch):
    """compile_drafter's trace: the layer picks the formulation from the mask's key length, with no graph break."""
    from dflash_lab.drafter import blocks

    monkeypatch.setattr(blocks, "SPLIT_MAX_SEQ_LEN", S if split else S - 1)
    torch._dynamo.reset()
    target, dc, drafter, ids, lm = _setup(layer_types=("sliding_attention", "full_attention"), window=5)
    bb = _batch(ids, lm, torch.tensor([[10, 13, 16, 0], [9, 12, 20, 21]]),
                torch.tensor([[True, True, True, False], [True, True, True, True]]))
    feats = FeatureExtractor(target, dc.target_layer_ids)(ids)
    masks = build_masks(bb, seq_len=S, backend="flex", layer_types=dc.layer_types, sliding_window=dc.sliding_window)
    assert masks["full_attention"].seq_lengths == (4 * B, S if split else S + 4 * B)
    ctx, emb = torch.arange(S)[None].expand(2, -1), embedding_of(target)(bb.draft_ids)
    with torch.no_grad():  # FlexAttention has no backward on CPU
        ref = drafter(feats, emb, bb.position_ids, ctx, masks)
        out = torch.compile(drafter, backend="eager", fullgraph=True)(feats, emb, bb.position_ids, ctx, masks)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_split_in_context_and_own_block_equals_one_dense_attention(causal):
    """model.attend_blocks (flex's path: the context through a BlockMask, each block's own slots by a batched
    matmul, merged through both log-sum-exps) against one SDPA over [context | every block] with the dense mask:
    grouped heads, a block whose anchor is 0 (no context at all: its flex part is empty), sliding layers (causal
    inside the block, context within the window)."""
    from dflash_lab.drafter.blocks import flex_block_mask
    from dflash_lab.drafter.model import attend, attend_blocks

    g = torch.Generator().manual_seed(3)
    b, h, kvh, d, N = 2, 6, 2, 16, 4
    anchors = torch.tensor([[0, 7, 19, 30], [3, 11, 12, 0]])
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    window = 9 if causal else None
    q = torch.randn(b, h, N * B, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, kvh, S + N * B, d, generator=g, dtype=torch.float64) for _ in range(2))
    dense = attend(q, k, v, dense_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=window))
    ctx_mask = flex_block_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=window)
    split = attend_blocks(q, (k[:, :, :S], v[:, :, :S]), (k[:, :, S:], v[:, :, S:]), ctx_mask, block_size=B,
                          causal=causal)
    rows = valid.repeat_interleave(B, dim=1)
    torch.testing.assert_close(split.transpose(1, 2)[rows], dense.transpose(1, 2)[rows], rtol=1e-5, atol=1e-5)
    if causal:  # the anchor-0 block sees no context, and its slot 0 (the anchor token) sees only itself
        own_v = v[0, :, S].repeat_interleave(h // kvh, dim=0)  # (h, d)
        torch.testing.assert_close(split[0, :, 0], own_v, rtol=1e-6, atol=1e-6)


def test_g_layer_id_rule():
    from dflash_lab.config.target_defaults import default_target_layer_ids

    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)


def test_chunked_head_ce_matches_full_cross_entropy():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 16, generator=g, requires_grad=True)
    W = torch.randn(100, 16, generator=g)
    y = torch.randint(0, 100, (50,), generator=g)
    w = torch.rand(50, generator=g)
    w[::7] = 0
    w = w / w.sum()
    loss, preds = chunked_head_ce(h, W, y, w, 8)
    loss.backward()
    h2 = h.detach().clone().requires_grad_(True)
    ref = (F.cross_entropy(h2 @ W.t(), y, reduction="none") * w).sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-5, atol=1e-6)
    assert torch.equal(preds, (h2 @ W.t()).argmax(-1))


def test_anchor_sampling_rules():
    lm = torch.zeros(3, 40, dtype=torch.bool)
    lm[0, 5:30] = True
    lm[1, 10:13] = True  # only positions 10, 11 have loss_mask[p] and loss_mask[p+1]
    g = torch.Generator().manual_seed(0)
    a, v = sample_anchors(lm, 6, g)
    assert v[0].all() and (a[0].diff() > 0).all() and ((a[0] >= 5) & (a[0] <= 28)).all()
    assert v[1].tolist() == [True, True, False, False, False, False] and a[1, :2].tolist() == [10, 11]
    assert not v[2].any()


def test_lr_schedule():
    kw = dict(peak=1e-3, total_steps=100, warmup_steps=4)
    assert lr_at(0, **kw) == pytest.approx(2.5e-4) and lr_at(3, **kw) == pytest.approx(1e-3)
    assert lr_at(52, **kw) == pytest.approx(5e-4) and lr_at(100, **kw) == pytest.approx(0.0, abs=1e-12)


def test_i_import_loads_no_jupyter_module():
    code = ("import sys, dflash_lab, dflash_lab.train.trainer, dflash_lab.train.engine, dflash_lab.runs.metrics;"
            "bad=[m for m in ('IPython','ipywidgets','plotly','widgets','ipykernel') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
