"""One parameter model (model_size.py): preflight, the placement check and the FLOP/MFU count agree, and the closed
forms equal the real modules' parameter counts."""

import pytest
import torch

from dflash_lab import TrainConfig
from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.runs.metrics import flops_per_sequence
from dflash_lab.config.model_size import drafter_matmul_parameters, drafter_parameters, target_parameters
from dflash_lab.train.placement import Placement, check_placement, drafter_num_parameters, target_num_parameters
from dflash_lab.workflows.preflight import estimate
from tests.conftest import make_tiny_qwen3


@pytest.mark.parametrize("layers,types", [(1, ()), (3, ("full_attention", "sliding_attention", "full_attention"))])
def test_closed_forms_equal_the_real_modules(layers, types):
    target = make_tiny_qwen3(tie=False, layers=8, hidden=64, vocab=256)
    assert target_parameters(target.config) == sum(p.numel() for p in target.parameters())
    dc = DrafterConfig.from_target(target.config, num_draft_layers=layers, block_size=8, mask_token_id=255,
                                   layer_types=types, sliding_window=16 if types else None)
    with torch.device("meta"):
        drafter = DFlashDrafter(dc)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    assert drafter_parameters(dc) == sum(p.numel() for p in trainable)
    assert drafter_matmul_parameters(dc) == sum(p.numel() for p in trainable if p.dim() == 2)


def test_preflight_placement_and_flops_agree(tmp_path):
    from dflash_lab.tiny import ensure_tiny_target

    ensure_tiny_target()
    cfg = TrainConfig(target="tiny", seq_len=64, batch_size=2, block_size=8, num_anchors=4, num_draft_layers=2)
    p = estimate(cfg)
    from dflash_lab.train.prepare import prepare_run

    prep = prepare_run(cfg, log=None)
    dc, tc = prep.drafter_config, prep.target_config
    assert p.drafter_params == drafter_num_parameters(dc) == drafter_parameters(dc)
    assert p.target_params == target_num_parameters(tc) == target_parameters(tc)
    # memory: preflight's items and the placement check are one model (memory_model.py): same total per device
    gpu = estimate(cfg.replace(devices=("cuda:0",)), data=prep.data, target_config=tc, gpu_memory_gib=80).devices[0]
    assert gpu.items["fp32 master + AdamW m, v"] == 12 * p.drafter_params
    report = check_placement(Placement(("cuda:0",), ("cuda:0",)), target_config=tc, drafter_config=dc, seq_len=64,
                             num_anchors=4, batch_size=2, mem_get_info=lambda d: (80e9, 80e9))
    assert report["cuda:0"]["need_gb"] == round(gpu.total / 1e9, 1)
    # FLOPs: the drafter's matmuls cost 2 FLOPs per weight per query position forward, 3x with backward
    S, N, B = 64, 4, 8
    flops = flops_per_sequence(target_cfg=tc, drafter_cfg=dc, seq_len=S, num_anchors=N)
    fc = dc.num_target_features * dc.hidden_size ** 2
    matmuls = 3 * (2 * (drafter_matmul_parameters(dc) - fc) * N * B + 2 * fc * S)
    assert matmuls < flops["drafter"] < 1.5 * matmuls  # the rest: attention scores and context k/v projections
