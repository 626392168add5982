"""The DSpark heads and the variant seam: names and shapes as vLLM loads them, the table against the config."""

from __future__ import annotations

import pytest
import torch

from dflash_lab.config import ConfigError, DrafterConfig, TrainConfig
from dflash_lab.config.drafter_config import DRAFTER_VARIANTS
from dflash_lab.drafter.dspark import DSparkHeads
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.drafter.variants import VARIANTS, variant_of
from tests.conftest import make_tiny_qwen3


def _dc(**over) -> DrafterConfig:
    kw = dict(num_draft_layers=2, block_size=8, mask_token_id=255, drafter_variant="dspark", markov_rank=16)
    kw.update(over)
    return DrafterConfig.from_target(make_tiny_qwen3().config, **kw)


def test_table_names_match_the_config():
    assert tuple(VARIANTS) == DRAFTER_VARIANTS
    assert all(v.name == k for k, v in VARIANTS.items())
    assert variant_of(_dc()).heads is DSparkHeads and variant_of(_dc(drafter_variant="dflash")).heads is None


def test_heads_have_the_names_and_shapes_vllm_loads():
    full = DFlashDrafter(_dc())
    shapes = {k: tuple(v.shape) for k, v in full.heads.state_dict().items()}
    assert shapes == {"markov_head.markov_w1.weight": (256, 16), "markov_head.markov_w2.weight": (256, 16),
                      "confidence_head.proj.weight": (1, 64 + 16), "confidence_head.proj.bias": (1,)}
    pruned = DFlashDrafter(_dc(draft_vocab_size=100, confidence_head_with_markov=False))
    shapes = {k: tuple(v.shape) for k, v in pruned.heads.state_dict().items()}
    # markov_w1 embeds the previous token in TARGET ids; markov_w2 projects to the DRAFT vocabulary
    assert shapes["markov_head.markov_w1.weight"] == (256, 16) and shapes["markov_head.markov_w2.weight"] == (100, 16)
    assert shapes["confidence_head.proj.weight"] == (1, 64)
    assert DFlashDrafter(_dc(enable_confidence_head=False)).heads.confidence_head is None
    assert DFlashDrafter(_dc(drafter_variant="dflash")).heads is None


def test_backbone_init_is_unchanged_by_the_heads():
    dflash, dspark = DFlashDrafter(_dc(drafter_variant="dflash")), DFlashDrafter(_dc())
    for m in (dflash, dspark):
        m.init_weights(torch.Generator().manual_seed(3))
    for name, p in dflash.named_parameters():
        assert torch.equal(p, dspark.get_parameter(name)), name
    assert torch.count_nonzero(dspark.heads.confidence_head.proj.bias) == 0
    assert 0.015 < float(dspark.heads.markov_head.markov_w1.weight.detach().std()) < 0.025


def test_head_methods_compute_the_published_maps():
    heads = DSparkHeads(_dc(draft_vocab_size=100))
    torch.manual_seed(0)
    for p in heads.parameters():
        p.data.normal_()
    prev = torch.tensor([[3, 7], [250, 0]])
    e = heads.markov_embed(prev)
    assert e.shape == (2, 2, 16) and torch.equal(e[1, 0], heads.markov_head.markov_w1.weight[250])
    bias = heads.markov_bias(e)
    assert bias.shape == (2, 2, 100)
    torch.testing.assert_close(bias[0, 1], heads.markov_head.markov_w2.weight @ e[0, 1])
    hidden = torch.randn(2, 2, 64)
    logit = heads.confidence_logit(hidden, e)
    w, b = heads.confidence_head.proj.weight[0], heads.confidence_head.proj.bias[0]
    torch.testing.assert_close(logit[1, 1], torch.cat([hidden[1, 1], e[1, 1]]) @ w + b)
    assert logit.dtype == torch.float32 and logit.shape == (2, 2)


@pytest.mark.parametrize("over,needle", [
    ({"drafter_variant": "dspark2"}, "unknown drafter variant"),
    ({"markov_rank": 0}, "markov_rank=0"),
])
def test_drafter_config_rejects(over, needle):
    with pytest.raises(ConfigError, match=needle):
        _dc(**over)


@pytest.mark.parametrize("over,needle", [
    ({"drafter_variant": "eagle"}, "unknown drafter variant"),
    ({"drafter_variant": "dspark", "loss_weighting": "dpace"}, "decayed slot weights"),
    ({"drafter_variant": "dspark", "distill_weight": 0.5}, "distill_weight=0.5"),
    ({"dspark_l1_weight": -1.0}, "dspark_l1_weight=-1.0"),
])
def test_train_config_rejects(over, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainConfig(**over)
