"""`Trainer`: the facade a notebook drives. Build from a TrainConfig, call `step(n)`, inspect state between calls.

    trainer = Trainer(TrainConfig(target="tiny", steps=200))
    trainer.step(10)          # -> metrics of the last step
    trainer.train()           # run to config.steps, honouring pause / stop events
    trainer.drafter, trainer.last_batch, trainer.history   # inspectable between calls

It wires config -> tokenizer/targets -> data -> drafter replicas -> engine -> metrics/run dir and holds no step
logic of its own (that lives in step.py and engine.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from . import rundir
from .config import ConfigError, DrafterConfig, TrainConfig
from .data import BatchSampler, read_conversations, resolve_data_path, tokenize_dataset
from .drafter import DFlashDrafter
from .engine import Engine, Worker
from .metrics import MetricsLogger, Throughput
from .optim import MasterAdamW, lr_at
from .targets import FeatureExtractor, embedding_of, lm_head_weight, load_target, load_tokenizer


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def check_devices(names: tuple[str, ...], field: str) -> list[torch.device]:
    devices = [torch.device(n) for n in names]
    for d in devices:
        if d.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(f"TrainConfig.{field}={names!r} asks for {d} but no CUDA GPU is visible. "
                                  'Fix: use devices=("cpu",) or run on a GPU machine.')
            if d.index is not None and d.index >= torch.cuda.device_count():
                raise ConfigError(f"TrainConfig.{field}: {d} does not exist; {torch.cuda.device_count()} GPUs are "
                                  "visible (CUDA_VISIBLE_DEVICES applies). Fix: use cuda:0..cuda:"
                                  f"{torch.cuda.device_count() - 1}.")
        elif d.type != "cpu":
            raise ConfigError(f"TrainConfig.{field}: unsupported device {d}. Fix: use 'cpu' or 'cuda:N'.")
    return devices


class Controls:
    """Events a dashboard or a STOP file sets; the training loop reads them at step boundaries only."""

    def __init__(self):
        self.pause = threading.Event()
        self.stop = threading.Event()
        self.checkpoint = threading.Event()
        self.new_lr: float | None = None


class Trainer:
    def __init__(self, config: TrainConfig, *, run_dir: str | Path | None = None, write_run_dir: bool = True,
                 log=print):
        self.config = cfg = config
        self.log = log
        self.phase = "loading data"
        torch.manual_seed(cfg.seed)
        devices = check_devices(cfg.devices, "devices")
        target_devices = check_devices(cfg.target_devices, "target_devices") if cfg.target_devices else devices
        if len(target_devices) not in (1, len(devices)):
            raise ConfigError(f"TrainConfig.target_devices={cfg.target_devices!r}: give one target device per drafter "
                              f"worker ({len(devices)}) or one shared device.")
        if len(target_devices) == 1:
            target_devices = target_devices * len(devices)

        self.tokenizer = load_tokenizer(cfg.target)
        self.phase = "loading targets"
        t0 = time.perf_counter()
        targets = {}
        for d in dict.fromkeys(target_devices):
            targets[d] = load_target(cfg.target, device=d, dtype=resolve_dtype(cfg.dtype, d))
        self.target_load_seconds = time.perf_counter() - t0
        self.target = targets[target_devices[0]]
        mask_id = cfg.mask_token_id
        if mask_id is None:
            mask_id = getattr(self.tokenizer, "mask_token_id", None)
        self.drafter_config = DrafterConfig.from_target(
            self.target.config, num_draft_layers=cfg.num_draft_layers, num_target_features=cfg.num_target_features,
            target_layer_ids=cfg.target_layer_ids, block_size=cfg.block_size, mask_token_id=mask_id,
            layer_types=cfg.layer_types, sliding_window=cfg.sliding_window)

        self.phase = "loading data"
        conversations = read_conversations(resolve_data_path(cfg.data))
        self.data = tokenize_dataset(self.tokenizer, conversations, seq_len=cfg.seq_len, block_size=cfg.block_size)
        self.sampler = BatchSampler(self.data, batch_size=cfg.batch_size, num_anchors=cfg.num_anchors,
                                    block_size=cfg.block_size, mask_token_id=self.drafter_config.mask_token_id,
                                    gamma=cfg.resolved_gamma, seed=cfg.seed)

        # Identical replicas: initialise once on the CPU with a seeded generator, then copy to every device.
        base = DFlashDrafter(self.drafter_config)
        base.init_weights(torch.Generator().manual_seed(cfg.seed))
        workers = []
        for dev, tdev in zip(devices, target_devices):
            dtype = resolve_dtype(cfg.dtype, dev)
            drafter = DFlashDrafter(self.drafter_config)
            drafter.load_state_dict(base.state_dict())
            drafter.to(device=dev, dtype=dtype)
            if cfg.compile_drafter:
                drafter = torch.compile(drafter)
            target = targets[tdev]
            embed = embedding_of(target) if tdev == dev else _frozen_copy(embedding_of(target), dev)
            head = lm_head_weight(target)
            head = head if tdev == dev else head.detach().to(dev)
            attention = cfg.attention if cfg.attention != "auto" else ("flex" if dev.type == "cuda" else "sdpa")
            workers.append(Worker(device=dev, extractor=FeatureExtractor(target, self.drafter_config.target_layer_ids),
                                  drafter=drafter, optimizer=MasterAdamW(drafter.parameters(), lr=cfg.lr,
                                                                         weight_decay=cfg.weight_decay),
                                  embed=embed, head_weight=head, attention=attention, target_device=tdev))
        self.workers = workers
        self.engine = Engine(workers, seq_len=cfg.seq_len, layer_types=self.drafter_config.layer_types,
                             sliding_window=self.drafter_config.sliding_window, chunk_size=cfg.loss_chunk_size,
                             grad_clip=cfg.grad_clip)

        self.run_dir: Path | None = None
        if write_run_dir:
            self.run_dir = Path(run_dir) if run_dir else rundir.new_run_dir(cfg.runs_dir, cfg.run_name)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            rundir.write_json(self.run_dir / rundir.CONFIG_FILE, cfg.to_dict())
            rundir.write_json(self.run_dir / "drafter_config.json", self.drafter_config.to_dict())
            rundir.write_json(self.run_dir / rundir.ENV_FILE, rundir.environment_info())
            rundir.write_json(self.run_dir / "data_report.json", self.data.report)
        self.metrics = MetricsLogger(self.run_dir / rundir.METRICS_FILE if self.run_dir else None)
        self.throughput = Throughput()
        self.controls = Controls()
        self.step_count = 0
        self.last_batch = None
        self.last_metrics: dict | None = None
        self.phase = "ready"

    # ----------------------------------------------------------------------------------------------------------
    @property
    def drafter(self) -> DFlashDrafter:
        d = self.workers[0].drafter
        return getattr(d, "_orig_mod", d)

    @property
    def history(self) -> list[dict]:
        return self.metrics.ring.snapshot()

    def current_lr(self) -> float:
        cfg = self.config
        if self.controls.new_lr is not None:
            return self.controls.new_lr
        return lr_at(self.step_count, peak=cfg.lr, total_steps=cfg.steps, warmup_steps=cfg.warmup_steps,
                     min_ratio=cfg.min_lr_ratio)

    def step(self, n: int = 1) -> dict:
        """Run n optimizer steps; returns the metrics of the last one."""
        if n < 1:
            raise ValueError(f"step(n={n}): n must be >= 1.")
        cfg = self.config
        self.phase = "training"
        for _ in range(n):
            batch = self.sampler.batch(self.step_count)
            self.last_batch = batch
            lr = self.current_lr()
            t0 = time.perf_counter()
            out = self.engine.step(batch, step=self.step_count, lr=lr)
            loss = out["loss"].item()  # .item() syncs: the step time below is real device time
            dt = time.perf_counter() - t0
            tokens = batch.input_ids.numel()
            self.throughput.update(dt, tokens)
            self.step_count += 1
            record = {
                "step": self.step_count, "loss": loss, "lr": lr, "grad_norm": float(out["grad_norm"]),
                "acc": float(out["acc"]), "sim_tau": float(out["sim_tau"]),
                "slot_acc": [round(float(a), 4) for a in out["slot_acc"]],
                "step_time_s": dt, "tokens": tokens, "draft_positions": batch.draft_ids.numel(),
                "epoch": self.sampler.position(self.step_count - 1)[0], **self.throughput.as_dict(),
                **self._memory(),
            }
            self.last_metrics = record
            if self.step_count % cfg.log_every == 0 or self.step_count == cfg.steps or self.step_count == 1:
                self.metrics.log(record)
            else:
                self.metrics.ring.append(record)
        return self.last_metrics

    def _memory(self) -> dict:
        mem = {}
        for w in self.workers:
            if w.device.type == "cuda":
                mem[f"mem_gb/{w.device}"] = round(torch.cuda.memory_allocated(w.device) / 2**30, 3)
        return mem

    def train(self, steps: int | None = None, *, progress_every_s: float = 10.0) -> dict | None:
        """Run until `steps` (default config.steps) total steps, checking controls at step boundaries."""
        target = steps if steps is not None else self.config.steps
        last_print = 0.0
        while self.step_count < target and not self.controls.stop.is_set():
            if self.controls.pause.is_set():
                self.phase = "paused"
                time.sleep(0.05)
                continue
            self.step(1)
            now = time.monotonic()
            if now - last_print >= progress_every_s or self.step_count == target:
                last_print = now
                self.log(self.progress_line(target))
        self.phase = "stopped" if self.controls.stop.is_set() else "finished"
        return self.last_metrics

    def progress_line(self, target: int | None = None) -> str:
        m = self.last_metrics or {}
        target = target or self.config.steps
        tps = m.get("steady_tokens_per_s") or m.get("tokens_per_s") or 0.0
        state = "" if m.get("throughput_state") == "steady" else " (warming up)"
        eta = ""
        st = self.throughput.steady_step_time or m.get("step_time_s")
        if st:
            secs = int(st * (target - self.step_count))
            eta = f" | ETA {secs // 3600}h{secs % 3600 // 60:02d}m{secs % 60:02d}s"
        mem = "".join(f" | {k.split('/')[1]} {v:.1f} GiB" for k, v in m.items() if k.startswith("mem_gb/"))
        return (f"step {self.step_count}/{target} | {tps / 1e3:.1f}k tok/s{state} | loss {m.get('loss', float('nan')):.4f}"
                f" | acc {m.get('acc', 0):.3f} | sim tau {m.get('sim_tau', 1):.2f}{mem}{eta}")

    def save_drafter(self, path: str | Path | None = None) -> Path:
        """Drafter weights only (safetensors, export names, no embedding/head)."""
        from safetensors.torch import save_file

        path = Path(path) if path else (self.run_dir / "checkpoints" / "drafter.safetensors")
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.drafter.state_dict().items()
                 if not k.startswith("rotary_emb.")}
        tmp = path.with_name(path.name + ".tmp")
        save_file(state, str(tmp), metadata={"step": str(self.step_count)})
        tmp.replace(path)
        return path

    def finish(self) -> dict:
        """End of a run: save the drafter, plot the curves, copy the executed notebook; returns a summary."""
        summary = {"steps": self.step_count, "run_dir": str(self.run_dir) if self.run_dir else None}
        hist = [r for r in self.history if "loss" in r]
        if hist:
            summary.update(loss_first=hist[0]["loss"], loss_last=hist[-1]["loss"], sim_tau_last=hist[-1]["sim_tau"],
                           steady_tokens_per_s=self.throughput.steady_tps)
        if self.run_dir:
            from .plots import plot_training

            summary["drafter"] = str(self.save_drafter())
            png = plot_training(self.run_dir)
            summary["plot"] = str(png) if png else None
            nb = rundir.save_executed_notebook(self.run_dir)
            summary["notebook"] = str(nb) if nb else None
            rundir.write_json(self.run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        self.engine.shutdown()
        self.metrics.close()


def _frozen_copy(embed: torch.nn.Embedding, device: torch.device) -> torch.nn.Embedding:
    e = torch.nn.Embedding.from_pretrained(embed.weight.detach().to(device), freeze=True)
    return e
