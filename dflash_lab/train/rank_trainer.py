"""The training loop of one torchrun rank (or of a single process): setup, the step, metrics, checkpoints.

Each rank runs the step the threaded engine's workers run in halves (step.py; optim.py; schedule.py) on its slice
`BatchSampler.batch(step).split(num_drafters)[i]` of the same global batch; DDP (or FSDP2) sums the gradients
(distributed.py). Rank 0 alone writes metrics.jsonl, status.json, events.jsonl and checkpoints (dist_checkpoint.py:
a torchrun checkpoint resumes in a notebook Trainer and back); every rank writes system.rank{R}.jsonl
(gpu_monitor.py). Target-only ranks (split layout) compute each step's features one step ahead and send them to
their drafter ranks. A `STOP` (or `CHECKPOINT`) file in the run directory is read by rank 0 at a step boundary and
its decision broadcast, so every rank leaves (or saves) at the same step. Tests inject faults via fault_hooks.py."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from dflash_lab.runs import checkpoint, lock as run_lock, rundir, train_state
from . import dist_checkpoint, fault_hooks
from dflash_lab.config import ConfigError, TrainConfig
from .distributed import DistContext, full_tensor, share_frozen_head, wrap_ddp, wrap_fsdp2
from .engine_build import build_engine, initial_drafter
from dflash_lab.data.draft_vocab import draft_head, set_draft_vocab
from dflash_lab.runs.gpu_time import TrainClock
from dflash_lab.runs.metrics import MetricsLogger, Throughput
from .muon import make_optimizer
from .placement import make_placement
from .prepare import prepare_run
from .progress import progress_line
from .resume import checkpoint_state
from dflash_lab.drafter.loss_weights import loss_weighting_of
from dflash_lab.drafter.step import DraftInputs, block_stats, build_masks, context_positions, train_step
from dflash_lab.target.load import load_target

STOP_FILE = "STOP"
CHECKPOINT_FILE = "CHECKPOINT"  # touch it to request a checkpoint at the next step boundary
STATUS_FILE = "status.json"


class TrainingDiverged(RuntimeError):
    pass


class RankTrainer:
    """The training loop of one rank. Build, `train()`, `close()`; rank 0 also owns the run directory's files."""

    def __init__(self, cfg: TrainConfig, ctx: DistContext, run_dir: Path, *, log=print, checkpoints: bool = True,
                 explicit=None):
        """`explicit`: on resume, the fields set on the command line (`--steps`): only these override (resume.py)."""
        self.ctx, self.run_dir, self.gpu_clock = ctx, Path(run_dir), TrainClock(devices=ctx.world_size)
        self.checkpoints = checkpoints  # False: benchmarks that must not spend minutes writing optimizer state
        self.log = (lambda *a: log(*a, flush=True)) if log is print else log
        self.phase = "loading"
        dev = ctx.device
        # The notebook Trainer's preparation (prepare.py), so its data and resume rules hold; placement: this device
        log_main = self.log if ctx.is_main else None  # every rank tokenizes; rank 0 reports
        self.prepared = prep = prepare_run(cfg, explicit=explicit, placement=make_placement((str(dev),)),
                                           log=log_main, check_memory=False)
        self.cfg = self.config = cfg = prep.config
        if cfg.batch_size % ctx.num_drafters:  # checked once chosen: config.json may leave it to the target
            raise ConfigError(f"TrainConfig.batch_size={cfg.batch_size} does not split over {ctx.num_drafters} "
                              f"drafter ranks. Fix: use a multiple of {ctx.num_drafters}.")
        self.resume, self.schedule = prep.resume, prep.schedule
        self.dtype, self.attention = prep.dtype(dev), prep.attention(dev)
        self.tokenizer, self.drafter_config = prep.tokenizer, prep.drafter_config
        self.data, self.sampler = prep.data, prep.sampler
        self.target = None
        if ctx.is_target:  # same seed as the threaded Trainer: bench:* targets get identical random weights
            self.target = load_target(cfg.target, device=dev, dtype=self.dtype, seed=cfg.seed, progress_every_s=10.0,
                                      replica=ctx.layout.target_ranks.index(ctx.rank),
                                      progress=lambda p: self.log(f"[rank {ctx.rank}] {p.line()}"))
        self.part_size = cfg.batch_size // ctx.num_drafters
        self.model = self.optimizer = self.engine = self.extractor = None
        self._next_batch: tuple[int, object] | None = None  # (step, batch) built while the device ran the last step
        # A rank that holds its own target and drafter runs the notebook Trainer's engine (one worker: static
        # buffers, the target and drafter CUDA graphs, the feature store); only the drafter ranks' gradient sum is
        # added. Ranks of a split layout and FSDP2 shards run the plain step (step.train_step) eagerly.
        self.uses_engine = ctx.layout.colocated and (ctx.config.parallel == "ddp" or ctx.num_drafters == 1)
        if cfg.distill_weight > 0 and not self.uses_engine:  # the plain step's features carry no target logits
            raise ConfigError(f"distill_weight={cfg.distill_weight} needs DDP ranks that each hold a target. Fix: "
                              "parallel='ddp' with every rank a target, or distill_weight=0.")
        if self.uses_engine:
            self._build_engine(make_placement((str(dev),)))
        else:
            self.extractor = prep.feature_extractor(self.target, dev) if self.target is not None else None
            self.embed, self.head = share_frozen_head(ctx, self.target, self.dtype)  # drafter ranks only
            if ctx.is_drafter:
                self._build_drafter()
        self.step_count = 0
        if self.resume is not None and ctx.is_drafter:  # data and drafter shape were checked in prepare_run
            self._restore(self.resume)
        self.step_count = ctx.broadcast_int(self.step_count)  # target-only ranks learn the resumed step here

        self.metrics = None
        self.throughput = Throughput()
        self.last_metrics: dict | None = None
        self.last_checkpoint_step = self.resume.step if self.resume is not None else None
        self.recent_losses: list[float] = []
        self.diverged_at: int | None = None
        self._pending_sends: list = []
        if ctx.is_main:
            self._init_run_dir()
        self.monitor = self._start_monitor()
        self.phase = "ready"

    # ------------------------------------------------------------------------------------------------------------
    # Setup
    # ------------------------------------------------------------------------------------------------------------
    def _build_drafter(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        # The threaded engine's seeded init, on this rank's device (a CUDA generator on GPUs: identical on every
        # rank and to a Trainer's replicas on the same kind of device).
        drafter = initial_drafter(self.drafter_config, cfg.seed, ctx.device)
        set_draft_vocab(drafter, self.prepared.draft_vocab)  # d2t; the head becomes its (d, H) rows
        self.head, self.label_map = draft_head(drafter, self.head)
        if ctx.config.parallel == "fsdp2":
            drafter.to(device=ctx.device)  # fp32 shards ARE the masters; compute dtype comes from the FSDP policy
            model = wrap_fsdp2(drafter, ctx, self.dtype)
        else:
            drafter.to(device=ctx.device, dtype=self.dtype)
            model = wrap_ddp(torch.compile(drafter) if cfg.compiles_on(ctx.device.type) else drafter, ctx)
        self.model, self.drafter = model, drafter
        self.optimizer = make_optimizer(cfg, model)
        self.param_names = train_state.trainable_names(drafter)
        if not ctx.layout.colocated:
            self.feature_buf = torch.empty(self.part_size, cfg.seq_len,
                                           self.drafter_config.num_target_features * self.drafter_config.hidden_size,
                                           dtype=self.dtype, device=ctx.device)

    def _build_engine(self, placement) -> None:
        """The threaded engine with this rank's one worker; with several drafter ranks its flat gradient is summed
        over them (all-reduce SUM: the loss weights are normalised over the global batch, as DDP's hook assumes)."""
        ctx, prep = self.ctx, self.prepared
        reducer = None
        if ctx.distributed and ctx.num_drafters > 1:
            group = ctx.drafter_group
            reducer = lambda flat: torch.distributed.all_reduce(flat, group=group)  # noqa: E731
        self.engine = build_engine(self.cfg, placement, [self.target], self.drafter_config, grad_reducer=reducer,
                                   target_config=prep.target_config, log=self.log if ctx.is_main else None,
                                   draft_vocab=prep.draft_vocab, store_rows=prep.feature_store_rows,
                                   store_host_rows=prep.feature_store_host_rows)
        w = self.engine.workers[0]
        self.extractor = w.target.extractor  # the one the engine's target replica runs (online or cached)
        self.drafter, self.optimizer, self.model = w.drafter, w.optimizer, w.forward_module
        self.embed, self.head, self.label_map = w.embed, w.head_weight, w.label_map
        self.param_names = train_state.trainable_names(self.drafter)

    def _init_run_dir(self) -> None:
        rd, cfg = self.run_dir, self.cfg
        run_lock.acquire(rd, log=self.log)  # robust: rank 0 owns the run dir; a second job is refused
        rundir.refuse_used_run_dir(rd, resume_from=checkpoint.run_dir_of(self.resume.path) if self.resume else None)
        (rd / checkpoint.CHECKPOINTS_DIR).mkdir(parents=True, exist_ok=True)
        (rd / "plots").mkdir(exist_ok=True)
        rundir.write_json(rd / rundir.CONFIG_FILE, cfg.to_dict())
        rundir.write_json(rd / "drafter_config.json", self.drafter_config.to_dict())
        rundir.write_json(rd / rundir.ENV_FILE, {**rundir.environment_info(), "distributed": self.ctx.describe()})
        rundir.write_json(rd / "data_report.json", self.data.report)
        rundir.write_json(rd / "distributed.json", self.ctx.config.to_dict())
        metrics_path = rd / rundir.METRICS_FILE
        previous = []
        if self.resume is not None:  # same run dir: rows after the checkpoint are recomputed, so they are dropped
            previous = rundir.resume_metrics(rd, self.resume.step, source=checkpoint.run_dir_of(self.resume.path))
            rundir.log_event(rd, "resumed", step=self.resume.step, checkpoint=str(self.resume.path),
                             world_size=self.ctx.world_size)
        self.metrics = MetricsLogger(metrics_path)
        for row in previous:
            self.metrics.ring.append(row)
        self.gpu_clock.continue_from(previous)  # GPU time of the earlier jobs of this run
        rundir.log_event(rd, "start", step=self.step_count, **self.ctx.describe())
        link = rd / rundir.SYSTEM_FILE  # the dashboard follows system.jsonl: rank 0's samples (all GPUs of node 0)
        if not link.exists() and not link.is_symlink():
            try:
                link.symlink_to(f"system.rank{self.ctx.rank}.jsonl")
            except OSError:
                pass
        self._status("ready")

    def _start_monitor(self):
        """system.rank{R}.jsonl from the sampler (gpu_monitor.py): this host's GPUs (NVML) + CPU/RAM, every rank."""
        try:
            from dflash_lab.runs.gpu_monitor import GpuMonitor
        except ImportError:
            return None
        try:
            mon = GpuMonitor(interval_s=1.0, jsonl_path=self.run_dir / f"system.rank{self.ctx.rank}.jsonl")
            mon.start()
            return mon
        except Exception as e:  # noqa: BLE001 - monitoring must never stop training
            self.log(f"[rank {self.ctx.rank}] WARNING: GPU monitor did not start ({type(e).__name__}: {e})")
            return None

    # ------------------------------------------------------------------------------------------------------------
    # The loop
    # ------------------------------------------------------------------------------------------------------------
    def train(self, progress_every_s: float = 10.0) -> dict | None:
        cfg, ctx = self.cfg, self.ctx
        total = cfg.steps
        feeds_only = ctx.is_target and not ctx.is_drafter
        if ctx.is_main:
            self.log(f"training from step {self.step_count} to {total} on {ctx.world_size} rank(s) "
                     f"({ctx.num_drafters} drafter, {len(ctx.layout.target_ranks)} target, {ctx.backend}, "
                     f"{ctx.config.parallel}) | run dir {self.run_dir} | touch {self.run_dir / STOP_FILE} to stop")
        self.phase = "training"
        if feeds_only and self.step_count < total:
            self._send_features(self.step_count)  # one step ahead of the drafters from here on
        last_print, stopped = time.monotonic(), False
        while self.step_count < total:
            t0 = time.perf_counter()
            stop, ckpt = ctx.control(*self._requests())
            if stop:
                stopped = True
                if ctx.is_drafter and not ctx.layout.colocated:  # drain the features already sent for this step
                    ctx.recv(self.feature_buf, ctx.layout.feeder[ctx.rank])
                break
            fault_hooks.maybe_fault(ctx.rank, self.step_count)
            if feeds_only and self.step_count + 1 < total:
                self._send_features(self.step_count + 1)
            record = self._drafter_step(self.step_count, t0) if ctx.is_drafter else None
            self.step_count += 1
            if ctx.is_drafter and self.diverged_at is None and (
                    ckpt or (cfg.checkpoint_every and self.step_count % cfg.checkpoint_every == 0)):
                self.save_checkpoint("periodic" if not ckpt else "requested")
            if ctx.is_main:
                now = time.monotonic()
                if now - last_print >= progress_every_s or self.step_count == total:
                    last_print = now
                    self.log(self.progress_line())
                    self._status("training")
            del record
        self._wait_sends()
        if ctx.is_drafter and self.diverged_at is None and self.last_checkpoint_step != self.step_count:
            self.save_checkpoint("stop" if stopped else "finish")
        self.phase = "diverged" if self.diverged_at is not None else ("stopped" if stopped else "finished")
        if ctx.is_main:
            self._status(self.phase)
            rundir.log_event(self.run_dir, self.phase, step=self.step_count)
            self.log(f"{self.phase} at step {self.step_count}/{total}"
                     + (f"; resume with: --resume {self.run_dir}" if stopped else ""))
        ctx.barrier()
        if self.diverged_at is not None:
            raise TrainingDiverged(f"loss or grad norm not finite at step {self.diverged_at}; the last good "
                                   f"checkpoint (step {self.last_checkpoint_step}) is kept. Fix: resume from it with "
                                   "a lower lr or grad_clip, or check the data around that step.")
        return self.last_metrics

    def _requests(self) -> tuple[bool, bool]:
        """Rank 0's view: a STOP / CHECKPOINT file in the run dir (consumed), or divergence. Other ranks: no vote."""
        if not self.ctx.is_main:
            return False, False
        stop_file = _consume(self.run_dir / STOP_FILE)
        if stop_file:
            rundir.log_event(self.run_dir, "stop_requested", step=self.step_count, source=STOP_FILE)
            self.log(f"STOP file found at step {self.step_count}: every rank stops here after a checkpoint")
        return self.diverged_at is not None or stop_file, _consume(self.run_dir / CHECKPOINT_FILE)

    def _send_features(self, step: int) -> None:
        """Target-only rank: features of `step` for every drafter rank it feeds (async sends, waited one step later)."""
        ctx = self.ctx
        self._wait_sends(keep=len(ctx.layout.served_by(ctx.rank)))
        parts = self.sampler.batch(step).split(ctx.num_drafters)
        for d in ctx.layout.served_by(ctx.rank):
            part = parts[ctx.layout.drafter_ranks.index(d)]
            docs = None if part.doc_ids is None else part.doc_ids.to(ctx.device)  # packed windows
            feats = self.extractor(part.input_ids.to(ctx.device), docs).contiguous()  # (b, S, n*H)
            self._pending_sends.append((torch.distributed.isend(feats, dst=d), feats))

    def _wait_sends(self, keep: int = 0) -> None:
        while len(self._pending_sends) > keep:
            work, _ = self._pending_sends.pop(0)
            work.wait()

    def _drafter_step(self, step: int, t0: float) -> dict:
        """This rank's slice: features -> drafter loss -> backward (DDP sums) -> clip + AdamW -> stats gathered."""
        cfg, ctx, dc = self.cfg, self.ctx, self.drafter_config
        pre, self._next_batch = self._next_batch, None
        batch = pre[1] if pre is not None and pre[0] == step else self.sampler.batch(step)
        lr = self.schedule.lr(step)
        cuda = ctx.device.type == "cuda"
        if self.uses_engine:  # the notebook's step: staged, graphed, summed over drafter ranks inside
            out = self.engine.step(batch.split(ctx.num_drafters)[ctx.drafter_index], step=step, lr=lr)
            if step + 1 < cfg.steps:  # host work of the next batch while the device runs this one
                self._next_batch = (step + 1, self.sampler.batch(step + 1))
            return self._record(step, t0, batch, lr, out)
        part = batch.split(ctx.num_drafters)[ctx.drafter_index].to(ctx.device, non_blocking=True)
        if ctx.layout.colocated:
            features = self.extractor(part.input_ids, part.doc_ids)  # (b, S, n*H)
        else:  # time this drafter waits for its target rank (supply vs demand): CUDA events, since NCCL's recv
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None  # returns at once
            tw = time.perf_counter()
            if cuda:
                marks[0].record()
            features = ctx.recv(self.feature_buf, ctx.layout.feeder[ctx.rank])
            if cuda:
                marks[1].record()
            wait = time.perf_counter() - tw
        masks = build_masks(part, seq_len=cfg.seq_len, backend=self.attention, layer_types=dc.layer_types,
                            sliding_window=dc.sliding_window, layer_windows=dc.layer_windows)
        ctx_pos = context_positions(part, cfg.seq_len, ctx.device)
        # The step (step.py): DDP sums the gradients over drafter ranks in backward; FSDP2 reduce-scatters them.
        out = train_step(self.model, self.optimizer, self.embed, self.head, features, DraftInputs(part, masks, ctx_pos),
                         lr=lr, grad_clip=cfg.grad_clip, chunk_size=cfg.loss_chunk_size,
                         weighting=loss_weighting_of(cfg), label_map=self.label_map)
        # the wait, read once the gather below has synced the device (CUDA events are timed only when complete)
        waited = None if ctx.layout.colocated else (
            (lambda: marks[0].elapsed_time(marks[1]) / 1e3) if cuda else (lambda: wait))
        return self._record(step, t0, batch, lr, out, feature_wait=waited)

    def _record(self, step: int, t0: float, batch, lr: float, out: dict, feature_wait=None) -> dict:
        """The step's metrics over every drafter rank (one all_gather), logged by rank 0. `feature_wait()`: seconds
        this drafter waited for its target rank (split layouts)."""
        cfg, ctx = self.cfg, self.ctx
        cuda = ctx.device.type == "cuda"
        loss, grad_norm = out["loss"], full_tensor(out["grad_norm"])
        fault_hooks.maybe_dump_grads(self.ctx.rank, self.param_names, self.optimizer, step)
        mem = torch.cuda.memory_allocated(ctx.device) / 2**30 if cuda else 0.0  # allocator counter: no sync
        dev = loss.device
        rows = _gather_named(ctx, {  # one small all_gather; .cpu() inside syncs: the step time is device time
            "loss": loss.detach().float().reshape(1), "grad_norm": grad_norm.detach().float().reshape(1).to(dev),
            "mem_gb": torch.full((1,), mem, device=dev), "correct": out["correct"].flatten().float(),
            "has_loss": out["has_loss"].flatten().float(), "terms": out["terms"].detach().float().reshape(-1)})
        dt = time.perf_counter() - t0
        shape = (-1,) + tuple(out["correct"].shape[1:])  # (ranks * b, N, B-1)
        stats = block_stats(rows["correct"].reshape(shape).bool(), rows["has_loss"].reshape(shape).bool())
        loss_total, gnorm = float(rows["loss"].sum()), float(rows["grad_norm"][0, 0])
        if not (math.isfinite(loss_total) and math.isfinite(gnorm)):
            self.diverged_at = step + 1
        tokens = batch.input_ids.numel()
        self.throughput.update(dt, tokens)
        record = {
            "step": step + 1, "loss": loss_total, "lr": lr, "grad_norm": gnorm, "acc": float(stats["acc"]),
            "sim_tau": float(stats["sim_tau"]), "slot_acc": [round(float(a), 4) for a in stats["slot_acc"]],
            "step_time_s": dt, "tokens": tokens, "draft_positions": batch.draft_ids.numel(),
            "epoch": self.sampler.position(step)[0], **self.throughput.as_dict(),
            "world_size": ctx.world_size, "drafter_ranks": ctx.num_drafters,
            "tokens_per_s_per_rank": tokens / dt / ctx.world_size if dt > 0 else 0.0, **self.gpu_clock.fields(),
            **dict(zip(out["term_names"], rows["terms"].sum(0).tolist())),  # the variant's, summed over ranks
        }
        if feature_wait is not None:  # this rank's wait (rank 0 logs; its feeder serves like every other)
            record["feature_wait_s"] = waited = feature_wait()
            record["feature_wait_frac"] = waited / dt if dt > 0 else 0.0
        if self.engine is not None:  # phase times, graph modes, feature store: the notebook's engine fields
            record.update(self.engine.metrics(tokens_per_s=self.throughput.steady_tps or self.throughput.instant_tps))
        if ctx.device.type == "cuda":
            for i, r in enumerate(ctx.layout.drafter_ranks):
                record[f"mem_gb/rank{r}"] = round(float(rows["mem_gb"][i, 0]), 3)
        self.last_metrics = record
        if math.isfinite(loss_total):
            self.recent_losses = (self.recent_losses + [loss_total])[-100:]
        if ctx.is_main:
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps or step == 0 or self.diverged_at:
                self.metrics.log(record)
            else:
                self.metrics.ring.append(record)
        return record

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints (checkpoint.py's format; rank 0 writes; with FSDP2 every drafter rank helps gather)
    # ------------------------------------------------------------------------------------------------------------
    def save_checkpoint(self, reason: str) -> Path | None:
        """Every drafter rank calls this at the same step (FSDP2 gathers shards); rank 0 writes."""
        ctx, cfg = self.ctx, self.cfg
        self.last_checkpoint_step = self.step_count
        if not self.checkpoints:
            return None
        if not ctx.is_main and not (ctx.config.parallel == "fsdp2" and ctx.num_drafters > 1):
            return None
        weights, opt_tensors, groups = dist_checkpoint.gather_full_state(self.drafter, self.optimizer,
                                                                        self.param_names, export_dtype=self.dtype)
        if not ctx.is_main:
            return None
        rng_tensors, rng_meta = train_state.rng_state([ctx.device])
        state = checkpoint_state(self, reason, self.recent_losses, names=self.param_names, groups=groups,
                                 rng=rng_meta, extra={"distributed": ctx.describe()})
        files = {checkpoint.DRAFTER_FILE: weights, checkpoint.OPTIMIZER_FILE: opt_tensors,
                 checkpoint.RNG_FILE: rng_tensors}
        path = dist_checkpoint.write(self.run_dir, self.step_count, files, state, keep=cfg.keep_checkpoints,
                                     reason=reason, log=self.log)
        if path is not None:
            self.recent_losses = []
        return path

    def _restore(self, resume) -> None:
        """Drafter weights, fp32 masters and AdamW state from a checkpoint (every drafter rank reads the files)."""
        names = resume.state["optimizer"]["param_names"]
        if names != self.param_names:
            raise ConfigError(f"checkpoint {resume.path} holds parameters {names[:4]}... that do not match this "
                              "drafter's. Fix: resume with the config the checkpoint was trained with.")
        if self.ctx.config.parallel == "fsdp2":
            dist_checkpoint.restore_sharded(self.optimizer, names, resume.optimizer)
        else:
            train_state.restore_optimizer(self.optimizer, names, resume.optimizer,
                                         resume.state["optimizer"]["param_groups"])
        train_state.restore_rng(resume.rng, resume.state.get("rng", {}))
        self.step_count = resume.step
        if self.ctx.is_main:
            self.log(f"resumed from {resume.path} at step {resume.step}")

    # ------------------------------------------------------------------------------------------------------------
    def progress_line(self) -> str:
        return progress_line(self.last_metrics or {}, step=self.step_count, target=self.cfg.steps,
                             steady_step_time=self.throughput.steady_step_time, ranks=self.ctx.world_size)

    def _status(self, phase: str, **extra) -> None:
        rundir.write_json(self.run_dir / STATUS_FILE, {
            "phase": phase, "step": self.step_count, "steps": self.cfg.steps, "world_size": self.ctx.world_size,
            "time": time.time(), "pid": os.getpid(),
            "detail": f"torchrun: {self.ctx.world_size} rank(s), {self.ctx.num_drafters} drafter, "
                      f"{self.ctx.backend}, {self.ctx.config.parallel}", **extra})

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self.monitor is not None:
            try:
                self.monitor.stop()
            finally:
                self.monitor = None
        if self.metrics is not None:
            self.metrics.close()


# ----------------------------------------------------------------------------------------------------------------
def _gather_named(ctx: DistContext, fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every drafter rank's 1-D `fields`, gathered in ONE all_gather; returns {name: (num_drafters, len) on CPU}."""
    sizes = [t.numel() for t in fields.values()]
    rows = ctx.gather_drafters(torch.cat(list(fields.values()))).cpu()
    return dict(zip(fields, rows.split(sizes, dim=1)))


def _consume(path: Path) -> bool:
    if not path.exists():  # one stat per step: microseconds
        return False
    try:
        os.replace(path, path.with_name(path.name + ".done"))
    except OSError:
        pass
    return True
