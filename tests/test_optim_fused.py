"""Fused clip + AdamW over flat buffers reading bf16 gradients == the unfused reference (fp32
grad copies, clip_grad_norm_, torch AdamW, copy back), on CPU with bf16 parameters as on a GPU."""

import pytest
import torch

from dflash_lab.train.optim import MasterAdamW, flat_view

SHAPES = [(64, 48), (48,), (32, 64), (16,), (80, 16)]


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.1).bfloat16()) for s in SHAPES]


def _grads(step, scale):
    g = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(s, generator=g) * scale).bfloat16() for s in SHAPES]


def _run(fused: bool, steps: int, *, scale: float, clip: float, wd: float, flat: bool, opt=None, params=None,
         start=0):
    params = params if params is not None else _params()
    opt = opt or MasterAdamW(params, lr=1e-2, weight_decay=wd, fused_clip=fused)
    buf = torch.zeros(sum(p.numel() for p in params), dtype=torch.bfloat16)
    norms = []
    for s in range(start, start + steps):
        gs = _grads(s, scale)
        if flat:  # like the engine: every p.grad is a view of one flat buffer
            off = 0
            for p, g in zip(params, gs):
                p.grad = buf[off:off + g.numel()].view_as(p)
                p.grad.copy_(g)
                off += g.numel()
        else:
            for p, g in zip(params, gs):
                p.grad = g.clone()
        norms.append(float(opt.step(lr=1e-2 * (1 - s / 20), grad_clip=clip)))
    return params, opt, norms


@pytest.mark.parametrize("scale,clip,wd,flat", [
    (1.0, 1.0, 0.0, True),  # norm ~ 100: the clip is active every step
    (1e-3, 1.0, 0.0, True),  # norm < clip: no clipping
    (1.0, 0.0, 0.1, True),  # clip off, weight decay on
    (1.0, 1.0, 0.1, False),  # gradients that are not one flat buffer (concatenated)
])
def test_fused_equals_reference_after_steps(scale, clip, wd, flat):
    ref, ref_opt, ref_norms = _run(False, 8, scale=scale, clip=clip, wd=wd, flat=flat)
    fus, fus_opt, fus_norms = _run(True, 8, scale=scale, clip=clip, wd=wd, flat=flat)
    assert fus_opt.fused_clip and not ref_opt.fused_clip
    assert fus_norms == pytest.approx(ref_norms, rel=1e-5)
    for a, b in zip(ref_opt.masters, fus_opt.masters):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
    for a, b in zip(ref, fus):  # bf16 parameters: equal up to one bf16 rounding of the same master
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-4)
    moved = sum(float((m.detach() - p0.detach().float()).abs().sum()) for m, p0 in zip(fus_opt.masters, _params()))
    assert moved > 1e-3  # the test would fail if nothing stepped


def test_flat_view_only_for_back_to_back_storage():
    buf = torch.zeros(10)
    a, b = buf[0:4].view(2, 2), buf[4:10].view(3, 2)
    v = flat_view([a, b])
    assert v is not None and v.shape == (10,) and v.data_ptr() == buf.data_ptr()
    assert flat_view([b, a]) is None and flat_view([a, torch.zeros(6)]) is None


def test_state_dict_round_trip_continues_exactly():
    _, whole, _ = _run(True, 6, scale=1.0, clip=1.0, wd=0.0, flat=True)
    params, first, _ = _run(True, 3, scale=1.0, clip=1.0, wd=0.0, flat=True)
    assert float(first.inner.state_dict()["state"][4]["step"]) == 3  # what dist_checkpoint reads directly
    sd = first.state_dict()
    assert float(sd["state"][0]["step"]) == 3 and sd["state"][0]["exp_avg"].shape == SHAPES[0]
    fresh = MasterAdamW(params, lr=1e-2, fused_clip=True)
    fresh.load_state_dict(sd)
    for m, m0 in zip(fresh.masters, first.masters):
        m.data.copy_(m0)  # what checkpoint.restore_optimizer does
    _run(True, 3, scale=1.0, clip=1.0, wd=0.0, flat=True, opt=fresh, params=params, start=3)
    for a, b in zip(whole.masters, fresh.masters):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_default_is_unfused_on_cpu():
    assert not MasterAdamW([torch.nn.Parameter(torch.zeros(4))], lr=1e-3).fused_clip
    assert not MasterAdamW(_params(), lr=1e-3).fused_clip  # bf16 on CPU: only when asked
