"""The only threaded, stateful module: one worker thread per GPU, static buffers, captured steps, gradient sums.

    targets (frozen, bf16) --features, GPU->GPU--> drafter workers --grads--> sum over replicas --> AdamW each

Placement (placement.py) decides the layout; `build_engine` builds it:
- colocated: worker i owns target replica i on the same GPU; its thread runs target forward then drafter step on one
  CUDA stream, and the drafter reads the target graph's static output directly (no copy at all).
- split: target replicas have their own threads/streams and push features into two "inbox" slots on each drafter GPU
  (peer copy, no host round-trip); CUDA events order writer and reader, so the target side works on batch t+1 while
  the drafters train on batch t (the Trainer passes `next_batch`).

Every step: each worker copies its micro-batch into static buffers, builds the FlexAttention BlockMask from the
static anchors OUTSIDE the graph, replays its captured forward+backward (cuda_graphs.GraphedStep; eager on CPU),
gradients (one flat buffer per replica, the parameters' .grad are views of it) are summed across replicas with one
NCCL all-reduce (loss weights are normalised over the global batch, so the sum IS the single-device gradient), and
each worker steps its own MasterAdamW identically, which keeps the replicas in sync without a broadcast.

An exception in any thread stops the step, waits for every other thread (nothing is left running), is re-raised in
the caller as WorkerError with the device and the step, and marks the engine broken so a later `step()` says so.
Metrics (`Engine.metrics`) come from CUDA events on each stream: per-phase times, each GPU's idle fraction, and for
split placements supply (features/s the targets can make) versus demand (what the drafters can consume).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import statistics
import threading
import time

import torch

from .blocks import BlockBatch, block_mask_from_dense, dense_mask, flex_mask_mod
from .config import window_masks
from .cuda_graphs import GraphedStep, copy_into, input_mismatch
from .step import DraftInputs, block_stats, drafter_loss


class WorkerError(RuntimeError):
    """A worker failed; carries the device and the step."""

    def __init__(self, device: str, step: int, cause: BaseException, role: str = "drafter worker"):
        super().__init__(f"{role} on {device} failed at step {step}: {type(cause).__name__}: {cause}")
        self.device, self.step, self.cause, self.role = device, step, cause, role


class EngineBrokenError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------------------------
# Threads, timing marks and per-stream timelines
# ---------------------------------------------------------------------------------------------------------------

class DeviceThread:
    """One thread, and on a GPU one CUDA stream, that runs everything submitted for one device role, in order."""

    def __init__(self, device: torch.device, role: str):
        self.device, self.role = device, role
        self.pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dflash-{role}-{device}")
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def submit(self, fn, *args) -> cf.Future:
        return self.pool.submit(self._run, fn, args)

    def _run(self, fn, args):
        if self.stream is None:
            return fn(*args)
        torch.cuda.set_device(self.device)
        with torch.cuda.stream(self.stream):
            return fn(*args)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def mark(device: torch.device, stream=None):
    """A point on a device's timeline: a timing CUDA event on the (current) stream, or a host timestamp on CPU."""
    if device.type != "cuda":
        return time.perf_counter()
    e = torch.cuda.Event(enable_timing=True)
    e.record(stream)
    return e


def _ready(m) -> bool:
    return m.query() if isinstance(m, torch.cuda.Event) else True


def _ms(a, b) -> float:
    return a.elapsed_time(b) if isinstance(a, torch.cuda.Event) else (b - a) * 1e3


class Timeline:
    """Busy intervals of one stream (phase, start, end), read back once their events completed (no sync)."""

    def __init__(self, keep: int = 96):
        self._pending: collections.deque = collections.deque()
        self.done: collections.deque = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, step: int, phase: str, start, end) -> None:
        with self._lock:
            self._pending.append((step, phase, start, end))

    def harvest(self) -> None:
        with self._lock:
            while self._pending and _ready(self._pending[0][3]):
                step, phase, a, b = self._pending.popleft()
                self.done.append((step, phase, a, b, _ms(a, b)))

    def phase_ms(self, phase: str) -> float | None:
        xs = [ms for _, p, _, _, ms in self.done if p == phase]
        return statistics.median(xs) if xs else None

    def busy_fraction(self, last_steps: int = 16) -> float | None:
        """Share of wall time this stream was busy over its last `last_steps` steps (None before 3 steps)."""
        steps = sorted({s for s, *_ in self.done})[-last_steps:]
        if len(steps) < 3:
            return None
        first = steps[1]  # skip the oldest step: its start may precede a gap we did not see
        rows = [r for r in self.done if r[0] >= first]
        span = _ms(rows[0][2], rows[-1][3])
        return min(1.0, sum(r[4] for r in rows) / span) if span > 0 else None


# ---------------------------------------------------------------------------------------------------------------
# Static buffers
# ---------------------------------------------------------------------------------------------------------------

class StaticBuffers:
    """Persistent device tensors keyed by name. `stage` copies a host tensor into the kept buffer when the shape and
    dtype match (same address every step: what a CUDA graph needs); otherwise it returns a fresh device tensor,
    which the graph wrapper then reports as a mismatch and runs eagerly."""

    def __init__(self, device: torch.device):
        self.device, self.bufs = device, {}

    def stage(self, name: str, src: torch.Tensor) -> torch.Tensor:
        buf = self.bufs.get(name)
        if buf is not None and buf.shape == src.shape and buf.dtype == src.dtype:
            buf.copy_(src, non_blocking=True)
            return buf
        fresh = src.to(self.device, non_blocking=True)
        if buf is None:
            self.bufs[name] = fresh
        return fresh


def _why_eager(cuda_graphs: bool, device: torch.device) -> str:
    return "no CUDA graphs on CPU" if device.type != "cuda" else "cuda_graphs=False"


# ---------------------------------------------------------------------------------------------------------------
# Target replica and drafter worker
# ---------------------------------------------------------------------------------------------------------------

class TargetReplica:
    """A frozen target on one device; its forward (up to the last needed layer) is captured like the drafter step."""

    def __init__(self, index: int, device: torch.device, extractor, *, cuda_graphs: bool, log=None):
        self.index, self.device, self.extractor = index, torch.device(device), extractor
        self.graphed = GraphedStep(lambda input_ids: extractor(input_ids), name=f"target[{index}]@{self.device}",
                                   enabled=cuda_graphs and self.device.type == "cuda", warmup=1, log=log,
                                   disabled_reason=_why_eager(cuda_graphs, self.device))
        self.buffers = StaticBuffers(self.device)
        self.timeline = Timeline()
        self.thread: DeviceThread | None = None  # set by the Engine (own thread if split, the worker's if colocated)

    @property
    def dtype(self) -> torch.dtype:
        dtype = getattr(self.extractor, "dtype", None)  # CachedFeatureExtractor: the cache's compute dtype
        return dtype if dtype is not None else self.extractor.decoder.embed_tokens.weight.dtype

    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(b, S) host ids -> (b, S, n*H) on this device; in graph mode the static output (valid until next call)."""
        ids = self.buffers.stage("input_ids", input_ids) if self.device.type == "cuda" else input_ids.to(self.device)
        return self.graphed(input_ids=ids)


class Worker:
    """One drafter replica on one device: flat gradient buffer, static inputs, captured forward+backward, optimiser."""

    def __init__(self, *, index: int, device, drafter: torch.nn.Module, optimizer, embed: torch.nn.Embedding,
                 head_weight: torch.Tensor, attention: str, seq_len: int, layer_types: tuple[str, ...],
                 sliding_window: int | None, chunk_size: int, cuda_graphs: bool, forward_module=None, log=None,
                 layer_windows: tuple = ()):
        self.index, self.device = index, torch.device(device)
        self.drafter, self.optimizer, self.embed, self.head_weight = drafter, optimizer, embed, head_weight
        self.forward_module = forward_module if forward_module is not None else drafter  # compiled or not
        self.attention, self.seq_len, self.chunk_size = attention, seq_len, chunk_size
        self.layer_types, self.sliding_window = tuple(layer_types), sliding_window
        self.mask_windows = window_masks(layer_types, sliding_window, layer_windows)  # {mask key: window}
        self.block_size = drafter.config.block_size
        self.thread = DeviceThread(self.device, "drafter")
        self.target: TargetReplica | None = None  # colocated only
        self.timeline = Timeline()
        self.buffers = StaticBuffers(self.device)
        self.inbox: list[torch.Tensor | None] = [None, None]  # split: feature slots the target side writes
        self.inbox_free = [torch.cuda.Event() if self.device.type == "cuda" else None for _ in range(2)]
        self._features: torch.Tensor | None = None
        self._mask_mods: dict | None = None
        self._static_masks: dict = {}
        self.graphed = GraphedStep(self._forward_backward, name=f"drafter[{index}]@{self.device}",
                                   enabled=cuda_graphs and self.device.type == "cuda", warmup=2, log=log,
                                   disabled_reason=_why_eager(cuda_graphs, self.device))
        params = [p for p in drafter.parameters() if p.requires_grad]
        if len({(p.dtype, p.device) for p in params}) != 1:
            raise ValueError("all trainable drafter parameters must share one dtype and device")
        self.params = params
        self.flat_grad = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=self.device)
        views, offset = [], 0
        for p in params:
            views.append(self.flat_grad[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self._grad_views = views
        self.attach_grads()

    def attach_grads(self) -> None:
        """Point every p.grad at its view of the flat buffer (backward accumulates into it in place)."""
        for p, v in zip(self.params, self._grad_views):
            if p.grad is not v:
                p.grad = v

    # -- inputs ---------------------------------------------------------------------------------------------------
    def take_features(self, slot: int) -> torch.Tensor:
        """Split placements: the features the target side pushed into inbox[slot] (ordered by an event wait)."""
        src = self.inbox[slot]
        if self.device.type != "cuda":
            return src
        if self._features is None or self._features.shape != src.shape:
            self._features = torch.empty_like(src)
        self._features.copy_(src, non_blocking=True)
        self.inbox_free[slot].record()  # the target side may overwrite this slot now
        return self._features

    def _stage(self, part: BlockBatch) -> dict:
        names = ("draft_ids", "position_ids", "labels", "loss_weights", "anchors", "anchor_valid")
        if self.device.type != "cuda":
            t = {k: getattr(part, k).to(self.device) for k in names}
        else:
            t = {k: self.buffers.stage(k, getattr(part, k)) for k in names}
        b = part.anchors.shape[0]
        ctx = self.buffers.bufs.get("ctx_pos")
        if ctx is None or ctx.shape != (b, self.seq_len):
            ctx = torch.arange(self.seq_len, device=self.device)[None].expand(b, -1).contiguous()
            self.buffers.bufs["ctx_pos"] = ctx
        t["ctx_pos"] = ctx
        return t

    def _masks(self, anchors: torch.Tensor, anchor_valid: torch.Tensor) -> dict:
        """Attention masks per distinct window (config.window_masks), built from the (static) anchors outside any
        graph: the windows are data of the masks, never Python values inside the compiled or captured step."""
        S, B = self.seq_len, self.block_size
        window = self.mask_windows
        types = sorted(window)
        if self.attention == "sdpa":
            return {t: dense_mask(anchors, anchor_valid, seq_len=S, block_size=B, sliding_window=window[t])
                    for t in types}
        static = anchors is self.buffers.bufs.get("anchors") and anchor_valid is self.buffers.bufs.get("anchor_valid")
        if static and self._mask_mods is None:  # closures over the STATIC anchors: the graph's flex kernels read them
            self._mask_mods = {t: flex_mask_mod(anchors, anchor_valid, seq_len=S, block_size=B,
                                                sliding_window=window[t]) for t in types}
        mods = self._mask_mods if static else {
            t: flex_mask_mod(anchors, anchor_valid, seq_len=S, block_size=B, sliding_window=window[t]) for t in types}
        masks = {t: block_mask_from_dense(dense_mask(anchors, anchor_valid, seq_len=S, block_size=B,
                                                     sliding_window=window[t]), mods[t]) for t in types}
        if not static:
            return masks
        out = {}
        for t, m in masks.items():  # refresh the kept BlockMask in place (same tensors every step)
            kept = self._static_masks.get(t)
            if kept is None:
                self._static_masks[t] = kept = m
            elif input_mismatch(t, m, kept) is None:
                copy_into(kept, m)
            else:
                kept = m
            out[t] = kept
        return out

    # -- the captured step ------------------------------------------------------------------------------------
    def _forward_backward(self, features, draft_ids, position_ids, labels, loss_weights, ctx_pos, **masks):
        self.flat_grad.zero_()  # masks: {mask key: mask}, one per distinct window
        # input_ids / loss_mask / anchors are not needed past this point (features and masks carry them).
        bb = BlockBatch(input_ids=None, loss_mask=None, anchors=None, anchor_valid=None, draft_ids=draft_ids,
                        position_ids=position_ids, labels=labels, loss_weights=loss_weights,
                        block_size=self.block_size)
        loss, raw = drafter_loss(self.forward_module, self.embed, self.head_weight, features,
                                 DraftInputs(bb, masks, ctx_pos), self.chunk_size)
        loss.backward()
        return loss.detach(), raw["correct"], raw["has_loss"]

    def forward_backward(self, part: BlockBatch, features: torch.Tensor, step: int) -> dict:
        m0 = mark(self.device)
        self.attach_grads()
        t = self._stage(part)
        masks = self._masks(t["anchors"], t["anchor_valid"])
        loss, correct, has_loss = self.graphed(
            features=features, draft_ids=t["draft_ids"], position_ids=t["position_ids"], labels=t["labels"],
            loss_weights=t["loss_weights"], ctx_pos=t["ctx_pos"], **masks)
        out = {"loss": loss.clone(), "correct": correct.clone(), "has_loss": has_loss.clone()}
        self.timeline.add(step, "drafter", m0, mark(self.device))
        return out

    def optimizer_step(self, lr: float, grad_clip: float, step: int = -1) -> torch.Tensor:
        m0 = mark(self.device)
        self.attach_grads()
        norm = self.optimizer.step(lr, grad_clip)
        for p, m in zip(self.optimizer.params, self.optimizer.masters):
            if m is not p:
                m.grad = None  # fp32 master grads are rebuilt each step: do not hold 4 bytes/param between steps
        self.timeline.add(step, "optimizer", m0, mark(self.device))
        return norm

    def shutdown(self) -> None:
        self.thread.shutdown()


# ---------------------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------------------

class _Job:
    """One batch's target work (split placements): futures per replica, each returning its 'features ready' event."""

    def __init__(self, batch: BlockBatch, slot: int, futures: list[cf.Future], step: int):
        self.batch, self.slot, self.futures, self.step = batch, slot, futures, step


class Engine:
    def __init__(self, workers: list[Worker], targets: list[TargetReplica], *, colocated: bool, seq_len: int,
                 grad_clip: float, target_config=None, drafter_config=None, prefetch: bool = True, log=None):
        self.workers, self.targets, self.colocated = workers, targets, colocated
        self.seq_len, self.grad_clip, self.prefetch, self.log = seq_len, grad_clip, prefetch, log
        self.target_config, self.drafter_config = target_config, drafter_config
        if colocated:
            if len(targets) != len(workers):
                raise ValueError("colocated placement needs one target replica per worker")
            for w, r in zip(workers, targets):
                w.target, r.thread = r, w.thread
        else:
            for r in targets:
                r.thread = DeviceThread(r.device, "target")
        self.broken: WorkerError | None = None
        self._lock = threading.Lock()
        self._prefetched: _Job | None = None
        self._next_slot = 0
        self._routes: dict | None = None
        self._shape: tuple | None = None  # (b, S, N, B) of the last batch
        self._flops: dict | None = None
        self.steps_done = 0
        self.first_step_seconds: float | None = None
        self._dynamo_start = _dynamo_counts()
        self._dynamo_after_first: dict | None = None
        self._nccl = None
        for d in {str(x.device): x.device for x in [*workers, *targets]}.values():
            if d.type == "cuda":  # weights/masters were made on the default stream; workers use their own streams
                torch.cuda.synchronize(d)

    @property
    def prefetches(self) -> bool:
        """True when the caller should pass `next_batch` (split placements overlap target and drafter work)."""
        return self.prefetch and not self.colocated

    # -- public ---------------------------------------------------------------------------------------------------
    def step(self, batch: BlockBatch, *, step: int, lr: float, next_batch: BlockBatch | None = None) -> dict:
        """One optimizer step over the global batch. Returns tensors on the first worker's device (read them to sync).

        `next_batch` (split placements): the batch of the following step, whose target forward then runs while the
        drafters train on this one.
        """
        if self.broken is not None:
            raise EngineBrokenError(
                f"the engine stopped after an error ({self.broken}). Its replicas may be out of sync. "
                "HINT: fix the cause, then build a new Trainer (or resume_from the last checkpoint).")
        with self._lock:
            t0 = time.perf_counter()
            try:
                out = self._step(batch, step, lr, next_batch)
            except WorkerError as e:
                self.broken = e
                self._drain()
                raise e from e.cause
            self.steps_done += 1
            if self.steps_done == 1:
                self.first_step_seconds = time.perf_counter() - t0
                self._dynamo_after_first = _dynamo_counts()
            return out

    def shutdown(self) -> None:
        self._drain()
        for t in {id(x.thread): x.thread for x in [*self.workers, *self.targets] if x.thread is not None}.values():
            t.shutdown()

    # -- one step -------------------------------------------------------------------------------------------------
    def _step(self, batch: BlockBatch, step: int, lr: float, next_batch: BlockBatch | None) -> dict:
        D = len(self.workers)
        b, S = batch.input_ids.shape
        self._shape = (b, S, batch.num_anchors, batch.block_size)
        parts = batch.split(D)
        if self.colocated:
            outs = self._gather(step, [(w, w.thread.submit(self._colocated_task, w, parts[i], step))
                                       for i, w in enumerate(self.workers)])
        else:
            job = self._job_for(batch, step)
            ready = self._gather(step, list(zip(self.targets, job.futures)), role="target replica")
            if next_batch is not None and self.prefetch:
                self._prefetched = self._submit(next_batch, step + 1)
            feeders = self._routes["feeders"]
            outs = self._gather(step, [(w, w.thread.submit(self._drafter_task, w, parts[i],
                                                           [ready[r] for r in feeders[i]], job.slot, step))
                                       for i, w in enumerate(self.workers)])
        if D > 1:
            self._sum_gradients(step)
        norms = self._gather(step, [(w, w.thread.submit(w.optimizer_step, lr, self.grad_clip, step))
                                    for w in self.workers])
        dev0 = self.workers[0].device
        if dev0.type == "cuda":  # what follows (and the caller's reads) run on this thread's streams: order them
            for w, o, n in zip(self.workers, outs, norms):
                torch.cuda.current_stream(w.device).wait_stream(w.thread.stream)
                for t in (o["loss"], o["correct"], o["has_loss"], n):
                    t.record_stream(torch.cuda.current_stream(w.device))
        loss = sum(o["loss"].to(dev0) for o in outs)
        correct = torch.cat([o["correct"].to(dev0) for o in outs])
        has_loss = torch.cat([o["has_loss"].to(dev0) for o in outs])
        return {"loss": loss, "grad_norm": norms[0], **block_stats(correct, has_loss)}

    def _colocated_task(self, w: Worker, part: BlockBatch, step: int) -> dict:
        m0 = mark(w.device)
        features = w.target.features(part.input_ids)
        w.target.timeline.add(step, "target", m0, mark(w.device))
        return w.forward_backward(part, features, step)

    def _drafter_task(self, w: Worker, part: BlockBatch, ready: list, slot: int, step: int) -> dict:
        if w.device.type == "cuda":
            for ev in ready:
                torch.cuda.current_stream().wait_event(ev)  # on the GPU: no host wait
        return w.forward_backward(part, w.take_features(slot), step)

    def _target_task(self, r: TargetReplica, input_ids: torch.Tensor, slot: int, step: int):
        routes = self._routes["targets"][r.index]
        if r.device.type == "cuda":
            for w, *_ in routes:
                torch.cuda.current_stream().wait_event(w.inbox_free[slot])  # slot consumed by the drafter?
        m0 = mark(r.device)
        features = r.features(input_ids)  # (bt, S, n*H)
        for w, s0, s1, d0, d1 in routes:
            w.inbox[slot][d0:d1].copy_(features[s0:s1], non_blocking=True)  # GPU -> GPU peer copy
        m1 = mark(r.device)
        r.timeline.add(step, "target", m0, m1)
        return m1 if r.device.type == "cuda" else None

    # -- split placements: target jobs ------------------------------------------------------------------------
    def _job_for(self, batch: BlockBatch, step: int) -> _Job:
        pre, self._prefetched = self._prefetched, None
        if pre is not None:
            if pre.batch is batch or (pre.batch.input_ids.shape == batch.input_ids.shape
                                      and torch.equal(pre.batch.input_ids, batch.input_ids)):
                return pre  # features depend on input_ids only
            _wait_quietly(pre.futures)  # the caller changed its mind: discard
        return self._submit(batch, step)

    def _submit(self, batch: BlockBatch, step: int) -> _Job:
        self._prepare_routes(batch)
        slot, self._next_slot = self._next_slot, 1 - self._next_slot
        bt = batch.input_ids.shape[0] // len(self.targets)
        futures = [r.thread.submit(self._target_task, r, batch.input_ids[i * bt:(i + 1) * bt], slot, step)
                   for i, r in enumerate(self.targets)]
        return _Job(batch, slot, futures, step)

    def _prepare_routes(self, batch: BlockBatch) -> None:
        """Which rows of which target replica feed which rows of which worker; (re)allocate inbox slots."""
        b, S = batch.input_ids.shape
        T, D = len(self.targets), len(self.workers)
        if b % T or b % D:
            raise ValueError(f"batch of {b} sequences does not split over {T} target replicas and {D} drafter "
                             "workers. Fix: use a batch_size that is a multiple of both.")
        if self._routes is not None and self._routes["shape"] == (b, S):
            return
        if self._routes is not None:  # shape changed: let in-flight work finish before reallocating slots
            self._drain()
            for w in self.workers:
                if w.device.type == "cuda":
                    torch.cuda.synchronize(w.device)
        bt, bd = b // T, b // D
        width = self.drafter_config.num_target_features * self.drafter_config.hidden_size
        dtype = self.targets[0].dtype
        for w in self.workers:
            w.inbox = [torch.empty(bd, S, width, dtype=dtype, device=w.device) for _ in range(2)]
        targets = {r.index: [] for r in self.targets}
        feeders = {i: [] for i in range(D)}
        for r in range(T):
            for d in range(D):
                lo, hi = max(r * bt, d * bd), min((r + 1) * bt, (d + 1) * bd)
                if lo < hi:
                    targets[r].append((self.workers[d], lo - r * bt, hi - r * bt, lo - d * bd, hi - d * bd))
                    feeders[d].append(r)
        self._routes = {"shape": (b, S), "targets": targets, "feeders": feeders}

    def _drain(self) -> None:
        """Wait for every queued target job (prefetch), ignoring its errors: nothing keeps running after a failure."""
        pre, self._prefetched = self._prefetched, None
        if pre is not None:
            _wait_quietly(pre.futures)

    # -- gradients --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _sum_gradients(self, step: int) -> None:
        """flat_grad <- sum over replicas, in place on every worker (NCCL all-reduce on the workers' streams)."""
        ws = self.workers
        flats = [w.flat_grad for w in ws]
        if ws[0].device.type != "cuda":
            m0 = mark(ws[0].device)
            total = flats[0]
            for f in flats[1:]:
                total += f
            for f in flats[1:]:
                f.copy_(total)
            m1 = mark(ws[0].device)
            for w in ws:
                w.timeline.add(step, "reduce", m0, m1)
            return
        starts = [mark(w.device, w.thread.stream) for w in ws]
        streams = [w.thread.stream for w in ws]
        if self._nccl is None:
            try:
                import torch.cuda.nccl as nccl

                self._nccl = nccl if nccl.is_available(flats) else False
            except (ImportError, RuntimeError):
                self._nccl = False
        if self._nccl:
            try:
                self._nccl.all_reduce(flats, streams=streams)
            except RuntimeError as e:  # keep training on peer copies, and say so once
                self._nccl = False
                if self.log:
                    self.log(f"NCCL all-reduce failed ({e}); summing gradients with peer copies instead")
        if not self._nccl:  # reduce to the first GPU, then copy back (peer copies on the workers' streams)
            s0 = streams[0]
            for w in ws[1:]:
                with torch.cuda.stream(w.thread.stream), torch.cuda.stream(s0):
                    s0.wait_stream(w.thread.stream)
                    flats[0].add_(w.flat_grad.to(ws[0].device, non_blocking=True))
            for w in ws[1:]:
                with torch.cuda.stream(w.thread.stream), torch.cuda.stream(s0):
                    w.thread.stream.wait_stream(s0)
                    w.flat_grad.copy_(flats[0], non_blocking=True)
        for w, m0 in zip(ws, starts):
            w.timeline.add(step, "reduce", m0, mark(w.device, w.thread.stream))

    # -- errors -----------------------------------------------------------------------------------------------
    def _gather(self, step: int, pairs: list, role: str = "drafter worker") -> list:
        results, first = [], None
        for owner, fut in pairs:  # wait for ALL, so none is left running on stale state
            try:
                results.append(fut.result())
            except BaseException as e:  # noqa: BLE001 - re-raised below with device and step
                if first is None:
                    first = e if isinstance(e, WorkerError) else WorkerError(str(owner.device), step, e, role)
        if first is not None:
            raise first
        return results

    # -- metrics ----------------------------------------------------------------------------------------------
    def metrics(self, tokens_per_s: float | None = None) -> dict:
        """Engine metrics for a record: phase times, GPU idle fractions, supply/demand (split), MFU, memory,
        graph modes, compile counters. `tokens_per_s` (the caller's steady or instant rate) drives MFU."""
        for x in [*self.targets, *self.workers]:
            x.timeline.harvest()
        m: dict = {"placement": "colocated" if self.colocated else "split"}

        def med(xs):
            xs = [x for x in xs if x is not None]
            return round(statistics.median(xs), 3) if xs else None

        m["target_ms"] = med([r.timeline.phase_ms("target") for r in self.targets])
        m["drafter_ms"] = med([w.timeline.phase_ms("drafter") for w in self.workers])
        m["optimizer_ms"] = med([w.timeline.phase_ms("optimizer") for w in self.workers])
        if len(self.workers) > 1:
            m["reduce_ms"] = med([w.timeline.phase_ms("reduce") for w in self.workers])
        if self._shape is not None:
            b, S, N, B = self._shape
            if not self.colocated:
                tw = [r.timeline.busy_fraction() for r in self.targets]
                dw = [w.timeline.busy_fraction() for w in self.workers]
                if all(x is not None for x in tw + dw):
                    m["target_wait_frac"] = round(1 - statistics.mean(tw), 4)
                    m["drafter_wait_frac"] = round(1 - statistics.mean(dw), 4)
                d_busy = sum(x or 0 for x in (m["drafter_ms"], m["optimizer_ms"], m.get("reduce_ms")))
                if m["target_ms"] and d_busy:
                    m["supply_tokens_per_s"] = round(b * S / (m["target_ms"] / 1e3), 1)  # all replicas together
                    m["demand_tokens_per_s"] = round(b * S / (d_busy / 1e3), 1)
                    m.update(_balance(m))
            if tokens_per_s:
                n_dev = len({str(d) for d in [*(r.device for r in self.targets), *(w.device for w in self.workers)]})
                m["tokens_per_s_per_gpu" if self.workers[0].device.type == "cuda" else "tokens_per_s_per_device"] = \
                    round(tokens_per_s / n_dev, 1)
                m["draft_positions_per_s"] = round(tokens_per_s * N * B / S, 1)
                flops = self.flops_per_sequence()
                peak = self.peak_flops()
                if flops and peak:
                    m["mfu"] = round(tokens_per_s / S * flops["total"] / (peak * n_dev), 4)
        for d in dict.fromkeys([*(r.device for r in self.targets), *(w.device for w in self.workers)]):
            if d.type == "cuda":
                m[f"mem_gb/{d}"] = round(torch.cuda.memory_allocated(d) / 2**30, 3)
                m[f"peak_mem_gb/{d}"] = round(torch.cuda.max_memory_allocated(d) / 2**30, 3)
        for x in [*self.targets, *self.workers]:
            m[f"graph/{x.graphed.name}"] = x.graphed.describe()
        now = _dynamo_counts()
        if now:
            m["compiled_graphs"] = now["graphs"] - self._dynamo_start["graphs"]
            m["graph_breaks"] = now["graph_breaks"] - self._dynamo_start["graph_breaks"]
            if self._dynamo_after_first is not None:
                m["recompiles_after_first_step"] = now["graphs"] - self._dynamo_after_first["graphs"]
        if self.first_step_seconds is not None:
            m["first_step_s"] = round(self.first_step_seconds, 3)
        return m

    def flops_per_sequence(self) -> dict | None:
        """The FLOP model of docs/performance.md for the current shape (target, drafter, head, total)."""
        if self._flops is None and self._shape is not None and self.target_config is not None:
            from .metrics import flops_per_sequence

            _, S, N, _ = self._shape
            self._flops = flops_per_sequence(target_cfg=self.target_config, drafter_cfg=self.drafter_config,
                                             seq_len=S, num_anchors=N)
        return self._flops

    def peak_flops(self) -> float | None:
        d = self.workers[0].device
        if d.type != "cuda":
            return None
        from .metrics import peak_flops

        return peak_flops(torch.cuda.get_device_name(d))


def _balance(m: dict) -> dict:
    """Which side of a split placement limits throughput, in words a user acts on."""
    dw, tw = m.get("drafter_wait_frac"), m.get("target_wait_frac")
    supply, demand = m["supply_tokens_per_s"], m["demand_tokens_per_s"]
    rates = f"targets can supply {supply / 1e3:.1f}k tok/s, drafters can consume {demand / 1e3:.1f}k tok/s"
    if supply < 0.9 * demand:
        side = "target"
        hint = (f"drafter GPUs wait {dw:.0%} of the time for features: " if dw is not None else "") + \
               f"{rates}; give the target side more GPUs (more replicas)"
    elif demand < 0.9 * supply:
        side = "drafter"
        hint = (f"target GPUs wait {tw:.0%} of the time for the drafters: " if tw is not None else "") + \
               f"{rates}; give the drafter side more GPUs"
    else:
        side, hint = "balanced", f"balanced: {rates}"
    return {"bottleneck": side, "balance_hint": hint}


def _wait_quietly(futures) -> None:
    for f in futures:
        try:
            f.result()
        except BaseException:  # noqa: BLE001 - already failed or discarded; the caller reports the first error
            pass


def _dynamo_counts() -> dict:
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - no dynamo: nothing to count
        return {}
    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


# ---------------------------------------------------------------------------------------------------------------
# Building an engine from a config, a placement and loaded targets
# ---------------------------------------------------------------------------------------------------------------

def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _empty_drafter(drafter_config, device: torch.device):
    """A drafter whose parameters are allocated on `device` without the default (CPU-slow) init."""
    from .drafter import DFlashDrafter, RotaryEmbedding

    if device.type == "cpu":
        return DFlashDrafter(drafter_config)
    with torch.device("meta"):
        d = DFlashDrafter(drafter_config)
    d.to_empty(device=device)
    with torch.device(device):
        d.rotary_emb = RotaryEmbedding(drafter_config)  # RoPE tables are computed, not initialised
    return d


def _initial_drafter(drafter_config, seed: int, device: torch.device):
    """The seeded initial weights, made once. On a GPU they are drawn from a CUDA generator (1B parameters in
    milliseconds instead of ~20 s of CPU construction + init), so a GPU run's init differs from a CPU run's init with
    the same seed; all replicas of one run are identical either way."""
    d = _empty_drafter(drafter_config, device)
    d.init_weights(torch.Generator(device=device).manual_seed(seed))
    return d


def build_engine(config, placement, targets: list, drafter_config, *, target_config=None, log=None,
                 compile_backend: str = "inductor", compile_mode: str | None = None) -> Engine:
    """Drafter replicas (identical init), target replicas and worker threads for `placement`.

    `targets`: loaded target models aligned with placement.target_devices (targets.load_targets). With
    config.compile_drafter each replica's forward is torch.compile(dynamic=False, mode=compile_mode): inductor
    kernels, no CUDAGraph Trees; our own capture (cuda_graphs.py) wraps the compiled step.
    """
    from .optim import MasterAdamW
    from .targets import FeatureExtractor, embedding_of, lm_head_weight

    cfg = config
    if compile_mode is not None and cfg.compile_drafter:  # validated like the field: CUDAGraph Trees are refused
        cfg = cfg.replace(compile_mode=compile_mode)
    base = _initial_drafter(drafter_config, cfg.seed, torch.device(placement.drafter_devices[0]))
    state = base.state_dict()
    def extractor(device, model):
        if not cfg.feature_cache:  # online: run the target up to its last needed layer
            return FeatureExtractor(model, drafter_config.target_layer_ids, fp8=cfg.target_fp8,
                                    compile=cfg.compile_target)
        from .feature_cache import CachedFeatureExtractor  # offline: read features, run no target layer

        return CachedFeatureExtractor(cfg.feature_cache, layer_ids=drafter_config.target_layer_ids,
                                      dtype=embedding_of(model).weight.dtype)

    # A cache lookup is host work, so it cannot be captured in a CUDA graph: cached features run eagerly.
    replicas = [TargetReplica(i, torch.device(d), extractor(d, m), cuda_graphs=cfg.cuda_graphs and not cfg.feature_cache,
                              log=log)
                for i, (d, m) in enumerate(zip(placement.target_devices, targets))]
    workers = []
    for i, name in enumerate(placement.drafter_devices):
        dev = torch.device(name)
        drafter = _empty_drafter(drafter_config, dev)
        drafter.load_state_dict(state)  # identical replicas (GPU -> GPU copies)
        drafter.to(device=dev, dtype=compute_dtype(cfg.dtype, dev))
        forward = drafter
        if cfg.drafter_fp8:  # perf (issue 16): FP8 GEMMs in the drafter's linear layers, same parameters
            from .fp8 import fp8_train_linears

            fp8_train_linears(drafter, weight_grad=cfg.drafter_fp8_weight_grad)
        if cfg.compile_drafter is True or (cfg.compile_drafter == "auto" and dev.type == "cuda"):
            forward = torch.compile(drafter, dynamic=False, backend=compile_backend, mode=cfg.compile_mode)
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
        attention = cfg.attention if cfg.attention != "auto" else ("flex" if dev.type == "cuda" else "sdpa")
        workers.append(Worker(index=i, device=dev, drafter=drafter, forward_module=forward,
                              optimizer=MasterAdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay),
                              embed=embed, head_weight=head, attention=attention, seq_len=cfg.seq_len,
                              layer_types=drafter_config.layer_types, sliding_window=drafter_config.sliding_window,
                              layer_windows=drafter_config.layer_windows,
                              chunk_size=cfg.loss_chunk_size, cuda_graphs=cfg.cuda_graphs, log=log))
    return Engine(workers, replicas, colocated=placement.colocated, seq_len=cfg.seq_len, grad_clip=cfg.grad_clip,
                  target_config=target_config if target_config is not None else getattr(targets[0], "config", None),
                  drafter_config=drafter_config, log=log)
