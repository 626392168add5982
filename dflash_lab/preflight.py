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
- plus a CUDA context / workspace allowance of 1 GiB and 10% allocator slack per GPU.
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

from .config import DrafterConfig, TrainConfig

GIB = 2**30
CUDA_OVERHEAD_BYTES = 1 * GIB
ALLOCATOR_SLACK = 0.10
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


def config_param_count(tc) -> int:
    """Parameter count of a decoder-only HF LM from its config (dense and Qwen-style MoE)."""
    H, L, V = tc.hidden_size, tc.num_hidden_layers, tc.vocab_size
    nh = tc.num_attention_heads
    nkv = getattr(tc, "num_key_value_heads", None) or nh
    hd = getattr(tc, "head_dim", None) or H // nh
    attn = H * nh * hd * 2 + H * nkv * hd * 2 + 2 * hd  # q, o, k, v (+ q_norm/k_norm)
    experts = getattr(tc, "num_experts", 0) or getattr(tc, "num_local_experts", 0) or 0
    if experts:
        mlp = experts * 3 * H * tc.moe_intermediate_size + H * experts
        shared = getattr(tc, "shared_expert_intermediate_size", 0) or 0
        mlp += 3 * H * shared + (H if shared else 0)
    else:
        mlp = 3 * H * tc.intermediate_size
    per_layer = attn + mlp + 2 * H
    head = 0 if getattr(tc, "tie_word_embeddings", False) else V * H
    return V * H + L * per_layer + H + head


def drafter_param_count(dc: DrafterConfig) -> int:
    from .drafter import DFlashDrafter

    with torch.device("meta"):
        model = DFlashDrafter(dc)
    return sum(p.numel() for p in model.parameters())


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class DeviceEstimate:
    device: str
    items: dict = field(default_factory=dict)  # name -> bytes
    capacity: int | None = None  # bytes, None = unknown

    @property
    def total(self) -> int:
        return sum(self.items.values())

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.total <= self.capacity


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


def target_activation_bytes(tc, *, batch: int, seq_len: int, num_features: int, dtype_bytes: int) -> int:
    """Forward-only target up to max(ids): one layer's transients + the kept feature outputs."""
    H = tc.hidden_size
    nh = tc.num_attention_heads
    nkv = getattr(tc, "num_key_value_heads", None) or nh
    hd = getattr(tc, "head_dim", None) or H // nh
    inter = getattr(tc, "intermediate_size", 0) or 0
    if getattr(tc, "num_experts", 0):
        inter = max(inter, tc.moe_intermediate_size * getattr(tc, "num_experts_per_tok", 1))
    per_token = 3 * H + (nh + 2 * nkv) * hd + nh * hd + 3 * inter
    return batch * seq_len * (per_token + num_features * H) * dtype_bytes


def drafter_activation_bytes(dc: DrafterConfig, *, batch: int, seq_len: int, num_anchors: int, dtype_bytes: int,
                             chunk_size: int, backend: str) -> int:
    """What autograd keeps for one micro-batch of the drafter step, plus the head's chunk buffers."""
    H, Iw, D = dc.hidden_size, dc.intermediate_size, dc.num_hidden_layers
    nh, nkv, hd = dc.num_attention_heads, dc.num_key_value_heads, dc.head_dim
    n = len(dc.target_layer_ids)
    Q = num_anchors * dc.block_size
    KV = seq_len + Q
    c = dtype_bytes
    per_layer = c * (Q * (4 * H + 3 * nh * hd + 4 * Iw) + KV * 5 * nkv * hd) \
        + 4 * (4 * Q * H + 2 * Q * nh * hd + 2 * KV * nkv * hd)  # fp32 norm intermediates
    if backend == "sdpa_math":  # CPU SDPA with a boolean mask keeps the attention probabilities
        per_layer += c * nh * Q * KV
    once = c * (seq_len * n * H + 3 * seq_len * H + 3 * Q * H) + 4 * 2 * seq_len * H
    rows = num_anchors * (dc.block_size - 1)
    head = c * 2 * rows * H + min(chunk_size, rows) * dc.vocab_size * (4 + 4 + c)
    mask = Q * KV if backend.startswith("sdpa") else 0
    return batch * (D * per_layer + per_layer + once + mask) + head  # + one layer of gradient transients


def estimate(config: TrainConfig, *, data=None, target_config=None, tokens_per_s: float | None = None,
             gpu_memory_gib=None, cache_dtype: torch.dtype = torch.bfloat16, log=None) -> Preflight:
    """Pre-flight for `config`. `data`: TokenizedData (tokenized here with the target's tokenizer when None);
    `gpu_memory_gib`: capacity per device (a number or {device: GiB}); by default the visible GPU's memory, or host
    RAM for "cpu"; `tokens_per_s`: sequence tokens/s (padded, as the Trainer counts them) for the ETA."""
    from .targets import resolve_target_path

    cfg = config
    path = None
    if target_config is None:
        from transformers import AutoConfig

        path = resolve_target_path(cfg.target)
        target_config = AutoConfig.from_pretrained(path)
    tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else 0
    dc = DrafterConfig.from_target(tc, num_draft_layers=cfg.num_draft_layers,
                                   num_target_features=cfg.num_target_features, target_layer_ids=cfg.target_layer_ids,
                                   block_size=cfg.block_size, mask_token_id=mask_id, layer_types=cfg.layer_types,
                                   sliding_window=cfg.sliding_window, layer_windows=cfg.layer_windows)
    counted = safetensors_param_count(path) if path is not None and Path(path).is_dir() else None
    target_params = counted if counted is not None else config_param_count(tc)
    source = "safetensors headers" if counted is not None else "from config"
    drafter_params = drafter_param_count(dc)
    if data is None:
        from .data import load_dataset
        from .targets import load_tokenizer

        data = load_dataset(load_tokenizer(cfg.target), cfg.data, seq_len=cfg.seq_len, block_size=cfg.block_size,
                            enable_thinking=getattr(cfg, "enable_thinking", None),
                            data_format=getattr(cfg, "data_format", "auto"), log=log)

    workers = list(cfg.devices)
    tdevs = list(cfg.target_devices) if cfg.target_devices else list(workers)
    if len(tdevs) == 1:
        tdevs = tdevs * len(workers)
    micro = cfg.batch_size // len(workers)
    n = len(dc.target_layer_ids)
    per: dict[str, DeviceEstimate] = {}

    def dev(name: str) -> DeviceEstimate:
        if name not in per:
            per[name] = DeviceEstimate(name, {}, _capacity(name, gpu_memory_gib))
        return per[name]

    def add(name: str, key: str, nbytes: float) -> None:
        d = dev(name)
        d.items[key] = d.items.get(key, 0) + int(nbytes)

    def cbytes(name: str) -> int:
        if cfg.dtype == "auto":
            return 2 if torch.device(name).type == "cuda" else 4
        return 2 if cfg.dtype == "bfloat16" else 4

    for t in dict.fromkeys(tdevs):
        add(t, "target weights", target_params * cbytes(t))
    for w, t in zip(workers, tdevs):
        add(t, "target activations", target_activation_bytes(tc, batch=micro, seq_len=cfg.seq_len,
                                                             num_features=n, dtype_bytes=cbytes(t)))
        c = cbytes(w)
        add(w, "drafter weights+grads", drafter_params * 2 * c)
        add(w, "fp32 master + AdamW m, v", drafter_params * (12 if c != 4 else 8))
        backend = cfg.attention if cfg.attention != "auto" else ("flex" if torch.device(w).type == "cuda" else "sdpa")
        if backend == "sdpa" and torch.device(w).type == "cpu":
            backend = "sdpa_math"
        add(w, "drafter activations", drafter_activation_bytes(dc, batch=micro, seq_len=cfg.seq_len,
                                                               num_anchors=cfg.num_anchors, dtype_bytes=c,
                                                               chunk_size=cfg.loss_chunk_size, backend=backend))
        if t != w:  # features are copied from the target's device to the drafter's
            add(w, "features (copied in)", micro * cfg.seq_len * n * dc.hidden_size * c)
        if torch.device(w).type == "cuda" and "embedding + head copy" not in per[w].items and t != w:
            add(w, "embedding + head copy", dc.vocab_size * dc.hidden_size * c * (1 if dc.tie_word_embeddings else 2))
    for d in per.values():
        if torch.device(d.device).type == "cuda":
            d.items["allocator slack 10%"] = int(ALLOCATOR_SLACK * d.total)
            d.items["CUDA context"] = CUDA_OVERHEAD_BYTES

    warnings = []
    for d in per.values():
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
    from .trainer import Trainer

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
