"""Building an engine from a config, a placement and loaded targets: identical drafter replicas (seeded init),
target replicas with their feature extractors, one worker per drafter device. Dtype and attention backend come from
prepare.plan_device (decided once per device); features from prepare.make_feature_extractor (online or cached)."""

from __future__ import annotations

import torch

from dflash_lab.drafter.model import DFlashDrafter, RotaryEmbedding
from .engine import Engine
from dflash_lab.target.fp8 import fp8_train_linears
from dflash_lab.drafter.loss_weights import loss_weighting_of
from .muon import make_optimizer
from .prepare import check_distill_placement, distill_top_k, make_feature_extractor, plan_device
from dflash_lab.target.features import embedding_of, lm_head_weight
from dflash_lab.data.draft_vocab import draft_head, set_draft_vocab
from .feature_store import FeatureStore, feature_width
from .workers import TargetReplica, Worker


def empty_drafter(drafter_config, device: torch.device) -> DFlashDrafter:
    """A drafter whose parameters are allocated on `device` without the default (CPU-slow) init."""
    if device.type == "cpu":
        return DFlashDrafter(drafter_config)
    with torch.device("meta"):
        d = DFlashDrafter(drafter_config)
    d.to_empty(device=device)
    with torch.device(device):
        d.rotary_emb = RotaryEmbedding(drafter_config)  # RoPE tables are computed, not initialised
    return d


def initial_drafter(drafter_config, seed: int, device: torch.device) -> DFlashDrafter:
    """The seeded initial weights, made once. On a GPU they are drawn from a CUDA generator (1B parameters in
    milliseconds instead of ~20 s of CPU construction + init), so a GPU run's init differs from a CPU run's init with
    the same seed; all replicas of one run are identical either way. torchrun ranks (rank_trainer.py) use it too."""
    d = empty_drafter(drafter_config, device)
    d.init_weights(torch.Generator(device=device).manual_seed(seed))
    return d


def feature_store_for(cfg, drafter_config, device, dtype, windows: int | None,
                      host_rows: int = 0) -> FeatureStore | None:
    """The store of a target replica (feature_store.py): at most `windows` rows on its device and `host_rows` in host
    memory; None when cfg.feature_store_gib is 0 or neither has room for a window (prepare.py said so)."""
    if not cfg.feature_store_gib or (windows == 0 and not host_rows):
        return None
    return FeatureStore(gib=cfg.feature_store_gib, seq_len=cfg.seq_len, width=feature_width(drafter_config),
                        dtype=dtype, device=torch.device(device), max_rows=windows, soft_top_k=distill_top_k(cfg),
                        storage=cfg.feature_store_dtype, groups=drafter_config.num_target_features,
                        host_rows=host_rows)


def build_engine(config, placement, targets: list, drafter_config, *, target_config=None, log=None,
                 compile_backend: str = "inductor", compile_mode: str | None = None, draft_vocab=None,
                 store_rows: int | None = None, store_host_rows: int = 0, grad_reducer=None) -> Engine:
    """Drafter replicas (identical init), target replicas and worker threads for `placement`.

    `targets`: loaded target models aligned with placement.target_devices (targets.load_targets). With
    config.compile_drafter each replica's forward is torch.compile(dynamic=False, mode=compile_mode): inductor
    kernels, no CUDAGraph Trees; our own capture (cuda_graphs.py) wraps the compiled step. `store_rows`: the most
    windows each replica's feature store keeps on its device (prepare.py: the data's windows, or what fits beside
    the run), `store_host_rows` in host memory.
    """
    cfg = config
    check_distill_placement(cfg, placement)
    if compile_mode is not None and cfg.compile_drafter:  # validated like the field: CUDAGraph Trees are refused
        cfg = cfg.replace(compile_mode=compile_mode)
    base = initial_drafter(drafter_config, cfg.seed, torch.device(placement.drafter_devices[0]))
    set_draft_vocab(base, draft_vocab)  # the d2t buffer travels with the weights (checkpoint, export)
    state = base.state_dict()
    # A cache lookup is host work, so it cannot be captured in a CUDA graph: cached features run eagerly.
    replicas = [TargetReplica(i, torch.device(d), make_feature_extractor(cfg, drafter_config, m, plan_device(cfg, d)),
                              cuda_graphs=cfg.cuda_graphs and not cfg.feature_cache, log=log,
                              store=feature_store_for(cfg, drafter_config, d, plan_device(cfg, d).dtype, store_rows,
                                                      store_host_rows))
                for i, (d, m) in enumerate(zip(placement.target_devices, targets))]
    workers = []
    for i, name in enumerate(placement.drafter_devices):
        dev, plan = torch.device(name), plan_device(cfg, name)
        drafter = empty_drafter(drafter_config, dev)
        drafter.load_state_dict(state)  # identical replicas (GPU -> GPU copies)
        drafter.to(device=dev, dtype=plan.dtype)
        forward = drafter
        if cfg.drafter_fp8:  # FP8 GEMMs in the drafter's linear layers, same parameters
            fp8_train_linears(drafter, weight_grad=cfg.drafter_fp8_weight_grad)
        if cfg.compiles_on(dev.type):
            forward = torch.compile(drafter, dynamic=False, backend=compile_backend, mode=cfg.compile_mode)
        if cfg.compile_drafter == "auto" and i == 0 and log is not None:  # say what "auto" decided
            log("drafter: compile_drafter='auto' -> " + ("compiled (torch.compile, fixed shapes)" if
                cfg.compiles_on(dev.type) else "eager (auto compiles on CUDA only)") + f" on {dev}")
        if placement.colocated:
            src = targets[i]
        else:  # any replica will do (identical); prefer one on this device (CPU tests)
            same = [m for d, m in zip(placement.target_devices, targets) if torch.device(d) == dev]
            src = same[0] if same else targets[0]
        embed, head = embedding_of(src), lm_head_weight(src)
        if embed.weight.device != dev:  # frozen copies next to the drafter (split placements)
            tied = head is embed.weight
            embed = torch.nn.Embedding.from_pretrained(embed.weight.detach().to(dev), freeze=True)
            head = embed.weight if tied else head.detach().to(dev)
        head, label_map = draft_head(drafter, head)  # a (d, H) slice of the target head when pruned
        workers.append(Worker(index=i, device=dev, drafter=drafter, forward_module=forward,
                              optimizer=make_optimizer(cfg, drafter),
                              embed=embed, head_weight=head, label_map=label_map, attention=plan.attention,
                              seq_len=cfg.seq_len,
                              layer_types=drafter_config.layer_types, sliding_window=drafter_config.sliding_window,
                              layer_windows=drafter_config.layer_windows,
                              chunk_size=cfg.loss_chunk_size, cuda_graphs=cfg.cuda_graphs, log=log,
                              loss_weighting=loss_weighting_of(cfg), distill_weight=cfg.distill_weight))
    return Engine(workers, replicas, colocated=placement.colocated, seq_len=cfg.seq_len, grad_clip=cfg.grad_clip,
                  target_config=target_config if target_config is not None else getattr(targets[0], "config", None),
                  drafter_config=drafter_config, log=log, grad_reducer=grad_reducer)
