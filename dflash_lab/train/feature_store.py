"""Target features kept in device memory and reused across epochs: the frozen target runs once per training window.

A long run sees every window many times (100,000 steps of 32 windows over 30k conversations is ~100 epochs), and
the target is frozen, so a window's features are the same every time it comes back. The store keeps them, on the
device that computed them, in one preallocated tensor (rows, S, n*H) of the features' dtype: a window that is
stored is a gather from it, one that is not runs the target (its CUDA graph) and is written into a free row.

Windows are recognised by a digest of their padded token ids (and document ids when packed), computed on the host
from the batch the sampler built, so the store needs no sample indices and holds for any sampler, resume included.
A batch is served from the store only when EVERY row of it is stored (the target graph keeps one fixed shape); once
the store is full, new windows are computed each time they come back and the hit rate says so. With several target
replicas each keeps the windows it computed: a window that comes back on another replica is computed there again
until that replica holds it too.

A batch is served only whole, so a store holding a share f of the windows serves about f^b of the batches of b
windows: a store must hold (nearly) every window to pay. Windows the GPU has no room for can therefore be kept in
host memory (`host_rows`, TrainConfig.feature_store_host_gib): a batch then gathers its GPU rows on the GPU and its
host rows on the host into a small pinned staging buffer, copied in with one host-to-device copy per column: host
memory bandwidth and PCIe instead of a target forward. The host tier itself is ordinary (pageable) memory: pinning
tens of GiB is slow, rounded up to a power of two by torch's pinned allocator, and refused under memlock limits.
While it fills, a batch's new host rows are copied out of the device into pinned staging without waiting and
written into the host tier at the store's next call, while the next batch's target forward runs: with a copy that
waited for the target and the write right after it, the long preset's steps ran 136-148k tokens/s while the host
rows filled against ~195k while the device rows did (one H100, 2026-12-06; this path not yet measured there).

Size: rows = gib / (S * n*H * bytes). SmolLM2-135M features (5 layers x 576, bf16) at S=320 are 1.8 MiB a window,
so 30k windows need 53 GiB, which an H200 holds beside the drafter; a 8B target (5 x 4096) at S=3072 is 120 MiB a
window: there only small data sets fit, and the offline disk cache (data/feature_cache.py) is the tool.

FP8 storage (`storage="float8"`) halves a window: each position's features of each target layer are kept as
float8_e4m3fn scaled by their own absolute maximum (one fp32 scale per position and layer, +0.7% at 576 wide) and
come back in the features' dtype on gather. E4M3 keeps 3 mantissa bits, so an element is off by at most 1/16 of
its own size (and by at most 1/16 of 2^-6 of its row's maximum near zero): the drafter reads slightly rounded
features, where bf16 storage (the default) gives back exactly what the target computed. It reads them rounded in
every epoch, the first included (a computed window is rounded as it is stored): with exact features on a miss and
rounded ones on a hit, a run's losses would depend on the store's size, and a resumed job, whose store starts
empty, would not repeat the steps of the job it continues.
"""

from __future__ import annotations

import torch

from dflash_lab.data.feature_cache import row_hash
from dflash_lab.target.device_time import to_device_async

GIB = 2**30
RESERVE_BYTES = 4 * GIB  # device memory a store leaves free for the step's activations and the allocator
STORAGE = ("auto", "float8")  # the features' own dtype, or E4M3 with a scale per position and target layer
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite E4M3 value: a row's maximum maps onto it


def window_key(input_ids: torch.Tensor, doc_ids: torch.Tensor | None) -> bytes:
    """16-byte digest of one padded window: its token ids, and its document ids when windows are packed (the offline
    cache's row digest, so both recognise a window alike)."""
    return row_hash(input_ids, doc_ids)


def feature_width(drafter_config) -> int:
    """Features a window keeps per position: the target layers the drafter reads, side by side."""
    return drafter_config.num_target_features * drafter_config.hidden_size


def row_bytes(*, seq_len: int, width: int, dtype: torch.dtype, soft_top_k: int = 0, storage: str = "auto",
              groups: int = 1) -> int:
    """Bytes one stored window takes: its features (float8: 1 byte each + one fp32 scale per position and each of
    `groups` target layers), and its top-k ids (int32) and log-probabilities (fp32)."""
    if storage not in STORAGE:
        raise ValueError(f"feature store storage={storage!r} is not one of {STORAGE}")
    if storage == "float8":
        return seq_len * (width + 4 * groups + 8 * soft_top_k)
    return seq_len * (width * torch.empty((), dtype=dtype).element_size() + 8 * soft_top_k)


def store_bytes(*, gib: float, seq_len: int, width: int, dtype: torch.dtype, windows: int | None = None,
                soft_top_k: int = 0, storage: str = "auto", groups: int = 1) -> int:
    """Device memory a store of `gib` takes: whole rows, never more rows than the data has windows (so a generous
    feature_store_gib on a small data set costs only what the data needs; the placement check counts this)."""
    per_row = row_bytes(seq_len=seq_len, width=width, dtype=dtype, soft_top_k=soft_top_k, storage=storage,
                        groups=groups)
    rows = int(gib * GIB // per_row)
    return per_row * (rows if windows is None else min(rows, windows))


def check_holds_a_window(gib: float, per_row: int, seq_len: int, width: int) -> None:
    """A feature_store_gib below one window is a mistake, not a store of none: say so with the size that works."""
    if int(gib * GIB // per_row) < 1:
        raise ValueError(f"feature_store_gib={gib} holds no window of {per_row / 2**20:.1f} MiB "
                         f"(seq_len {seq_len} x {width} features). Fix: raise feature_store_gib above "
                         f"{per_row / GIB:.4f}, or set it to 0 to recompute the features every step.")


class FeatureStore:
    """Features of up to `rows` windows, kept on `device`; `lookup` / `put` / `gather` are called by one thread."""

    def __init__(self, *, gib: float, seq_len: int, width: int, dtype: torch.dtype, device: torch.device,
                 max_rows: int | None = None, soft_top_k: int = 0, storage: str = "auto", groups: int = 1,
                 host_rows: int = 0):
        """`soft_top_k` > 0: each window also keeps the target's top-k next-token ids (int32) and log-probabilities
        (fp32) of every position (distillation's targets, target/soft_labels.py); get and put then take and give
        (features, ids, log-probs). `storage="float8"`: features kept in E4M3 (module docstring), scaled per
        position and per each of the `groups` target layers side by side in `width` (the drafter's
        num_target_features). `host_rows`: windows kept in host memory once the device rows are full."""
        if storage == "float8" and width % groups:
            raise ValueError(f"feature store width {width} is not {groups} target layers of equal size")
        per_row = row_bytes(seq_len=seq_len, width=width, dtype=dtype, soft_top_k=soft_top_k, storage=storage,
                            groups=groups)
        rows = int(gib * GIB // per_row)
        if max_rows is not None:
            rows = min(rows, max_rows)  # no more rows than the data has windows
        if not host_rows:
            check_holds_a_window(gib, per_row, seq_len, width)
        self.device, self.rows, self.row_bytes = torch.device(device), rows, per_row
        self.dtype, self.storage, self.groups = dtype, storage, groups
        if self.device.type == "cuda":  # the store comes on top of the run's estimate: refuse it before it OOMs
            free, _ = torch.cuda.mem_get_info(self.device)
            need = rows * per_row
            if need > free - RESERVE_BYTES:
                raise ValueError(f"feature_store_gib={gib} needs {need / GIB:.1f} GiB on {self.device} for {rows} "
                                 f"windows, but {free / GIB:.1f} GiB are free there (and {RESERVE_BYTES / GIB:.0f} "
                                 "GiB are kept for the step). Fix: set feature_store_gib to at most "
                                 f"{max(0.0, (free - RESERVE_BYTES) / GIB):.0f} (windows beyond it are recomputed).")
        fp8 = storage == "float8"
        # float8 rows are kept as their bytes (uint8): index_select / index_copy_ have no float8 kernels
        self.features = torch.empty(rows, seq_len, width, dtype=torch.uint8 if fp8 else dtype, device=self.device)
        self.columns = [self.features]  # everything a window keeps, row-aligned
        self.scales = torch.empty(rows, seq_len, groups, dtype=torch.float32, device=self.device) if fp8 else None
        if fp8:
            self.columns.append(self.scales)
        if soft_top_k:
            self.columns += [torch.empty(rows, seq_len, soft_top_k, dtype=torch.int32, device=self.device),
                             torch.empty(rows, seq_len, soft_top_k, dtype=torch.float32, device=self.device)]
        # the host tier: slot r >= rows is row r - rows here (pageable; a batch's rows go through pinned staging)
        self.host_rows = int(host_rows)
        self.host_columns = [torch.empty((self.host_rows,) + tuple(c.shape[1:]), dtype=c.dtype)
                             for c in self.columns] if self.host_rows else []
        self._slots: dict[bytes, int] = {}
        self.hits = self.misses = 0  # windows served from the store / computed by the target
        self.host_hits = 0  # of the hits, windows copied in from the host tier
        self._out: list[torch.Tensor] | None = None
        self._rounded: torch.Tensor | None = None  # float8: a computed batch's features as a gather gives them back
        # the last copy out of the pinned staging: the next batch writes it only after that copy finished
        self._staged = torch.cuda.Event() if self.device.type == "cuda" and self.host_rows else None
        # rows put for the host tier: copied out of the device into pinned staging when put, written into the host
        # tier at the next call that needs it (the drafter's step is launched meanwhile, instead of waiting for
        # the copy and the host's write as a synchronous copy would)
        self._put_staging: list[torch.Tensor] = []
        self._put_copied = torch.cuda.Event() if self.device.type == "cuda" and self.host_rows else None
        self._pending: tuple[torch.Tensor, int] | None = None  # (host rows, how many) staged, not written yet

    @property
    def stored(self) -> int:
        return len(self._slots)

    @property
    def gib(self) -> float:
        return self.rows * self.row_bytes / GIB

    @property
    def host_gib(self) -> float:
        return self.host_rows * self.row_bytes / GIB

    def lookup(self, keys: list[bytes]) -> list[int] | None:
        """The rows holding these windows, or None when any of them is not stored (the target runs for the batch)."""
        slots = [self._slots.get(k) for k in keys]
        if any(s is None for s in slots):
            self.misses += len(keys)
            return None
        self.hits += len(keys)
        return slots

    def _to_device(self, values: list[int]) -> torch.Tensor:
        index = torch.tensor(values, dtype=torch.long)
        return to_device_async(index, self.device)

    def gather(self, slots: list[int]):
        """(b, S, width) features of stored rows (with soft_top_k: (features, ids, log-probs)), in kept output
        buffers (valid until the next call)."""
        b = len(slots)
        if self._out is None or self._out[0].shape[0] != b:
            self._out = [torch.empty((b,) + tuple(c.shape[1:]), dtype=c.dtype, device=self.device)
                         for c in self.columns]
            if self.scales is not None:  # where the float8 rows come back in the features' dtype
                self._features_out = torch.empty(self._out[0].shape, dtype=self.dtype, device=self.device)
            if self.host_rows:  # a batch's host rows: pinned on the host, then their copy on the device
                pin = self.device.type == "cuda"
                self._pinned = [torch.empty_like(o, device="cpu", pin_memory=pin) for o in self._out]
                self._landed = [torch.empty_like(o) for o in self._out]
        if all(s < self.rows for s in slots):
            index = self._to_device(slots)
            out = [torch.index_select(c, 0, index, out=o) for c, o in zip(self.columns, self._out)]
        else:
            out = self._gather_two_tiers(slots)
        if self.scales is not None:
            (q, scale), out = out[:2], out[2:]
            out = [self._dequantize(q, scale, self._features_out), *out]
        return out[0] if len(out) == 1 else tuple(out)

    def _gather_two_tiers(self, slots: list[int]) -> list[torch.Tensor]:
        """Device rows gathered on the device, host rows gathered on the host into pinned staging and copied in
        (asynchronously: the staging is written again only after the previous copy out of it finished)."""
        self._land()  # rows put for the host tier by the last batch, before any of them is read
        on_device = [(i, s) for i, s in enumerate(slots) if s < self.rows]
        on_host = [(i, s - self.rows) for i, s in enumerate(slots) if s >= self.rows]
        k = len(on_host)
        self.host_hits += k
        host_index = torch.tensor([r for _, r in on_host], dtype=torch.long)
        host_at = self._to_device([i for i, _ in on_host])
        if on_device:
            device_index = self._to_device([s for _, s in on_device])
            device_at = self._to_device([i for i, _ in on_device])
        if self._staged is not None:
            self._staged.synchronize()
        for c, hc, o, pinned, landed in zip(self.columns, self.host_columns, self._out, self._pinned, self._landed):
            torch.index_select(hc, 0, host_index, out=pinned[:k])
            landed[:k].copy_(pinned[:k], non_blocking=True)
            o.index_copy_(0, host_at, landed[:k])
            if on_device:
                o.index_copy_(0, device_at, c.index_select(0, device_index))
        if self._staged is not None:
            self._staged.record()
        return self._out

    def _quantize(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, S, width) features -> E4M3 values (as bytes) and the fp32 scale of each position's slice of each
        layer."""
        b, s, w = features.shape
        x = features.float().view(b, s, self.groups, w // self.groups)
        scale = x.abs().amax(dim=-1).div_(FP8_MAX).clamp_(min=torch.finfo(torch.float32).tiny)
        return (x / scale.unsqueeze(-1)).to(FP8).view(b, s, w).view(torch.uint8), scale

    def _dequantize(self, q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        b, s, w = q.shape
        x = q.view(FP8).view(b, s, self.groups, w // self.groups).float().mul_(scale.unsqueeze(-1))
        return out.copy_(x.view(b, s, w))

    def put(self, keys: list[bytes], outputs):
        """Keep the rows of `outputs` (features (b, S, width), or the tuple `gather` gives) whose windows are new,
        while free rows remain; return what the step reads: `outputs` as a later gather gives them back.

        With float8 storage that is the rounded features, for every window of the batch, kept or not: a window
        would otherwise be read exact when computed and rounded when served, so a run's numbers would depend on
        the store's size, and a resumed job (whose store starts empty) would not repeat the steps it resumes."""
        given = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        outputs, step_reads = given, given
        if self.scales is not None:
            q, scale = self._quantize(given[0])
            if self._rounded is None or self._rounded.shape != given[0].shape:
                self._rounded = torch.empty(given[0].shape, dtype=self.dtype, device=self.device)
            outputs = (q, scale, *given[1:])
            step_reads = (self._dequantize(q, scale, self._rounded), *given[1:])
        if len(outputs) != len(self.columns):
            raise ValueError(f"the store keeps {len(self.columns) - (self.scales is not None)} tensors per window, "
                             f"got {len(outputs) - (self.scales is not None)}")
        self._keep(keys, outputs)
        return step_reads[0] if len(step_reads) == 1 else step_reads

    def _keep(self, keys: list[bytes], outputs: tuple) -> None:
        """Write the new windows of a batch (stored form: float8 features already quantized) into free rows."""
        # a batch may hold one window twice (data mixed with replacement, small data at a large batch): it is one
        # new window, kept from its first row; a second entry would move its slot and hand the next window the same
        firsts = {}
        for i, k in enumerate(keys):
            if k not in self._slots:
                firsts.setdefault(k, i)
        free = self.rows + self.host_rows - len(self._slots)
        new = [(i, k) for k, i in firsts.items()][:free]
        if not new:
            return
        for _, k in new:  # device rows first, then the host tier
            self._slots[k] = len(self._slots)
        to_device = [(i, self._slots[k]) for i, k in new if self._slots[k] < self.rows]
        to_host = [(i, self._slots[k] - self.rows) for i, k in new if self._slots[k] >= self.rows]
        if to_device:
            src, dst = self._to_device([i for i, _ in to_device]), self._to_device([r for _, r in to_device])
            for column, t in zip(self.columns, outputs):
                column.index_copy_(0, dst, t.index_select(0, src).to(column.dtype))
        if to_host:  # only while the host tier fills (epoch 1): staged now, written at the next store call
            self._land()  # the previous batch's rows first: one staging area
            n, src = len(to_host), self._to_device([i for i, _ in to_host])
            if not self._put_staging or self._put_staging[0].shape[0] < n:
                pin = self.device.type == "cuda"
                self._put_staging = [torch.empty((len(keys),) + tuple(c.shape[1:]), dtype=c.dtype, pin_memory=pin)
                                     for c in self.host_columns]
            for staged, column, t in zip(self._put_staging, self.host_columns, outputs):
                staged[:n].copy_(t.index_select(0, src).to(column.dtype), non_blocking=True)
            if self._put_copied is not None:
                self._put_copied.record(torch.cuda.current_stream(self.device))
            self._pending = torch.tensor([r for _, r in to_host]), n

    def _land(self) -> None:
        """The host rows staged by the last put, written into the host tier (after their copy out of the device)."""
        if self._pending is None:
            return
        dst, n = self._pending
        if self._put_copied is not None:
            self._put_copied.synchronize()
        for column, staged in zip(self.host_columns, self._put_staging):
            column.index_copy_(0, dst, staged[:n])
        self._pending = None

    def report(self) -> dict:
        """What the store did so far: its size, how full it is, and the share of windows it served."""
        seen = self.hits + self.misses
        report = {"feature_store_rows": self.rows, "feature_store_stored": self.stored,
                  "feature_store_gib": round(self.gib, 3), "feature_store_storage": self.storage,
                  "feature_store_hit_rate": round(self.hits / seen, 4) if seen else 0.0}
        if self.host_rows:  # the host tier: its size, and the share of served windows copied in from it
            report.update(feature_store_host_rows=self.host_rows, feature_store_host_gib=round(self.host_gib, 3),
                          feature_store_host_share=round(self.host_hits / self.hits, 4) if self.hits else 0.0)
        return report
