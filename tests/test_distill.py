"""Distillation: the target's top-k distribution as a second training target (TrainConfig.distill_weight).

The head's loss and gradient are checked against a naive full-logits reference with autograd, the target's top-k
against its own full forward, and a whole run: with distillation the store serves exactly what the target gives,
and a weight of 0 is today's hard-label step bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflash_lab import TrainConfig
from dflash_lab.config import ConfigError
from dflash_lab.data.draft_vocab import label_map
from dflash_lab.drafter.blocks import build_block_batch
from dflash_lab.drafter.loss_weights import LossWeighting, dpace_weights
from dflash_lab.drafter.step import DraftInputs, SoftTargets, drafter_loss, soft_row_targets
from dflash_lab.target.features import FeatureExtractor
from tests.conftest import make_tiny_qwen3

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, H, B, S, K = 40, 16, 4, 24, 5


class FixedHidden(torch.nn.Module):
    """A stand-in drafter whose output is one learnable tensor: the head + loss is what is under test."""

    def __init__(self, shape, seed):
        super().__init__()
        self.h = torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(seed)))

    def forward(self, *args, **kwargs):
        return self.h


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, V, (2, S), generator=g)
    loss_mask = torch.ones(2, S, dtype=torch.bool)
    loss_mask[:, :3] = False
    anchors = torch.tensor([[3, 6, 10, 20], [4, 9, 12, 0]])
    valid = torch.tensor([[True] * 4, [True, True, True, False]])
    bb = build_block_batch(input_ids, loss_mask, anchors, valid, block_size=B, mask_token_id=V - 1, gamma=4.0)
    W = torch.randn(V, H, generator=g)
    target_logits = torch.randn(2, S, V, generator=g) * 3
    logp_all = target_logits.log_softmax(-1)
    logp, ids = logp_all.topk(K, dim=-1)
    soft = SoftTargets(ids.to(torch.int32), logp, anchors, weight=0.6)
    return bb, W, soft, logp_all, FixedHidden((2, anchors.shape[1] * B, H), seed + 1)


def _reference(bb, W, soft, drafter, vocab_ids=None, alpha=None):
    """Naive: full logits, the mixture target built densely per row, autograd for the gradient."""
    h = drafter.h.detach().clone().requires_grad_(True)
    b, N = soft.anchors.shape
    hs = h.view(b, N, B, H)[:, :, 1:].reshape(-1, H)
    y = bb.labels.view(b, N, B)[:, :, 1:].reshape(-1)
    w = bb.loss_weights.view(b, N, B)[:, :, 1:].reshape(-1)
    rows = []  # (batch, position whose distribution predicts the slot's label)
    for i in range(b):
        for n in range(N):
            for j in range(1, B):
                rows.append((i, min(int(soft.anchors[i, n]) + j - 1, S - 1)))
    Wd = W if vocab_ids is None else W[vocab_ids]
    Vd = Wd.shape[0]
    target = torch.zeros(len(rows), Vd)
    for r, (i, t) in enumerate(rows):
        p = torch.zeros(V)
        p[soft.ids[i, t].long()] = soft.logp[i, t].exp()
        if vocab_ids is not None:
            p = p[vocab_ids]
        inside = vocab_ids is None or bool(torch.isin(y[r], vocab_ids))
        yd = int(y[r]) if vocab_ids is None else int(torch.searchsorted(vocab_ids, y[r]).clamp(max=Vd - 1))
        share = soft.weight if p.sum() > 0 else 0.0
        target[r] = share * p / p.sum().clamp(min=1e-30)
        target[r, yd] += 1 - share
        if not inside:
            w = w.clone()
            w[r] = 0
    logits = hs @ Wd.t()
    mix = -(target * logits.log_softmax(-1)).sum(-1)
    if alpha is None:
        loss = (w * mix).sum()
    else:
        y_d = y if vocab_ids is None else torch.searchsorted(vocab_ids, y).clamp(max=Vd - 1)
        hard = F.cross_entropy(logits.detach(), y_d, reduction="none")
        f = dpace_weights(torch.exp(-hard).view(-1, B - 1), (w > 0).view(-1, B - 1), alpha).flatten()
        loss = (w * f * mix).sum()
    loss.backward()
    return float(loss.detach()), h.grad


@pytest.mark.parametrize("dpace", [False, True])
@pytest.mark.parametrize("pruned", [False, True])
def test_distilled_loss_and_gradient_equal_a_naive_reference(dpace, pruned):
    bb, W, soft, _, drafter = _case(seed=1 + 2 * dpace + pruned)
    vocab_ids = torch.sort(torch.randperm(V, generator=torch.Generator().manual_seed(7))[:25]).values if pruned \
        else None
    weighting = LossWeighting(mode="dpace", alpha=0.5) if dpace else LossWeighting()
    head = W if vocab_ids is None else W[vocab_ids]
    lm = None if vocab_ids is None else label_map(vocab_ids, V)
    loss, raw = drafter_loss(drafter, torch.nn.Embedding(V, H), head, None, DraftInputs(bb, {}, None), chunk_size=7,
                             weighting=weighting, label_map=lm, soft=soft)
    loss.backward()
    ref_loss, ref_grad = _reference(bb, W, soft, drafter, vocab_ids, alpha=0.5 if dpace else None)
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-5)
    assert torch.allclose(drafter.h.grad, ref_grad, atol=1e-6)
    hard, _ = drafter_loss(drafter, torch.nn.Embedding(V, H), head, None, DraftInputs(bb, {}, None), chunk_size=7,
                           weighting=weighting, label_map=lm)
    assert abs(float(hard.detach()) - ref_loss) > 1e-3  # the soft part changes the loss: the test can fail


def test_soft_rows_read_the_distribution_before_each_label():
    bb, _, soft, logp_all, _ = _case()
    hard, ids, p = soft_row_targets(soft, B)
    # block 0 of sequence 0 starts at anchor 3: slot 1 (label token 4) reads position 3, slot 3 reads position 5
    assert torch.equal(ids[0], soft.ids[0, 3].long()) and torch.equal(ids[2], soft.ids[0, 5].long())
    top = logp_all[0, 3].exp().topk(K).values
    assert torch.allclose(p[0], 0.6 * top / top.sum()) and float(hard[0]) == pytest.approx(0.4)
    assert torch.allclose(hard + p.sum(-1), torch.ones_like(hard))
    # anchor 20 + 2 = 22 < S; an index past the window is clamped (its weight is 0 anyway)
    assert int(ids.shape[0]) == 2 * 4 * (B - 1)


def test_target_top_k_equals_its_full_forward():
    target = make_tiny_qwen3()
    ids = torch.randint(0, 250, (2, 20), generator=torch.Generator().manual_seed(0))
    plain = FeatureExtractor(target, (0, 2), fused_norms=False)
    ext = FeatureExtractor(target, (0, 2), fused_norms=False, soft_top_k=4, soft_temperature=0.7)
    feats, top_ids, top_logp = ext(ids)
    torch.testing.assert_close(feats, plain(ids), rtol=0, atol=0)  # the features are unchanged
    with torch.no_grad():
        ref = (target(ids).logits.float() / 0.7).log_softmax(-1).topk(4, dim=-1)
    torch.testing.assert_close(top_logp, ref.values, rtol=1e-5, atol=1e-5)
    assert torch.equal(top_ids.long(), ref.indices) and top_ids.dtype == torch.int32


def test_distill_settings_are_checked():
    with pytest.raises(ConfigError, match="distill_weight"):
        TrainConfig(target="tiny", distill_weight=1.5)
    with pytest.raises(ConfigError, match="distill_top_k"):
        TrainConfig(target="tiny", distill_top_k=0)
    with pytest.raises(ConfigError, match="distill_temperature"):
        TrainConfig(target="tiny", distill_temperature=0.0)
    with pytest.raises(ConfigError, match="logits"):
        TrainConfig(target="tiny", distill_weight=0.5, feature_cache="/tmp/nowhere")


def test_split_placement_is_refused_before_loading():
    from dflash_lab.train.placement import make_placement
    from dflash_lab.train.prepare import check_distill_placement

    cfg = TrainConfig(target="tiny", distill_weight=0.5, devices=("cpu",))
    check_distill_placement(cfg, make_placement(("cpu",)))  # colocated: fine
    split = make_placement(("cpu", "cpu"), ("cpu",))  # two drafter workers fed by one target replica
    assert not split.colocated
    with pytest.raises(ValueError, match="colocated"):
        check_distill_placement(cfg, split)


def test_a_distilled_run_trains_and_the_store_serves_what_the_target_gives(tmp_path):
    """12 conversations, batch 4: with distillation the store's hits give the losses of recomputing; the soft
    term lowers the drafter's KL to the target, and weight 0 is the hard-label run bit for bit."""
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.trainer import Trainer

    data = tmp_path / "slice.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:12]))
    cfg = TrainConfig(target="tiny", data=str(data), seq_len=64, batch_size=4, block_size=8, num_anchors=4,
                      num_draft_layers=1, steps=9, seed=0, checkpoint_every=0, eval_every=0, lr=3e-3)
    curves = {}
    for name, over in {"hard": {}, "zero": {"distill_top_k": 4}, "soft": {"distill_weight": 0.5},
                       "soft-store": {"distill_weight": 0.5, "feature_store_gib": 0.01}}.items():
        trainer = Trainer(cfg.replace(**over), write_run_dir=False, log=lambda *a: None)
        try:
            curves[name] = [trainer.step(1)["loss"] for _ in range(cfg.steps)]
            if name == "soft-store":
                assert trainer.last_metrics["feature_store_hit_rate"] > 0.5
        finally:
            trainer.close()
    assert curves["zero"] == curves["hard"]
    assert curves["soft-store"] == pytest.approx(curves["soft"], rel=1e-6, abs=1e-6)
    assert all(abs(a - b) > 1e-4 for a, b in zip(curves["soft"], curves["hard"]))
    assert curves["soft"][-1] < curves["soft"][0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_top_k_keeps_the_exact_ids_and_log_probabilities_within_bf16_rounding(temperature):
    """The selection runs on the bf16 logits the head's matmul writes, the normaliser on their exp terms rounded to
    bf16: against the fp32 log-softmax of the same bf16 logits the ids are the same, the log-probabilities within
    2e-3, and the renormalised top-k shares (what the drafter trains towards) within 1e-4."""
    from dflash_lab.target.soft_labels import top_k_distribution

    g = torch.Generator().manual_seed(3)
    V, H = 4096, 64
    head = (torch.randn(V, H, generator=g) * 0.4).bfloat16()  # logit std ~3: a peaked, chat-like distribution
    hidden = torch.randn(2, 50, H, generator=g).bfloat16()
    ids, logp = top_k_distribution(hidden, torch.nn.Identity(), head, k=16, temperature=temperature)
    exact = ((hidden.reshape(-1, H) @ head.t()).float() / temperature).log_softmax(-1)
    ref = exact.topk(16, dim=-1)
    got_ids, got = ids.reshape(-1, 16).long(), logp.reshape(-1, 16)
    assert torch.equal(got_ids.sort(-1).values, ref.indices.sort(-1).values)
    torch.testing.assert_close(got, exact.gather(1, got_ids), rtol=0, atol=2e-3)
    assert float((got[:, 0] - ref.values[:, 0]).abs().max()) < 2e-3 and float(got.exp().sum(-1).max()) <= 1.0 + 2e-3
    shares, ref_shares = got.softmax(-1), ref.values.softmax(-1)  # ties may order equal values differently
    torch.testing.assert_close(shares.sort(-1).values, ref_shares.sort(-1).values, rtol=0, atol=1e-4)


def test_the_soft_label_benchmark_compares_both_formulations_on_the_same_rows(capsys):
    import json

    from dflash_lab.benchmarks.soft_labels import main

    assert main(["--rows", "96", "--hidden", "32", "--vocab", "512", "--k", "4", "16", "--repeats", "1",
                 "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["formulation"], r["k"]) for r in rows] == [("top_k_distribution", 4), ("plain_fp32", 4),
                                                          ("top_k_distribution", 16), ("plain_fp32", 16)]
    assert all(r["same_ids"] and r["max_logp_diff"] < 1e-5 and r["ms"] > 0 for r in rows)  # fp32 on the CPU
    with pytest.raises(SystemExit):
        main(["--vocab", "1", "--device", "cpu"])
    assert "vocab >= 2" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_the_gpu_the_bf16_selection_matches_the_fp32_one_at_smollm2s_head():
    """SmolLM2-135M's head shape in bf16 on CUDA: the same ids as the fp32 formulation (as sets), log-probabilities
    within bf16 rounding, at k 16 and 64."""
    from dflash_lab.benchmarks.soft_labels import plain_top_k
    from dflash_lab.target.soft_labels import top_k_distribution

    g = torch.Generator().manual_seed(0)
    head = (torch.randn(49_152, 576, generator=g) * 0.1).to("cuda", torch.bfloat16)
    hidden = torch.randn(1, 2048, 576, generator=g).to("cuda", torch.bfloat16)
    for k in (16, 64):
        ids, logp = top_k_distribution(hidden, torch.nn.Identity(), head, k=k, temperature=1.0)
        ref_ids, ref_logp = plain_top_k(hidden, head, k=k, temperature=1.0)
        assert torch.equal(ids.reshape(-1, k).sort(-1).values, ref_ids.sort(-1).values)
        diff = (logp.reshape(-1, k).sort(-1).values - ref_logp.sort(-1).values).abs().max()
        assert float(diff) < 2e-3


def test_a_top_k_larger_than_the_vocabulary_is_refused_before_the_target_loads(monkeypatch):
    """TrainConfig cannot know the vocabulary; the target's config.json does, and it is read before any weight:
    distill_top_k=1000 on the tiny target (960 ids) is refused there, naming both numbers (it failed at step 0,
    after the target had loaded)."""
    import dflash_lab.train.trainer as trainer_module
    from dflash_lab.target.load import load_target_config
    from dflash_lab.train.prepare import prepare_run
    from dflash_lab.train.trainer import Trainer

    vocab = load_target_config("tiny").vocab_size
    cfg = TrainConfig(target="tiny", distill_weight=0.5, distill_top_k=vocab + 40, checkpoint_every=0, eval_every=0)
    with pytest.raises(ConfigError, match=rf"distill_top_k={vocab + 40} .*vocabulary of {vocab} ids.*Fix"):
        prepare_run(cfg, log=None)

    def no_weights(*a, **kw):
        raise AssertionError("the target's weights were loaded")

    monkeypatch.setattr(trainer_module, "load_targets", no_weights)
    with pytest.raises(ConfigError, match="distill_top_k"):
        Trainer(cfg, write_run_dir=False, log=lambda *a: None)
    prepare_run(cfg.replace(distill_top_k=vocab), log=None)  # the whole vocabulary is a top-k
