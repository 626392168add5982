"""GPU-only checks (marker `gpu`; skipped with a reason on CPU): CUDA-graph replay == eager (loss and gradients),
flex == dense masks (forward AND gradients), the graph wrapper's fallback reason, multi-GPU == one GPU, compiled
CE epilogue == eager, compile_drafter under our own capture, the distilled step under capture == eager."""

import pytest
import torch

from dflash_lab.benchmarks.step import synthetic_batch
from dflash_lab.config import DrafterConfig, TrainConfig
from dflash_lab.train.engine_build import build_engine
from dflash_lab.train.placement import make_placement
from dflash_lab.target.load import load_target_config, load_targets
from tests.conftest import bench_tiny_engine

pytestmark = pytest.mark.gpu
S, N, B = 256, 16, 16
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _engine(devices, target_devices=None, **kw):
    return bench_tiny_engine(devices, target_devices, seq_len=S, num_anchors=N, block_size=B, **kw)


def _batch(step, num_anchors=N):
    return synthetic_batch(step, batch_size=2, seq_len=S, num_anchors=num_anchors, block_size=B, vocab_size=1024,
                           mask_token_id=1023, gamma=7.0)


def _run(engine, steps=4, batches=None):
    losses, grads = [], []
    for s in range(steps):
        batch = batches[s] if batches else _batch(s)
        nxt = _batch(s + 1) if engine.prefetches else None
        losses.append(engine.step(batch, step=s, lr=1e-3, next_batch=nxt)["loss"].item())
        grads.append(engine.workers[0].flat_grad.float().cpu().clone())
    params = torch.cat([p.detach().float().flatten().cpu() for p in engine.workers[0].drafter.parameters()])
    return losses, grads, params


def test_graph_replay_equals_eager_loss_and_gradients():
    graph, eager = _engine(("cuda:0",), cuda_graphs=True), _engine(("cuda:0",), cuda_graphs=False)
    lg, gg, pg = _run(graph)
    le, ge, pe = _run(eager)
    assert graph.workers[0].graphed.mode == "graph" and graph.workers[0].graphed.replays >= 4
    assert graph.targets[0].graphed.mode == "graph"
    assert eager.workers[0].graphed.describe() == "eager: cuda_graphs=False"
    assert lg == pytest.approx(le, rel=1e-5)
    for a, b in zip(gg, ge):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a - b).abs().max()
    assert torch.allclose(pg, pe, rtol=1e-5, atol=1e-5)
    graph.shutdown(), eager.shutdown()


def test_distilled_step_under_capture_equals_eager():
    """Distillation's target top-k (every layer + LM head inside the target graph) and the soft head loss replayed
    from CUDA graphs give the eager step's losses and gradients."""
    graph = _engine(("cuda:0",), cuda_graphs=True, distill_weight=0.5)
    eager = _engine(("cuda:0",), cuda_graphs=False, distill_weight=0.5)
    hard = _engine(("cuda:0",), cuda_graphs=True)
    lg, gg, _ = _run(graph)
    le, ge, _ = _run(eager)
    lh, _, _ = _run(hard)
    assert graph.workers[0].graphed.mode == "graph" and graph.targets[0].graphed.mode == "graph"
    assert lg == pytest.approx(le, rel=1e-5)
    for a, b in zip(gg, ge):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a - b).abs().max()
    assert all(abs(a - b) > 1e-4 for a, b in zip(lg, lh))  # the soft term is there
    graph.shutdown(), eager.shutdown(), hard.shutdown()


def test_graph_wrapper_falls_back_eagerly_and_says_why():
    engine = _engine(("cuda:0",))
    _run(engine, steps=2)
    out = engine.step(_batch(2, num_anchors=N // 2), step=2, lr=1e-3)  # fewer anchors: other shapes
    assert torch.isfinite(out["loss"])
    reasons = " ".join(engine.workers[0].graphed.fallbacks)
    assert "draft_ids: shape (2, 128)" in reasons and "captured (2, 256)" in reasons
    assert engine.workers[0].graphed.mode == "graph"  # the captured graph stays for the usual shape
    engine.step(_batch(3), step=3, lr=1e-3)
    assert engine.workers[0].graphed.replays >= 3
    engine.shutdown()


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("layer_types,window", [(("full_attention",) * 2, None),
                                                (("sliding_attention", "full_attention"), 96)])
def test_flex_and_dense_masks_agree_forward_and_gradients(layer_types, window, split, monkeypatch):
    """Both flex formulations (the context alone + each block's own slots, and one call over [context | blocks])
    against the dense mask, forward and every parameter's gradient."""
    from dflash_lab.drafter import blocks
    from dflash_lab.drafter.blocks import dense_mask, flex_block_mask
    from dflash_lab.drafter.model import DFlashDrafter

    monkeypatch.setattr(blocks, "SPLIT_MAX_SEQ_LEN", S if split else S - 1)

    tc = load_target_config("bench:tiny")
    dc = DrafterConfig.from_target(tc, num_draft_layers=2, block_size=B, mask_token_id=1023, layer_types=layer_types,
                                   sliding_window=window)
    torch.manual_seed(0)
    d = DFlashDrafter(dc)
    d.init_weights(torch.Generator().manual_seed(0))
    d = d.cuda()
    batch = _batch(0).to("cuda")
    anchors, valid = batch.anchors.clone(), batch.anchor_valid.clone()
    anchors[0, 0], valid[0, 0] = 0, True  # a block that sees no context (flex's part is empty: lse -inf)
    anchors[1, -1], valid[1, -1] = 0, False  # a padding block
    feats = torch.randn(2, S, 5 * dc.hidden_size, device="cuda")
    emb = torch.randn(2, N * B, dc.hidden_size, device="cuda")
    ctx = torch.arange(S, device="cuda")[None].expand(2, -1)
    rows = valid.repeat_interleave(B, dim=1)[..., None]  # padding rows carry no loss (and differ between paths)
    outs, grads = [], []
    for make in (flex_block_mask, dense_mask):
        masks = {t: make(anchors, valid, seq_len=S, block_size=B,
                         sliding_window=window if t == "sliding_attention" else None) for t in set(layer_types)}
        d.zero_grad()
        h = d(feats, emb, batch.position_ids, ctx, masks) * rows
        (h.float() * torch.linspace(-1, 1, h.shape[-1], device="cuda")).sum().backward()
        outs.append(h.detach())
        grads.append(torch.cat([p.grad.flatten() for p in d.parameters()]))
    assert torch.isfinite(grads[0]).all()
    assert torch.allclose(outs[0], outs[1], atol=2e-4, rtol=1e-3), (outs[0] - outs[1]).abs().max()
    assert torch.allclose(grads[0], grads[1], atol=2e-3, rtol=1e-3), (grads[0] - grads[1]).abs().max()


def test_compiled_ce_epilogue_matches_eager():
    from dflash_lab.drafter import step

    logits = torch.randn(512, 1000, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.randint(0, 1000, (512,), device="cuda")
    w = torch.rand(512, device="cuda")
    a = step._ce_chunk(logits, y, w)
    b = step._ce_chunk_fn(logits.device)(logits, y, w)
    assert torch.allclose(a[0], b[0], rtol=1e-4)
    assert (a[1] == b[1]).float().mean() > 0.999
    assert torch.allclose(a[2].float(), b[2].float(), atol=1e-2, rtol=1e-2)


def test_compile_drafter_under_our_capture():
    plain, compiled = _engine(("cuda:0",)), _engine(("cuda:0",), compile_drafter=True)
    lp, _, _ = _run(plain, steps=3)
    lc, _, _ = _run(compiled, steps=3)
    m = compiled.metrics()
    assert compiled.workers[0].graphed.mode == "graph", compiled.workers[0].graphed.status()
    assert m["recompiles_after_first_step"] == 0 and m["compiled_graphs"] >= 1
    assert lc == pytest.approx(lp, rel=1e-3)
    plain.shutdown(), compiled.shutdown()


@two_gpus
def test_two_gpus_equal_one_gpu():
    l1, g1, p1 = _run(_engine(("cuda:0",)))
    two = _engine(("cuda:0", "cuda:1"))
    l2, g2, p2 = _run(two)
    assert all(w.graphed.mode == "graph" for w in two.workers)
    assert l1 == pytest.approx(l2, rel=1e-5)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    # AdamW normalises each gradient element: near-zero ones turn fp32 summation-order noise into ~1e-4 updates
    assert torch.allclose(p1, p2, rtol=1e-4, atol=2e-4)
    two.shutdown()


@two_gpus
def test_split_target_gpu0_drafter_gpu1_with_prefetch():
    l1, _, p1 = _run(_engine(("cuda:0",)), steps=5)
    split = _engine(("cuda:1",), target_devices=("cuda:0",))
    l2, _, p2 = _run(split, steps=5)
    m = split.metrics(tokens_per_s=1e4)
    assert l1 == pytest.approx(l2, rel=1e-5) and torch.allclose(p1, p2, rtol=1e-5, atol=1e-5)
    assert 0 <= m["drafter_wait_frac"] <= 1 and m["bottleneck"] in ("target", "drafter", "balanced")
    split.shutdown()


# ---------------------------------------------------------------------------------------------------------------
# perf: mixed sliding/full layers with two windows compiled under our capture; FP8; fused optimizer
# ---------------------------------------------------------------------------------------------------------------

MIXED = dict(layer_types=("sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                          "full_attention"), sliding_window=64, layer_windows=(64, None, 128, 64, None))


def _mixed_engine(devices, **kw):
    return bench_tiny_engine(devices, seq_len=S, num_anchors=N, block_size=B, batch_size=len(devices), drafter=MIXED,
                             **MIXED, **kw)


def _mixed_run(engine, steps=4):
    losses, grads = [], []
    for s in range(steps):
        batch = synthetic_batch(s, batch_size=len(engine.workers), seq_len=S, num_anchors=N, block_size=B,
                                vocab_size=1024, mask_token_id=1023, gamma=7.0)
        losses.append(engine.step(batch, step=s, lr=1e-3)["loss"].item())
        grads.append(engine.workers[0].flat_grad.float().cpu().clone())
    return losses, grads


@pytest.mark.parametrize("devices", [("cuda:0",), pytest.param(("cuda:0", "cuda:1"), marks=two_gpus)])
def test_mixed_windows_compiled_under_capture_no_recompiles_equal_to_eager(devices):
    eager = _mixed_engine(devices, cuda_graphs=False)
    le, ge = _mixed_run(eager)
    eager.shutdown()
    compiled = _mixed_engine(devices, compile_drafter=True)
    assert set(compiled.workers[0].mask_windows) == {"sliding_attention", "sliding_attention_128", "full_attention"}
    lc, gc = _mixed_run(compiled, steps=6)  # anchors (and all three BlockMasks) change every step
    m = compiled.metrics()
    assert all(w.graphed.mode == "graph" and not w.graphed.fallbacks for w in compiled.workers), \
        [w.graphed.status() for w in compiled.workers]
    assert m["recompiles_after_first_step"] == 0 and m["graph_breaks"] == 0, m
    assert lc[:4] == pytest.approx(le, rel=1e-3)
    for a, b in zip(gc, ge):
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-5), (a - b).abs().max()
    compiled.shutdown()


def test_fp8_target_features_error_per_layer():
    from dflash_lab.target import fp8
    from dflash_lab.target.features import FeatureExtractor

    model = load_targets("bench:tiny", ["cuda:0"], dtype=torch.bfloat16)[0]
    ids = torch.randint(0, 1024, (2, S), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    layers = (1, 3, 5)
    ref = FeatureExtractor(model, layers)(ids)
    got = FeatureExtractor(model, layers, fp8=True)(ids)
    err = fp8.feature_error(ref, got, layers)
    print("fp8 feature error vs bf16:", err)
    for layer, e in err.items():
        assert e["rel_err"] < 0.1 and e["cosine"] > 0.995, (layer, e)


@pytest.mark.parametrize("compile_drafter,weight_grad", [(False, False), (True, False), (False, True)])
def test_fp8_engine_under_capture_close_to_bf16(compile_drafter, weight_grad):
    ref = _engine(("cuda:0",), dtype="bfloat16", compile_drafter=compile_drafter)
    lr_, _, _ = _run(ref, steps=4)
    ref.shutdown()
    eng = _engine(("cuda:0",), dtype="bfloat16", compile_drafter=compile_drafter, target_fp8=True, drafter_fp8=True,
                  drafter_fp8_weight_grad=weight_grad)
    lf, _, _ = _run(eng, steps=4)
    m = eng.metrics()
    assert eng.workers[0].graphed.mode == "graph" and eng.targets[0].graphed.mode == "graph"
    assert m.get("recompiles_after_first_step", 0) == 0
    assert lf == pytest.approx(lr_, rel=0.03) and lf != lr_
    eng.shutdown()


def test_fused_optimizer_on_cuda_matches_unfused():
    from dflash_lab.train.optim import MasterAdamW

    g = torch.Generator("cuda").manual_seed(0)
    shapes = [(256, 128), (128,), (384, 256)]
    runs = []
    for fused in (None, False):  # None = the CUDA default (fused)
        params = [torch.nn.Parameter((torch.randn(s, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
                                      * 0.1).bfloat16()) for i, s in enumerate(shapes)]
        opt = MasterAdamW(params, lr=1e-2, weight_decay=0.01, fused_clip=fused)
        assert opt.fused_clip is (fused is None)
        flat = torch.zeros(sum(p.numel() for p in params), device="cuda", dtype=torch.bfloat16)
        for step in range(6):
            g.manual_seed(step)
            flat.copy_(torch.randn(flat.shape, device="cuda", generator=g))
            off = 0
            for p in params:
                p.grad = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
            opt.step(1e-2, 1.0)
        runs.append(torch.cat([m.detach().flatten() for m in opt.masters]))
    assert torch.allclose(runs[0], runs[1], rtol=1e-5, atol=1e-6), (runs[0] - runs[1]).abs().max()


def test_compiled_target_under_capture_matches_eager_target():
    plain = _engine(("cuda:0",), dtype="bfloat16")
    lp, _, _ = _run(plain, steps=3)
    plain.shutdown()
    eng = _engine(("cuda:0",), dtype="bfloat16", compile_target=True)
    lc, _, _ = _run(eng, steps=3)
    m = eng.metrics()
    assert eng.targets[0].graphed.mode == "graph", eng.targets[0].graphed.status()
    assert m["recompiles_after_first_step"] == 0 and m["graph_breaks"] == 0, m
    assert lc == pytest.approx(lp, rel=1e-2)
    eng.shutdown()


def test_float8_feature_store_round_trip_on_the_gpu():
    """bf16 features of the SmolLM2 width through an E4M3 store on CUDA: the bytes-as-uint8 copies and the
    dequantisation run there, and each element comes back within E4M3's half-ulp (1/16) of itself."""
    from dflash_lab.train.feature_store import FeatureStore

    dev = torch.device("cuda:0")
    S_, groups, H = 320, 5, 576
    store = FeatureStore(gib=0.01, seq_len=S_, width=groups * H, dtype=torch.bfloat16, device=dev, storage="float8",
                         groups=groups)
    feats = (torch.randn(4, S_, groups * H, device=dev) * 3).to(torch.bfloat16)
    keys = [bytes([i]) * 16 for i in range(4)]
    computed = store.put(keys, feats).clone()  # what the step reads on the miss: the features as stored
    back = store.gather(store.lookup(keys))
    assert back.dtype == torch.bfloat16 and back.device == feats.device
    assert torch.equal(computed, back)  # a hit and a miss give the step the same features, bit for bit
    x = feats.float()
    scale = x.view(4, S_, groups, H).abs().amax(-1, keepdim=True) / 448.0
    bound = x.abs() / 16 + (scale * 2**-10).expand(4, S_, groups, H).reshape(x.shape) + x.abs() / 128  # + bf16's
    assert bool(((back.float() - x).abs() <= bound).all())


def test_a_feature_store_with_a_host_tier_on_the_gpu_gathers_exactly_batch_after_batch():
    """4 windows on the GPU, 12 in host memory: 50 batches gathered back to back, each mixing GPU and host rows,
    with no host sync between them (each kept by a clone queued on the stream, compared only at the end: a pinned
    staging buffer written again before its copy to the GPU ran would show as a wrong batch), and a GPU-only batch."""
    from dflash_lab.train.feature_store import FeatureStore, row_bytes

    dev = torch.device("cuda:0")
    S_, W = 320, 5 * 576
    store = FeatureStore(gib=4 * row_bytes(seq_len=S_, width=W, dtype=torch.bfloat16) / 2**30, seq_len=S_, width=W,
                         dtype=torch.bfloat16, device=dev, host_rows=12)
    feats = torch.randn(16, S_, W, device=dev).to(torch.bfloat16)
    keys = [bytes([i]) * 16 for i in range(16)]
    for i in range(0, 16, 4):
        store.put(keys[i:i + 4], feats[i:i + 4])
    assert (store.rows, store.host_rows, store.stored) == (4, 12, 16)
    g = torch.Generator().manual_seed(0)
    orders = [torch.randperm(16, generator=g)[:8].tolist() for _ in range(50)]
    got = [store.gather(store.lookup([keys[i] for i in order])).clone() for order in orders]
    assert all(torch.equal(x, feats[order]) for x, order in zip(got, orders))
    assert torch.equal(store.gather(store.lookup(keys[:4])), feats[:4])
    assert store.report()["feature_store_host_share"] > 0.5
