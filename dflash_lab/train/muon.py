"""Muon for the drafter's weight matrices, AdamW for the rest, on fp32 masters (the `optimizer` knob).

Which tensor goes where is decided by ROLE, not by name: the weight of every nn.Linear (q/k/v/o, MLP gate/up/down,
the `fc` that fuses the target features; Fp8TrainLinear is an nn.Linear too) is a hidden 2-D matrix and goes to
`torch.optim.Muon`; everything else (the RMSNorm weights, 1-D) stays on `torch.optim.AdamW`. The drafter has no
embedding or LM head of its own (they are the target's, frozen), so no 2-D tensor is left out of Muon by exception.
A 5-layer drafter: 36 matrices on Muon, 22 norm vectors on AdamW.

The step keeps MasterAdamW's order and numerics around the update: bf16 grads -> fp32 master grads -> ONE global
grad-norm clip over all masters -> AdamW step + Muon step -> copy the masters into the (bf16) parameters. It runs
in the worker's `optimizer_step`, after the cross-replica gradient sum and OUTSIDE any CUDA graph (the graph
captures forward+backward only, workers.py), so Muon's Newton-Schulz iterations (bf16 matmuls, torch's own) are
never captured. There is no fused flat path here: the ~5 Newton-Schulz matmuls per matrix dominate Muon's cost.

Learning rate: Muon gets torch's `adjust_lr_fn="match_rms_adamw"` (Moonshot's 0.2 * sqrt(max(A, B)) scaling), so
its update has AdamW's RMS and the same lr scale works for both groups. `muon_lr` (None = `lr`) is the Muon group's
peak on that same scale and follows the same warm-up + cosine (scaled by muon_lr / lr); it is NOT Keller Jordan's
0.02-scale Muon lr. Weight decay is `weight_decay` for both groups (decoupled, like AdamW).

Checkpoints keep checkpoint.py's format: masters as `master/<p>`, AdamW state as `exp_avg/<p>`, `exp_avg_sq/<p>`,
`step/<p>`, Muon's as `momentum_buffer/<p>`. The config checks and the refusal to resume under another optimizer are
config/feature_checks.py.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_lab.runs.checkpoint import CheckpointError
from .optim import FP32Masters, MasterAdamW

MUON_ADJUST_LR = "match_rms_adamw"


def make_optimizer(cfg, module: nn.Module):
    """The optimizer `cfg.optimizer` names over `module`'s trainable parameters (the uncompiled drafter)."""
    if cfg.optimizer == "muon":
        return MasterMuon(module, lr=cfg.lr, muon_lr=cfg.muon_lr, momentum=cfg.muon_momentum,
                          weight_decay=cfg.weight_decay)
    return MasterAdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def matrix_roles(module: nn.Module) -> list[bool]:
    """For each trainable parameter of `module` (in `parameters()` order): True if it is an nn.Linear weight of the
    backbone. A variant's heads (drafter/variants.py) stay on AdamW: DSpark's are an embedding, a projection onto
    the vocabulary and a one-row map, none of them a hidden matrix."""
    heads = getattr(module, "heads", None)
    inside = {id(p) for p in heads.parameters()} if heads is not None else set()
    linear = {id(m.weight) for m in module.modules() if isinstance(m, nn.Linear) and id(m.weight) not in inside}
    return [id(p) in linear for p in module.parameters() if p.requires_grad]


class MasterMuon(FP32Masters):
    """Muon (nn.Linear weights) + AdamW (the rest) over fp32 masters; MasterAdamW's interface (params, masters,
    step(lr, grad_clip), state_dict with one index per trainable parameter)."""

    kind = "muon"

    def __init__(self, module: nn.Module, *, lr: float, muon_lr: float | None = None, momentum: float = 0.95,
                 weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8):
        params = [p for p in module.parameters() if p.requires_grad]
        if any(type(p.data) is not torch.Tensor for p in params):
            raise ValueError("Muon needs whole matrices, but the drafter's parameters are sharded (FSDP2 DTensors): "
                             "Newton-Schulz on a shard is not Muon. Fix: optimizer=\"adamw\" with parallel=\"fsdp2\", "
                             "or parallel=\"ddp\".")
        super().__init__(params)
        self.is_matrix = matrix_roles(module)
        self.muon_index = [i for i, m in enumerate(self.is_matrix) if m]
        self.adamw_index = [i for i, m in enumerate(self.is_matrix) if not m]
        if not self.muon_index or not self.adamw_index:
            raise ValueError(f"Muon + AdamW needs both matrices and other tensors; got {len(self.muon_index)} "
                             f"nn.Linear weights and {len(self.adamw_index)} others. Fix: optimizer=\"adamw\".")
        self.muon_lr_scale = 1.0 if muon_lr is None else muon_lr / lr
        self.momentum = momentum
        fused = all(m.device.type == "cuda" for m in self.masters)
        self.adamw = torch.optim.AdamW([self.masters[i] for i in self.adamw_index], lr=lr, betas=betas, eps=eps,
                                       weight_decay=weight_decay, fused=fused or None)
        self.muon = torch.optim.Muon([self.masters[i] for i in self.muon_index], lr=lr * self.muon_lr_scale,
                                     weight_decay=weight_decay, momentum=momentum, adjust_lr_fn=MUON_ADJUST_LR)

    def step(self, lr: float, grad_clip: float) -> torch.Tensor:
        """Grads to the masters, one global clip, AdamW + Muon, copy back. Returns the pre-clip grad norm (a tensor:
        no sync)."""
        norm = self.grads_to_masters_and_clip(grad_clip)  # over ALL masters, before either optimizer
        self.adamw.param_groups[0]["lr"] = lr
        self.muon.param_groups[0]["lr"] = lr * self.muon_lr_scale
        self.adamw.step()
        self.muon.step()
        self.masters_to_params()
        return norm

    # -- state: one index per trainable parameter (train_state.py keys it by name) -------------------------------
    def _groups(self) -> list[tuple[torch.optim.Optimizer, list[int]]]:
        return [(self.adamw, self.adamw_index), (self.muon, self.muon_index)]

    def state_dict(self) -> dict:
        """{"state": {i: per-tensor state}, "param_groups": [AdamW group, Muon group]}, i = index in `masters`."""
        state, groups = {}, []
        for opt, index in self._groups():
            for i in index:
                if self.masters[i] in opt.state:
                    state[i] = dict(opt.state[self.masters[i]])
            groups.append({**{k: v for k, v in opt.param_groups[0].items() if k != "params"}, "params": list(index)})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        """Inverse of state_dict. The groups' `params` lists are not trusted (train_state.restore_optimizer numbers
        them in order): which tensor is in which group is decided by role, here. `muon_momentum` is the config's
        (a resume may change it, like lr)."""
        groups = sd["param_groups"]
        if len(groups) != 2 or "momentum" not in groups[1] or "betas" not in groups[0]:
            raise CheckpointError("the checkpoint's optimizer state is not Muon + AdamW (it has "
                                  f"{len(groups)} param group(s) with {sorted(groups[0])[:6]}...). Fix: resume with "
                                  "the optimizer the checkpoint was trained with (its state.json config.optimizer).")
        for (opt, index), g in zip(self._groups(), groups):
            state = {j: sd["state"][i] for j, i in enumerate(index) if i in sd["state"]}
            hp = {k: (tuple(v) if isinstance(v, list) else v) for k, v in g.items() if k != "params"}
            opt.load_state_dict({"state": state, "param_groups": [{**hp, "params": list(range(len(index)))}]})
        self.muon.param_groups[0]["momentum"] = self.momentum
