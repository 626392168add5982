"""The only threaded, stateful module: one worker thread per device, each with a target replica and a drafter replica.

A step splits the global batch over the workers; every worker runs target features -> drafter forward/backward on
its own device in its own thread; gradients are summed across replicas (loss weights are normalised over the global
batch, so the sum IS the single-device gradient); then every worker steps its own optimiser identically, which keeps
the replicas in sync without a broadcast. An exception in a worker stops the step, is re-raised in the caller with
the worker's device and the step, and marks the engine broken so a later `step()` says so instead of hanging.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from dataclasses import dataclass

import torch

from .blocks import BlockBatch
from .step import DraftInputs, block_stats, build_masks, drafter_loss


class WorkerError(RuntimeError):
    """A worker failed; carries the device and the step."""

    def __init__(self, device: str, step: int, cause: BaseException):
        super().__init__(f"worker on {device} failed at step {step}: {type(cause).__name__}: {cause}")
        self.device, self.step, self.cause = device, step, cause


class EngineBrokenError(RuntimeError):
    pass


@dataclass
class Worker:
    """Everything one device holds. Built by the Trainer (placement decides the devices)."""

    device: torch.device
    extractor: object  # targets.FeatureExtractor on `target_device`
    drafter: torch.nn.Module
    optimizer: object  # optim.MasterAdamW
    embed: torch.nn.Embedding  # frozen target embedding on `device`
    head_weight: torch.Tensor  # frozen target LM head (V, H) on `device`
    attention: str  # "flex" | "sdpa"
    target_device: torch.device | None = None

    def __post_init__(self):
        self.pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dflash-{self.device}")
        self.stats = None
        self.compute_seconds = 0.0

    def forward_backward(self, batch: BlockBatch, *, seq_len: int, layer_types, sliding_window, chunk_size: int):
        dev = self.device
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        tdev = self.target_device or dev
        features = self.extractor(batch.input_ids.to(tdev, non_blocking=True))  # (b, S, n*H)
        if features.device != dev:
            features = features.to(dev, non_blocking=True)  # GPU -> GPU peer copy, no host round-trip
        bb = batch.to(dev, non_blocking=True)
        masks = build_masks(bb, seq_len=seq_len, backend=self.attention, layer_types=layer_types,
                            sliding_window=sliding_window)
        ctx_pos = torch.arange(seq_len, device=dev)[None].expand(bb.input_ids.shape[0], -1)
        self.optimizer.zero_grad()
        loss, raw = drafter_loss(self.drafter, self.embed, self.head_weight, features,
                                 DraftInputs(bb, masks, ctx_pos), chunk_size)
        loss.backward()
        return {"loss": loss.detach(), "correct": raw["correct"], "has_loss": raw["has_loss"]}

    def optimizer_step(self, lr: float, grad_clip: float) -> torch.Tensor:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return self.optimizer.step(lr, grad_clip)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Engine:
    def __init__(self, workers: list[Worker], *, seq_len: int, layer_types: tuple[str, ...],
                 sliding_window: int | None, chunk_size: int, grad_clip: float):
        self.workers = workers
        self.seq_len, self.layer_types, self.sliding_window = seq_len, layer_types, sliding_window
        self.chunk_size, self.grad_clip = chunk_size, grad_clip
        self.broken: WorkerError | None = None
        self._lock = threading.Lock()

    def _run_all(self, step: int, fn_per_worker) -> list:
        futures = [(w, w.pool.submit(fn_per_worker, i, w)) for i, w in enumerate(self.workers)]
        results, first_error = [], None
        for w, fut in futures:  # wait for ALL workers so none is left running on stale state
            try:
                results.append(fut.result())
            except BaseException as e:  # noqa: BLE001 - re-raised below with device and step
                if first_error is None:
                    first_error = WorkerError(str(w.device), step, e)
        if first_error is not None:
            self.broken = first_error
            raise first_error from first_error.cause
        return results

    def step(self, batch: BlockBatch, *, step: int, lr: float) -> dict:
        """One optimizer step over the global batch. Returns tensors on the first worker's device."""
        if self.broken is not None:
            raise EngineBrokenError(
                f"the engine stopped after an error ({self.broken}). Its replicas may be out of sync. "
                "HINT: fix the cause, then build a new Trainer (or resume_from the last checkpoint).")
        with self._lock:
            parts = batch.split(len(self.workers))
            outs = self._run_all(step, lambda i, w: w.forward_backward(
                parts[i], seq_len=self.seq_len, layer_types=self.layer_types, sliding_window=self.sliding_window,
                chunk_size=self.chunk_size))
            if len(self.workers) > 1:
                self._sum_gradients()
            norms = self._run_all(step, lambda i, w: w.optimizer_step(lr, self.grad_clip))
            dev0 = self.workers[0].device
            loss = sum(o["loss"].to(dev0) for o in outs)
            correct = torch.cat([o["correct"].to(dev0) for o in outs])
            has_loss = torch.cat([o["has_loss"].to(dev0) for o in outs])
            return {"loss": loss, "grad_norm": norms[0], **block_stats(correct, has_loss)}

    @torch.no_grad()
    def _sum_gradients(self) -> None:
        """All-reduce (sum) of gradients across replicas through the first device."""
        grads = [w.optimizer.grads() for w in self.workers]
        dev0 = self.workers[0].device
        for j in range(len(grads[0])):
            total = grads[0][j].clone()
            for g in grads[1:]:
                total += g[j].to(dev0, non_blocking=True)
            for w, g in zip(self.workers, grads):
                g[j].copy_(total, non_blocking=True)

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()
