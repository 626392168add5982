"""Compiled drafters on CPU: a drafter mixing full and sliding layers with two distinct windows, compiled (inductor) in
several worker threads, has zero recompiles after the first step, zero graph breaks, and the loss and gradients of
the eager drafter; the window is data of the mask (one flex compile for every window); per-layer windows are
validated, refused at export, and CUDAGraph Trees modes are refused at config time."""

import pytest
import torch

from dflash_lab.benchmarks.step import synthetic_batch
from dflash_lab.drafter.blocks import dense_mask, flex_block_mask
from dflash_lab.config import ConfigError, DrafterConfig, TrainConfig
from dflash_lab.config.windows import window_masks
from dflash_lab.train.engine_build import build_engine
from dflash_lab.evaluation.export import export_config
from dflash_lab.train.placement import make_placement
from tests.conftest import make_tiny_qwen3

S, N, B = 64, 4, 8
TYPES = ("sliding_attention", "full_attention", "sliding_attention", "sliding_attention")
WINDOWS = (8, None, 20, 8)  # two distinct windows + a full layer


@pytest.fixture(scope="module")
def target():
    return make_tiny_qwen3(tie=False, layers=8, hidden=64, vocab=256)


def _dc(target, **kw):
    return DrafterConfig.from_target(target.config, num_draft_layers=4, block_size=B, mask_token_id=255,
                                     layer_types=TYPES, sliding_window=8, layer_windows=WINDOWS, **kw)


def _engine(target, devices, **kw):
    cfg = TrainConfig(seq_len=S, num_anchors=N, block_size=B, batch_size=len(devices), devices=devices,
                      mask_token_id=255, num_draft_layers=4, layer_types=TYPES, sliding_window=8,
                      layer_windows=WINDOWS, lr=1e-3, **kw)
    placement = make_placement(cfg.devices, cfg.target_devices)
    return build_engine(cfg, placement, [target] * len(placement.target_devices), _dc(target),
                        target_config=target.config)


def _run(engine, steps):
    losses, grads = [], []
    for s in range(steps):
        batch = synthetic_batch(s, batch_size=len(engine.workers), seq_len=S, num_anchors=N, block_size=B,
                                vocab_size=256, mask_token_id=255, gamma=4.0)
        losses.append(engine.step(batch, step=s, lr=1e-3)["loss"].item())
        grads.append(engine.workers[0].flat_grad.clone())
    return losses, grads


def test_mixed_windows_compiled_in_threads_no_recompiles_and_equal_to_eager(target):
    torch._dynamo.reset()
    eager = _engine(target, ("cpu", "cpu"))
    le, ge = _run(eager, 4)
    eager.shutdown()
    compiled = _engine(target, ("cpu", "cpu"), compile_drafter=True)
    assert set(compiled.workers[0].mask_windows.items()) == {
        ("sliding_attention", 8), ("full_attention", None), ("sliding_attention_20", 20)}
    lc, gc = _run(compiled, 4)  # the anchors (hence every mask) change every step
    m = compiled.metrics()
    compiled.shutdown()
    assert m["compiled_graphs"] >= 1, m
    assert m["recompiles_after_first_step"] == 0, m
    assert m["graph_breaks"] == 0, m
    assert lc == pytest.approx(le, rel=1e-4)
    for a, b in zip(gc, ge):  # inductor reorders the sums: errors scale with the gradient, not with each element
        scale = float(b.abs().max())
        assert scale > 1e-4 and float((a - b).abs().max()) <= 1e-3 * scale, ((a - b).abs().max(), scale)


def test_window_is_data_one_flex_compile_for_every_window():
    """The seed's trap: a window baked into the mask_mod as a Python int is a new dynamo guard per window, so every
    distinct window recompiles the flex kernel. Here one compile serves every sliding window."""
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(lambda q, k, v, m: flex_attention(q, k, v, block_mask=m), backend="eager", dynamic=False)
    g = torch.Generator().manual_seed(0)
    anchors = torch.tensor([[3, 20, 40, 50]])
    valid = torch.ones(1, 4, dtype=torch.bool)
    q = torch.randn(1, 2, N * B, 16, generator=g)
    k = v = torch.randn(1, 2, S, 16, generator=g)  # the context keys: flex's mask covers those
    for window in (8, 20, 33, 47):
        fn(q, k, v, flex_block_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=window))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0


@pytest.mark.parametrize("causal", [False, True])
def test_split_attention_traces_whole_and_equals_the_dense_one(causal):
    """The split attention as a compiled drafter (or its own compile on CUDA) runs it: dynamo traces it as one graph
    (flex with its log-sum-exp, the blocks' own scores, the merge), and the traced function equals one dense
    attention over [context | blocks] on every row of a real block."""
    from torch._dynamo.utils import counters

    from dflash_lab.drafter.model import _attend_blocks_eager, attend

    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(1)
    anchors, valid = torch.tensor([[0, 20, 40, 50]]), torch.tensor([[True, True, True, False]])
    window = 12 if causal else None
    q = torch.randn(1, 4, N * B, 16, generator=g)
    k, v = (torch.randn(1, 2, S + N * B, 16, generator=g) for _ in range(2))
    mask = flex_block_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=window)
    assert mask.seq_lengths == (N * B, S)  # a window this short takes the split
    with torch.no_grad():  # FlexAttention has no backward on CPU
        fn = torch.compile(_attend_blocks_eager, backend="eager", fullgraph=True)
        out = fn(q, (k[:, :, :S], v[:, :, :S]), (k[:, :, S:], v[:, :, S:]), mask, block_size=B, causal=causal)
        ref = attend(q, k, v, dense_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=window))
    assert counters["stats"]["unique_graphs"] == 1 and sum(counters["graph_break"].values()) == 0
    rows = valid.repeat_interleave(B, dim=1)[0]
    torch.testing.assert_close(out[:, :, rows], ref[:, :, rows], rtol=1e-4, atol=1e-4)


def test_masks_differ_per_window_and_keys_follow_the_config(target):
    dc = _dc(target)
    assert dc.windows == WINDOWS
    assert dc.mask_keys == ("sliding_attention", "full_attention", "sliding_attention_20", "sliding_attention")
    assert window_masks(TYPES, 8, WINDOWS) == {"sliding_attention": 8, "full_attention": None,
                                               "sliding_attention_20": 20}
    anchors, valid = torch.tensor([[30, 40, 50, 55]]), torch.ones(1, 4, dtype=torch.bool)
    m8, m20 = (dense_mask(anchors, valid, seq_len=S, block_size=B, sliding_window=w) for w in (8, 20))
    assert int(m8.sum()) < int(m20.sum())  # the wider window sees more context
    single = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=B, mask_token_id=255,
                                       layer_types=("sliding_attention", "full_attention"), sliding_window=8)
    assert single.mask_keys == ("sliding_attention", "full_attention")  # single-window keys unchanged


@pytest.mark.parametrize("windows,needle", [
    ((8, None, 20), "3 entries for 4 draft layers"),
    ((8, 16, 20, 8), "layer 1 is full_attention but has window 16"),
    ((8, None, None, 8), "layer 2 is sliding_attention but has window None"),
    ((8, None, 0, 8), "layer 2 is sliding_attention but has window 0"),
])
def test_layer_windows_rejected_with_field_and_fix(target, windows, needle):
    with pytest.raises(ConfigError) as e:
        DrafterConfig.from_target(target.config, num_draft_layers=4, block_size=B, mask_token_id=255,
                                  layer_types=TYPES, layer_windows=windows)
    assert "DrafterConfig.layer_windows" in str(e.value) and needle in str(e.value) and "Fix:" in str(e.value)
    with pytest.raises(ConfigError, match="TrainConfig.layer_windows"):
        TrainConfig(num_draft_layers=4, layer_types=TYPES, layer_windows=windows)


def test_export_refuses_several_windows_and_keeps_one(target):
    with pytest.raises(ValueError, match="2 distinct sliding windows") as e:
        export_config(_dc(target))
    assert "vLLM, SGLang" in str(e.value) and "Fix:" in str(e.value)
    one = DrafterConfig.from_target(target.config, num_draft_layers=4, block_size=B, mask_token_id=255,
                                    layer_types=TYPES, layer_windows=(12, None, 12, 12))
    out = export_config(one)
    assert out["sliding_window"] == 12 and out["layer_types"] == list(TYPES)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cudagraph_tree_modes_refused_at_config_time(mode):
    with pytest.raises(ConfigError) as e:
        TrainConfig(compile_drafter=True, compile_mode=mode)
    msg = str(e.value)
    assert f"TrainConfig.compile_mode={mode!r}" in msg and "CUDAGraph Trees" in msg and "worker threads" in msg
    assert "max-autotune-no-cudagraphs" in msg and "cuda_graphs=True" in msg


def test_compile_mode_values():
    assert TrainConfig(compile_drafter=True, compile_mode="max-autotune-no-cudagraphs").compile_mode
    with pytest.raises(ConfigError, match="without compile_drafter=True"):
        TrainConfig(compile_drafter=False, compile_mode="default")
    with pytest.raises(ConfigError, match="unknown torch.compile mode"):
        TrainConfig(compile_drafter=True, compile_mode="fast")
    with pytest.raises(ConfigError, match="TrainConfig.target_fp8"):
        TrainConfig(target_fp8=True, feature_cache="/tmp/cache")


def test_compile_drafter_auto_keeps_the_cpu_path_eager(target):
    engine = _engine(target, ("cpu",), compile_drafter="auto")
    assert engine.workers[0].forward_module is engine.workers[0].drafter  # not compiled on CPU
    engine.shutdown()
    with pytest.raises(ConfigError, match="TrainConfig.compile_drafter='yes'"):
        TrainConfig(compile_drafter="yes")


@pytest.mark.parametrize("fp8", [False, True])
def test_compiled_target_layer_loop_equals_eager_without_graph_breaks(fp8):
    from torch._dynamo.utils import counters

    from dflash_lab.target.features import FeatureExtractor

    model = make_tiny_qwen3(tie=False, layers=3, hidden=64, vocab=256)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    ref = FeatureExtractor(model, (0, 2), fp8=fp8)(ids)
    torch._dynamo.reset()
    counters.clear()
    ext = FeatureExtractor(model, (0, 2), fp8=fp8, compile=True)
    first, again = ext(ids), ext(ids)
    assert counters["stats"]["unique_graphs"] == 1 and sum(counters["graph_break"].values()) == 0
    assert torch.allclose(first, ref, rtol=1e-4, atol=1e-5), (first - ref).abs().max()
    assert torch.equal(first, again)
    with pytest.raises(ConfigError, match="TrainConfig.compile_target"):
        TrainConfig(compile_target=True, feature_cache="/tmp/cache")
