"""Muon: parameter groups by role, one step == torch.optim.Muon + AdamW on a copy, the tiny-target run
learns, exact resume, optimizer switch refused on resume, config errors, two workers == one worker."""

import pytest
import torch

from dflash_lab import TrainConfig
from dflash_lab.runs import checkpoint, rundir
from dflash_lab.config import ConfigError, DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.train.muon import MasterMuon, make_optimizer, matrix_roles
from dflash_lab.train.optim import MasterAdamW
from dflash_lab.train.trainer import Trainer
from tests.conftest import make_tiny_qwen3
from tests.test_engine import _engine, _run


@pytest.fixture(scope="module")
def drafter_config():
    return DrafterConfig.from_target(make_tiny_qwen3(tie=False, layers=8, hidden=64, vocab=256).config,
                                     num_draft_layers=2, block_size=8, mask_token_id=255)


def _drafter(dc, dtype=torch.float32):
    d = DFlashDrafter(dc)
    d.init_weights(torch.Generator().manual_seed(0))
    return d.to(dtype)


def _fake_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


# ---------------------------------------------------------------------------------------------------------------
# groups and one step
# ---------------------------------------------------------------------------------------------------------------

def test_groups_by_role_linear_weights_on_muon_the_rest_on_adamw(drafter_config):
    d = _drafter(drafter_config)
    names = [n for n, p in d.named_parameters() if p.requires_grad]
    opt = MasterMuon(d, lr=1e-3)
    muon = [names[i] for i in opt.muon_index]
    adamw = [names[i] for i in opt.adamw_index]
    # 2 layers x (q, k, v, o, gate, up, down) + fc; 2 layers x (q_norm, k_norm, 2 layer norms) + hidden_norm + norm
    assert (len(muon), len(adamw)) == (15, 10)
    assert sorted(n.split(".")[-2] for n in muon) == sorted(
        ["fc"] + 2 * ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert all(d.get_parameter(n).ndim == 1 for n in adamw) and all(d.get_parameter(n).ndim == 2 for n in muon)
    assert sum(d.get_parameter(n).numel() for n in muon) == sum(
        m.weight.numel() for m in d.modules() if isinstance(m, torch.nn.Linear))
    assert matrix_roles(d).count(True) == 15
    # the optimizer the config names
    assert isinstance(make_optimizer(TrainConfig(optimizer="muon", lr=6e-4), d), MasterMuon)
    assert isinstance(make_optimizer(TrainConfig(lr=6e-4), d), MasterAdamW)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_steps_equal_torch_muon_and_adamw_on_a_copy_with_global_clip(drafter_config, dtype):
    d = _drafter(drafter_config, dtype)
    ref = [p.detach().float().clone().requires_grad_(True) for p in d.parameters()]
    roles = matrix_roles(d)
    lr, clip, wd = 2e-3, 1.0, 0.01
    opt = MasterMuon(d, lr=lr, muon_lr=4e-3, momentum=0.9, weight_decay=wd)
    ref_muon = torch.optim.Muon([r for r, m in zip(ref, roles) if m], lr=4e-3, momentum=0.9, weight_decay=wd,
                                adjust_lr_fn="match_rms_adamw")
    ref_adamw = torch.optim.AdamW([r for r, m in zip(ref, roles) if not m], lr=lr, weight_decay=wd)
    for step, scale in enumerate((1.0, 0.5)):  # the second step has a different lr: muon_lr follows lr's schedule
        _fake_grads(d.parameters(), seed=step)
        for r, p in zip(ref, d.parameters()):
            r.grad = p.grad.float().clone()  # fp32: .float() would alias the grad the clip scales
        norm = opt.step(lr * scale, clip)
        want = torch.nn.utils.clip_grad_norm_(ref, clip)  # ONE clip over all tensors, before both optimizers
        ref_adamw.param_groups[0]["lr"], ref_muon.param_groups[0]["lr"] = lr * scale, 4e-3 * scale
        ref_adamw.step()
        ref_muon.step()
        assert norm.item() == want.item() and norm.item() > 10  # the clip is active (coefficient < 1)
        for m, r in zip(opt.masters, ref):
            assert m.dtype == torch.float32 and torch.equal(m, r)
        for p, m in zip(d.parameters(), opt.masters):  # compute copies refreshed from the fp32 masters
            assert torch.equal(p.detach(), m.detach().to(dtype))


def test_update_rms_is_on_adamw_scale(drafter_config):
    """match_rms_adamw: a Muon step moves each matrix by an RMS of about 0.2 * lr, like AdamW's ~lr-sized steps."""
    d = _drafter(drafter_config)
    before = [p.detach().clone() for p in d.parameters()]
    opt = MasterMuon(d, lr=1e-3)
    _fake_grads(d.parameters(), seed=3)
    opt.step(1e-3, 0.0)
    rms = [(p.detach() - b).pow(2).mean().sqrt().item() / 1e-3 for p, b, m in
           zip(d.parameters(), before, opt.is_matrix) if m]
    assert len(rms) == 15 and all(0.1 < r < 0.3 for r in rms), rms
    adam_rms = [(p.detach() - b).pow(2).mean().sqrt().item() / 1e-3 for p, b, m in
                zip(d.parameters(), before, opt.is_matrix) if not m]
    assert all(r == pytest.approx(1.0, rel=1e-3) for r in adam_rms)  # AdamW's first step: |update| = lr


# ---------------------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, field, fix", [
    (dict(optimizer="sgd"), "optimizer", "use one of ('adamw', 'muon')"),
    (dict(optimizer="muon", muon_lr=0.0), "muon_lr", "leave it None"),
    (dict(optimizer="muon", muon_lr=-1e-3), "muon_lr", "leave it None"),
    (dict(optimizer="muon", muon_momentum=1.0), "muon_momentum", "use 0.95"),
    (dict(muon_lr=1e-3), "muon_lr", 'set optimizer="muon" as well'),
    (dict(muon_momentum=0.9), "muon_momentum", 'set optimizer="muon" as well'),
])
def test_config_errors_name_field_value_and_fix(kw, field, fix):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**kw)
    msg = str(e.value)
    assert f"TrainConfig.{field}=" in msg and fix in msg


def test_config_defaults_are_adamw():
    cfg = TrainConfig()
    assert (cfg.optimizer, cfg.muon_lr, cfg.muon_momentum) == ("adamw", None, 0.95)
    assert TrainConfig.from_dict(TrainConfig(optimizer="muon", muon_lr=1e-3).to_dict()).muon_lr == 1e-3


# ---------------------------------------------------------------------------------------------------------------
# engine: two workers, tiny-target training, resume
# ---------------------------------------------------------------------------------------------------------------

def test_two_workers_equal_one_worker_with_muon():
    """The engine sums the gradients across workers BEFORE optimizer_step, so every replica's Muon sees the global
    gradient and the replicas stay identical. Against one worker only fp32 summation order differs, but Muon's
    Newton-Schulz runs in bf16 (torch's) and turns a 1e-8 gradient difference into bf16 rounding flips: measured
    max weight difference after 3 steps at lr 1e-3 is 2e-4 (AdamW: 8e-7), hence the looser bound."""
    target = make_tiny_qwen3(tie=False, layers=8, hidden=64, vocab=256)
    e1, e2 = _engine(target, ("cpu",), optimizer="muon"), _engine(target, ("cpu", "cpu"), optimizer="muon")
    assert isinstance(e2.workers[1].optimizer, MasterMuon)
    replicas = e2.workers
    l1, g1, p1 = _run(e1, steps=3)
    l2, g2, p2 = _run(e2, steps=3)
    assert l1 == pytest.approx(l2, rel=1e-5) and l1[1] != l1[0]
    assert torch.allclose(g1[0], g2[0], rtol=1e-4, atol=1e-7)  # same weights: summed grads == global grad
    for a, b in zip(g1[1:], g2[1:]):
        assert (a - b).abs().max().item() < 1e-4 < a.abs().max().item()
    assert (p1 - p2).abs().max().item() < 1e-3
    for pa, pb in zip(replicas[0].drafter.parameters(), replicas[1].drafter.parameters()):
        assert torch.equal(pa, pb)  # replicas stay identical without a broadcast


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    from dflash_lab.tiny import ensure_tiny_target, tiny_data_path

    ensure_tiny_target()
    path = tmp_path_factory.mktemp("data") / "train300.jsonl"
    path.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:300]))
    return path


STEPS = 12
SMALL = dict(target="tiny", steps=STEPS, seq_len=64, batch_size=2, block_size=8, num_anchors=4, num_draft_layers=2,
             lr=3e-3, log_every=1, checkpoint_every=4, keep_checkpoints=3, seed=0, optimizer="muon")


def _config(tmp_path, data_file, **kw):
    return TrainConfig(**{**SMALL, "data": str(data_file), "runs_dir": str(tmp_path / "runs"), **kw})


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in rundir.read_jsonl(run_dir / rundir.METRICS_FILE)}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_file):
    """An uninterrupted Muon run on the tiny target: losses and final weights."""
    t = Trainer(_config(tmp_path_factory.mktemp("straight"), data_file), log=lambda *a: None)
    assert isinstance(t.workers[0].optimizer, MasterMuon)
    t.train()
    weights = {k: v.clone() for k, v in t.drafter.state_dict().items()}
    t.close()
    return t.run_dir, _losses(t.run_dir), weights


def test_tiny_target_run_with_muon_learns(straight):
    _, losses, _ = straight
    assert sorted(losses) == list(range(1, STEPS + 1))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (10, 11, 12)) / 3
    assert last < 0.9 * first, (first, last)
    ckpt = checkpoint.load_checkpoint(straight[0])
    momenta = [k for k in ckpt.optimizer if k.startswith("momentum_buffer/")]
    assert len(momenta) == 15 and len([k for k in ckpt.optimizer if k.startswith("exp_avg/")]) == 10
    assert ckpt.state["config"]["optimizer"] == "muon"


def test_resume_is_bit_exact_with_muon(tmp_path, data_file, straight):
    run_dir, losses, weights = straight
    ckpt = str(run_dir / "checkpoints" / "step-0000004")
    more = Trainer(TrainConfig(resume_from=ckpt), log=lambda *a: None, explicit={"resume_from"})
    assert more.config.optimizer == "muon" and more.step_count == 4
    more.train()
    assert more.step_count == STEPS
    again = _losses(more.run_dir)
    assert {s: again[s] for s in range(5, STEPS + 1)} == {s: losses[s] for s in range(5, STEPS + 1)}
    for k, v in more.drafter.state_dict().items():
        assert torch.equal(v, weights[k]), k
    more.close()


def test_resume_under_another_optimizer_is_refused_naming_both(tmp_path, data_file, straight):
    ckpt = str(straight[0] / "checkpoints" / "step-0000004")
    with pytest.raises(ConfigError) as e:
        Trainer(TrainConfig(resume_from=ckpt, optimizer="adamw"), log=lambda *a: None,
                explicit={"resume_from", "optimizer"})
    msg = str(e.value)
    assert "optimizer='muon'" in msg and "optimizer='adamw'" in msg and "resume_from=None" in msg
    with pytest.raises(Exception, match="not Muon"):  # the state itself is checked too (a direct restore)
        MasterMuon(_drafter_like(checkpoint.load_checkpoint(ckpt)), lr=1e-3).load_state_dict(
            {"state": {}, "param_groups": [{"betas": (0.9, 0.999), "params": []}]})


def _drafter_like(ckpt):
    return DFlashDrafter(DrafterConfig(**{k: tuple(v) if isinstance(v, list) else v
                                          for k, v in ckpt.state["drafter_config"].items()}))
