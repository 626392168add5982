"""AdamW with fp32 master weights, cosine schedule with linear warm-up, global grad-norm clipping.

The drafter computes in bf16 on GPUs; the optimiser keeps an fp32 master copy of every parameter, steps it, and
copies it back. On CPU (fp32 compute) the master IS the parameter: no copy, no extra memory.

Fused clip (`fused_clip`, the default for bf16 parameters on CUDA): the masters, exp_avg and exp_avg_sq live in three
flat fp32 buffers; one compiled pointwise kernel reads the bf16 gradients directly (the engine's flat gradient
buffer, no fp32 copy), applies the clip coefficient (a device tensor: no sync) and does the whole AdamW update;
one multi-tensor copy writes the bf16 parameters. ~30 bytes of traffic per parameter instead of ~52 (fp32 grad copy,
clip pass, torch's fused AdamW, copy back). The torch AdamW object still holds the state (views of the flat
buffers), so checkpoints keep their format.
"""

from __future__ import annotations

import math

import torch


def lr_at(step: int, *, peak: float, total_steps: int, warmup_steps: int, min_ratio: float = 0.0,
          shape: str = "cosine", decay_steps: int = 0) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up to `peak`, then either a cosine to
    min_ratio*peak at `total_steps` ("cosine"), or `peak` held until the last `decay_steps` steps, which fall linearly
    to min_ratio*peak ("wsd": warm-up, stable, decay)."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if shape == "wsd":
        start = max(warmup_steps, total_steps - decay_steps)
        if step < start:
            return peak
        progress = min(1.0, (step - start + 1) / max(1, total_steps - start))
        return peak * (1 - (1 - min_ratio) * progress)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class FP32Masters:
    """fp32 master copies of (possibly bf16) trainable parameters and the steps around any update rule: grads to the
    masters, one global grad-norm clip, masters back into the parameters. MasterAdamW and muon.MasterMuon share it.
    On fp32 parameters the master IS the parameter (no copy)."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.masters = [p if p.dtype == torch.float32 else p.detach().float().clone().requires_grad_(True)
                        for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for m in self.masters:
            m.grad = None

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.params]

    def master_state(self) -> list[torch.Tensor]:
        return self.masters

    def grads_to_masters_and_clip(self, grad_clip: float) -> torch.Tensor:
        """fp32 master grads, clipped over ALL masters; returns the pre-clip norm (a tensor: no sync)."""
        for p, m in zip(self.params, self.masters):
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()
        if grad_clip > 0:
            return torch.nn.utils.clip_grad_norm_(self.masters, grad_clip, foreach=True)
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m.grad) for m in self.masters
                                                     if m.grad is not None]))

    @torch.no_grad()
    def masters_to_params(self) -> None:
        for p, m in zip(self.params, self.masters):
            if m is not p:
                p.copy_(m)


class MasterAdamW(FP32Masters):
    """AdamW over fp32 masters of (possibly bf16) model parameters.

    `fused_clip`: None = on for bf16/fp16 parameters that are all on CUDA (see the module docstring), else off;
    True forces it (e.g. bf16 parameters on CPU, for tests)."""

    def __init__(self, params, *, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8,
                 fused_clip: bool | None = None):
        params = [p for p in params if p.requires_grad]
        if fused_clip is None:
            fused_clip = all(p.device.type == "cuda" and p.dtype != torch.float32 and type(p.data) is torch.Tensor
                             for p in params)
        self.fused_clip = bool(fused_clip) and bool(params)
        if self.fused_clip:
            self.params, self.flat = params, FlatAdamState(params)
            self.masters = self.flat.masters
        else:
            super().__init__(params)
        fused = all(p.device.type == "cuda" for p in self.masters)
        self.inner = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps,
                                       fused=fused or None)
        if self.fused_clip:
            self.flat.attach(self.inner)

    def step(self, lr: float, grad_clip: float) -> torch.Tensor:
        """Move grads to the masters, clip, step, copy back. Returns the pre-clip grad norm (a tensor: no sync)."""
        if self.fused_clip:
            return self.flat.step(self.inner, self.params, lr, grad_clip)
        norm = self.grads_to_masters_and_clip(grad_clip)
        for g in self.inner.param_groups:
            g["lr"] = lr
        self.inner.step()
        self.masters_to_params()
        return norm

    def state_dict(self) -> dict:
        if self.fused_clip:
            self.flat.sync_steps(self.inner)
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


# ---------------------------------------------------------------------------------------------------------------
# perf: fused clip + AdamW over flat buffers, reading bf16 gradients
# ---------------------------------------------------------------------------------------------------------------

def flat_view(tensors: list) -> torch.Tensor | None:
    """One 1-D tensor over `tensors` if they are contiguous, same dtype, and lie back to back in one storage (the
    engine's gradient views); None otherwise."""
    t0 = tensors[0] if tensors else None
    if t0 is None:
        return None
    ptr, offset = t0.untyped_storage().data_ptr(), t0.storage_offset()
    for t in tensors:
        if (t is None or not t.is_contiguous() or t.dtype != t0.dtype or t.device != t0.device
                or t.untyped_storage().data_ptr() != ptr or t.storage_offset() != offset):
            return None
        offset += t.numel()
    return t0.as_strided((offset - t0.storage_offset(),), (1,), t0.storage_offset())


def _adamw_flat(master, grad, exp_avg, exp_avg_sq, coef, hp, beta1: float, beta2: float, eps: float,
                weight_decay: float) -> None:
    """AdamW (torch semantics) on flat buffers; grad in any float dtype, scaled by the clip coefficient `coef`;
    hp = [lr, 1 - beta1^t, 1 - beta2^t] as a device tensor (new values never recompile)."""
    lr, bc1, bc2 = hp[0], hp[1], hp[2]
    g = grad.float() * coef
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = exp_avg_sq.sqrt() / bc2.sqrt() + eps
    master.sub_(exp_avg / denom * (lr / bc1))


_compiled_adamw_flat = None


def _adamw_fn(device: torch.device):
    global _compiled_adamw_flat
    if device.type != "cuda":
        return _adamw_flat
    if _compiled_adamw_flat is None:  # one pointwise kernel over the flat buffers (eager would be ~10 passes)
        _compiled_adamw_flat = torch.compile(_adamw_flat, dynamic=False)
    return _compiled_adamw_flat


class FlatAdamState:
    """fp32 masters, exp_avg and exp_avg_sq as views of three flat buffers, stepped by one fused update."""

    def __init__(self, params: list[torch.Tensor]):
        dev = params[0].device
        total = sum(p.numel() for p in params)
        self.master = torch.empty(total, dtype=torch.float32, device=dev)
        self.exp_avg = torch.zeros(total, dtype=torch.float32, device=dev)
        self.exp_avg_sq = torch.zeros(total, dtype=torch.float32, device=dev)
        self.masters, self._m, self._v = [], [], []
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                m = self.master[offset:offset + n].view_as(p)
                m.copy_(p)
                self.masters.append(m.requires_grad_(True))
                self._m.append(self.exp_avg[offset:offset + n].view_as(p))
                self._v.append(self.exp_avg_sq[offset:offset + n].view_as(p))
                offset += n
        self.t = 0

    def attach(self, inner: torch.optim.AdamW) -> None:
        """Make the torch AdamW's state the flat views (its state_dict/load_state_dict then save/load them)."""
        self.steps = [torch.tensor(float(self.t)) for _ in self.masters]  # one per parameter, as torch keeps them
        for m, ea, eas, st in zip(self.masters, self._m, self._v, self.steps):
            inner.state[m] = {"step": st, "exp_avg": ea, "exp_avg_sq": eas}

    @torch.no_grad()
    def _adopt(self, inner: torch.optim.AdamW) -> None:
        """After a load (load_state_dict or direct assignment) the state tensors are new: copy them in, re-point."""
        for m, ea, eas in zip(self.masters, self._m, self._v):
            st = inner.state.get(m)
            if st and st.get("exp_avg") is not ea:
                ea.copy_(st["exp_avg"])
                eas.copy_(st["exp_avg_sq"])
                self.t = int(float(st["step"]))
        self.attach(inner)

    def sync_steps(self, inner: torch.optim.AdamW) -> None:
        self._adopt(inner)

    @torch.no_grad()
    def step(self, inner: torch.optim.AdamW, params: list[torch.Tensor], lr: float, grad_clip: float) -> torch.Tensor:
        self._adopt(inner)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat_g = flat_view(grads)
        if flat_g is None:
            flat_g = torch.cat([g.reshape(-1) for g in grads])
        norm = torch.linalg.vector_norm(flat_g, dtype=torch.float32)
        coef = (grad_clip / (norm + 1e-6)).clamp(max=1.0) if grad_clip > 0 else torch.ones_like(norm)
        group = inner.param_groups[0]
        group["lr"] = lr
        beta1, beta2 = group["betas"]
        self.t += 1
        torch._foreach_add_(self.steps, 1.0)  # readers of inner.state_dict() directly see the true step
        hp = torch.tensor([lr, 1 - beta1 ** self.t, 1 - beta2 ** self.t], dtype=torch.float32)
        _adamw_fn(self.master.device)(self.master, flat_g, self.exp_avg, self.exp_avg_sq, coef,
                                      hp.to(self.master.device, non_blocking=True), beta1, beta2, group["eps"],
                                      group["weight_decay"])
        torch._foreach_copy_(params, self.masters)
        return norm
