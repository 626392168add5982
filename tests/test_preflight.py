"""Pre-flight: exact parameter counts and optimizer memory, per-device layout, tokens/steps/epochs, cache disk, ETA,
and a clear warning when the plan does not fit (no weights loaded, no GPU needed)."""

import pytest
import torch

from dflash_lab.config import TrainConfig
from dflash_lab.data.tokenize import TokenizedData
from dflash_lab.workflows.preflight import GIB, config_param_count, estimate, preflight, safetensors_param_count


def qwen3_8b_config():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                       max_position_embeddings=40960, rope_theta=1_000_000.0)


def fake_data(n: int, seq_len: int, length: int, supervised: int) -> TokenizedData:
    """n samples of `length` real tokens with `supervised` of them in the loss (only the shapes matter here)."""
    mask = torch.zeros(n, seq_len, dtype=torch.bool)
    mask[:, :supervised] = True
    return TokenizedData(torch.zeros(n, seq_len, dtype=torch.int32), mask, torch.full((n,), length))


PAPER = dict(target="Qwen/Qwen3-8B", devices=("cuda:0",), seq_len=3072, num_anchors=512, batch_size=1,
             steps=6000, mask_token_id=151669, feature_store_gib=0.0)  # the run alone: no store fitted beside it


def test_qwen3_8b_paper_shape_counts_and_memory():
    cfg = TrainConfig(**PAPER)
    data = fake_data(1000, 3072, 1500, 1000)
    p = estimate(cfg, data=data, target_config=qwen3_8b_config(), tokens_per_s=11_000, gpu_memory_gib=139.8)
    assert p.target_params == config_param_count(qwen3_8b_config()) == 8_190_735_360  # Qwen3-8B: 8.19B
    assert 1.04e9 < p.drafter_params < 1.06e9  # the method doc: ~1.05B for the Qwen3-8B drafter
    (gpu,) = p.devices
    assert gpu.items["target weights"] == 2 * p.target_params  # bf16
    assert gpu.items["drafter weights+grads"] == 4 * p.drafter_params  # bf16 weights + bf16 grads
    assert gpu.items["fp32 master + AdamW m, v"] == 12 * p.drafter_params
    assert gpu.items["CUDA context"] == GIB
    assert 40 * GIB < gpu.total < 80 * GIB and gpu.fits and p.fits and not p.warnings  # peer measured 51 GiB here
    assert p.samples == 1000 and p.steps_per_epoch == 1000 and p.epochs == 6.0
    assert p.tokens_per_epoch == 1_500_000 and p.supervised_tokens_per_epoch == 1_000_000
    assert p.feature_cache_bytes == 1_500_000 * 5 * 4096 * 2 + 1_500_000 * 4  # 5 layers x H, bf16
    assert p.eta_seconds == pytest.approx(6000 * 3072 / 11_000)
    text = str(p)
    assert "cuda:0:" in text and "[ok]" in text and "ETA: 0h27m55s at 11,000 tokens/s (given)" in text
    html = p._repr_html_()
    assert "<table>" in html and "target weights" in html and "cuda:0" in html
    assert p.to_dict()["devices"]["cuda:0"]["total_gib"] == pytest.approx(gpu.total / GIB)


def test_warns_clearly_when_the_plan_does_not_fit():
    cfg = TrainConfig(**{**PAPER, "num_anchors": 3000})
    p = estimate(cfg, data=fake_data(8, 3072, 3000, 2000), target_config=qwen3_8b_config(), gpu_memory_gib=80)
    assert not p.fits and len(p.warnings) == 1
    w = p.warnings[0]
    assert w.startswith("cuda:0 needs ~") and "has 80.0 GiB: the plan will not fit. Fix: lower num_anchors" in w
    assert "DOES NOT FIT" in str(p) and "warning" in p._repr_html_()
    assert "ETA: unknown (pass tokens_per_s" in str(p)
    small = estimate(cfg.replace(num_anchors=256), data=fake_data(8, 3072, 3000, 2000),
                     target_config=qwen3_8b_config(), gpu_memory_gib=80)
    big = p.devices[0].items["drafter activations"]
    assert small.fits and small.devices[0].items["drafter activations"] < big / 4  # grows with anchors


def test_separate_target_gpu_and_two_drafter_workers():
    cfg = TrainConfig(**{**PAPER, "devices": ("cuda:0", "cuda:1"), "target_devices": ("cuda:2",), "batch_size": 2})
    p = estimate(cfg, data=fake_data(100, 3072, 1000, 500), target_config=qwen3_8b_config(),
                 gpu_memory_gib={"cuda:0": 80, "cuda:1": 80, "cuda:2": 40})
    by = {d.device: d for d in p.devices}
    assert set(by) == {"cuda:0", "cuda:1", "cuda:2"}
    assert "target weights" in by["cuda:2"].items and "target weights" not in by["cuda:0"].items
    assert by["cuda:0"].items["features (copied in)"] == 1 * 3072 * 5 * 4096 * 2  # micro-batch 1 per worker
    assert by["cuda:0"].total == by["cuda:1"].total and by["cuda:2"].capacity == 40 * GIB
    assert p.steps_per_epoch == 50


@pytest.fixture(scope="module")
def tiny_cfg():
    return TrainConfig(target="tiny", seq_len=128, batch_size=2, num_anchors=4, block_size=8, steps=50)


def test_tiny_target_counted_from_safetensors_headers_and_data_tokenized(tiny_cfg):
    from dflash_lab.target.load import load_target, resolve_target_path

    model = load_target("tiny")
    n = sum(p.numel() for p in model.parameters())
    assert safetensors_param_count(resolve_target_path("tiny")) == n == config_param_count(model.config)
    p = estimate(tiny_cfg, tokens_per_s=1000.0)  # tokenizes the tiny data itself
    assert p.target_params == n and p.target_params_source == "safetensors headers"
    assert p.samples > 1000 and p.steps_per_epoch == p.samples // 2
    (cpu,) = p.devices
    assert cpu.device == "cpu" and cpu.items["target weights"] == 4 * n and cpu.capacity > 0  # fp32 on CPU, host RAM
    assert cpu.items["fp32 master + AdamW m, v"] == 8 * p.drafter_params  # fp32: the master IS the weight


def test_benchmarked_tokens_per_s_gives_the_eta(tiny_cfg):
    p = preflight(tiny_cfg, benchmark=True, benchmark_steps=4)  # 4 real Trainer steps on the tiny target (CPU)
    assert p.tokens_per_s > 0 and p.tokens_per_s_source == "benchmarked, 4 steps"
    assert p.eta_seconds == pytest.approx(50 * 2 * 128 / p.tokens_per_s)
    assert "(benchmarked, 4 steps)" in str(p)


def test_a_feature_store_counts_the_datas_windows_and_one_beyond_the_room_is_fitted_not_a_failure():
    """The store is counted as the data's windows (not the GiB asked); one larger than the room beside the run
    is a warning with the GiB the run will keep, and the plan still fits."""
    from dflash_lab.train.feature_store import RESERVE_BYTES, row_bytes

    cfg = TrainConfig(**{**PAPER, "seq_len": 512, "num_anchors": 64, "feature_store_gib": 500.0})
    row = row_bytes(seq_len=512, width=5 * 4096, dtype=torch.bfloat16)  # 20 MiB a window at this width
    small = estimate(cfg, data=fake_data(100, 512, 400, 200), target_config=qwen3_8b_config(), gpu_memory_gib=139.8)
    (gpu,) = small.devices
    assert gpu.store == 100 * row and gpu.store_kept == 100 * row and small.fits and not small.warnings
    big = estimate(cfg, data=fake_data(6000, 512, 400, 200), target_config=qwen3_8b_config(), gpu_memory_gib=139.8)
    (gpu,) = big.devices
    rest = gpu.total - gpu.store
    kept = (int(139.8 * GIB) - RESERVE_BYTES - rest) // row  # whole windows, 4 GiB to spare, as the run sizes it
    assert gpu.store == 6000 * row and gpu.store_kept == kept * row and 4000 < kept < 6000
    assert big.fits and len(big.warnings) == 1  # the run's own words (prepare.store_note), without its WARNING:
    assert big.warnings[0] == (
        f"feature store: {kept:,} windows on cuda:0 ({kept * row / GIB:.1f} GiB, all the room the GPU has beside the "
        f"run) of the data's 6,000: a batch is served from the store only when it holds all 1 of its windows, about "
        f"{kept / 6000:.1%} of batches here; the target computes the others. Fix: feature_store_host_gib="
        f"{-(-(6000 - kept) * row // GIB)} keeps the other {6000 - kept:,} in host memory (if the machine has it); or "
        f'feature_store_dtype="float8" holds 6,000 in the same GPU memory.')
    hosted = estimate(cfg.replace(feature_store_host_gib=64.0), data=fake_data(6000, 512, 400, 200),
                      target_config=qwen3_8b_config(), gpu_memory_gib=139.8)
    assert hosted.fits and not hosted.warnings  # the host tier takes what the GPU has no room for
    # ... when the job's machine has that memory: with 20 GiB available it keeps 12 GiB (8 stay free), and says so
    small_host = estimate(cfg.replace(feature_store_host_gib=64.0), data=fake_data(6000, 512, 400, 200),
                          target_config=qwen3_8b_config(), gpu_memory_gib=139.8, host_memory_gib=20.0)
    hosted_rows = 12 * GIB // row
    assert small_host.fits and len(small_host.warnings) == 1
    assert small_host.warnings[0].startswith(
        f"feature store: {kept:,} windows on cuda:0 ({kept * row / GIB:.1f} GiB, all the room the GPU has beside the "
        f"run) + {hosted_rows:,} in host memory ({hosted_rows * row / GIB:.1f} GiB) of the data's 6,000")
    assert f"[ok, the feature store kept to {gpu.store_kept / GIB:.2f} GiB]" in str(big)
