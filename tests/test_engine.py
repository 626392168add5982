"""Engine on CPU: threads, no graphs. Multi-worker == single worker on the global batch, split placements with
prefetch, errors that carry the device and step and leave nothing running, metrics, opt-in compile in threads."""

import threading
import time

import pytest
import torch

from dflash_lab.benchmarks.step import synthetic_batch
from dflash_lab.config import DrafterConfig, TrainConfig
from dflash_lab.train.engine import EngineBrokenError, WorkerError
from dflash_lab.train.engine_build import build_engine
from dflash_lab.train.placement import make_placement
from tests.conftest import make_tiny_qwen3

S, N, B = 64, 4, 8


@pytest.fixture(scope="module")
def target():
    return make_tiny_qwen3(tie=False, layers=8, hidden=64, vocab=256)


def _engine(target, devices, target_devices=None, **kw):
    cfg = TrainConfig(seq_len=S, num_anchors=N, block_size=B, batch_size=2, devices=devices,
                      target_devices=target_devices, mask_token_id=255, num_draft_layers=2, lr=1e-3, **kw)
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=B, mask_token_id=255)
    placement = make_placement(cfg.devices, cfg.target_devices)
    models = [target] * len(placement.target_devices)
    # compile_backend="eager": dynamo traces in the worker threads (what can break there) without a C++ compiler
    return build_engine(cfg, placement, models, dc, target_config=target.config, compile_backend="eager")


def _batch(step, b=2):
    return synthetic_batch(step, batch_size=b, seq_len=S, num_anchors=N, block_size=B, vocab_size=256,
                           mask_token_id=255, gamma=4.0)


def _run(engine, steps=2, prefetch=False):
    losses, grads = [], []
    for s in range(steps):
        nxt = _batch(s + 1) if prefetch and engine.prefetches else None
        out = engine.step(_batch(s), step=s, lr=1e-3, next_batch=nxt)
        losses.append(out["loss"].item())
        grads.append(engine.workers[0].flat_grad.clone())
    params = torch.cat([p.detach().flatten() for p in engine.workers[0].drafter.parameters()])
    engine.shutdown()
    return losses, grads, params


def test_two_workers_equal_one_worker_on_the_global_batch(target):
    l1, g1, p1 = _run(_engine(target, ("cpu",)))
    l2, g2, p2 = _run(_engine(target, ("cpu", "cpu")))
    assert l1 == pytest.approx(l2, rel=1e-5)
    for a, b in zip(g1, g2):  # summed gradients of 2 replicas == the single-device gradient
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), (a - b).abs().max()
    assert torch.allclose(p1, p2, rtol=1e-5, atol=2e-6)  # AdamW amplifies fp32 summation-order noise
    assert l1[0] > 0 and l1[1] != l1[0]


def test_split_placement_with_prefetch_matches_colocated(target):
    l1, g1, p1 = _run(_engine(target, ("cpu",)), steps=3)
    split = _engine(target, ("cpu", "cpu"), target_devices=("cpu",))
    assert split.prefetches and not split.colocated
    l2, g2, p2 = _run(split, steps=3, prefetch=True)
    assert l1 == pytest.approx(l2, rel=1e-5)
    assert torch.allclose(p1, p2, rtol=1e-5, atol=2e-6)  # AdamW amplifies fp32 summation-order noise


def test_worker_error_carries_device_and_step_and_nothing_keeps_running(target):
    engine = _engine(target, ("cpu", "cpu"))
    engine.step(_batch(0), step=0, lr=1e-3)
    slow_done = threading.Event()
    fast, slow = engine.workers[1], engine.workers[0]
    orig = slow._forward_backward

    def slow_fb(*a, **k):
        time.sleep(0.3)
        out = orig(*a, **k)
        slow_done.set()
        return out

    def boom(*a, **k):
        raise RuntimeError("injected fault")

    slow._forward_backward, fast._forward_backward = slow_fb, boom
    slow.graphed.fn, fast.graphed.fn = slow_fb, boom
    with pytest.raises(WorkerError) as info:
        engine.step(_batch(1), step=1, lr=1e-3)
    e = info.value
    assert e.device == "cpu" and e.step == 1 and "injected fault" in str(e) and "step 1" in str(e)
    assert slow_done.is_set()  # the caller got the error only after every worker finished
    with pytest.raises(EngineBrokenError, match="stopped after an error.*injected fault.*HINT"):
        engine.step(_batch(2), step=2, lr=1e-3)
    engine.shutdown()


def test_target_error_in_split_placement_names_the_target_replica(target):
    engine = _engine(target, ("cpu",), target_devices=("cpu", "cpu"))
    r = engine.targets[1]
    r.graphed.fn = lambda input_ids: (_ for _ in ()).throw(ValueError("target broke"))
    with pytest.raises(WorkerError, match="target replica on cpu failed at step 0: ValueError: target broke"):
        engine.step(_batch(0), step=0, lr=1e-3, next_batch=_batch(1))
    assert engine.broken is not None
    engine.shutdown()


def test_metrics_split_supply_demand_and_phase_times(target):
    engine = _engine(target, ("cpu", "cpu"), target_devices=("cpu",))
    for s in range(5):
        engine.step(_batch(s), step=s, lr=1e-3, next_batch=_batch(s + 1))
    m = engine.metrics(tokens_per_s=1000.0)
    engine.shutdown()
    assert m["placement"] == "split"
    assert m["target_ms"] > 0 and m["drafter_ms"] > 0 and m["optimizer_ms"] > 0 and m["reduce_ms"] >= 0
    assert 0.0 <= m["target_wait_frac"] <= 1.0 and 0.0 <= m["drafter_wait_frac"] <= 1.0
    assert m["supply_tokens_per_s"] == pytest.approx(2 * S / (m["target_ms"] / 1e3), rel=1e-3)
    assert m["bottleneck"] in ("target", "drafter", "balanced") and "tok/s" in m["balance_hint"]
    assert m["draft_positions_per_s"] == pytest.approx(1000.0 * N * B / S)
    assert m["graph/drafter[0]@cpu"] == "eager: no CUDA graphs on CPU"
    assert "mfu" not in m  # no peak FLOP/s for a CPU


def test_compile_drafter_runs_in_worker_threads_and_counts_graphs(target):
    engine = _engine(target, ("cpu", "cpu"), compile_drafter=True)
    for s in range(3):
        loss = engine.step(_batch(s), step=s, lr=1e-3)["loss"].item()
    m = engine.metrics()
    engine.shutdown()
    assert loss == loss  # finite
    assert m["compiled_graphs"] >= 1 and m["recompiles_after_first_step"] == 0 and m["graph_breaks"] >= 0


@pytest.mark.parametrize("context_only,tiles", [(True, 128), (False, 128), (False, (64, 128))])
@pytest.mark.parametrize("seq_len,window", [(256, None), (200, None), (256, 96)])
def test_block_mask_from_dense_equals_create_block_mask(seq_len, window, context_only, tiles):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from dflash_lab.drafter.blocks import block_mask_from_dense, context_mask, dense_mask, flex_mask_mod

    batch = synthetic_batch(0, batch_size=2, seq_len=seq_len, num_anchors=12, block_size=16, vocab_size=256,
                            mask_token_id=255, gamma=7.0)
    a, v = batch.anchors, batch.anchor_valid
    mod = flex_mask_mod(a, v, seq_len=seq_len, block_size=16, sliding_window=window, context_only=context_only)
    Q, KV = 12 * 16, seq_len + (0 if context_only else 12 * 16)  # the context alone, or [context | blocks]
    ref = create_block_mask(mod, B=2, H=None, Q_LEN=Q, KV_LEN=KV, device="cpu", BLOCK_SIZE=tiles)
    dense = (context_mask if context_only else dense_mask)(a, v, seq_len=seq_len, block_size=16, sliding_window=window)
    ours = block_mask_from_dense(dense, mod, tiles)
    for k in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(ours, k), getattr(ref, k)), k
    n = ref.kv_num_blocks.max()
    assert torch.equal(ours.kv_indices[..., :n].sort(-1).values, ref.kv_indices[..., :n].sort(-1).values)
    q, k_, v_ = (torch.randn(2, 4, Q if i == 0 else KV, 32) for i in range(3))
    assert torch.allclose(flex_attention(q, k_, v_, block_mask=ours), flex_attention(q, k_, v_, block_mask=ref),
                          atol=1e-5)
