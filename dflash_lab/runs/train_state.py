"""What a checkpoint holds besides files: the trainable parameter names, the optimiser's masters and AdamW state,
the RNG states (torch CPU/CUDA, python, numpy), and restoring all of them into a replica.

Tensors go to safetensors and the rest to JSON (never pickle); checkpoint.py writes and reads them.
"""

from __future__ import annotations

import random

import torch

from .checkpoint import Checkpoint, CheckpointError
from dflash_lab.config.errors import ConfigError


def trainable_names(module: torch.nn.Module) -> list[str]:
    """Names of the parameters MasterAdamW holds, in its order (requires_grad parameters of the module)."""
    return [n for n, p in module.named_parameters() if p.requires_grad]


def optimizer_tensors(optimizer, names: list[str]) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """fp32 masters + AdamW state keyed by parameter name, and the param groups' hyper-parameters (JSON)."""
    if len(names) != len(optimizer.masters):
        raise CheckpointError(f"optimizer holds {len(optimizer.masters)} tensors but the drafter has {len(names)} "
                              "trainable parameters; the checkpoint would not map back. This is a bug: report it.")
    sd = optimizer.state_dict()
    out = {}
    for i, name in enumerate(names):
        out[f"master/{name}"] = optimizer.masters[i].detach()
        for key, val in sd["state"].get(i, {}).items():
            out[f"{key}/{name}"] = val.detach() if torch.is_tensor(val) else torch.tensor(val)
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
              for g in sd["param_groups"]]
    return out, groups


@torch.no_grad()
def restore_optimizer(optimizer, names: list[str], tensors: dict[str, torch.Tensor], groups: list[dict]) -> None:
    """Load masters + AdamW state, then copy the masters into the (possibly bf16) parameters."""
    missing = [n for n in names if f"master/{n}" not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint optimizer state lacks parameters {missing[:5]} (of {len(missing)}); the "
                              "drafter shape differs from the one that was saved. Fix: resume with the same config.")
    state = {}
    for i, name in enumerate(names):
        per = {key.split("/", 1)[0]: t for key, t in tensors.items() if key.split("/", 1)[1] == name
               and not key.startswith("master/")}
        if per:
            state[i] = per
    param_groups = []
    start = 0
    for g, current in zip(groups, optimizer.state_dict()["param_groups"]):
        n = len(current["params"])
        param_groups.append({**{k: (tuple(v) if k == "betas" else v) for k, v in g.items()},
                             "params": list(range(start, start + n))})
        start += n
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})
    for p, m, name in zip(optimizer.params, optimizer.masters, names):
        m.copy_(tensors[f"master/{name}"].to(device=m.device, dtype=m.dtype))
        if m is not p:
            p.copy_(m)


def rng_state(devices: list[torch.device]) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, json) holding torch CPU/CUDA, python and numpy RNG states."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    for d in devices:
        if d.type == "cuda":
            tensors[f"cuda/{d.index or 0}"] = torch.cuda.get_rng_state(d)
    version, internal, gauss = random.getstate()
    meta = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        meta["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    for key, t in tensors.items():
        if key.startswith("cuda/") and torch.cuda.is_available():
            idx = int(key.split("/")[1])
            if idx < torch.cuda.device_count():
                torch.cuda.set_rng_state(t, idx)
    if "python" in meta:
        version, internal, gauss = meta["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in meta:
        import numpy as np

        kind, keys, pos, has_gauss, cached = meta["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


@torch.no_grad()
def restore_replica(module: torch.nn.Module, optimizer, resume: Checkpoint) -> None:
    """Drafter weights + masters + AdamW state of a checkpoint into one replica (module = the uncompiled drafter)."""
    names = resume.state["optimizer"]["param_names"]
    if trainable_names(module) != names:
        raise ConfigError(f"checkpoint {resume.path} holds parameters {names[:4]}... that do not match this "
                          "drafter's. Fix: resume with the config the checkpoint was trained with.")
    missing, unexpected = module.load_state_dict(resume.drafter, strict=False)
    missing = [k for k in missing if not k.startswith("rotary_emb.")]
    if missing or unexpected:
        raise ConfigError(f"checkpoint {resume.path}: drafter weights do not fit (missing {missing[:4]}, "
                          f"unexpected {unexpected[:4]}). Fix: resume with the config it was trained with.")
    restore_optimizer(optimizer, names, resume.optimizer, resume.state["optimizer"]["param_groups"])
