"""Every knob of a DFlash run as frozen, keyword-only dataclasses, validated when built.

Two configs:
- `DrafterConfig`: the draft model's shape, derived from the target's config (`DrafterConfig.from_target`), in the
  field names of the exported `config.json` (section 4 of docs/dflash-method.md), so export is a plain dump.
- `TrainConfig`: what to train on, how long, and how (data, shapes, optimiser, devices, logging).

A bad value raises `ConfigError` at construction naming the field, the value and the fix. Derived values
(default target layer ids, the loss decay gamma; rules in target_defaults.py) are computed once, here. The perf
knobs are checked in perf_checks.py, per-layer windows in windows.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config_errors import ConfigError, fail
from .field_types import check_field_types
from .sinks import sink_problem
from .perf_checks import check_perf_fields
from .draft_vocab import check_draft_vocab_fields, check_draft_vocab_size
from .target_defaults import (KNOWN_MASK_TOKEN_IDS, KNOWN_MASK_TOKEN_IDS_BY_VOCAB, default_gamma,
                              default_target_layer_ids)
from .windows import check_layer_windows, layer_windows_of, mask_key

LAYER_TYPES = ("full_attention", "sliding_attention")
ATTENTION_BACKENDS = ("auto", "flex", "sdpa")

@dataclass(frozen=True, kw_only=True)
class DrafterConfig:
    """Shape of the DFlash draft model. Field names follow the exported Qwen3-style `config.json`."""

    hidden_size: int
    """Drafter hidden size; must equal the target's (the fused context is added to the target's space)."""
    target_hidden_size: int
    """The target's hidden size, kept to check the drafter against it."""
    intermediate_size: int
    """SwiGLU MLP width of each draft layer (copied from the target by default)."""
    num_hidden_layers: int = 5
    """Number of draft decoder layers (paper: 5; 8 for some MoE targets)."""
    num_attention_heads: int
    """Query heads per draft layer."""
    num_key_value_heads: int
    """Key/value heads per draft layer (GQA)."""
    head_dim: int
    """Per-head dimension."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon, copied from the target."""
    rope_theta: float = 1_000_000.0
    """RoPE base, copied from the target."""
    rope_scaling: dict | None = None
    """RoPE scaling dict, copied from the target (None = plain RoPE)."""
    max_position_embeddings: int = 40960
    """Copied from the target."""
    vocab_size: int
    """The target's vocabulary size (embedding rows); the drafter has no embedding of its own."""
    tie_word_embeddings: bool = False
    """Whether the target ties its LM head to its embedding; the drafter uses the target's head either way."""
    block_size: int = 16
    """Tokens drafted per pass: the anchor plus block_size - 1 MASK slots."""
    mask_token_id: int
    """Reserved, unused row of the target's embedding used as MASK; never learned, never resized."""
    num_target_layers: int
    """Number of decoder layers of the target."""
    target_layer_ids: tuple[int, ...]
    """Target layers whose OUTPUT feeds the drafter (DFlash convention: id i = HF hidden_states[i + 1])."""
    layer_types: tuple[str, ...] = ()
    """Per draft layer: "full_attention" or "sliding_attention"; empty means all full attention."""
    sliding_window: int | None = None
    """Window of the sliding-attention layers (required if any layer slides)."""
    # perf (issues 16/18)
    layer_windows: tuple[int | None, ...] = ()
    """Per draft layer window: None on full-attention layers, a positive int on sliding ones; empty = every sliding
    layer uses `sliding_window`. Several distinct values train fine (one mask per window) but cannot be exported
    (config.json has one `sliding_window`)."""
    # issue 17: draft vocabulary
    draft_vocab_size: int | None = None
    """Ids the drafter predicts (a `d2t` buffer maps them to target ids, draft_vocab.py); None = the whole target
    vocabulary."""

    def __post_init__(self) -> None:
        c = "DrafterConfig"
        check_field_types(self, fail)
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                fail(c, name, v, "must be a positive integer", f"set {name} to a value >= 1")
        if self.hidden_size != self.target_hidden_size:
            fail(c, "hidden_size", self.hidden_size,
                 f"the drafter's hidden size must equal the target's hidden size ({self.target_hidden_size})",
                 f"use hidden_size={self.target_hidden_size} (DrafterConfig.from_target does this)")
        if self.num_attention_heads % self.num_key_value_heads:
            fail(c, "num_key_value_heads", self.num_key_value_heads,
                 f"num_attention_heads={self.num_attention_heads} is not a multiple of it",
                 "use a divisor of num_attention_heads")
        if not isinstance(self.block_size, int) or self.block_size < 2:
            fail(c, "block_size", self.block_size, "a block needs the anchor plus at least one MASK slot",
                 "use block_size >= 2 (16 is the paper's default; 10 and 8 are also used)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            fail(c, "mask_token_id", self.mask_token_id,
                 f"it is outside the target vocabulary [0, {self.vocab_size})",
                 "pick a reserved, unused row of the target's embedding (Qwen3: 151669), never resize the vocab")
        ids = tuple(self.target_layer_ids)
        if not ids:
            fail(c, "target_layer_ids", ids, "at least one target layer is needed", "pass e.g. (1, 9, 17, 25, 33)")
        bad = [i for i in ids if not 0 <= i < self.num_target_layers]
        if bad:
            fail(c, "target_layer_ids", ids,
                 f"ids {bad} are out of range for a target with {self.num_target_layers} layers "
                 f"(valid: 0..{self.num_target_layers - 1})",
                 "use ids in range, or leave them unset for the default rule")
        if len(set(ids)) != len(ids) or list(ids) != sorted(ids):
            fail(c, "target_layer_ids", ids, "ids must be strictly increasing and distinct",
                 "sort them and drop duplicates")
        object.__setattr__(self, "target_layer_ids", ids)
        types = tuple(self.layer_types) or ("full_attention",) * self.num_hidden_layers
        for t in types:
            if t not in LAYER_TYPES:
                fail(c, "layer_types", types, f"unknown layer type {t!r}", f"use only {LAYER_TYPES}")
        if len(types) != self.num_hidden_layers:
            fail(c, "layer_types", types, f"it has {len(types)} entries for {self.num_hidden_layers} draft layers",
                 "give one type per draft layer")
        object.__setattr__(self, "layer_types", types)
        object.__setattr__(self, "layer_windows", check_layer_windows(c, types, self.sliding_window,
                                                                      self.layer_windows))
        check_draft_vocab_size(self.draft_vocab_size, self.vocab_size)

    @property
    def windows(self) -> tuple[int | None, ...]:
        """The attention window of each draft layer (None = full attention)."""
        return layer_windows_of(self.layer_types, self.sliding_window, self.layer_windows)

    @property
    def mask_keys(self) -> tuple[str, ...]:
        """Per draft layer, the key of its mask in the `masks` dict (one mask per distinct window)."""
        return tuple(mask_key(w, self.sliding_window) for w in self.windows)

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_target(cls, target_config: Any, *, num_draft_layers: int = 5, num_target_features: int = 5,
                    target_layer_ids: tuple[int, ...] | None = None, block_size: int = 16,
                    mask_token_id: int | None = None, layer_types: tuple[str, ...] = (),
                    sliding_window: int | None = None, layer_windows: tuple = (),
                    draft_vocab_size: int | None = None) -> "DrafterConfig":
        """Derive the drafter from a Hugging Face target config: same hidden size, heads, RoPE and vocabulary."""
        tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        L = tc.num_hidden_layers
        ids = tuple(target_layer_ids) if target_layer_ids else default_target_layer_ids(L, num_target_features)
        if mask_token_id is None:
            model_type = getattr(tc, "model_type", "")
            mask_token_id = KNOWN_MASK_TOKEN_IDS_BY_VOCAB.get((model_type, tc.vocab_size),
                                                              KNOWN_MASK_TOKEN_IDS.get(model_type))
            if mask_token_id is None or mask_token_id >= tc.vocab_size:
                raise ConfigError(
                    f"mask_token_id is not set and no default is known for model_type={tc.model_type!r} with "
                    f"vocab_size={tc.vocab_size}. Fix: pass mask_token_id = a reserved, unused embedding row "
                    "(e.g. the tokenizer's mask token or an unused special token).")
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        rope_params = getattr(tc, "rope_parameters", None) or {}
        rope_theta = getattr(tc, "rope_theta", None) or rope_params.get("rope_theta", 10000.0)
        rope_scaling = getattr(tc, "rope_scaling", None)
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = dict(rope_params)
        return cls(
            hidden_size=tc.hidden_size, target_hidden_size=tc.hidden_size,
            intermediate_size=tc.intermediate_size, num_hidden_layers=num_draft_layers,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
            head_dim=head_dim, rms_norm_eps=tc.rms_norm_eps, rope_theta=float(rope_theta),
            rope_scaling=rope_scaling, max_position_embeddings=tc.max_position_embeddings,
            vocab_size=tc.vocab_size, tie_word_embeddings=bool(getattr(tc, "tie_word_embeddings", False)),
            block_size=block_size, mask_token_id=int(mask_token_id), num_target_layers=L, target_layer_ids=ids,
            layer_types=tuple(layer_types), sliding_window=sliding_window, layer_windows=tuple(layer_windows or ()),
            draft_vocab_size=draft_vocab_size,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: target, data, shapes, optimiser, devices and logging."""

    target: str = "tiny"
    """Hugging Face id, local model directory, or "tiny" for the embedded default target."""
    data: str = "tiny"
    """Chat data file (JSONL/Parquet, OpenAI `messages` or ShareGPT), or "tiny" for the embedded chat set."""
    data_format: str = "auto"
    """"openai" (`messages`), "sharegpt" (`conversations`), or "auto" (detected per record)."""
    enable_thinking: bool | None = None
    """Thinking mode passed to the chat template (must match serving); None = the template's default."""
    data_errors: str = "skip"
    """Unusable records: "skip" (counted with file:line in data_report.json) or "raise" (stop at the first)."""
    feature_cache: str | None = None
    """Directory of an offline feature cache (`python -m dflash_lab.feature_cache`): features are read from it
    instead of running the target's layers (only its embedding and LM head are used). None = online features."""
    run_name: str = "run"
    """Short name used in the run directory `runs/<UTC stamp>-<run_name>-<id>/`."""
    runs_dir: str = "runs"
    """Where run directories are created."""
    steps: int = 200
    """Optimizer steps to train."""
    seq_len: int = 256
    """Fixed sequence length: samples are truncated / right-padded to it (paper: 3072)."""
    batch_size: int = 4
    """Sequences per optimizer step, summed over all drafter workers."""
    block_size: int = 16
    """Tokens drafted per pass (anchor + block_size - 1 MASK slots)."""
    num_anchors: int = 32
    """Anchors (blocks) sampled per sequence per step (paper: 512)."""
    num_draft_layers: int = 5
    """Draft decoder layers."""
    num_target_features: int = 5
    """How many target layers feed the drafter when target_layer_ids is not given."""
    target_layer_ids: tuple[int, ...] | None = None
    """Override of the default layer-id rule (DFlash convention: id i = output of target layer i)."""
    mask_token_id: int | None = None
    """Override of the MASK token; by default the tokenizer's mask token or the known id of the target family."""
    layer_types: tuple[str, ...] = ()
    """Per draft layer "full_attention"/"sliding_attention"; empty = all full."""
    sliding_window: int | None = None
    """Window for sliding-attention draft layers."""
    lr: float = 6e-4
    """Peak learning rate (paper: 6e-4)."""
    weight_decay: float = 0.0
    """AdamW weight decay (paper: 0)."""
    warmup_ratio: float = 0.04
    """Fraction of steps with linear warm-up before the cosine decay."""
    min_lr_ratio: float = 0.0
    """Cosine floor as a fraction of lr."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (paper: 1.0); 0 disables."""
    gamma: float | None = None
    """Loss decay w_k = exp(-(k-1)/gamma); None = 7 for B=16, 5 for B=10, 4 for B=8."""
    loss_chunk_size: int = 4096
    """Positions per chunk of the LM head + CE (never all N*B x vocab logits at once)."""
    seed: int = 0
    """Seed for init, shuffling and anchor sampling."""
    devices: tuple[str, ...] = ("cpu",)
    """Drafter workers' devices, e.g. ("cuda:0", "cuda:1"); each holds a drafter replica."""
    target_devices: tuple[str, ...] | None = None
    """Target replicas' devices; None = colocated with each drafter worker."""
    dtype: str = "auto"
    """Compute dtype: "auto" (bf16 on CUDA, fp32 on CPU), "bfloat16" or "float32". Master weights are fp32."""
    attention: str = "auto"
    """Drafter attention: "flex" (BlockMask), "sdpa" (dense mask), or "auto" (flex on CUDA, sdpa on CPU)."""
    compile_drafter: bool | str = False
    """torch.compile the drafter (opt-in; the eager + CUDA-graph path is the default); "auto" = compile on CUDA
    workers only (the CPU path stays eager)."""
    cuda_graphs: bool = True
    """Capture the drafter step as a CUDA graph on GPU workers (ignored on CPU)."""
    log_every: int = 10
    """Write metrics.jsonl every N steps."""
    checkpoint_every: int = 0
    """Save a checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Rotation: keep the last K checkpoints (plus the best)."""
    eval_every: int = 0
    """Real speculative-decoding tau on held-out prompts every N steps (0 = off)."""
    resume_from: str | None = None
    """Run directory or checkpoint to continue from exactly."""
    # validation (issue 12): honest metrics beside the training ones (dflash_lab/validation.py, docs/tau-gap.md)
    heldout_data: str | None = None
    """Held-out conversations for validation and real tau. None = the data's own held-out split: "tiny" -> its 100
    held-out chats; a data file -> `heldout.jsonl` next to it; a `datasets` directory -> its "heldout", "test" or
    "validation" split. "" = none (validation and real tau off)."""
    val_every: int | None = None
    """Teacher-forced validation (`val_acc`, `val_slot_acc`, `val_sim_tau`) every N steps and at the last step;
    None = auto (every max(50, steps // 10) steps, so runs under 50 steps skip it); 0 = off."""
    val_sequences: int = 16
    """Held-out sequences in the fixed validation set (every valid anchor of each is scored)."""
    real_tau_every: int | None = None
    """Real speculative decoding (`real_tau`) on held-out prompts every N steps and at the last step; None = auto:
    on for real targets (every max(100, steps // 10) steps), off for the CPU tiny target; 0 = off."""
    real_tau_prompts: int = 8
    """Held-out prompts per real-tau measurement (temperature 0, block size of the run)."""
    real_tau_new_tokens: int = 64
    """New tokens generated per prompt in a real-tau measurement."""
    # -- metric sinks (issue 15) --
    metric_sinks: tuple[str, ...] = ()
    """Optional extra metric sinks (sinks.py): "tensorboard" (<run_dir>/tensorboard/) and/or "wandb" (offline)."""
    # perf (issues 16/18)
    layer_windows: tuple[int | None, ...] = ()
    """Per draft layer window (None on full layers); empty = every sliding layer uses `sliding_window`."""
    compile_mode: str | None = None
    """torch.compile mode with compile_drafter: None (default) or "max-autotune-no-cudagraphs". Modes that use
    CUDAGraph Trees ("reduce-overhead", "max-autotune") are refused: the engine captures CUDA graphs itself."""
    target_fp8: bool = False
    """Run the frozen target's linear layers in FP8 (row-wise scaled, forward only) for feature extraction; the
    bf16 weights stay for evaluation. Opt-in: see docs/engine-traps.md for the features' error."""
    drafter_fp8: bool = False
    """Train the drafter's linear layers with FP8 GEMMs (forward and input gradient row-wise scaled e4m3, weight
    gradient in bf16); master weights and optimizer stay fp32."""
    drafter_fp8_weight_grad: bool = False
    """With drafter_fp8: the weight gradient's GEMM in FP8 as well (all three GEMMs; torchao's "rowwise" recipe)."""
    compile_target: bool = False
    """torch.compile the target's layer loop (RoPE, norms, residual glue, FP8 casts) for feature extraction; the
    engine still captures it as a CUDA graph. Opt-in until measured."""
    # issue 17: draft vocabulary
    draft_vocab_size: int | None = None
    """Draft vocabulary: the drafter predicts only the d most frequent supervised target tokens of the training data
    (a frozen (d, H) slice of the target head; labels outside it carry no loss and count as wrong). None = the full
    target vocabulary (draft_vocab.py, docs/ablations.md)."""

    def __post_init__(self) -> None:
        c = "TrainConfig"
        check_field_types(self, fail)
        ints = {"steps": 1, "seq_len": 8, "batch_size": 1, "block_size": 2, "num_anchors": 1,
                "num_draft_layers": 1, "num_target_features": 1, "loss_chunk_size": 1, "log_every": 1,
                "keep_checkpoints": 1}
        fixes = {"block_size": "use block_size >= 2 (16 is the paper's default)",
                 "num_anchors": "use num_anchors >= 1 (paper: 512)", "steps": "use steps >= 1"}
        for name, lo in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                fail(c, name, v, f"must be an integer >= {lo}", fixes.get(name, f"set {name} >= {lo}"))
        for name in ("checkpoint_every", "eval_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                fail(c, name, v, "must be an integer >= 0", f"set {name} to 0 (off) or a positive interval")
        if self.seq_len < 2 * self.block_size:
            fail(c, "seq_len", self.seq_len, f"it must hold at least two blocks (2 * block_size = "
                 f"{2 * self.block_size})", f"use seq_len >= {2 * self.block_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            fail(c, "lr", self.lr, "must be a positive finite number", "use e.g. 6e-4")
        if not 0 <= self.warmup_ratio < 1:
            fail(c, "warmup_ratio", self.warmup_ratio, "must be in [0, 1)", "use e.g. 0.04")
        if not 0 <= self.min_lr_ratio <= 1:
            fail(c, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]", "use 0.0 for a full cosine decay")
        if self.grad_clip < 0:
            fail(c, "grad_clip", self.grad_clip, "must be >= 0", "use 1.0 (paper) or 0 to disable")
        if self.weight_decay < 0:
            fail(c, "weight_decay", self.weight_decay, "must be >= 0", "use 0.0 (paper) or e.g. 0.01")
        if not 0 <= self.seed < 2**63:
            fail(c, "seed", self.seed, "must be in [0, 2**63)", "use a non-negative integer, e.g. 0")
        # Anchors are distinct positions p with p and p + 1 in the sequence: more than seq_len - 1 can never be
        # sampled, and the surplus would still be allocated (num_anchors * block_size positions per sequence).
        if self.num_anchors > self.seq_len - 1:
            fail(c, "num_anchors", self.num_anchors, f"at most seq_len - 1 = {self.seq_len - 1} anchors fit in a "
                 f"sequence of seq_len={self.seq_len}", f"use num_anchors <= {self.seq_len - 1} (paper: 512 for "
                 "seq_len 3072), or raise seq_len")
        if self.gamma is not None and self.gamma <= 0:
            fail(c, "gamma", self.gamma, "must be > 0", "leave it None for the paper's value")
        if self.data_format not in ("auto", "openai", "sharegpt"):
            fail(c, "data_format", self.data_format, "unknown data format", 'use "auto", "openai" or "sharegpt"')
        if not (self.enable_thinking is None or isinstance(self.enable_thinking, bool)):
            fail(c, "enable_thinking", self.enable_thinking, "must be True, False or None",
                 "use None for the template's default")
        if self.data_errors not in ("skip", "raise"):
            fail(c, "data_errors", self.data_errors, "unknown policy", 'use "skip" or "raise"')
        if self.dtype not in ("auto", "bfloat16", "float32"):
            fail(c, "dtype", self.dtype, "unknown dtype", 'use "auto", "bfloat16" or "float32"')
        if self.attention not in ATTENTION_BACKENDS:
            fail(c, "attention", self.attention, "unknown attention backend", f"use one of {ATTENTION_BACKENDS}")
        for t in self.layer_types:
            if t not in LAYER_TYPES:
                fail(c, "layer_types", self.layer_types, f"unknown layer type {t!r}", f"use only {LAYER_TYPES}")
        if self.layer_types and len(self.layer_types) != self.num_draft_layers:
            fail(c, "layer_types", self.layer_types,
                 f"{len(self.layer_types)} entries for {self.num_draft_layers} draft layers",
                 "give one type per draft layer or leave it empty")
        if isinstance(self.devices, str) or not self.devices:
            fail(c, "devices", self.devices, "must be a non-empty tuple of device names",
                 'use e.g. ("cpu",) or ("cuda:0", "cuda:1")')
        object.__setattr__(self, "devices", tuple(self.devices))
        if self.target_devices is not None:
            object.__setattr__(self, "target_devices", tuple(self.target_devices))
        if self.target_layer_ids is not None:
            object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if self.batch_size % len(self.devices):
            fail(c, "batch_size", self.batch_size, f"it must split evenly over {len(self.devices)} drafter workers",
                 f"use a multiple of {len(self.devices)}")
        # validation (issue 12)
        for name in ("val_every", "real_tau_every"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                fail(c, name, v, "must be None (auto), 0 (off) or a positive interval", f"set {name}=None or e.g. 100")
        for name in ("val_sequences", "real_tau_prompts", "real_tau_new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail(c, name, v, "must be an integer >= 1", f"set {name} >= 1 (turn the measurement off with "
                     f"{'val_every' if name == 'val_sequences' else 'real_tau_every'}=0)")
        # -- metric sinks (issue 15) --
        if isinstance(self.metric_sinks, str):
            fail(c, "metric_sinks", self.metric_sinks, "must be a tuple of sink names", f"use ({self.metric_sinks!r},)")
        object.__setattr__(self, "metric_sinks", tuple(self.metric_sinks))
        for name in self.metric_sinks:
            if (problem := sink_problem(name)) is not None:
                fail(c, "metric_sinks", self.metric_sinks, problem, 'use () (off), ("tensorboard",) or ("wandb",) '
                     "with the package installed")
        check_perf_fields(self)
        check_draft_vocab_fields(self)

    @property
    def resolved_gamma(self) -> float:
        return self.gamma if self.gamma is not None else default_gamma(self.block_size)

    @property
    def warmup_steps(self) -> int:
        return int(round(self.warmup_ratio * self.steps))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"TrainConfig got unknown fields {unknown}. Fix: remove them or check the spelling "
                              f"(known fields: {sorted(known)}).")
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**d)

    @classmethod
    def from_json(cls, path: str | Path) -> "TrainConfig":
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} does not exist. Fix: pass the config.json of a run directory.")
        return cls.from_dict(json.loads(p.read_text()))

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)
