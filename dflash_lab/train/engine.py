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

import concurrent.futures as cf
import threading
import time

import torch

from dflash_lab.drafter.blocks import BlockBatch
from .engine_metrics import dynamo_counts, engine_metrics
from dflash_lab.drafter.step import block_stats
from dflash_lab.drafter.variants import variant_of
from dflash_lab.target.device_time import mark
from .streams import DeviceThread
from .workers import TargetReplica, Worker


class WorkerError(RuntimeError):
    """A worker failed; carries the device and the step."""

    def __init__(self, device: str, step: int, cause: BaseException, role: str = "drafter worker"):
        super().__init__(f"{role} on {device} failed at step {step}: {type(cause).__name__}: {cause}")
        self.device, self.step, self.cause, self.role = device, step, cause, role


class EngineBrokenError(RuntimeError):
    pass



# ---------------------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------------------

class _Job:
    """One batch's target work (split placements): futures per replica, each returning its 'features ready' event."""

    def __init__(self, batch: BlockBatch, slot: int, futures: list[cf.Future], step: int):
        self.batch, self.slot, self.futures, self.step = batch, slot, futures, step


class Engine:
    def __init__(self, workers: list[Worker], targets: list[TargetReplica], *, colocated: bool, seq_len: int,
                 grad_clip: float, target_config=None, drafter_config=None, prefetch: bool = True, log=None,
                 grad_reducer=None):
        """`grad_reducer(flat_grad)`: the sum over other PROCESSES (a torchrun rank's all-reduce over the drafter
        ranks), run in each worker's thread on its stream after this process's replicas were summed."""
        self.workers, self.targets, self.colocated = workers, targets, colocated
        self.grad_reducer = grad_reducer
        self.seq_len, self.grad_clip, self.prefetch, self.log = seq_len, grad_clip, prefetch, log
        self.target_config, self.drafter_config = target_config, drafter_config
        self.term_names = variant_of(workers[0].drafter.config).metrics  # the variant's logged loss terms
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
        self.shape: tuple | None = None  # (b, S, N, B) of the last batch
        self.flops: dict | None = None
        self.steps_done = 0
        self.first_step_seconds: float | None = None
        self.dynamo_start = dynamo_counts()
        self.dynamo_after_first: dict | None = None
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
                self.dynamo_after_first = dynamo_counts()
            return out

    def shutdown(self) -> None:
        self._drain()
        for t in {id(x.thread): x.thread for x in [*self.workers, *self.targets] if x.thread is not None}.values():
            t.shutdown()

    # -- one step -------------------------------------------------------------------------------------------------
    def _step(self, batch: BlockBatch, step: int, lr: float, next_batch: BlockBatch | None) -> dict:
        D = len(self.workers)
        b, S = batch.input_ids.shape
        self.shape = (b, S, batch.num_anchors, batch.block_size)
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
        if self.grad_reducer is not None:
            self._gather(step, [(w, w.thread.submit(self._reduce_across_processes, w, step)) for w in self.workers])
        norms = self._gather(step, [(w, w.thread.submit(w.optimizer_step, lr, self.grad_clip, step))
                                    for w in self.workers])
        dev0 = self.workers[0].device
        if dev0.type == "cuda":  # what follows (and the caller's reads) run on this thread's streams: order them
            for w, o, n in zip(self.workers, outs, norms):
                torch.cuda.current_stream(w.device).wait_stream(w.thread.stream)
                for t in (o["loss"], o["correct"], o["has_loss"], o["terms"], n):
                    t.record_stream(torch.cuda.current_stream(w.device))
        loss = sum(o["loss"].to(dev0) for o in outs)
        correct = torch.cat([o["correct"].to(dev0) for o in outs])
        has_loss = torch.cat([o["has_loss"].to(dev0) for o in outs])
        terms = sum(o["terms"].to(dev0) for o in outs)  # the variant's loss terms: weighted sums, as the loss
        return {"loss": loss, "grad_norm": norms[0], "correct": correct, "has_loss": has_loss, "terms": terms,
                "term_names": self.term_names, **block_stats(correct, has_loss)}

    def _reduce_across_processes(self, w: Worker, step: int) -> None:
        m0 = mark(w.device)
        self.grad_reducer(w.flat_grad)
        w.timeline.add(step, "reduce", m0, mark(w.device))

    def _colocated_task(self, w: Worker, part: BlockBatch, step: int) -> dict:
        m0 = mark(w.device)
        features = w.target.features(part.input_ids, part.doc_ids)
        w.target.timeline.add(step, "target", m0, mark(w.device))
        return w.forward_backward(part, features, step)

    def _drafter_task(self, w: Worker, part: BlockBatch, ready: list, slot: int, step: int) -> dict:
        if w.device.type == "cuda":
            for ev in ready:
                torch.cuda.current_stream().wait_event(ev)  # on the GPU: no host wait
        return w.forward_backward(part, w.take_features(slot), step)

    def _target_task(self, r: TargetReplica, input_ids: torch.Tensor, doc_ids: torch.Tensor | None, slot: int,
                     step: int):
        routes = self._routes["targets"][r.index]
        if r.device.type == "cuda":
            for w, *_ in routes:
                torch.cuda.current_stream().wait_event(w.inbox_free[slot])  # slot consumed by the drafter?
        m0 = mark(r.device)
        features = r.features(input_ids, doc_ids)  # (bt, S, n*H)
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
                                      and torch.equal(pre.batch.input_ids, batch.input_ids)
                                      and _same_docs(pre.batch.doc_ids, batch.doc_ids)):
                return pre  # features depend on input_ids (and doc_ids when packed) only
            _wait_quietly(pre.futures)  # the caller changed its mind: discard
        return self._submit(batch, step)

    def _submit(self, batch: BlockBatch, step: int) -> _Job:
        self._prepare_routes(batch)
        slot, self._next_slot = self._next_slot, 1 - self._next_slot
        bt = batch.input_ids.shape[0] // len(self.targets)
        docs = batch.doc_ids
        futures = [r.thread.submit(self._target_task, r, batch.input_ids[i * bt:(i + 1) * bt],
                                   None if docs is None else docs[i * bt:(i + 1) * bt], slot, step)
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
        """Engine metrics for a record (engine_metrics.py): phase times, GPU idle fractions, supply/demand (split),
        MFU, memory, graph modes, compile counters. `tokens_per_s` (the caller's steady or instant rate) drives MFU."""
        return engine_metrics(self, tokens_per_s)


def _same_docs(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _wait_quietly(futures) -> None:
    for f in futures:
        try:
            f.result()
        except BaseException:  # noqa: BLE001 - already failed or discarded; the caller reports the first error
            pass
