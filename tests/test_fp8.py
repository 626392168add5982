"""FP8 row-wise linears: numerics on CPU (torch._scaled_mm runs there at reference speed), the frozen
target's FP8 features against full precision per extracted layer, the trainable drafter linear's gradients, and the
engine with target_fp8 + drafter_fp8 (same parameters, a loss close to bf16's). GPU speed and the bf16 comparison
at a real shape are in tests/test_gpu.py and bench/results/2026-12-01-h200-run5/h200_run5.sh."""

import pytest
import torch

from dflash_lab.target import fp8
from dflash_lab.benchmarks.step import synthetic_batch
from dflash_lab.config import DrafterConfig, TrainConfig
from dflash_lab.train.engine_build import build_engine
from dflash_lab.train.placement import make_placement
from dflash_lab.target.features import FeatureExtractor
from tests.conftest import make_tiny_qwen3

S, N, B = 64, 4, 8


def test_quantize_rows_and_scaled_matmul():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g)
    x[3] *= 1000  # an outlier token keeps its own scale: other rows keep their precision
    w = torch.randn(96, 128, generator=g) * 0.05
    q, s = fp8.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1)
    assert float(q.float().abs().amax()) == pytest.approx(448.0)
    wq, ws = fp8.quantize_rows(w)
    y, ref = fp8.scaled_matmul(q, s, wq, ws, torch.float32), x @ w.t()
    rel_rows = (y - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(rel_rows.max()) < 0.08 and float(rel_rows.mean()) < 0.05


def test_train_linear_same_parameters_and_close_gradients():
    torch.manual_seed(0)
    ref = torch.nn.Linear(128, 96, bias=False)
    lin = torch.nn.Linear(128, 96, bias=False)
    lin.load_state_dict(ref.state_dict())
    odd = torch.nn.Linear(100, 96, bias=False)  # 100 is not a multiple of 16: stays a plain Linear
    module = torch.nn.ModuleDict({"a": lin, "odd": odd})
    assert fp8.fp8_train_linears(module) == 1 and type(odd) is torch.nn.Linear
    assert list(lin.state_dict()) == ["weight"] and isinstance(lin, torch.nn.Linear)
    xa = torch.randn(4, 16, 128, requires_grad=True)
    xb = xa.detach().clone().requires_grad_(True)
    ya, yb = ref(xa), lin(xb)
    assert yb.shape == ya.shape
    assert float((ya - yb).detach().norm() / ya.detach().norm()) < 0.06
    target = torch.randn_like(ya)
    ((ya - target) ** 2).mean().backward()
    ((yb - target) ** 2).mean().backward()
    assert float((xa.grad - xb.grad).norm() / xa.grad.norm()) < 0.08  # FP8 dX
    assert float((ref.weight.grad - lin.weight.grad).norm() / ref.weight.grad.norm()) < 0.08  # bf16-path dW


def test_fp8_weight_gradient_option():
    torch.manual_seed(0)
    ref = torch.nn.Linear(128, 96, bias=False)
    grads = {}
    for wg in (False, True):
        lin = torch.nn.Linear(128, 96, bias=False)
        lin.load_state_dict(ref.state_dict())
        fp8.fp8_train_linears(lin, weight_grad=wg)
        assert lin.fp8_weight_grad is wg
        x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
        lin(x).pow(2).sum().backward()
        grads[wg] = lin.weight.grad
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    ref(x).pow(2).sum().backward()
    for wg, g in grads.items():
        assert float((g - ref.weight.grad).norm() / ref.weight.grad.norm()) < 0.1, wg
    assert not torch.equal(grads[False], grads[True])  # the FP8 dW path is a different computation


def test_frozen_target_features_close_and_bf16_outside_the_scope():
    model = make_tiny_qwen3(tie=False, layers=8, hidden=64, vocab=256)
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits_before = model(ids).logits
    ref = FeatureExtractor(model, (1, 3, 5))(ids)
    ext = FeatureExtractor(model, (1, 3, 5), fp8=True)
    got = ext(ids)
    err = fp8.feature_error(ref, got, (1, 3, 5))
    assert set(err) == {1, 3, 5}
    for layer, e in err.items():
        assert 0 < e["rel_err"] < 0.1 and e["cosine"] > 0.995, (layer, e)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits_before)  # evaluation outside the scope: the exact target
    assert fp8.fp8_frozen_linears(model.model.layers[:6]) == 6 * 7  # q k v o gate up down, idempotent


def _engine(target, **kw):
    cfg = TrainConfig(seq_len=S, num_anchors=N, block_size=B, batch_size=1, devices=("cpu",), mask_token_id=255,
                      num_draft_layers=2, lr=1e-3, **kw)
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=B, mask_token_id=255)
    return build_engine(cfg, make_placement(cfg.devices, None), [target], dc, target_config=target.config)


def test_engine_fp8_loss_close_to_full_precision():
    losses = {}
    for name, kw in {"ref": {}, "fp8": {"target_fp8": True, "drafter_fp8": True}}.items():
        target = make_tiny_qwen3(tie=False, layers=8, hidden=64, vocab=256)
        engine = _engine(target, **kw)
        run = []
        for s in range(3):
            batch = synthetic_batch(s, batch_size=1, seq_len=S, num_anchors=N, block_size=B, vocab_size=256,
                                    mask_token_id=255, gamma=4.0)
            run.append(engine.step(batch, step=s, lr=1e-3)["loss"].item())
        if name == "fp8":
            layers = engine.workers[0].drafter.layers
            assert type(layers[0].mlp.up_proj) is fp8.Fp8TrainLinear
            assert engine.targets[0].extractor.fp8
        engine.shutdown()
        losses[name] = run
    assert losses["fp8"] == pytest.approx(losses["ref"], rel=0.02)
    assert losses["fp8"] != losses["ref"]  # it did run in FP8
