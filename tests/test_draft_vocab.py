"""Draft-vocabulary pruning: top-d on a hand-made corpus, coverage, pruned loss/accuracy against a naive
reference, checkpoint + resume, export with d2t, lossless speculative decoding with a pruned drafter (tiny target)."""

import functools
import json
import shutil
import tempfile
import atexit
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dflash_lab import TrainConfig
from dflash_lab.drafter.blocks import build_block_batch
from dflash_lab.config import ConfigError, DrafterConfig
from dflash_lab.data.draft_vocab import (DraftVocab, build_draft_vocab, check_same_vocab, count_supervised, label_map,
                                    target_ids_of, to_target_ids, top_ids)
from dflash_lab.drafter.step import DraftInputs, block_stats, drafter_loss


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


# ---------------------------------------------------------------------------------------------------------------
# Building the vocabulary
# ---------------------------------------------------------------------------------------------------------------

def _corpus():
    """Supervised: 5 x3, 3 x2, 7 x2, 2 x1, 9 x1 (9 tokens); unsupervised: 1 x6 (never counted)."""
    ids = torch.tensor([[1, 1, 1, 5, 5, 3, 7, 2],
                        [1, 1, 1, 5, 3, 7, 9, 0]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1],
                         [0, 0, 0, 1, 1, 1, 1, 0]], dtype=torch.bool)
    return ids, mask


def test_counts_top_d_ties_by_id_and_coverage():
    ids, mask = _corpus()
    counts = count_supervised(ids, mask, 12)
    assert counts.tolist() == [0, 0, 1, 2, 0, 3, 0, 2, 0, 1, 0, 0]  # id 1 (6x, unsupervised) and 0 (pad) not counted
    v3 = build_draft_vocab(ids, mask, size=3, vocab_size=12)
    assert v3.target_ids.tolist() == [3, 5, 7]
    assert v3.d2t.tolist() == [3, 4, 5]  # EAGLE-3 offsets: target = draft + d2t[draft]
    assert v3.coverage == pytest.approx(7 / 9) and v3.supervised_tokens == 9
    v4 = build_draft_vocab(ids, mask, size=4, vocab_size=12)
    assert v4.target_ids.tolist() == [2, 3, 5, 7]  # 2 and 9 tie at one count: the lower id wins
    assert v4.coverage == pytest.approx(8 / 9)
    # zero-count ids fill the rest in id order
    assert top_ids(counts, 7).tolist() == [0, 1, 2, 3, 5, 7, 9]
    assert target_ids_of(v4.d2t).tolist() == [2, 3, 5, 7]
    assert label_map(v4.target_ids, 12).tolist() == [-1, -1, 0, 1, -1, 2, -1, 3, -1, -1, -1, -1]
    assert v4.in_vocab.nonzero().flatten().tolist() == [2, 3, 5, 7]
    assert v4.report() == {"draft_vocab_size": 4, "target_vocab_size": 12, "coverage": round(8 / 9, 6),
                           "supervised_tokens": 9}


def test_config_validation_names_the_field_and_the_fix():
    for bad in (1, 0, -5, True, 2.5):
        with pytest.raises(ConfigError, match="draft_vocab_size"):
            TrainConfig(draft_vocab_size=bad)
    assert TrainConfig(draft_vocab_size=2).draft_vocab_size == 2 and TrainConfig().draft_vocab_size is None
    base = dict(hidden_size=8, target_hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=4, vocab_size=100, mask_token_id=99,
                num_target_layers=4, target_layer_ids=(1,))
    with pytest.raises(ConfigError, match=r"draft_vocab_size.*\(1, 100\]"):
        DrafterConfig(**base, draft_vocab_size=101)
    assert DrafterConfig(**base, draft_vocab_size=100).draft_vocab_size == 100


def test_resume_with_another_mapping_is_refused():
    ids, mask = _corpus()
    v = build_draft_vocab(ids, mask, size=3, vocab_size=12)
    check_same_vocab(v.d2t.clone(), v, "ckpt")
    check_same_vocab(None, None, "ckpt")
    with pytest.raises(ConfigError, match="draft vocabulary"):
        check_same_vocab(torch.tensor([2, 3, 3]), v, "ckpt")
    with pytest.raises(ConfigError, match="draft vocabulary"):
        check_same_vocab(None, v, "ckpt")


# ---------------------------------------------------------------------------------------------------------------
# Loss and accuracy with a pruned head == a naive reference
# ---------------------------------------------------------------------------------------------------------------

class FixedHidden(torch.nn.Module):
    """A stand-in drafter whose output is one learnable tensor: the head + loss is what is under test."""

    def __init__(self, shape, seed):
        super().__init__()
        self.h = torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(seed)))

    def forward(self, features, draft_embeds, *args):
        return self.h


def _pruned_case(V=40, H=16, d=12, B=4, S=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, V, (2, S), generator=g)
    loss_mask = torch.ones(2, S, dtype=torch.bool)
    loss_mask[:, :3] = False
    anchors = torch.tensor([[3, 6, 10, 15], [4, 9, 12, 19]])
    bb = build_block_batch(input_ids, loss_mask, anchors, torch.ones_like(anchors, dtype=torch.bool),
                           block_size=B, mask_token_id=V - 1, gamma=4.0)
    W = torch.randn(V, H, generator=g)
    ids = torch.sort(torch.randperm(V, generator=g)[:d]).values
    drafter = FixedHidden((2, anchors.shape[1] * B, H), seed + 1)
    embed = torch.nn.Embedding(V, H)
    return bb, W, ids, drafter, embed


def test_pruned_loss_and_accuracy_equal_a_naive_reference():
    bb, W, ids, drafter, embed = _pruned_case()
    B, V = bb.block_size, W.shape[0]
    inputs = DraftInputs(bb, {}, None)
    loss, raw = drafter_loss(drafter, embed, W[ids], None, inputs, chunk_size=5, label_map=label_map(ids, V))
    loss.backward()
    grad = drafter.h.grad.clone()

    # naive: full logits over the draft vocabulary, out-of-vocabulary labels no loss and wrong, autograd gradient
    h = drafter.h.detach().clone().requires_grad_(True)
    hs = h.view(2, -1, B, h.shape[-1])[:, :, 1:].reshape(-1, h.shape[-1])
    y = bb.labels.view(2, -1, B)[:, :, 1:].reshape(-1)
    w = bb.loss_weights.view(2, -1, B)[:, :, 1:].reshape(-1)
    logits = hs @ W[ids].t()
    inside = torch.isin(y, ids)
    y_draft = torch.searchsorted(ids, y).clamp(max=ids.numel() - 1)
    ce = F.cross_entropy(logits, y_draft, reduction="none")
    ref = (w * inside * ce).sum()
    ref.backward()
    correct = (ids[logits.argmax(-1)] == y) & inside
    assert 0 < int((~inside & (w > 0)).sum()) < int((w > 0).sum())  # the case has both kinds of labels
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert torch.allclose(grad, h.grad, atol=1e-6)
    assert torch.equal(raw["correct"].flatten(), correct)
    assert torch.equal(raw["has_loss"].flatten(), w > 0)  # out-of-vocabulary labels still count in accuracy
    st = block_stats(raw["correct"], raw["has_loss"])
    assert float(st["acc"]) == pytest.approx(float(correct.sum() / (w > 0).sum()))


def test_identity_draft_vocab_equals_the_full_head():
    bb, W, _, drafter, embed = _pruned_case(seed=3)
    V = W.shape[0]
    inputs = DraftInputs(bb, {}, None)
    full, raw_full = drafter_loss(drafter, embed, W, None, inputs, chunk_size=7)
    ids = torch.arange(V)
    same, raw_same = drafter_loss(drafter, embed, W[ids], None, inputs, chunk_size=7, label_map=label_map(ids, V))
    assert float(same.detach()) == float(full.detach())
    assert torch.equal(raw_same["correct"], raw_full["correct"])


def test_head_bench_times_every_vocabulary_on_the_same_rows():
    from dflash_lab.benchmarks.vocab_head import bench_head

    rows = bench_head(vocab_size=512, hidden=16, rows=64, sizes=(128, 256), chunk_size=32, repeats=1)
    assert [r["vocab"] for r in rows] == [512, 128, 256] and all(r["rows"] == 64 and r["ms"] > 0 for r in rows)
    assert rows[0]["speedup"] == 1.0


def test_to_target_ids_maps_draft_ids_with_offsets():
    class D(torch.nn.Module):
        pass

    d = D()
    d.config = type("C", (), {"draft_vocab_size": 3})()
    d.d2t = torch.tensor([3, 4, 5])
    assert to_target_ids(d, torch.tensor([0, 2, 1, 2])).tolist() == [3, 7, 5, 7]


# ---------------------------------------------------------------------------------------------------------------
# A pruned run on the tiny target: data report, checkpoint, resume, export, lossless decoding
# ---------------------------------------------------------------------------------------------------------------

D = 256  # of the tiny target's 960 ids
SMALL = dict(target="tiny", steps=4, seq_len=64, batch_size=2, block_size=8, num_anchors=4, num_draft_layers=2,
             lr=3e-3, log_every=1, checkpoint_every=2, seed=0, draft_vocab_size=D, val_every=0)


@functools.lru_cache(maxsize=1)
def pruned_run():
    """(root, run dir, the run's DraftVocab) of a 4-step pruned run on 200 tiny conversations."""
    from dflash_lab.tiny import ensure_tiny_target, tiny_data_path
    from dflash_lab.train.trainer import Trainer

    ensure_tiny_target()
    root = Path(tempfile.mkdtemp(prefix="dflash-vocab-"))
    atexit.register(shutil.rmtree, root, True)
    data = root / "train200.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:200]))
    t = Trainer(TrainConfig(**SMALL, data=str(data), runs_dir=str(root / "runs")), log=lambda *a: None)
    try:
        t.train()
        vocab = t.prepared.draft_vocab
        assert torch.equal(t.drafter.d2t.cpu(), vocab.d2t)
        assert t.workers[0].head_weight.shape[0] == D
    finally:
        t.close()
    return root, t.run_dir, vocab


def test_pruned_run_reports_coverage_and_checkpoints_d2t():
    from dflash_lab.runs import checkpoint

    root, run_dir, vocab = pruned_run()
    assert isinstance(vocab, DraftVocab) and vocab.size == D
    rep = json.loads((run_dir / "data_report.json").read_text())["draft_vocab"]
    assert rep["draft_vocab_size"] == D and rep["target_vocab_size"] == 960
    assert 0.5 < rep["coverage"] < 1.0 and rep["coverage"] == round(vocab.coverage, 6)
    ckpt = checkpoint.load_checkpoint(run_dir)
    assert ckpt.drafter["d2t"].dtype == torch.int64 and torch.equal(ckpt.drafter["d2t"], vocab.d2t)
    assert json.loads((run_dir / "drafter_config.json").read_text())["draft_vocab_size"] == D


def test_resume_restores_d2t_and_refuses_another_size():
    from dflash_lab.train.trainer import Trainer

    root, run_dir, vocab = pruned_run()
    cfg = TrainConfig(**{**SMALL, "steps": 5}, data=str(root / "train200.jsonl"), runs_dir=str(root / "runs"),
                      resume_from=str(run_dir))
    t = Trainer(cfg, log=lambda *a: None, explicit={"steps", "resume_from"})
    try:
        assert t.step_count == 4 and torch.equal(t.drafter.d2t.cpu(), vocab.d2t)
        t.step(1)
    finally:
        t.close()
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        Trainer(cfg.replace(draft_vocab_size=128), log=lambda *a: None,
                explicit={"steps", "resume_from", "draft_vocab_size"})


def test_export_holds_d2t_and_reloads(tmp_path):
    from safetensors.torch import load_file

    from dflash_lab.evaluation.export import export_drafter, load_drafter, load_exported

    _, run_dir, vocab = pruned_run()
    out = export_drafter(run_dir, tmp_path / "export", log=lambda *a: None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == D and cfg["vocab_size"] == 960
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["d2t"].dtype == torch.int64 and torch.equal(tensors["d2t"], vocab.d2t)
    # the head rows vLLM reads as the drafter's own head: the target's rows of the draft ids, in the export dtype
    from dflash_lab.target.load import read_head_weight

    assert "t2d" not in tensors
    assert torch.equal(tensors["lm_head.weight"], read_head_weight("tiny")[vocab.target_ids].to(torch.bfloat16))
    _, drafter = load_drafter(run_dir)
    ecfg, exported = load_exported(out)
    assert ecfg.draft_vocab_size == D and torch.equal(exported.d2t, vocab.d2t)
    assert torch.equal(to_target_ids(exported, torch.arange(D)), vocab.target_ids)
    # the remote-code model (trust_remote_code) holds the same d2t buffer, no missing or unexpected keys
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert torch.equal(model.d2t, vocab.d2t)


def test_pruned_drafter_decodes_losslessly_and_drafts_only_its_vocabulary():
    from dflash_lab.evaluation.evaluate import load_prompts
    from dflash_lab.evaluation.export import load_drafter
    from dflash_lab.evaluation.speculative import SpeculativeDecoder
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder
    from dflash_lab.target.load import load_target, load_tokenizer
    from dflash_lab.tiny import tiny_heldout_path

    _, run_dir, vocab = pruned_run()
    _, drafter = load_drafter(run_dir)
    target, tok = load_target("tiny"), load_tokenizer("tiny")
    eos = tok.eos_token_id
    dyn = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos)
    static = StaticSpeculativeDecoder(target, drafter, block_size=8, eos_token_id=eos, max_length=64)
    assert dyn.draft_head.shape[0] == D
    drafted = []
    real_propose = dyn._propose
    dyn._propose = lambda *a: drafted.extend((out := real_propose(*a)).drafts.tolist()) or out  # every draft
    allowed = set(vocab.target_ids.tolist())
    for ids in load_prompts(tiny_heldout_path(), tok, n_prompts=4):
        a, b = dyn.generate(ids, max_new_tokens=24), static.generate(ids, max_new_tokens=24)
        greedy = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24, eos_token_id=eos,
                                 pad_token_id=0)[0, len(ids):].tolist()
        assert a.output_ids == b.output_ids == greedy
    assert drafted and set(drafted) <= allowed
