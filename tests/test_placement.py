"""Placement: device names checked against what is visible, layouts, and memory estimates checked before loading."""

import pytest
import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.train.placement import (PlacementError, check_placement, drafter_num_parameters,
                                  gpus, make_placement, target_num_parameters)
from dflash_lab.target.load import load_target_config


@pytest.fixture
def two_fake_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)


def test_gpu_lists():
    assert gpus("0-4") == tuple(f"cuda:{i}" for i in range(5))
    assert gpus("0,2") == ("cuda:0", "cuda:2") and gpus(3) == ("cuda:3",) and gpus([5, 6]) == ("cuda:5", "cuda:6")
    with pytest.raises(PlacementError, match="has 'x', which is not a GPU index"):
        gpus("0,x")


def test_layouts(two_fake_gpus):
    co = make_placement(("cuda:0", "cuda:1"))
    assert co.colocated and co.mode == "colocated" and co.num_gpus == 2 and "colocated" in co.describe()
    split = make_placement(gpus("5-7"), gpus("0-4"))
    assert not split.colocated and split.num_gpus == 8 and "5 target replica(s)" in split.describe()
    assert make_placement(("cpu", "cpu")).colocated and not make_placement(("cpu", "cpu"), ("cpu",)).colocated


def test_device_errors_name_the_fix(two_fake_gpus, monkeypatch):
    with pytest.raises(PlacementError, match=r"cuda:9 does not exist: 8 GPU\(s\) are visible.*cuda:0..cuda:7"):
        make_placement(("cuda:9",))
    with pytest.raises(PlacementError, match="names \\['cuda:1'\\] more than once: one drafter worker per GPU"):
        make_placement(("cuda:1", "cuda:1"))
    with pytest.raises(PlacementError, match="share \\['cuda:1'\\].*colocate.*disjoint"):
        make_placement(("cuda:1", "cuda:2"), ("cuda:0", "cuda:1"))
    with pytest.raises(PlacementError, match="mix CPU and GPU"):
        make_placement(("cpu",), ("cuda:0",))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PlacementError, match="no CUDA GPU is visible.*notebooks: -y 'gpus: \\[\\]'; Python: devices=\\('cpu',\\)"):
        make_placement(("cuda:0",))


def test_parameter_counts_match_the_published_models():
    tc = load_target_config("bench:qwen3-8b")
    assert target_num_parameters(tc) == 8_190_735_360  # Qwen3-8B: 8.19B
    dc = DrafterConfig.from_target(tc)
    assert drafter_num_parameters(dc) == 1_048_626_432  # ~1.05B (5 x ~193M layers + 84M fc)
    big = load_target_config("bench:qwen3-32b")
    assert 32.0e9 < target_num_parameters(big) < 33.0e9


def test_memory_check_before_loading(two_fake_gpus):
    tc = load_target_config("bench:qwen3-8b")
    dc = DrafterConfig.from_target(tc)
    kw = dict(target_config=tc, drafter_config=dc, seq_len=3072, num_anchors=512)
    free = {"cuda:0": 140e9, "cuda:1": 20e9}
    info = lambda dev: (free[dev], 150e9)  # noqa: E731
    report = check_placement(make_placement(("cuda:0",)), batch_size=1, mem_get_info=info, **kw)
    # measured on an H200: 37.5 GB peak (CUDA graphs), 41 GB eager, 55 GB (51 GiB) in another run; the estimate
    # (memory_model.py, shared with preflight: 60.7 GB with slack and context) must not be below that
    assert 55 < report["cuda:0"]["need_gb"] < 65 and report["cuda:0"]["target_gb"] > 16.3
    with pytest.raises(PlacementError) as e:
        check_placement(make_placement(("cuda:1",)), batch_size=1, mem_get_info=info, **kw)
    msg = str(e.value)
    assert "cuda:1 needs ~" in msg and "has 20 GB free" in msg and "split the target and the drafter" in msg
    # split: the drafter GPU also holds frozen copies of the embedding and head (2 x 1.24 GB)
    split = check_placement(make_placement(("cuda:1",), ("cuda:0",)), batch_size=1,
                            mem_get_info=lambda d: (140e9, 150e9), **kw)
    assert split["cuda:1"]["drafter_gb"] > report["cuda:0"]["drafter_gb"] + 2.4
    with pytest.raises(PlacementError, match="batch_size=3 does not split evenly over 2 drafter workers"):
        check_placement(make_placement(("cuda:0", "cuda:1")), batch_size=3, mem_get_info=info, **kw)


def test_drafter_estimate_grows_with_anchors(two_fake_gpus):
    tc = load_target_config("bench:qwen3-8b")
    dc = DrafterConfig.from_target(tc)
    kw = dict(target_config=tc, drafter_config=dc, seq_len=3072, batch_size=1, mem_get_info=lambda d: (1e12, 1e12))
    small = check_placement(make_placement(("cuda:1",), ("cuda:0",)), num_anchors=128, **kw)["cuda:1"]["need_gb"]
    large = check_placement(make_placement(("cuda:1",), ("cuda:0",)), num_anchors=1024, **kw)["cuda:1"]["need_gb"]
    assert large > small + 8
    assert small * 1e9 > 16 * drafter_num_parameters(dc)  # weights + master + AdamW + grads at least


def test_a_feature_store_counts_on_the_target_device(two_fake_gpus):
    """feature_store_gib is device memory of the target's GPU: it enters the estimate before anything loads, and a
    store that does not fit is refused there, naming the device, not as an out-of-memory error minutes later."""
    tc = load_target_config("bench:qwen3-8b")
    dc = DrafterConfig.from_target(tc)
    kw = dict(target_config=tc, drafter_config=dc, seq_len=3072, num_anchors=512, batch_size=1,
              mem_get_info=lambda d: (140e9, 150e9))
    base = check_placement(make_placement(("cuda:1",), ("cuda:0",)), **kw)
    stored = check_placement(make_placement(("cuda:1",), ("cuda:0",)), feature_store_bytes=40 * 2**30, **kw)
    grown = stored["cuda:0"]["target_gb"] - base["cuda:0"]["target_gb"]
    assert abs(grown - 40 * 2**30 / 1e9) <= 0.11  # the whole store (GB rounded to 0.1), on the target's GPU only
    assert stored["cuda:1"]["need_gb"] == base["cuda:1"]["need_gb"]
    with pytest.raises(PlacementError, match="cuda:0 needs ~.*lower feature_store_gib"):
        check_placement(make_placement(("cuda:1",), ("cuda:0",)), feature_store_bytes=130 * 2**30, **kw)


def test_a_feature_store_larger_than_the_room_is_fitted_not_refused(two_fake_gpus):
    """A run asks more windows than its GPU holds beside everything else (the long recipe's ~56k SmolLM2 windows,
    ~96 GiB, on an 80 GB card): it keeps as many whole windows as fit with RESERVE_BYTES to spare, the same on every
    target replica, and runs; a store that fits keeps every window; no room at all leaves no store."""
    from dflash_lab.train.feature_store import RESERVE_BYTES, row_bytes

    tc = load_target_config("bench:qwen3-8b")
    dc = DrafterConfig.from_target(tc)
    row = row_bytes(seq_len=320, width=5 * 576, dtype=torch.bfloat16)
    assert row == 1_843_200  # 1.76 MiB: SmolLM2's five target layers x 576 at seq 320
    kw = dict(target_config=tc, drafter_config=dc, seq_len=320, num_anchors=64, batch_size=2, store_row_bytes=row)
    free = {"cuda:0": 80e9, "cuda:1": 70e9}
    info = lambda d: (free[d], 81e9)  # noqa: E731
    rest = check_placement(make_placement(("cuda:0", "cuda:1")), mem_get_info=lambda d: (1e12, 1e12),
                           **{k: v for k, v in kw.items() if k != "store_row_bytes"})
    report = check_placement(make_placement(("cuda:0", "cuda:1")), feature_store_bytes=56_000 * row,
                             mem_get_info=info, **kw)
    rows = report["cuda:0"]["feature_store_rows"]
    assert isinstance(rows, int)  # free memory may come as a float (a fake, or GB arithmetic)
    assert rows == report["cuda:1"]["feature_store_rows"]  # the GPU with less room sets both
    room = 70e9 - rest["cuda:1"]["need_gb"] * 1e9 - RESERVE_BYTES  # need_gb is rounded to 0.1 GB
    assert abs(rows - room / row) < 0.06e9 / row + 1 and 0 < rows < 56_000
    assert report["cuda:1"]["need_gb"] * 1e9 <= 70e9 - RESERVE_BYTES + 0.06e9  # fits with the reserve to spare
    fits = check_placement(make_placement(("cuda:0",)), feature_store_bytes=10_000 * row, mem_get_info=info, **kw)
    assert fits["cuda:0"]["feature_store_rows"] == 10_000
    alone = check_placement(make_placement(("cuda:0",)), mem_get_info=lambda d: (1e12, 1e12),
                            **{k: v for k, v in kw.items() if k != "store_row_bytes"})["cuda:0"]["need_gb"] * 1e9
    none = check_placement(make_placement(("cuda:0",)), feature_store_bytes=10_000 * row,
                           mem_get_info=lambda d: (alone + 2**30, 81e9), **kw)
    assert none["cuda:0"]["feature_store_rows"] == 0  # the run itself still fits: it runs without a store


def test_the_split_attention_adds_what_its_backward_keeps(monkeypatch):
    """Flex at short windows (model.attend_blocks) keeps, per layer and draft slot and head, the block's own fp32
    probabilities, two fp32 lse values and two fp32 outputs for the merge: the recipe shape (seq 320, 64 anchors, 9
    heads of 64, 3 layers) counts 5.38 MB a window a layer (the H100 measured +0.52 GB at batch 32, 3 layers)."""
    from dflash_lab.drafter import blocks
    from dflash_lab.train.memory_model import drafter_activation_bytes

    dc = DrafterConfig.from_target(load_target_config("bench:smollm2-135m"), num_draft_layers=3, block_size=16,
                                   mask_token_id=0)
    kw = dict(batch=32, seq_len=320, num_anchors=64, dtype_bytes=2, chunk_size=4096, backend="flex",
              fused_norms=True)
    split = drafter_activation_bytes(dc, **kw)
    monkeypatch.setattr(blocks, "SPLIT_MAX_SEQ_LEN", 0)
    single = drafter_activation_bytes(dc, **kw)
    per_window_layer = 9 * 1024 * (4 * 16 + 8 + 8 * 64)
    assert per_window_layer == 5_382_144
    assert split - single == 32 * (3 + 1) * per_window_layer  # every layer, and one more of gradient transients
