"""Pre-flight estimate of a run before any GPU work: memory per device, tokens, steps, cache disk, ETA, fit warnings.

Everything comes from configs and the tokenized data (no weights are loaded, nothing touches a GPU):
- target weights: exact parameter count from the safetensors headers when the files are local, else from the config;
  held in the compute dtype (the Trainer loads the whole target; only layers <= max(target_layer_ids) run);
- target activations: one decoder layer's transient tensors for the micro-batch (forward only, no grad) + the
  selected layers' outputs;
- drafter: exact parameter count (built on the meta device) x (weights + grads in the compute dtype, fp32 master
  when that is not fp32, AdamW m and v in fp32) = 16 bytes per parameter in bf16 or fp32;
- drafter activations: what autograd keeps for N*B block queries against S + N*B keys per layer, the fused
  context, the chunked LM head buffers, and (SDPA on CPU) the dense mask and attention probabilities;
- plus a CUDA context / workspace allowance of 1 GiB and 12% allocator slack per GPU.
The activation terms are an estimate (expect +-25%); weights and optimizer states are exact.

Tokens per epoch, steps and the offline feature cache size come from the tokenized data; the ETA from a tokens/s you
give (e.g. measured in an earlier run) or from `benchmark_tokens_per_s(config)` (a few real Trainer steps).
"""

from __future__ import annotations

import html
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_lab.config import DrafterConfig, TrainConfig
from dflash_lab.config.recipe_defaults import TargetFacts, resolve_defaults
from dflash_lab.config.model_size import drafter_parameters, target_parameters
from dflash_lab.train.placement import Placement, rows_that_fit

config_param_count = target_parameters  # the parameter model is model_size.py's (kept name for callers)
from dflash_lab.train.feature_store import feature_width, row_bytes, store_bytes
from dflash_lab.train.memory_model import (CUDA_OVERHEAD_BYTES, GIB, STORE_ITEM,  # noqa: F401 (re-exported)
                                           device_memory)
from dflash_lab.train.prepare import (HOST_KEEP_FREE, RunFacts, distill_top_k, host_room_bytes, plan_device,
                                      prepare_run, store_note, store_rows)
from dflash_lab.target.load import load_target_config, resolve_target_path

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_param_count(model_dir: str | Path) -> int | None:
    """Sum of tensor elements over *.safetensors in a directory, read from the headers only (no weights loaded)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in meta["shape"]:
                numel *= d
            total += numel
    return total


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class DeviceEstimate:
    device: str
    items: dict = field(default_factory=dict)  # name -> bytes
    capacity: int | None = None  # bytes, None = unknown
    store_row: int = 0  # bytes of one feature-store window (0: no store)

    @property
    def total(self) -> int:
        return sum(self.items.values())

    @property
    def store(self) -> int:
        """Bytes of the feature store counted here (the data's windows, at most feature_store_gib)."""
        return self.items.get(STORE_ITEM, 0)

    @property
    def fits(self) -> bool | None:
        """Whether the run fits; on a GPU a feature store beyond the room left is fitted to it when the run starts
        (placement.check_placement), so only the rest must fit."""
        fitted = self.store if torch.device(self.device).type == "cuda" else 0
        return None if self.capacity is None else self.total - fitted <= self.capacity

    @property
    def store_kept(self) -> int | None:
        """Bytes of the store a run keeps here: all of it, or the room left beside the run and RESERVE_BYTES."""
        if self.capacity is None or not self.store or torch.device(self.device).type != "cuda":
            return None
        rest = self.total - self.store
        return rows_that_fit(self.capacity, rest, self.store_row, self.store // self.store_row) * self.store_row


@dataclass
class Preflight:
    """The estimate. `fits` is False when any device is over capacity; `warnings` say what and the fix."""

    config: TrainConfig
    devices: list[DeviceEstimate]
    target_params: int
    target_params_source: str
    drafter_params: int
    samples: int
    tokens_per_epoch: int  # real tokens of the kept samples
    supervised_tokens_per_epoch: int
    padded_tokens_per_step: int
    steps_per_epoch: int
    epochs: float
    feature_cache_bytes: int
    tokens_per_s: float | None
    tokens_per_s_source: str
    warnings: list[str] = field(default_factory=list)

    @property
    def eta_seconds(self) -> float | None:
        if not self.tokens_per_s:
            return None
        return self.config.steps * self.padded_tokens_per_step / self.tokens_per_s

    @property
    def fits(self) -> bool:
        return all(d.fits is not False for d in self.devices)

    def to_dict(self) -> dict:
        return {"fits": self.fits, "devices": {d.device: {"total_gib": d.total / GIB, "capacity_gib":
                                                          None if d.capacity is None else d.capacity / GIB,
                                                          **{k: v / GIB for k, v in d.items.items()}}
                                               for d in self.devices},
                "target_params": self.target_params, "drafter_params": self.drafter_params, "samples": self.samples,
                "tokens_per_epoch": self.tokens_per_epoch, "steps_per_epoch": self.steps_per_epoch,
                "epochs": self.epochs, "feature_cache_gib": self.feature_cache_bytes / GIB,
                "tokens_per_s": self.tokens_per_s, "eta_seconds": self.eta_seconds, "warnings": self.warnings}

    def lines(self) -> list[str]:
        c = self.config
        out = [f"pre-flight: target {c.target} ({self.target_params / 1e9:.3f}B params, {self.target_params_source}),"
               f" drafter {self.drafter_params / 1e6:.1f}M params, seq_len {c.seq_len}, batch {c.batch_size}, "
               f"anchors {c.num_anchors} x block {c.block_size}"]
        for d in self.devices:
            cap = "capacity unknown" if d.capacity is None else f"of {d.capacity / GIB:.1f} GiB"
            flag = {True: "ok", False: "DOES NOT FIT", None: "?"}[d.fits]
            if d.fits and d.store_kept is not None and d.store_kept < d.store:
                flag = f"ok, the feature store kept to {d.store_kept / GIB:.2f} GiB"
            parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in d.items.items())
            out.append(f"  {d.device}: {d.total / GIB:.2f} GiB {cap} [{flag}] ({parts})")
        out.append(f"data: {self.samples:,} samples, {self.tokens_per_epoch:,} tokens/epoch "
                   f"({self.supervised_tokens_per_epoch:,} supervised); {self.steps_per_epoch:,} steps/epoch; "
                   f"{c.steps:,} steps = {self.epochs:.2f} epochs")
        out.append(f"offline feature cache: {self.feature_cache_bytes / GIB:.2f} GiB on disk")
        eta = self.eta_seconds
        out.append("ETA: unknown (pass tokens_per_s=... or run benchmark_tokens_per_s(config))" if eta is None else
                   f"ETA: {_hms(eta)} at {self.tokens_per_s:,.0f} tokens/s ({self.tokens_per_s_source})")
        out += [f"WARNING: {w}" for w in self.warnings]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        e = html.escape
        names = list(dict.fromkeys(k for d in self.devices for k in d.items))
        head = "".join(f"<th>{e(d.device)}</th>" for d in self.devices)
        rows = "".join(f"<tr><td style='text-align:left'>{e(n)}</td>" + "".join(
            f"<td>{d.items[n] / GIB:.2f}</td>" if n in d.items else "<td></td>" for d in self.devices) + "</tr>"
            for n in names)
        tot = "".join(f"<td><b style='color:{'#b91c1c' if d.fits is False else '#15803d'}'>{d.total / GIB:.2f}</b>"
                      f"{'' if d.capacity is None else f' / {d.capacity / GIB:.1f}'}</td>" for d in self.devices)
        text = "<br>".join(e(x) for x in self.lines()[len(self.devices) + 1:] if not x.startswith("WARNING"))
        warn = "".join(f"<div style='color:#b91c1c'><b>warning:</b> {e(w)}</div>" for w in self.warnings)
        return (f"<div><b>Pre-flight</b> <small>{e(self.lines()[0][12:])}</small><table><tr><th>GiB</th>{head}</tr>"
                f"{rows}<tr><td style='text-align:left'><b>total / capacity</b></td>{tot}</tr></table>"
                f"<div>{text}</div>{warn}</div>")


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 86400}d {s % 86400 // 3600}h{s % 3600 // 60:02d}m" if s >= 86400 else \
        f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def _capacity(device: str, given) -> int | None:
    if isinstance(given, dict):
        given = given.get(device)
    if given is not None:
        return int(float(given) * GIB)
    d = torch.device(device)
    if d.type == "cuda" and torch.cuda.is_available() and (d.index or 0) < torch.cuda.device_count():
        return torch.cuda.get_device_properties(d.index or 0).total_memory
    if d.type == "cpu":
        import psutil

        return psutil.virtual_memory().total
    return None


def estimate(config: TrainConfig, *, data=None, target_config=None, tokens_per_s: float | None = None,
             gpu_memory_gib=None, host_memory_gib: float | None = None, cache_dtype: torch.dtype = torch.bfloat16,
             log=None) -> Preflight:
    """Pre-flight for `config`. `data`: TokenizedData (tokenized here with the target's tokenizer when None);
    `gpu_memory_gib`: capacity per device (a number or {device: GiB}); by default the visible GPU's memory, or host
    RAM for "cpu"; `host_memory_gib`: the job machine's available host memory, which a feature store's host tier
    shares (less HOST_KEEP_FREE) — by default this machine's when `gpu_memory_gib` is left to it too, else unchecked;
    `tokens_per_s`: sequence tokens/s (padded, as the Trainer counts them) for the ETA."""
    cfg = config
    prep = None
    if data is None:  # the same preparation as a run (prepare.py): tokenizer, every data setting, drafter config
        prep = prepare_run(cfg, placement=Placement(tuple(cfg.devices), tuple(cfg.target_devices or cfg.devices)),
                           check_memory=False, log=log)  # devices unchecked: estimate a GPU job from any machine
        data, cfg = prep.data, prep.config  # fields left unset chosen as the run will (recipe_defaults.py)
    path = None
    if target_config is None:
        path = resolve_target_path(cfg.target)
        target_config = prep.target_config if prep is not None else load_target_config(cfg.target)
    if cfg.unresolved:  # a plan for data tokenized already: its unset fields chosen as a run would choose them
        facts = RunFacts(cfg, None, target_config, Placement(tuple(cfg.devices), tuple(cfg.target_devices or
                                                                                       cfg.devices)),
                         log=None, check_memory=False).given(data)
        cfg = resolve_defaults(cfg, target=TargetFacts.of(cfg.target, target_config), facts=facts).config
    tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    if prep is not None:
        dc = prep.drafter_config
    else:
        dc = DrafterConfig.from_target(tc, num_draft_layers=cfg.num_draft_layers,
                                       num_target_features=cfg.num_target_features,
                                       target_layer_ids=cfg.target_layer_ids, block_size=cfg.block_size,
                                       mask_token_id=cfg.mask_token_id if cfg.mask_token_id is not None else 0,
                                       layer_types=cfg.layer_types, sliding_window=cfg.sliding_window,
                                       layer_windows=cfg.layer_windows,
                                       drafter_variant=cfg.drafter_variant, markov_rank=cfg.markov_rank,
                                       enable_confidence_head=cfg.enable_confidence_head,
                                       confidence_head_with_markov=cfg.confidence_head_with_markov)
    counted = safetensors_param_count(path) if path is not None and Path(path).is_dir() else None
    target_params = counted if counted is not None else target_parameters(tc)
    source = "safetensors headers" if counted is not None else "from config"
    drafter_params = drafter_parameters(dc)

    row = dict(seq_len=cfg.seq_len, width=feature_width(dc), soft_top_k=distill_top_k(cfg),
               dtype=plan_device(cfg, (cfg.target_devices or cfg.devices)[0]).dtype, groups=dc.num_target_features)
    per_row = row_bytes(**row, storage=cfg.feature_store_dtype)
    per = {name: DeviceEstimate(name, items, _capacity(name, gpu_memory_gib), per_row) for name, items in device_memory(
        drafter_devices=tuple(cfg.devices), target_devices=tuple(cfg.target_devices or cfg.devices),
        target_config=tc, drafter_config=dc, target_params=target_params, drafter_params=drafter_params,
        seq_len=cfg.seq_len, num_anchors=cfg.num_anchors, batch_size=cfg.batch_size, chunk_size=cfg.loss_chunk_size,
        plan=lambda d: plan_device(cfg, d), feature_store_bytes=store_bytes(
            gib=cfg.feature_store_gib, windows=len(data), storage=cfg.feature_store_dtype, **row)).items()}
    n = len(dc.target_layer_ids)

    if host_memory_gib is not None:
        host_room = max(0, int(host_memory_gib * GIB) - HOST_KEEP_FREE)
    else:  # a plan for this machine (its own GPUs) checks its own host memory; one for another machine cannot
        host_room = host_room_bytes() if gpu_memory_gib is None else None
    warnings = []
    for d in per.values():
        if d.store and d.fits is not False:  # the run's own sizing and words (prepare.store_rows, store_note)
            kept = d.store_kept
            rows, host, gpu_full = store_rows(windows=len(data), per_row=per_row, gib=cfg.feature_store_gib,
                                              host_gib=cfg.feature_store_host_gib,
                                              fitted=None if kept is None else kept // per_row, host_room=host_room,
                                              replicas=len(dict.fromkeys(cfg.target_devices or cfg.devices)))
            if rows + host < len(data):
                warnings.append(store_note(
                    windows=len(data), rows=rows, host_rows=host, per_row=per_row, devices=(d.device,),
                    batch=max(1, cfg.batch_size // len(cfg.devices)), gpu_full=gpu_full,
                    fp8_row=row_bytes(**row, storage="float8") if cfg.feature_store_dtype == "auto" else 0,
                ).removeprefix("WARNING: "))
        if d.fits is False:
            warnings.append(
                f"{d.device} needs ~{d.total / GIB:.1f} GiB but has {d.capacity / GIB:.1f} GiB: the plan will not fit. "
                "Fix: lower num_anchors or seq_len (drafter activations grow with num_anchors * block_size and "
                "seq_len), lower batch_size per device, put the target on other GPUs (target_devices), or use "
                "more drafter devices.")
    samples = len(data)
    steps_per_epoch = samples // cfg.batch_size
    if steps_per_epoch == 0:
        warnings.append(f"only {samples} samples for batch_size={cfg.batch_size}: not one full batch. Fix: lower "
                        "batch_size or add data.")
    tokens = int(data.lengths.sum())
    nbytes_cache = _bytes(cache_dtype)
    cache = tokens * n * dc.hidden_size * nbytes_cache + tokens * 4
    tps_source = "given" if tokens_per_s else "none"
    return Preflight(config=cfg, devices=list(per.values()), target_params=target_params,
                     target_params_source=source, drafter_params=drafter_params, samples=samples,
                     tokens_per_epoch=tokens, supervised_tokens_per_epoch=int(data.loss_mask.sum()),
                     padded_tokens_per_step=cfg.batch_size * cfg.seq_len, steps_per_epoch=steps_per_epoch,
                     epochs=cfg.steps / steps_per_epoch if steps_per_epoch else float("inf"),
                     feature_cache_bytes=cache, tokens_per_s=tokens_per_s, tokens_per_s_source=tps_source,
                     warnings=warnings)


def benchmark_tokens_per_s(config: TrainConfig, *, steps: int = 8, log=None) -> float:
    """Sequence tokens/s measured with a few real Trainer steps of `config` (no run dir; the first two steps are
    warm-up and excluded). This DOES load the target and use the devices."""
    from dflash_lab.train.trainer import Trainer

    import time

    trainer = Trainer(config.replace(steps=max(steps, 3)), write_run_dir=False, log=log or (lambda *_: None))
    try:
        trainer.step(2)
        t0 = time.perf_counter()
        trainer.step(steps - 2 if steps > 2 else 1)
        dt = time.perf_counter() - t0
        return (steps - 2 if steps > 2 else 1) * config.batch_size * config.seq_len / dt
    finally:
        trainer.close()


def preflight(config: TrainConfig, *, tokens_per_s: float | None = None, benchmark: bool = False,
              benchmark_steps: int = 8, **kw) -> Preflight:
    """estimate(), optionally with a measured tokens/s (benchmark=True runs `benchmark_steps` Trainer steps)."""
    if benchmark and not tokens_per_s:
        tokens_per_s = benchmark_tokens_per_s(config, steps=benchmark_steps)
        p = estimate(config, tokens_per_s=tokens_per_s, **kw)
        p.tokens_per_s_source = f"benchmarked, {benchmark_steps} steps"
        return p
    return estimate(config, tokens_per_s=tokens_per_s, **kw)
