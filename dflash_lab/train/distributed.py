"""torch.distributed plumbing for `python -m dflash_lab.train` under torchrun: process groups, rank roles, DDP/FSDP2.

One process per GPU (or per CPU slot with gloo). Every rank computes the SAME global batch from (seed, step) and
takes its slice, so no batch is ever sent. Two placements:

- colocated (`targets_per_node=0`): every rank holds a target replica and a drafter replica (the in-process
  threaded engine's default, one process per GPU instead of one thread per GPU);
- split (`targets_per_node=k`): on every node the last k local ranks only run the target and `send` each drafter
  rank of the same node (round-robin) its slice's features; the other ranks only train the drafter. Features stay
  inside a node (NVLink), and the DDP/FSDP2 group holds the drafter ranks only.

Loss weights are normalised over the GLOBAL batch (blocks.py), so the exact gradient is the SUM of the ranks'
gradients. DDP averages by default; a comm hook here sums instead (and FSDP2 gets a divide factor of 1), so a
2-rank run matches a 1-rank run to fp32 rounding (tests/test_distributed.py checks it). Control decisions
(stop, checkpoint now) are broadcast from rank 0 over a CPU (gloo) group at each step boundary, so every rank
leaves the loop at the same step and no rank waits forever on a collective that the others skipped.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from dflash_lab.config import ConfigError

DIST_CONFIG_FILE = "distributed.json"
BACKENDS = ("auto", "nccl", "gloo")
PARALLEL = ("ddp", "fsdp2")
DEVICES = ("auto", "cpu", "cuda")


class DistributedError(RuntimeError):
    """A distributed setup or run problem; the message names the rank, the value and the fix."""


@dataclass(frozen=True, kw_only=True)
class DistConfig:
    """How a torchrun job lays out its ranks; saved as `distributed.json` next to the run's config.json."""

    backend: str = "auto"
    """Process-group backend: "nccl" (GPUs), "gloo" (CPU), or "auto" (nccl when the ranks use CUDA)."""
    device: str = "auto"
    """Rank device: "cuda" (cuda:LOCAL_RANK), "cpu", or "auto" (cuda if visible, else cpu)."""
    parallel: str = "ddp"
    """Drafter replication: "ddp" (full replica per rank, gradients summed) or "fsdp2" (fully_shard: parameters,
    gradients and AdamW state sharded over the drafter ranks, for drafters whose optimizer state does not fit)."""
    targets_per_node: int = 0
    """0 = target colocated with every drafter rank; k > 0 = the last k local ranks of each node run only the
    target and send features to the node's drafter ranks."""
    timeout_s: float = 600.0
    """Process-group timeout: a rank stuck this long in a collective (a peer died) raises instead of hanging."""

    def __post_init__(self) -> None:
        c = "DistConfig"
        if self.backend not in BACKENDS:
            raise ConfigError(f"{c}.backend={self.backend!r} is invalid. Fix: use one of {BACKENDS}.")
        if self.device not in DEVICES:
            raise ConfigError(f"{c}.device={self.device!r} is invalid. Fix: use one of {DEVICES}.")
        if self.parallel not in PARALLEL:
            raise ConfigError(f"{c}.parallel={self.parallel!r} is invalid. Fix: use 'ddp' or 'fsdp2'.")
        if isinstance(self.targets_per_node, bool) or not isinstance(self.targets_per_node, int) \
                or self.targets_per_node < 0:
            raise ConfigError(f"{c}.targets_per_node={self.targets_per_node!r} is invalid: must be an integer >= 0. "
                              "Fix: 0 colocates a target with every drafter rank; k > 0 dedicates k ranks per node.")
        if not self.timeout_s > 0:
            raise ConfigError(f"{c}.timeout_s={self.timeout_s!r} must be > 0. Fix: use e.g. 600 (NCCL's default).")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError(f"{c}: backend='nccl' cannot run on device='cpu'. Fix: use backend='gloo' on CPU.")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DistConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"DistConfig got unknown fields {unknown}. Fix: use only {sorted(known)}.")
        return cls(**d)

    @classmethod
    def load(cls, run_dir: str | Path) -> "DistConfig":
        """`<run_dir>/distributed.json` if present, else the defaults."""
        p = Path(run_dir) / DIST_CONFIG_FILE
        return cls.from_dict(json.loads(p.read_text())) if p.is_file() else cls()

    def replace(self, **changes) -> "DistConfig":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------------------------
# Rank layout: a pure function of (world size, ranks per node, targets per node), so every rank computes the same.
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Which ranks run the target, which train the drafter, and which target rank feeds each drafter rank."""

    world_size: int
    local_world_size: int
    drafter_ranks: tuple[int, ...]
    target_ranks: tuple[int, ...]
    feeder: dict = field(default_factory=dict)  # drafter rank -> target rank computing its features

    @property
    def colocated(self) -> bool:
        return self.drafter_ranks == self.target_ranks

    def served_by(self, target_rank: int) -> list[int]:
        """Drafter ranks whose features `target_rank` computes, in rank order."""
        return [d for d in self.drafter_ranks if self.feeder[d] == target_rank]


def rank_layout(world_size: int, local_world_size: int, targets_per_node: int) -> Layout:
    """Ranks of node n are n*G .. n*G+G-1 (torchrun's order); the last `targets_per_node` of each node run targets."""
    G = local_world_size
    if world_size % G:
        raise DistributedError(f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={G}: nodes must run "
                               "the same number of processes. Fix: use the same --nproc-per-node on every node.")
    if targets_per_node == 0:
        ranks = tuple(range(world_size))
        return Layout(world_size, G, ranks, ranks, {r: r for r in ranks})
    if targets_per_node >= G:
        raise DistributedError(f"targets_per_node={targets_per_node} leaves no drafter rank on a node with "
                               f"{G} processes. Fix: use targets_per_node <= {G - 1} (or 0 to colocate).")
    drafters, targets, feeder = [], [], {}
    for node in range(world_size // G):
        base = node * G
        local_d = [base + i for i in range(G - targets_per_node)]
        local_t = [base + i for i in range(G - targets_per_node, G)]
        for j, d in enumerate(local_d):
            feeder[d] = local_t[j % len(local_t)]
        drafters += local_d
        targets += local_t
    return Layout(world_size, G, tuple(drafters), tuple(targets), feeder)


# ---------------------------------------------------------------------------------------------------------------
# Process group setup from torchrun's environment
# ---------------------------------------------------------------------------------------------------------------
def torchrun_env() -> dict | None:
    """RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE set by torchrun, or None when not launched by it."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    return {"rank": int(os.environ["RANK"]), "world_size": world,
            "local_rank": int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", world))}


def resolve_device(dcfg: DistConfig, local_rank: int, train_devices: tuple[str, ...] = ("cuda",),
                   single_process: bool = False) -> torch.device:
    """cuda:LOCAL_RANK under torchrun; the config's first device in a single process. "auto" follows the
    TrainConfig: all-"cpu" devices (or backend gloo, or no GPU) -> cpu, otherwise cuda."""
    want = dcfg.device
    if want == "auto":
        on_cpu = all(str(d).startswith("cpu") for d in train_devices) or dcfg.backend == "gloo"
        want = "cuda" if torch.cuda.is_available() and not on_cpu else "cpu"
    if want == "cpu":
        return torch.device("cpu")
    if single_process and str(train_devices[0]).startswith("cuda:"):
        local_rank = torch.device(train_devices[0]).index
    if not torch.cuda.is_available():
        raise DistributedError("DistConfig.device='cuda' but no CUDA GPU is visible in this process. "
                               "Fix: run on a GPU machine, or use device='cpu' with backend='gloo'.")
    n = torch.cuda.device_count()
    if local_rank >= n:
        raise DistributedError(f"local rank {local_rank} needs cuda:{local_rank} but only {n} GPUs are visible "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Fix: use "
                               f"--nproc-per-node <= {n}.")
    return torch.device("cuda", local_rank)


class DistContext:
    """This process's place in the job: rank, device, role, and the groups it talks over.

    With WORLD_SIZE 1 (or no torchrun) there is no process group and every collective is a local no-op, so the same
    training loop runs single-process.
    """

    def __init__(self, dcfg: DistConfig, train_devices: tuple[str, ...] = ("cuda",), env: dict | None = None):
        env = env if env is not None else torchrun_env()
        self.config = dcfg
        self.rank = env["rank"] if env else 0
        self.world_size = env["world_size"] if env else 1
        self.local_rank = env["local_rank"] if env else 0
        self.local_world_size = env["local_world_size"] if env else 1
        self.device = resolve_device(dcfg, self.local_rank, tuple(train_devices), single_process=env is None)
        self.backend = dcfg.backend if dcfg.backend != "auto" else ("nccl" if self.device.type == "cuda" else "gloo")
        if self.backend == "nccl" and self.device.type != "cuda":
            raise DistributedError(f"rank {self.rank}: backend 'nccl' needs CUDA devices but this rank runs on "
                                   f"{self.device}. Fix: use backend='gloo' on CPU.")
        self.layout = rank_layout(self.world_size, self.local_world_size, dcfg.targets_per_node)
        self.is_drafter = self.rank in self.layout.drafter_ranks
        self.is_target = self.rank in self.layout.target_ranks
        self.num_drafters = len(self.layout.drafter_ranks)
        self.drafter_index = self.layout.drafter_ranks.index(self.rank) if self.is_drafter else None
        self.drafter_group = None  # None = the world group (or no group at all when world_size == 1)
        self.control_group = None
        self.initialized = False
        if self.world_size > 1:
            self._init_groups()

    def _init_groups(self) -> None:
        timeout = datetime.timedelta(seconds=self.config.timeout_s)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        kw = {"device_id": self.device} if self.backend == "nccl" else {}
        dist.init_process_group(self.backend, timeout=timeout, **kw)
        self.initialized = True
        # Every rank must create every group, in the same order.
        if self.backend != "gloo":
            self.control_group = dist.new_group(backend="gloo", timeout=timeout)
        if not self.layout.colocated:
            self.drafter_group = dist.new_group(list(self.layout.drafter_ranks), timeout=timeout)

    # ---------------------------------------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def describe(self) -> dict:
        lay = self.layout
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "local_world_size": self.local_world_size, "backend": self.backend, "device": str(self.device),
                "parallel": self.config.parallel, "drafter_ranks": list(lay.drafter_ranks),
                "target_ranks": list(lay.target_ranks), "colocated": lay.colocated,
                "feeder": {str(k): v for k, v in lay.feeder.items()}}

    def control(self, stop: bool, checkpoint: bool) -> tuple[bool, bool]:
        """Rank 0's (stop, checkpoint) decision, broadcast to every rank over the CPU group (a step-boundary sync)."""
        if not self.distributed:
            return stop, checkpoint
        flags = torch.tensor([int(stop), int(checkpoint)], dtype=torch.int64)
        dist.broadcast(flags, src=0, group=self.control_group)
        return bool(flags[0]), bool(flags[1])

    def broadcast_int(self, value: int) -> int:
        """Rank 0's integer (e.g. the resumed step) on every rank."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(t, src=0, group=self.control_group)
        return int(t[0])

    def all_ok(self, ok: bool) -> bool:
        """True on every rank iff `ok` is True on every rank (e.g. 'my setup succeeded')."""
        if not self.distributed:
            return ok
        t = torch.tensor([0 if ok else 1], dtype=torch.int64)
        dist.all_reduce(t, group=self.control_group)
        return int(t[0]) == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.control_group)

    def gather_drafters(self, t: torch.Tensor) -> torch.Tensor:
        """(k,) tensor per drafter rank -> (num_drafters, k) on every drafter rank (rank order)."""
        if self.num_drafters == 1:
            return t[None]
        out = [torch.empty_like(t) for _ in range(self.num_drafters)]
        dist.all_gather(out, t.contiguous(), group=self.drafter_group)
        return torch.stack(out)

    def send(self, t: torch.Tensor, dst: int) -> None:
        dist.send(t.contiguous(), dst=dst)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(t, src=src)
        return t

    def close(self) -> None:
        if self.initialized and dist.is_initialized():
            dist.destroy_process_group()
        self.initialized = False


def share_frozen_head(ctx: DistContext, target, dtype: torch.dtype):
    """(embedding, LM head weight) of the frozen target on a drafter rank; (None, None) on target-only ranks.

    Colocated: the local target's. Split: each target-only rank sends them once to every drafter rank it feeds
    (shape header, embedding, then the head unless tied), so a drafter-only rank never loads the target."""
    from dflash_lab.target.features import embedding_of, lm_head_weight

    if ctx.layout.colocated:
        return (embedding_of(target), lm_head_weight(target)) if ctx.is_drafter else (None, None)
    if ctx.is_target:
        emb, head = embedding_of(target).weight.detach(), lm_head_weight(target).detach()
        tied = head.data_ptr() == emb.data_ptr()
        for d in ctx.layout.served_by(ctx.rank):
            ctx.send(torch.tensor(list(emb.shape) + [int(tied)], dtype=torch.int64, device=ctx.device), d)
            ctx.send(emb, d)
            if not tied:
                ctx.send(head, d)
        return None, None
    src = ctx.layout.feeder[ctx.rank]
    rows, hidden, tied = ctx.recv(torch.empty(3, dtype=torch.int64, device=ctx.device), src).tolist()
    emb = ctx.recv(torch.empty(rows, hidden, dtype=dtype, device=ctx.device), src)
    head = emb if tied else ctx.recv(torch.empty(rows, hidden, dtype=dtype, device=ctx.device), src)
    return torch.nn.Embedding.from_pretrained(emb, freeze=True), head


# ---------------------------------------------------------------------------------------------------------------
# Drafter replication
# ---------------------------------------------------------------------------------------------------------------
def _sum_allreduce_hook(group, bucket):
    """DDP comm hook: all-reduce SUM (no division by world size): loss weights are already globally normalised."""
    return dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future().then(lambda f: f.value()[0])


def wrap_ddp(drafter: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """DistributedDataParallel over the drafter ranks, with summed gradients. Rank 0's weights are broadcast."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not ctx.distributed or ctx.num_drafters == 1:
        return drafter
    # The only buffers (RoPE inverse frequencies) are identical on every rank: no per-step buffer broadcast.
    quiet = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
             else {"broadcast_buffers": False})  # torch < 2.13 spells it broadcast_buffers
    ddp = DDP(drafter, device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
              process_group=ctx.drafter_group, **quiet)
    group = ctx.drafter_group if ctx.drafter_group is not None else dist.group.WORLD
    ddp.register_comm_hook(group, _sum_allreduce_hook)
    return ddp


def wrap_fsdp2(drafter: torch.nn.Module, ctx: DistContext, compute_dtype: torch.dtype) -> torch.nn.Module:
    """fully_shard each draft layer, then the root (fc, norms). Parameters stay fp32 shards (they ARE the AdamW
    masters); forward/backward run in `compute_dtype`; gradients are reduce-scattered in fp32 and summed."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if not ctx.distributed or ctx.num_drafters == 1:
        return drafter
    dev_type = ctx.device.type
    if ctx.drafter_group is None:
        mesh = init_device_mesh(dev_type, (ctx.world_size,))
    else:
        mesh = DeviceMesh.from_group(ctx.drafter_group, dev_type)
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) \
        if compute_dtype != torch.float32 else MixedPrecisionPolicy()
    for layer in drafter.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(drafter, mesh=mesh, mp_policy=mp)
    for m in drafter.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            if ctx.backend == "gloo":  # gloo has no PREMUL_SUM reduce op
                m.set_force_sum_reduction_for_comms(True)
    return drafter


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective over its mesh: every drafter rank must call it); plain tensors as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` laid out like `like` (a DTensor shard of this rank, or a plain tensor)."""
    if hasattr(like, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(device=like.device, dtype=like.dtype), like.device_mesh, like.placements)
    return full.to(device=like.device, dtype=like.dtype)
