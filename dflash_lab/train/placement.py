"""Which device holds which target replica and which drafter worker, checked BEFORE anything loads.

Two layouts:
- colocated: every GPU holds a target replica AND a drafter worker (`devices=("cuda:0", "cuda:1")`); features never
  leave the GPU that made them.
- split (disaggregated): target replicas on some GPUs, drafter workers on others (`target_devices=("cuda:0",)`,
  `devices=("cuda:1",)`); features travel GPU -> GPU (peer copy, no host round-trip) and the target side runs one
  batch ahead of the drafter side.

`check_placement` compares what each GPU must hold (memory_model.py: weights, optimiser state, activations, item by
item, the same model preflight shows) with its free memory and raises an actionable `PlacementError` ("cuda:3 needs
~61 GB ... and has 20 GB free: ...") before minutes are spent loading. `device_plan` decides each device's compute
dtype and attention backend (the one place; prepare.py applies it to a TrainConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_lab.config import ConfigError
from .feature_store import RESERVE_BYTES
from .memory_model import device_memory
from dflash_lab.config.model_size import drafter_parameters, target_parameters

# The parameter model lives in model_size.py (shared with preflight and the FLOP count); these names stay for callers.
target_num_parameters, drafter_num_parameters = target_parameters, drafter_parameters

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class PlacementError(ConfigError):
    """The placement cannot work on this machine; the message says which device and what to change."""


def gpus(spec: str | int | list | tuple) -> tuple[str, ...]:
    """"0-4" -> ("cuda:0", ..., "cuda:4"); "0,2" / [0, 2] / 3 -> ("cuda:0", "cuda:2") / ("cuda:3",)."""
    if isinstance(spec, int):
        return (f"cuda:{spec}",)
    if isinstance(spec, (list, tuple)):
        return tuple(f"cuda:{int(i)}" for i in spec)
    out: list[int] = []
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise PlacementError(f"GPU range {part!r} is invalid. Fix: write e.g. '0-4' or '0,1,2'.")
            out.extend(range(int(lo), int(hi) + 1))
        elif part.isdigit():
            out.append(int(part))
        else:
            raise PlacementError(f"GPU list {spec!r} has {part!r}, which is not a GPU index. Fix: write e.g. '0-4' "
                                 "or '0,1,2'.")
    return tuple(f"cuda:{i}" for i in out)


def _normalise(names, field: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    out = []
    for n in names:
        try:
            d = torch.device(n)
        except RuntimeError as e:
            raise PlacementError(f"{field}: {n!r} is not a device name ({e}). Fix: use 'cpu' or 'cuda:N'.") from e
        if d.type == "cuda":
            out.append(f"cuda:{0 if d.index is None else d.index}")
        elif d.type == "cpu":
            out.append("cpu")
        else:
            raise PlacementError(f"{field}: unsupported device {n!r}. Fix: use 'cpu' or 'cuda:N'.")
    return tuple(out)


@dataclass(frozen=True)
class Placement:
    """Drafter workers (one per device) and target replicas (one per device), by device name."""

    drafter_devices: tuple[str, ...]
    target_devices: tuple[str, ...]

    @property
    def colocated(self) -> bool:
        """Worker i runs its own target replica i on the same device, in the same thread."""
        return self.target_devices == self.drafter_devices

    @property
    def mode(self) -> str:
        return "colocated" if self.colocated else "split"

    @property
    def is_cuda(self) -> bool:
        return self.drafter_devices[0].startswith("cuda")

    @property
    def devices(self) -> tuple[str, ...]:
        """Every distinct device used, in order of first appearance."""
        return tuple(dict.fromkeys(self.target_devices + self.drafter_devices))

    @property
    def num_gpus(self) -> int:
        return sum(1 for d in self.devices if d.startswith("cuda"))

    def describe(self) -> str:
        if self.colocated:
            return f"colocated: target + drafter on each of {', '.join(self.drafter_devices)}"
        return (f"split: {len(self.target_devices)} target replica(s) on {', '.join(self.target_devices)} -> "
                f"{len(self.drafter_devices)} drafter worker(s) on {', '.join(self.drafter_devices)}")


def make_placement(devices, target_devices=None) -> Placement:
    """Validate device names against the visible devices (no memory check yet: see `check_placement`)."""
    drafters = _normalise(devices, "devices")
    targets = drafters if target_devices is None else _normalise(target_devices, "target_devices")
    if not drafters:
        raise PlacementError("devices is empty. Fix: name at least one drafter device, e.g. ('cuda:0',).")
    if not targets:
        raise PlacementError("target_devices is empty. Fix: leave it None (colocated) or name at least one device.")
    kinds = {d.split(":")[0] for d in drafters + targets}
    if len(kinds) > 1:
        raise PlacementError(f"devices={drafters} and target_devices={targets} mix CPU and GPU. Fix: put the target "
                             "and the drafter on GPUs (or both on 'cpu' for tests).")
    if "cuda" in kinds:
        if not torch.cuda.is_available():
            raise PlacementError(f"devices {tuple(dict.fromkeys(drafters + targets))} ask for GPUs but no CUDA GPU is "
                                 "visible. Fix: train "
                                 "on the CPU (notebooks: -y 'gpus: []'; Python: devices=('cpu',)) or run on a GPU "
                                 "machine with a CUDA build of torch (check CUDA_VISIBLE_DEVICES).")
        n = torch.cuda.device_count()
        for d in dict.fromkeys(drafters + targets):
            if int(d.split(":")[1]) >= n:
                raise PlacementError(f"{d} does not exist: {n} GPU(s) are visible (cuda:0..cuda:{n - 1}; "
                                     "CUDA_VISIBLE_DEVICES applies). Fix: pick GPUs from that range (notebooks: "
                                     f"-y 'gpus: [{', '.join(str(i) for i in range(min(n, 2)))}]').")
        for name, devs in (("devices", drafters), ("target_devices", targets)):
            dup = sorted({d for d in devs if devs.count(d) > 1})
            if dup:
                raise PlacementError(f"{name}={devs} names {dup} more than once: one {'drafter worker' if name == 'devices' else 'target replica'} "
                                     "per GPU. Fix: list each GPU once.")
        if targets != drafters and set(targets) & set(drafters):
            both = sorted(set(targets) & set(drafters))
            raise PlacementError(
                f"target_devices={targets} and devices={drafters} share {both} without being identical. Fix: either "
                "colocate (target_devices=None: a target replica and a drafter worker on every GPU) or use disjoint "
                "GPU sets (e.g. targets on 0-4, drafters on 5-7).")
    return Placement(drafter_devices=drafters, target_devices=targets)


# ---------------------------------------------------------------------------------------------------------------
# Memory estimates (bytes). Parameter counts come from the configs (model_size.py), so nothing needs to be loaded.
# ---------------------------------------------------------------------------------------------------------------

def resolve_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """"auto" -> bf16 on CUDA, fp32 on CPU (bf16 matmuls on CPU are slow and less exact); else the named dtype."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return DTYPES[name]


@dataclass(frozen=True)
class DevicePlan:
    """What runs on one device: its compute dtype and the drafter's attention backend."""

    device: str
    dtype: torch.dtype
    attention: str  # "flex" (BlockMask) or "sdpa" (dense mask)


def device_plan(device: str | torch.device, *, dtype: str = "auto", attention: str = "auto") -> DevicePlan:
    """The one place that turns `dtype="auto"` / `attention="auto"` into a decision for a device: bf16 + flex on
    CUDA, fp32 + SDPA on CPU (flex attention has no fast CPU kernel). prepare.plan_device applies a TrainConfig."""
    dev = torch.device(device)
    backend = ("flex" if dev.type == "cuda" else "sdpa") if attention == "auto" else attention
    return DevicePlan(device=str(dev), dtype=resolve_dtype(dtype, dev), attention=backend)


def rows_that_fit(free: float, rest: float, row: int, asked: int) -> int:
    """Whole windows of `row` bytes a feature store keeps on a device with `free` bytes where the run needs `rest`
    beside it, RESERVE_BYTES to spare; never more than `asked` (check_placement and preflight both size it so)."""
    return max(0, min(asked, int((free - rest - RESERVE_BYTES) // row)))


def check_placement(placement: Placement, *, target_config, drafter_config, seq_len: int, num_anchors: int,
                    batch_size: int, chunk_size: int = 4096, mem_get_info=None, plan=None,
                    feature_store_bytes: int = 0, store_row_bytes: int = 0) -> dict[str, dict]:
    """Batch divisibility and free memory per GPU, before loading. Returns {device: {need_gb, free_gb, ...}}.

    The need per device is memory_model.device_memory's (the model preflight shows item by item). `plan(device)`:
    the DevicePlan to assume (default: device_plan, bf16 + flex on GPUs). `mem_get_info(device) -> (free, total)`
    defaults to torch.cuda.mem_get_info (tests pass a fake).

    `store_row_bytes` > 0: the feature store (`feature_store_bytes` asked, whole windows of `store_row_bytes`) is
    fitted to the room the target GPUs have beside the run (their free memory less everything else the model counts
    and RESERVE_BYTES) instead of refusing the run; each target device's report then says the windows it holds
    (`feature_store_rows`), the same on every replica. A store is only ever a speed-up: windows it cannot hold are
    computed by the target each time they come back.
    """
    T, D = len(placement.target_devices), len(placement.drafter_devices)
    for n, what in ((D, "drafter workers"), (T, "target replicas")):
        if batch_size % n:
            raise PlacementError(f"batch_size={batch_size} does not split evenly over {n} {what} "
                                 f"({placement.describe()}). Fix: use a batch_size that is a multiple of {n}.")
    report: dict[str, dict] = {}
    if not placement.is_cuda:
        return report
    mem_get_info = mem_get_info or (lambda dev: torch.cuda.mem_get_info(torch.device(dev)))

    def need(store: int) -> dict[str, dict[str, int]]:
        return device_memory(drafter_devices=placement.drafter_devices, target_devices=placement.target_devices,
                             target_config=target_config, drafter_config=drafter_config,
                             target_params=target_parameters(target_config),
                             drafter_params=drafter_parameters(drafter_config), seq_len=seq_len,
                             num_anchors=num_anchors, batch_size=batch_size, chunk_size=chunk_size,
                             plan=plan or device_plan, feature_store_bytes=store)

    fitted = None
    if feature_store_bytes and store_row_bytes:
        rest, free_of = need(0), {d: mem_get_info(d)[0] for d in dict.fromkeys(placement.target_devices)}
        fitted = min(rows_that_fit(free_of[d], sum(rest[d].values()), store_row_bytes,
                                   feature_store_bytes // store_row_bytes) for d in free_of)
        feature_store_bytes = fitted * store_row_bytes
    items = need(feature_store_bytes)
    for dev in placement.devices:
        parts = {"target": sum(v for k, v in items[dev].items() if k.startswith("target")),
                 "drafter": sum(v for k, v in items[dev].items() if k.startswith(("drafter", "fp32", "features",
                                                                                    "embedding")))}
        parts = {k: v for k, v in parts.items() if v}
        need = sum(items[dev].values())  # + allocator slack and CUDA context (memory_model.py)
        free, total = mem_get_info(dev)
        report[dev] = {"need_gb": round(need / 1e9, 1), "free_gb": round(free / 1e9, 1),
                       "total_gb": round(total / 1e9, 1), **{f"{k}_gb": round(v / 1e9, 1) for k, v in parts.items()}}
        if fitted is not None and dev in placement.target_devices:
            report[dev]["feature_store_rows"] = fitted
        if need > free:
            what = " + ".join(f"{k} ~{v / 1e9:.0f} GB" for k, v in parts.items())
            hints = []
            if placement.colocated:
                hints.append("split the target and the drafter onto different GPUs (notebooks: -y 'target_gpus: "
                             "[1]'; Python: target_devices=...)")
            if "target" in parts and T > 1:
                hints.append("use fewer target replicas")
            if "target feature store (at most)" in items[dev]:
                hints.append("lower feature_store_gib (windows it cannot hold are recomputed)")
            if "drafter" in parts:
                hints.append("lower seq_len / num_anchors / batch_size")
            hints.append("use other GPUs (free memory is read now: another process may hold this one)")
            raise PlacementError(f"{dev} needs ~{need / 1e9:.0f} GB ({what}) and has {free / 1e9:.0f} GB free of "
                                 f"{total / 1e9:.0f} GB: {'; or '.join(hints)}.")
    return report


def devices_for(gpus) -> tuple[str, ...]:
    """Notebook helper: [] / None -> ("cpu",); [0, 1] -> ("cuda:0", "cuda:1"); strings pass through."""
    if not gpus:
        return ("cpu",)
    if isinstance(gpus, str) and gpus.strip().startswith("["):  # papermill's -p passes a list as its text
        raise ConfigError(f"gpus={gpus!r} is text, not a list: `-p gpus {gpus}` passes a string. Fix: "
                          f"-y 'gpus: {gpus.strip()}' (YAML: a list), or gpus = {gpus.strip()} in the notebook.")
    if isinstance(gpus, (int, str)):
        gpus = [gpus]
    out = []
    for g in gpus:
        if isinstance(g, bool) or not isinstance(g, (int, str)):
            raise ConfigError(f"gpus={gpus!r}: entries must be CUDA ordinals (0, 1, ...) or device names. "
                              'Fix: e.g. gpus = [0, 1] or gpus = ["cuda:0"].')
        out.append(f"cuda:{g}" if isinstance(g, int) else g)
    return tuple(out)
