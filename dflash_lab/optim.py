"""AdamW with fp32 master weights, cosine schedule with linear warm-up, global grad-norm clipping.

The drafter computes in bf16 on GPUs; the optimiser keeps an fp32 master copy of every parameter, steps it, and
copies it back. On CPU (fp32 compute) the master IS the parameter: no copy, no extra memory.
"""

from __future__ import annotations

import math

import torch


def lr_at(step: int, *, peak: float, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up to `peak`, then cosine to min_ratio*peak."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class MasterAdamW:
    """AdamW over fp32 masters of (possibly bf16) model parameters."""

    def __init__(self, params, *, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p if p.dtype == torch.float32 else p.detach().float().clone().requires_grad_(True)
                        for p in self.params]
        fused = all(p.device.type == "cuda" for p in self.masters)
        self.inner = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps,
                                       fused=fused or None)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for m in self.masters:
            m.grad = None

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.params]

    def step(self, lr: float, grad_clip: float) -> torch.Tensor:
        """Move grads to the masters, clip, step, copy back. Returns the pre-clip grad norm (a tensor: no sync)."""
        for p, m in zip(self.params, self.masters):
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()
        if grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.masters, grad_clip, foreach=True)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m.grad) for m in self.masters
                                                         if m.grad is not None]))
        for g in self.inner.param_groups:
            g["lr"] = lr
        self.inner.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if m is not p:
                    p.copy_(m)
        return norm

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def master_state(self) -> list[torch.Tensor]:
        return self.masters
