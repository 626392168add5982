"""Packed sequences (packing.py, segments.py, the doc_ids paths of blocks/features): windows and fill ratio,
features and drafter loss of a packed window == its conversations run alone, no leak across conversations, anchors
and labels inside one conversation, flex == dense on packed windows."""

import pytest
import torch

from dflash_lab.drafter.blocks import build_block_batch, dense_mask, raw_weight_total, sample_anchors
from dflash_lab.config import DrafterConfig, TrainConfig
from dflash_lab.config.errors import ConfigError
from dflash_lab.drafter.batches import BatchSampler
from dflash_lab.data.tokenize import TokenizedData
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.target.features import FeatureExtractor, embedding_of, lm_head_weight
from dflash_lab.data.packing import fill_report, pack_data, pack_windows
from dflash_lab.target.segments import document_positions
from dflash_lab.drafter.step import DraftInputs, build_masks, context_positions, drafter_loss
from tests.conftest import make_tiny_qwen3

S, B = 64, 8
LENGTHS = (20, 26, 12)  # three conversations in one window of S = 64: 58 real tokens, 6 padding
ATOL = 2e-5  # fp32 on CPU: packed vs alone differ only in summation order over masked (zero) keys and RoPE angles


def _setup(layer_types=(), window=None):
    target = make_tiny_qwen3()
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=B, mask_token_id=255,
                                   layer_types=layer_types, sliding_window=window)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(1), std=0.1)
    return target, dc, drafter


def _packed_window(seed=3):
    """ids (1, S), loss_mask (1, S) (supervised from token 4 of each conversation to its end), doc_ids (1, S)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 250, (1, S), generator=g)
    mask = torch.zeros(1, S, dtype=torch.bool)
    docs = torch.full((1, S), len(LENGTHS), dtype=torch.long)
    at = 0
    for d, L in enumerate(LENGTHS):
        mask[0, at + 4:at + L] = True
        docs[0, at:at + L] = d
        at += L
    return ids, mask, docs


def _starts():
    out, at = [], 0
    for L in LENGTHS:
        out.append(at)
        at += L
    return out


def _loss(drafter, target, dc, bb, feats, backend="sdpa"):
    masks = build_masks(bb, seq_len=bb.input_ids.shape[1], backend=backend, layer_types=dc.layer_types,
                        sliding_window=dc.sliding_window)
    ctx_pos = context_positions(bb, bb.input_ids.shape[1], "cpu")
    return drafter_loss(drafter, embedding_of(target), lm_head_weight(target), feats,
                        DraftInputs(bb, masks, ctx_pos), chunk_size=64)[0]


def _logits_of_blocks(drafter, target, dc, bb, feats, backend="sdpa"):
    masks = build_masks(bb, seq_len=bb.input_ids.shape[1], backend=backend, layer_types=dc.layer_types,
                        sliding_window=dc.sliding_window)
    ctx_pos = context_positions(bb, bb.input_ids.shape[1], "cpu")
    hidden = drafter(feats, embedding_of(target)(bb.draft_ids), bb.position_ids, ctx_pos, masks)
    return (hidden @ lm_head_weight(target).t()).view(bb.anchors.shape[0], bb.num_anchors, B, -1)


# -- packing itself ---------------------------------------------------------------------------------------------

def test_pack_windows_on_hand_made_lengths():
    # Six halves and one full row at seq_len 100: every order packs the halves in pairs -> 4 full windows.
    lengths = [50, 50, 100, 50, 50, 50, 50]
    for seed in range(5):
        windows = pack_windows(lengths, 100, seed)
        assert len(windows) == 4
        assert sorted(r for w in windows for r in w) == list(range(7))  # every row once, never split
        assert all(sum(lengths[r] for r in w) == 100 for w in windows)
    rep = fill_report(lengths, 100)
    assert rep["packed_windows"] == 4 and rep["tokens"] == 400
    assert rep["fill_unpacked"] == pytest.approx(400 / 700) and rep["fill_packed"] == pytest.approx(1.0)
    # Mixed lengths: best fit in the seeded order; deterministic, within seq_len, at least ceil(tokens / seq_len).
    mixed = [70, 30, 45, 45, 10, 90, 25, 60, 5, 20]  # 400 tokens
    w0 = pack_windows(mixed, 100, seed=0)
    assert w0 == pack_windows(mixed, 100, seed=0)
    assert all(sum(mixed[r] for r in w) <= 100 for w in w0)
    assert sorted(r for w in w0 for r in w) == list(range(10))
    assert 4 <= len(w0) <= 6
    rep = fill_report(mixed, 100, seed=0)
    assert rep["fill_unpacked"] == pytest.approx(0.4)
    assert rep["fill_packed"] == pytest.approx(400 / (100 * len(w0)))
    assert fill_report([300, 20], 100)["tokens"] == 120  # longer than seq_len: truncated, as at tokenization
    with pytest.raises(ValueError, match="exceeds seq_len"):
        pack_windows([101], 100, 0)


def test_pack_data_keeps_rows_and_numbers_documents():
    lengths = [5, 7, 3, 9]
    ids = torch.zeros(4, 12, dtype=torch.int32)
    mask = torch.zeros(4, 12, dtype=torch.bool)
    for r, L in enumerate(lengths):
        ids[r, :L] = torch.arange(1, L + 1) + 100 * r
        mask[r, 2:L] = True
    data = TokenizedData(ids, mask, torch.tensor(lengths), sample_ids=[f"s{r}" for r in range(4)])
    packed = pack_data(data, seq_len=12, seed=0, pad_id=0)
    assert packed.report["packing"]["packed_windows"] == len(packed) == 2  # 24 tokens in 2 windows of 12
    seen = set()
    for w in range(len(packed)):
        docs, pos = packed.doc_ids[w].long(), document_positions(packed.doc_ids[w:w + 1].long())[0]
        for d in docs.unique().tolist():
            at = (docs == d).nonzero().flatten()
            assert torch.equal(pos[at], torch.arange(len(at)))  # positions restart at each conversation
            row = ids[:, 0].tolist().index(int(packed.input_ids[w, at[0]])) if packed.input_ids[w, at[0]] else None
            if row is None:  # the padding document
                assert int(at[0]) == packed.lengths[w] and (packed.input_ids[w, at] == 0).all()
                continue
            seen.add(row)
            assert torch.equal(packed.input_ids[w, at], ids[row, :lengths[row]])
            assert torch.equal(packed.loss_mask[w, at], mask[row, :lengths[row]])
    assert seen == {0, 1, 2, 3}


def test_pack_sequences_with_a_feature_cache_is_refused():
    with pytest.raises(ConfigError, match="pack_sequences=True.*feature_cache"):
        TrainConfig(pack_sequences=True, feature_cache="/tmp/cache")
    assert TrainConfig().pack_sequences is False


# -- the target: features --------------------------------------------------------------------------------------

def _sliding_target():
    """A target with sliding-window layers (window 8 < every conversation here): its own mask path."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      use_sliding_window=True, sliding_window=8, max_window_layers=0,
                      layer_types=["sliding_attention", "full_attention"] * 4)
    return Qwen3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("sliding", [False, True])
def test_packed_features_equal_each_conversation_alone(sliding):
    target, dc, _ = _setup()
    if sliding:
        target = _sliding_target()
        assert "sliding_attention" in target.config.layer_types
    ids, _, docs = _packed_window()
    ext = FeatureExtractor(target, dc.target_layer_ids)
    packed = ext(ids, docs)  # (1, S, n*H)
    plain = ext(ids)
    for start, L in zip(_starts(), LENGTHS):
        alone = ext(ids[:, start:start + L])
        torch.testing.assert_close(packed[:, start:start + L], alone, rtol=0, atol=ATOL)
        if start:  # ...and the unpacked window does NOT equal it there (the test can fail)
            assert (plain[:, start:start + L] - alone).abs().max() > 1e-2


# -- the drafter: loss, leaks, anchors, labels, masks ------------------------------------------------------------

def _anchors_in_each_conversation():
    return [[s + 4, s + 7, s + L - 3] for s, L in zip(_starts(), LENGTHS)]  # near the ends: labels cross if unmasked


@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 6)])
def test_packed_loss_is_the_sum_over_conversations_alone(layer_types, window):
    target, dc, drafter = _setup(layer_types, window)
    ids, mask, docs = _packed_window()
    per_doc = _anchors_in_each_conversation()
    anchors = torch.tensor([sum(per_doc, [])])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    kw = dict(block_size=B, mask_token_id=255, gamma=4.0)
    total = raw_weight_total(mask, anchors, valid, block_size=B, gamma=4.0, doc_ids=docs)
    bb = build_block_batch(ids, mask, anchors, valid, weight_total=total, doc_ids=docs, **kw)
    ext = FeatureExtractor(target, dc.target_layer_ids)
    with torch.no_grad():
        packed = _loss(drafter, target, dc, bb, ext(ids, docs))
        parts, alone_totals = [], []
        for start, L, a in zip(_starts(), LENGTHS, per_doc):
            one_ids = torch.zeros(1, S, dtype=ids.dtype)  # the conversation alone, right-padded in its own window
            one_mask = torch.zeros(1, S, dtype=torch.bool)
            one_ids[0, :L], one_mask[0, :L] = ids[0, start:start + L], mask[0, start:start + L]
            one_a = torch.tensor([a]) - start
            one = build_block_batch(one_ids, one_mask, one_a, torch.ones_like(one_a, dtype=torch.bool),
                                    weight_total=total, **kw)
            parts.append(_loss(drafter, target, dc, one, ext(one_ids)))
            alone_totals.append(raw_weight_total(one_mask, one_a, one.anchor_valid, block_size=B, gamma=4.0))
    assert total == pytest.approx(sum(alone_totals))  # the normaliser adds up too
    torch.testing.assert_close(packed, sum(parts), rtol=0, atol=ATOL)
    # Without the document rules the same window gives another loss (labels and context cross conversations).
    with torch.no_grad():
        unpacked = _loss(drafter, target, dc, build_block_batch(ids, mask, anchors, valid, **kw), ext(ids))
    assert abs(float(unpacked) - float(sum(parts))) > 1e-3


@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 6)])
def test_a_token_of_one_conversation_never_leaks_into_another(layer_types, window):
    """Extends test_core's leak tests to packed windows: tokens -> target features -> drafter logits, end to end."""
    target, dc, drafter = _setup(layer_types, window)
    ids, mask, docs = _packed_window()
    per_doc = _anchors_in_each_conversation()
    anchors = torch.tensor([sum(per_doc, [])])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    ext = FeatureExtractor(target, dc.target_layer_ids)

    def logits(token_ids):
        bb = build_block_batch(token_ids, mask, anchors, valid, block_size=B, mask_token_id=255, gamma=4.0,
                               doc_ids=docs)
        with torch.no_grad():
            return _logits_of_blocks(drafter, target, dc, bb, ext(token_ids, docs))[0]  # (N, B, V)

    base = logits(ids)
    block_doc = [d for d, a in enumerate(per_doc) for _ in a]
    for d, (start, L) in enumerate(zip(_starts(), LENGTHS)):
        changed = ids.clone()
        changed[0, start:start + L] = (changed[0, start:start + L] + 17) % 250  # every token of conversation d
        out = logits(changed)
        for n, bd in enumerate(block_doc):
            diff = (out[n] - base[n]).abs().max()
            if bd == d:
                assert diff > 1e-3  # its own blocks change (the test can fail)
            else:
                assert diff <= 1e-6, (d, n, float(diff))


def test_anchors_and_labels_never_cross_a_boundary_exhaustively():
    torch.manual_seed(0)
    b, S2 = 3, 40
    docs = torch.zeros(b, S2, dtype=torch.long)
    for r, cuts in enumerate([(7, 15, 30), (1, 2, 20, 21, 39), (12, 36)]):  # incl. one-token conversations
        for c in cuts:
            docs[r, c:] += 1
    mask = torch.ones(b, S2, dtype=torch.bool)  # every token supervised: only the document rule can stop a crossing
    mask[2, 36:] = False  # padding of row 2
    same_next = (docs[:, :-1] == docs[:, 1:]) & mask[:, :-1] & mask[:, 1:]
    anchors, valid = sample_anchors(mask, S2 - 1, torch.Generator().manual_seed(0), doc_ids=docs)
    for r in range(b):
        picked = set(anchors[r][valid[r]].tolist())
        assert picked == set(same_next[r].nonzero().flatten().tolist())  # exactly the in-document candidates
    bb = build_block_batch(mask.long(), mask, anchors, valid, block_size=B, mask_token_id=255, gamma=4.0,
                           doc_ids=docs)
    w = bb.loss_weights.view(b, -1, B)
    pos = document_positions(docs)
    for r in range(b):
        for n in range(anchors.shape[1]):
            p = int(anchors[r, n])
            for k in range(B):
                inside = bool(valid[r, n]) and k > 0 and p + k < S2 and bool(mask[r, p + k]) \
                    and int(docs[r, p + k]) == int(docs[r, p])
                assert (float(w[r, n, k]) > 0) == inside, (r, n, k)
            if valid[r, n]:
                assert torch.equal(bb.position_ids.view(b, -1, B)[r, n], pos[r, p] + torch.arange(B))
    raw = raw_weight_total(mask, anchors, valid, block_size=B, gamma=4.0, doc_ids=docs)
    assert float(bb.loss_weights.sum()) * raw == pytest.approx(raw)  # normaliser == the kept weights
    assert raw < raw_weight_total(mask, anchors, valid, block_size=B, gamma=4.0)  # crossing slots were dropped


def test_unpacked_batches_are_unchanged_by_one_document():
    """doc_ids of one document everywhere == doc_ids=None: the packed rules reduce to today's."""
    ids, mask, _ = _packed_window()
    one = torch.zeros_like(ids)
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    a0, v0 = sample_anchors(mask, 10, g())
    a1, v1 = sample_anchors(mask, 10, g(), doc_ids=one)
    assert torch.equal(a0, a1) and torch.equal(v0, v1)
    kw = dict(block_size=B, mask_token_id=255, gamma=4.0)
    b0 = build_block_batch(ids, mask, a0, v0, **kw)
    b1 = build_block_batch(ids, mask, a0, v0, doc_ids=one, **kw)
    for f in ("draft_ids", "position_ids", "labels", "loss_weights"):
        assert torch.equal(getattr(b0, f), getattr(b1, f)), f
    assert torch.equal(dense_mask(a0, v0, seq_len=S, block_size=B),
                       dense_mask(a0, v0, seq_len=S, block_size=B, doc_ids=one))


@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 5)])
def test_flex_and_dense_masks_agree_on_packed_windows(layer_types, window):
    from torch.nn.attention.flex_attention import create_mask

    from dflash_lab.drafter.blocks import flex_mask_mod

    target, dc, drafter = _setup(layer_types, window)
    ids, mask, docs = _packed_window()
    anchors = torch.tensor([sum(_anchors_in_each_conversation(), [])])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    valid[0, -1] = False  # one padding block
    N = anchors.shape[1]
    mod = flex_mask_mod(anchors, valid, seq_len=S, block_size=B, sliding_window=window, doc_ids=docs)
    dense = dense_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=window, doc_ids=docs)
    torch.testing.assert_close(create_mask(mod, 1, None, N * B, S, device="cpu"), dense[..., :S])  # context keys
    bb = build_block_batch(ids, mask, anchors, valid, block_size=B, mask_token_id=255, gamma=4.0, doc_ids=docs)
    feats = FeatureExtractor(target, dc.target_layer_ids)(ids, docs)
    with torch.no_grad():  # FlexAttention has no backward on CPU
        out_dense = _logits_of_blocks(drafter, target, dc, bb, feats, "sdpa")
        out_flex = _logits_of_blocks(drafter, target, dc, bb, feats, "flex")
    torch.testing.assert_close(out_flex[0, :-1], out_dense[0, :-1], rtol=1e-4, atol=1e-4)


def test_batch_sampler_on_packed_data_carries_doc_ids():
    ids, mask, docs = _packed_window()
    data = TokenizedData(ids.repeat(4, 1).int(), mask.repeat(4, 1), torch.full((4,), sum(LENGTHS)),
                         doc_ids=docs.repeat(4, 1).int())
    sampler = BatchSampler(data, batch_size=2, num_anchors=12, block_size=B, mask_token_id=255, gamma=4.0, seed=0)
    bb = sampler.batch(0)
    assert bb.doc_ids.shape == (2, S) and bb.doc_ids.dtype == torch.long
    d = bb.doc_ids.gather(1, bb.anchors)
    assert (d == bb.doc_ids.gather(1, bb.anchors + 1))[bb.anchor_valid].all()
    halves = bb.split(2)
    assert [h.doc_ids.shape for h in halves] == [(1, S), (1, S)]
    assert bb.to("cpu").doc_ids is not None


def test_packed_runs_train_the_same_in_the_engine_and_the_torchrun_rank(tmp_path):
    """Both step paths (engine workers: staged doc_ids + per-document ctx positions; RankTrainer: step.py helpers)
    give the same packed losses on windows that really hold several conversations."""
    import dataclasses
    from dflash_lab.train.distributed import DistConfig, DistContext
    from dflash_lab.train.rank_trainer import RankTrainer
    from dflash_lab.train.trainer import Trainer
    from tests import golden

    cfg = dataclasses.replace(golden.config(tmp_path), pack_sequences=True, steps=6, seq_len=256, num_anchors=8)
    t = Trainer(cfg, write_run_dir=False, log=lambda *a: None)
    try:
        t.step(cfg.steps)
        engine = [r["loss"] for r in t.history]
        docs = t.last_batch.doc_ids
        assert docs is not None and int(docs.max()) >= 2, "expected >= 2 conversations (+ padding) in a window"
    finally:
        t.close()
    ctx = DistContext(DistConfig(backend="gloo"), train_devices=cfg.devices, env=None)
    rt = RankTrainer(cfg, ctx, tmp_path / "rank_run", log=lambda *a: None, checkpoints=False)
    try:
        rt.train(progress_every_s=1e9)
        rank = [r["loss"] for r in rt.metrics.ring.snapshot()]
    finally:
        rt.close()
        ctx.close()
    assert len(engine) == cfg.steps and rank == pytest.approx(engine, **golden.TOLERANCE)


def _packed_synthetic(step, *, b=2, seq_len=256, num_anchors=16, block=16):
    """Random packed windows whose conversation cuts move every step (same shapes: what a CUDA graph replays)."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, 1023, (b, seq_len), generator=g)
    docs = torch.zeros(b, seq_len, dtype=torch.long)
    mask = torch.ones(b, seq_len, dtype=torch.bool)
    for r in range(b):
        for c in sorted(torch.randint(8, seq_len - 8, (3,), generator=g).tolist()):
            docs[r, c:] += 1
            mask[r, c:c + 4] = False  # a short prompt at each conversation start
    anchors, valid = sample_anchors(mask, num_anchors, g, doc_ids=docs)
    total = raw_weight_total(mask, anchors, valid, block_size=block, gamma=7.0, doc_ids=docs)
    return build_block_batch(ids, mask, anchors, valid, block_size=block, mask_token_id=1023, gamma=7.0,
                             weight_total=total, doc_ids=docs)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["flex", "sdpa"])
def test_packed_graph_replay_equals_eager_on_the_gpu(attention):
    """doc_ids are one more static buffer: the target (per-document causal mask + RoPE built inside the capture) and
    the drafter (flex mask_mods over the static doc_ids) replay packed windows whose cuts change every step."""
    from tests.conftest import bench_tiny_engine

    def engine(cuda_graphs):
        return bench_tiny_engine(attention=attention, cuda_graphs=cuda_graphs, pack_sequences=True)

    losses = {}
    for graphs in (True, False):
        eng = engine(graphs)
        losses[graphs] = [eng.step(_packed_synthetic(s), step=s, lr=1e-3, next_batch=None)["loss"].item()
                          for s in range(5)]
        if graphs:
            w, t = eng.workers[0].graphed, eng.targets[0].graphed
            assert w.mode == "graph" and w.replays >= 3 and not w.fallbacks, w.status()
            assert t.mode == "graph" and not t.fallbacks, t.status()
        eng.shutdown()
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_a_resume_cannot_switch_packing():
    """Packing changes the data stream (other windows, other batches): a resume keeps the checkpoint's value."""
    from pathlib import Path
    from types import SimpleNamespace

    from dflash_lab.train.resume import resumed_config
    from dflash_lab.runs.resume_checks import config_differences

    ckpt = SimpleNamespace(state={"config": TrainConfig(lr=6e-4).to_dict()}, path=Path("ckpt"), step=3)  # a run's
    with pytest.raises(ConfigError, match="pack_sequences: False \\(checkpoint\\) -> True"):
        resumed_config(ckpt, TrainConfig(pack_sequences=True, resume_from="ckpt"), log=lambda s: None)
    cfg, _ = resumed_config(ckpt, TrainConfig(resume_from="ckpt"), log=lambda s: None)
    assert cfg.pack_sequences is False
    assert [d[0] for d in config_differences(TrainConfig().to_dict(), TrainConfig(pack_sequences=True).to_dict())] \
        == ["pack_sequences"]


def test_too_few_packed_windows_blame_packing_not_filtering(tmp_path):
    """6 short conversations all kept, packed into 1 window of 1024 tokens: fewer than batch_size=4 windows must say
    so (it used to say "only 1 samples survived filtering ... see the data report" with nothing dropped)."""
    from dflash_lab.data.chat_formats import DataError
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.prepare import prepare_run

    data = tmp_path / "six.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:6]))
    cfg = TrainConfig(target="tiny", data=str(data), seq_len=1024, batch_size=4, block_size=8, num_anchors=4,
                      num_draft_layers=1, pack_sequences=True, steps=2, runs_dir=str(tmp_path / "runs"))
    with pytest.raises(DataError) as e:
        prepare_run(cfg, log=None)
    msg = str(e.value)
    assert "all 6 conversations kept" in msg and "gives 1 window(s), fewer than batch_size=4" in msg
    assert "survived filtering" not in msg and "pack_sequences=False" in msg


def test_windows_mostly_padding_make_the_run_say_what_packing_would_fill(tmp_path):
    """Unpacked windows of 1024 tokens for the tiny data's short conversations are mostly padding: the run says how
    much, and what packing would fill; packed (or well filled) it says nothing of the kind."""
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.prepare import FILL_HINT_BELOW, prepare_run

    data = tmp_path / "some.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:40]))
    cfg = TrainConfig(target="tiny", data=str(data), seq_len=1024, batch_size=2, block_size=8, num_anchors=4,
                      num_draft_layers=1, steps=2, runs_dir=str(tmp_path / "runs"))
    lines = []
    run = prepare_run(cfg, log=lines.append)
    fill = run.data.report["fill"]
    assert fill["fill_unpacked"] < FILL_HINT_BELOW < fill["fill_packed"]
    hint = [line for line in lines if "pack_sequences=True" in line]
    assert len(hint) == 1
    assert f"fill {fill['fill_unpacked']:.0%} of the {fill['rows']:,} windows of 1024" in hint[0]
    assert f"{fill['fill_packed']:.0%} of {fill['packed_windows']:,} windows" in hint[0]
    lines.clear()
    prepare_run(cfg.replace(pack_sequences=True), log=lines.append)
    assert not [line for line in lines if "pack_sequences=True" in line]
