"""Every knob of a DFlash run as frozen, keyword-only dataclasses, validated when built.

Two configs:
- `DrafterConfig` (drafter_config.py, re-exported here): the draft model's shape, derived from the target's config.
- `TrainConfig`: what to train on, how long, and how (data, shapes, optimiser, devices, logging, ablation knobs).

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

from .errors import ConfigError, fail
from .field_types import check_field_types, field_default
from .feature_checks import (check_distill_fields, check_draft_vocab_fields, check_loss_weighting_fields,
                             check_optimizer_fields, check_pack_fields, sink_problem)
from .perf_checks import check_perf_fields
from .recipe_defaults import RESOLVED_FIELDS
from .target_defaults import default_gamma
from .drafter_config import (ATTENTION_BACKENDS, LAYER_TYPES, DrafterConfig,  # noqa: F401 (DrafterConfig re-exported)
                             check_variant_fields)

# DSpark's loss terms and the TrainConfig field that weighs each (their defaults are DeepSpec's published weights).
DSPARK_LOSS_TERMS = (("ce", "dspark_ce_weight"), ("l1", "dspark_l1_weight"),
                     ("confidence", "dspark_confidence_weight"))
DSPARK_WEIGHT_FIELDS = tuple(name for _, name in DSPARK_LOSS_TERMS)


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
    token_cache: bool = True
    """Keep the tokenized data in `$DFLASH_LAB_CACHE/tokenized/` (keyed by the data's bytes, the tokenizer and these
    settings) so the next run on the same data reads it instead of tokenizing; False = tokenize every run."""
    feature_cache: str | None = None
    """Directory of an offline feature cache (`python -m dflash_lab.data.feature_cache`): features are read from it
    instead of running the target's layers (only its embedding and LM head are used). None = online features."""
    run_name: str = "run"
    """Short name used in the run directory `runs/<run_name>-<UTC stamp>-<id>/`."""
    runs_dir: str = "runs"
    """Where run directories are created."""
    steps: int = 200
    """Optimizer steps to train."""
    seq_len: int | None = None
    """Fixed sequence length: samples are truncated / right-padded to it (paper: 3072). None = chosen for the target
    and data (recipe_defaults.py, as every field documented "None = chosen for the target")."""
    batch_size: int | None = None
    """Sequences per optimizer step, summed over all drafter workers. None = chosen for the target."""
    block_size: int | None = None
    """Tokens drafted per pass (anchor + block_size - 1 MASK slots). None = chosen for the target."""
    num_anchors: int | None = None
    """Anchors (blocks) sampled per sequence per step (paper: 512). None = chosen for the target."""
    num_draft_layers: int | None = None
    """Draft decoder layers. None = chosen for the target."""
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
    lr: float | None = None
    """Peak learning rate (paper: 6e-4). None = chosen for the target and batch."""
    weight_decay: float = 0.0
    """AdamW weight decay (paper: 0)."""
    warmup_ratio: float = 0.04
    """Fraction of steps with linear warm-up before the cosine decay."""
    min_lr_ratio: float = 0.0
    """Floor of the decay as a fraction of lr."""
    lr_schedule: str = "cosine"
    """"cosine" (warm-up, then a cosine to min_lr_ratio * lr at `steps`) or "wsd" (warm-up, lr held, then a linear
    decay over the last `decay_ratio` of the steps: a run extended in its stable phase keeps its lr; schedule.py)."""
    decay_ratio: float = 0.2
    """"wsd": the fraction of the steps in the final linear decay."""
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
    compile_drafter: bool | str | None = None
    """torch.compile the drafter; "auto" = compile on CUDA workers only (the CPU path stays eager); False = eager +
    CUDA graphs. None = chosen for the target ("auto" for real targets)."""
    cuda_graphs: bool = True
    """Capture the drafter step as a CUDA graph on GPU workers (ignored on CPU)."""
    overlap_steps: bool = True
    """Start step k+1 on the device before step k's bookkeeping (metrics record, logging, dashboard) runs on the
    host, so the GPU does not idle through it (~3 ms of an 18 ms recipe-shape step on an H200). Steps that
    checkpoint, validate, evaluate, pause or stop are booked before the next one starts; the numbers are the same
    either way. A `train(callbacks=...)` callback runs while the next step is on the device: one that reads the
    weights calls `trainer.save_checkpoint()` or sets this False. False: one step at a time."""
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
    time_budget_s: float | None = None
    """Wall-clock seconds this process may train, counted from the Trainer's construction (loading included): when
    spent, the run stops at the next step boundary with a checkpoint ("stopped (resumable)") and `resume_from`
    continues it exactly in the next job. None = no limit. Leave room for what follows training (e.g. 540 of a
    10-minute job)."""
    # validation: honest metrics beside the training ones (dflash_lab/train/validation.py, docs/tau-gap.md)
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
    real_tau_prompts: int = 32
    """Held-out prompts per real-tau measurement (temperature 0, block size of the run); logged with a 95% bootstrap
    interval over them (8 prompts read 2.28 where 64 others read 1.83: too few to decide anything)."""
    real_tau_new_tokens: int = 128
    """New tokens generated per prompt in a real-tau measurement (128, as `evaluate`)."""
    # -- metric sinks --
    metric_sinks: tuple[str, ...] = ()
    """Optional extra metric sinks (sinks.py): "tensorboard" (<run_dir>/tensorboard/) and/or "wandb" (offline)."""
    # perf
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
    # loss weighting (D-PACE; loss_weights.py, docs/ablations.md)
    loss_weighting: str | None = None
    """"decay" (paper: w_k = exp(-(k-1)/gamma)) or "dpace" (D-PACE, arXiv 2605.18810, detached self-weights). None =
    chosen for the target (D-PACE for real targets)."""
    dpace_alpha: float = 0.5
    """D-PACE smoothing in (0, 1]: q~ = (1 - alpha) * exp(-CE) + alpha."""
    loss_normalizer: str = "valid_anchors"
    """dpace's GLOBAL normaliser: "valid_anchors" (in the global batch) or "anchor_budget" (batch_size *
    num_anchors). Decay keeps its own global weight-sum normaliser."""
    # Muon optimizer
    optimizer: str = "adamw"
    """"adamw" (the paper's: AdamW on every tensor) or "muon": torch.optim.Muon on the nn.Linear weight matrices
    (q/k/v/o, MLP, fc), AdamW on the rest (norms); fp32 masters and one global grad clip either way (muon.py)."""
    muon_lr: float | None = None
    """Muon's peak lr (same warm-up + cosine). None = `lr`: Muon runs with torch's adjust_lr_fn="match_rms_adamw",
    so AdamW's lr scale works unchanged; a value is on that same scale (not the 0.02 of Muon without it)."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum."""
    # packed sequences
    pack_sequences: bool = False
    """Pack several whole conversations into each seq_len window (first fit, seeded; packing.py) instead of one,
    right-padded. Attention, anchors and labels never cross a conversation; positions restart per conversation."""
    # draft vocabulary
    draft_vocab_size: int | None = None
    """Draft vocabulary: the drafter predicts only the d most frequent supervised target tokens of the training data
    (a frozen (d, H) slice of the target head; labels outside it carry no loss and count as wrong). None = the full
    target vocabulary (draft_vocab.py, docs/ablations.md)."""
    # features reused across epochs
    feature_store_gib: float | None = None
    """GiB of device memory (per target replica) that keep each training window's target features once computed, so
    the frozen target runs once per window instead of once per epoch (train/feature_store.py). 0 = recompute every
    step. The store never holds more rows than the data has windows, nor more than fit on the GPU beside the run
    (the memory model's need and 4 GiB to spare, read before anything loads: a WARNING line names the windows held
    and those computed each time); the hit rate is logged. None = chosen for the run: on (every window asked for) when
    the data is seen more than once on GPUs."""
    feature_store_host_gib: float | None = None
    """GiB of host memory (per target replica) for the windows the GPU store has no room for: a batch is served from
    the store only when it holds all of its windows, so a store that holds most but not all of them seldom pays.
    Host rows are copied in through a pinned staging buffer (train/feature_store.py); at most what the machine has
    available less 8 GiB when the run starts (torchrun ranks sharing a machine each count it alone: give each a
    share). 0 = GPU only. None = chosen with feature_store_gib."""
    feature_store_dtype: str = "auto"
    """How the store keeps features: "auto" = their own dtype (bf16 on a GPU: exactly what the target computed);
    "float8" = E4M3 with one scale per position and target layer, half the memory (twice the windows in the same
    GiB), each element rounded to 3 mantissa bits (train/feature_store.py)."""

    # distillation: the target's own next-token distribution as a second training target
    distill_weight: float = 0.0
    """Share of each supervised position's loss taken against the target's own distribution there (its top
    `distill_top_k` probabilities at `distill_temperature`, renormalised) instead of the data's token: the target
    to beat when serving samples (T > 0), where acceptance is sum_x min(p, q), not whether q's argmax is right.
    0 = the paper's hard labels only; 0.5 = half each (drafter/step.py, target/features.py)."""
    distill_top_k: int = 16
    """How many of the target's most probable ids each position keeps for distillation (ids + log-probabilities,
    8 bytes each per position: also what the feature store keeps beside the features)."""
    distill_temperature: float = 1.0
    """The temperature of the target distribution distilled: the serving temperature it should fit."""

    # drafter variant (drafter/variants.py; the heads' fields are DrafterConfig's, the loss weights DeepSpec's)
    drafter_variant: str = "dflash"
    """"dflash" (the backbone alone) or "dspark" (plus a Markov head over the previous token and a confidence head;
    drafter/dspark.py). DSpark's published block is 7 drafts: block_size=8 here (anchor + 7 MASK slots)."""
    markov_rank: int = field_default(DrafterConfig, "markov_rank")
    """dspark: rank of the Markov head (DrafterConfig's default: DeepSpec's 256)."""
    enable_confidence_head: bool = True
    """dspark: train the confidence head (the engine's adaptive verification length reads it)."""
    confidence_head_with_markov: bool = True
    """dspark: the confidence head reads the slot's Markov embedding beside its hidden state (DeepSpec: True)."""
    dspark_ce_weight: float = 0.1
    """dspark: weight of the CE of the Markov-corrected logits against the data's token (DeepSpec: 0.1)."""
    dspark_l1_weight: float = 0.9
    """dspark: weight of the L1 distance between the corrected distribution and the target's (DeepSpec: 0.9); the
    target's distribution is its top-`distill_top_k` (distill_weight=1), else the data's token stands in for it."""
    dspark_confidence_weight: float = 1.0
    """dspark: weight of the confidence head's BCE against each slot's acceptance probability (DeepSpec: 1.0)."""

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
            if v is None and name in RESOLVED_FIELDS:  # chosen for the target when the run is prepared
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                fail(c, name, v, f"must be an integer >= {lo}", fixes.get(name, f"set {name} >= {lo}"))
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            fail(c, "time_budget_s", self.time_budget_s, "must be a positive number of seconds",
                 "use e.g. 540 (a 10-minute job with room to save), or None for no limit")
        for name in ("checkpoint_every", "eval_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                fail(c, name, v, "must be an integer >= 0", f"set {name} to 0 (off) or a positive interval")
        if None not in (self.seq_len, self.block_size) and self.seq_len < 2 * self.block_size:
            fail(c, "seq_len", self.seq_len, f"it must hold at least two blocks (2 * block_size = "
                 f"{2 * self.block_size})", f"use seq_len >= {2 * self.block_size}")
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            fail(c, "lr", self.lr, "must be a positive finite number", "use e.g. 6e-4")
        if not 0 <= self.warmup_ratio < 1:
            fail(c, "warmup_ratio", self.warmup_ratio, "must be in [0, 1)", "use e.g. 0.04")
        if not 0 <= self.min_lr_ratio <= 1:
            fail(c, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]", "use 0.0 for a full cosine decay")
        if self.lr_schedule not in ("cosine", "wsd"):
            fail(c, "lr_schedule", self.lr_schedule, "unknown schedule", 'use "cosine" or "wsd"')
        if not 0 < self.decay_ratio <= 1:
            fail(c, "decay_ratio", self.decay_ratio, "must be in (0, 1]", "use e.g. 0.2 (the last fifth of the steps)")
        if self.grad_clip < 0:
            fail(c, "grad_clip", self.grad_clip, "must be >= 0", "use 1.0 (paper) or 0 to disable")
        if self.weight_decay < 0:
            fail(c, "weight_decay", self.weight_decay, "must be >= 0", "use 0.0 (paper) or e.g. 0.01")
        if not 0 <= self.seed < 2**63:
            fail(c, "seed", self.seed, "must be in [0, 2**63)", "use a non-negative integer, e.g. 0")
        # Anchors are distinct positions p with p and p + 1 in the sequence: more than seq_len - 1 can never be
        # sampled, and the surplus would still be allocated (num_anchors * block_size positions per sequence).
        if None not in (self.num_anchors, self.seq_len) and self.num_anchors > self.seq_len - 1:
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
        if not isinstance(self.token_cache, bool):
            fail(c, "token_cache", self.token_cache, "must be True or False", "token_cache=True reads and keeps the "
                 "tokenized data in the cache, False tokenizes every run")
        if self.data_errors not in ("skip", "raise"):
            fail(c, "data_errors", self.data_errors, "unknown policy", 'use "skip" or "raise"')
        if self.dtype not in ("auto", "bfloat16", "float32"):
            fail(c, "dtype", self.dtype, "unknown dtype", 'use "auto", "bfloat16" or "float32"')
        if self.attention not in ATTENTION_BACKENDS:
            fail(c, "attention", self.attention, "unknown attention backend", f"use one of {ATTENTION_BACKENDS}")
        for t in self.layer_types:
            if t not in LAYER_TYPES:
                fail(c, "layer_types", self.layer_types, f"unknown layer type {t!r}", f"use only {LAYER_TYPES}")
        if self.layer_types and self.num_draft_layers is not None and len(self.layer_types) != self.num_draft_layers:
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
        if self.batch_size is not None and self.batch_size % len(self.devices):
            fail(c, "batch_size", self.batch_size, f"it must split evenly over {len(self.devices)} drafter workers",
                 f"use a multiple of {len(self.devices)}")
        # validation
        for name in ("val_every", "real_tau_every"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                fail(c, name, v, "must be None (auto), 0 (off) or a positive interval", f"set {name}=None or e.g. 100")
        for name in ("val_sequences", "real_tau_prompts", "real_tau_new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail(c, name, v, "must be an integer >= 1", f"set {name} >= 1 (turn the measurement off with "
                     f"{'val_every' if name == 'val_sequences' else 'real_tau_every'}=0)")
        # -- metric sinks --
        if isinstance(self.metric_sinks, str):
            fail(c, "metric_sinks", self.metric_sinks, "must be a tuple of sink names", f"use ({self.metric_sinks!r},)")
        object.__setattr__(self, "metric_sinks", tuple(self.metric_sinks))
        for name in self.metric_sinks:
            if (problem := sink_problem(name)) is not None:
                fail(c, "metric_sinks", self.metric_sinks, problem, 'use () (off), ("tensorboard",) or ("wandb",) '
                     "with the package installed")
        check_perf_fields(self)
        check_loss_weighting_fields(self)
        check_optimizer_fields(self)
        check_pack_fields(self)
        check_draft_vocab_fields(self)
        check_distill_fields(self)
        check_variant_fields(c, self)
        for name in DSPARK_WEIGHT_FIELDS:
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                fail(c, name, v, "must be a finite number >= 0", "use DeepSpec's "
                     + " / ".join(str(field_default(TrainConfig, n)) for n in DSPARK_WEIGHT_FIELDS))
        need = self.variant_loss_weighting(self.drafter_variant)
        if need and self.loss_weighting not in (need[0], None):  # None: chosen for the target (recipe_defaults)
            fail(c, "loss_weighting", self.loss_weighting, f"{self.drafter_variant} trains with {need[1]}",
                 f'use loss_weighting="{need[0]}"')
        if self.drafter_variant == "dspark":
            if self.distill_weight not in (0.0, 1.0):
                fail(c, "distill_weight", self.distill_weight, "dspark's CE is on the data's token and its L1 on the "
                     "target's distribution (DeepSpec's loss): distill_weight only says whether the target's "
                     "top-k is there", "use 1.0 (the published loss) or 0 (the data's token stands in for it)")

    @staticmethod
    def variant_loss_weighting(variant: str) -> tuple[str, str] | None:
        """(the loss weighting drafter `variant` must train with, why), or None when it trains with either. The one
        statement of that rule: TrainConfig and RecipeConfig check it, recipe_defaults chooses by it."""
        if variant == "dspark":
            return "decay", "the decayed slot weights it is published with (D-PACE weights the DFlash CE alone)"
        return None

    def compiles_on(self, device_type: str) -> bool:
        """Whether the drafter is torch.compiled on a device of this type: True everywhere, "auto" on CUDA only
        (fixed shapes there; the CPU path stays eager)."""
        return self.compile_drafter is True or (self.compile_drafter == "auto" and device_type == "cuda")

    @property
    def unresolved(self) -> tuple[str, ...]:
        """The fields still None, to be chosen for the target when the run is prepared (recipe_defaults.py)."""
        return tuple(f for f in RESOLVED_FIELDS if getattr(self, f) is None)

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
