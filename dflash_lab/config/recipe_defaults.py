"""The settings a run trains with when the user leaves them unset: one function for every way to start a run.

    resolved = resolve_defaults(config, target=TargetFacts.of("Qwen/Qwen3-8B", target_config), facts=run_facts)
    resolved.config        # every RESOLVED_FIELDS value filled in; a value the user set is never touched
    resolved.line()        # "settings: block 16 (paper default for real targets); seq_len 2048 (longest ...)"

A TrainConfig field of RESOLVED_FIELDS left None means "choose for this target". The embedded tiny target gets the
settings its CPU demo was tuned with (TINY, what notebooks/train.ipynb trained with before this function existed,
pinned by tests/golden_losses.json and the demo). Any other target gets the paper's recipe scaled to it and to the
data, with the knob study's findings (docs/results.md, "Every knob at 10,000 steps"):
- block 16, 5 draft layers (5 beat 3 by +0.14 tau on held-out chitchat at 10,000 steps), D-PACE loss weighting
  (+0.19 over decay), the paper's gamma for the block (target_defaults.default_gamma);
- seq_len: the data's longest sample rounded up to a multiple of 64, at most 3072 (the paper's) or the target's
  context; num_anchors = seq_len / 6 (the paper's 512 at 3072);
- batch: the largest of 64, 32, 16, ... the memory model fits on the GPUs (32 on a CPU, where nothing is read).
  64 at lr 8.5e-4 trained as well as 32 at 6e-4 at equal tokens (3.02 against 2.99 on held-out chitchat); 128 at
  1.2e-3 was behind (-0.10) for 18% less GPU time per token, so 64 is the ceiling. lr: the paper's 6e-4 up to
  batch 32, 6e-4 * sqrt(batch / 32) above (8.5e-4 at 64, the value measured);
- the fast path where it pays: the drafter compiled on CUDA ("auto": eager on the CPU), and the feature store ON
  when the data is seen more than once (steps * batch > windows), asked for every window and cut by the placement
  check to the GPU's room beside the target, the drafter and the step's activations (host memory takes the rest).
  The pruned draft head (draft_vocab_size) stays opt-in.

The function is pure: what it needs to know about the data and the machine comes in `facts` (RunFacts: prepare.py
measures them; tests feed numbers), asked only for the fields still unset.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol

from .errors import ConfigError
from .target_defaults import default_gamma

# The fields this function fills when they are None, in the order they are decided (later ones read earlier ones).
RESOLVED_FIELDS = ("block_size", "num_draft_layers", "loss_weighting", "seq_len", "num_anchors", "batch_size", "lr",
                   "compile_drafter", "feature_store_gib", "feature_store_host_gib")

# The embedded tiny target on a CPU: the settings the demo and the golden losses were tuned with.
TINY = {"block_size": 8, "num_draft_layers": 2, "loss_weighting": "decay", "seq_len": 192, "num_anchors": 24,
        "batch_size": 8, "lr": 3e-3, "compile_drafter": False, "feature_store_gib": 0.0,
        "feature_store_host_gib": 0.0}

PAPER_BLOCK = 16
PAPER_LAYERS = 5
PAPER_SEQ_LEN = 3072
SEQ_MULTIPLE = 64  # windows rounded up to a multiple of this: a few shapes, not one per data set
ANCHOR_DIVISOR = 6  # paper: 512 anchors in 3072 tokens
BATCHES = (64, 32, 16, 8, 4, 2, 1)  # tried largest first on GPUs; 128 measured behind at equal tokens
CPU_BATCH = 32  # the knob study's baseline batch
PAPER_LR, PAPER_LR_BATCH = 6e-4, 32


@dataclass(frozen=True)
class TargetFacts:
    """What the resolution needs to know about the target: is it the embedded tiny one, and its context length."""

    name: str
    tiny: bool
    context: int | None  # max_position_embeddings; None = unknown

    @classmethod
    def of(cls, target: str, target_config) -> TargetFacts:
        tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        context = getattr(tc, "max_position_embeddings", None)
        return cls(name=target, tiny=target == "tiny", context=int(context) if context else None)


class RunFacts(Protocol):
    """The data and machine facts the resolution asks for (prepare.py's implementation measures them)."""

    cuda: bool  # the drafter workers are CUDA devices

    def longest_sample(self, config, cap: int) -> int:
        """Tokens in the longest training sample, truncated at `cap` (`config`: block_size set)."""

    def windows(self, config) -> int:
        """Training windows (samples, or packed windows) at `config.seq_len`."""

    def batch_fits(self, config) -> bool:
        """Whether `config` (every shape field set, batch included) fits the GPUs beside the target."""

    def store_gib(self, config) -> float:
        """GiB a feature store needs to hold every window of the data at `config`'s shape."""

    def store_room_gib(self, config) -> tuple[float, float] | None:
        """(GiB the GPUs have for a store beside the target, the drafter and the step's activations, GiB of host
        memory for its host tier), or None when this machine's memory is not read (the run fits the store then)."""


@dataclass(frozen=True)
class Choice:
    field: str
    value: object
    why: str


@dataclass(frozen=True)
class Resolved:
    config: object  # the TrainConfig with every RESOLVED_FIELDS value set
    choices: tuple[Choice, ...]  # one per field this call filled, in decision order

    def line(self) -> str:
        """The progress line naming every value chosen and why ("" when the user set them all)."""
        if not self.choices:
            return ""
        groups: list[tuple[str, list[str]]] = []  # consecutive choices with one reason share it
        for c in self.choices:
            if not groups or groups[-1][0] != c.why:
                groups.append((c.why, []))
            groups[-1][1].append(f"{_label(c.field)} {_show(c.value)}")
        return "settings: " + "; ".join(f"{', '.join(values)} ({why})" for why, values in groups)

    def as_dict(self) -> dict:
        return {c.field: {"value": c.value, "why": c.why} for c in self.choices}


def lr_for_batch(batch: int) -> float:
    """The lr the measurements support at `batch`: the paper's 6e-4 up to 32, scaled by sqrt(batch / 32) above
    (8.5e-4 at 64: the long preset's, level with 32 at 6e-4 at equal tokens)."""
    if batch <= PAPER_LR_BATCH:
        return PAPER_LR
    return float(f"{PAPER_LR * math.sqrt(batch / PAPER_LR_BATCH):.2g}")


def seq_len_cap(target: TargetFacts) -> int:
    """The longest window a resolved run uses: the paper's 3072, or the target's context when shorter."""
    cap = PAPER_SEQ_LEN if target.context is None else min(PAPER_SEQ_LEN, target.context)
    return max(SEQ_MULTIPLE, cap // SEQ_MULTIPLE * SEQ_MULTIPLE)


def resolve_defaults(config, *, target: TargetFacts, facts: RunFacts | None = None) -> Resolved:
    """`config` with every unset RESOLVED_FIELDS value chosen for `target` (module docstring); values set stay."""
    todo = config.unresolved  # TrainConfig's: the RESOLVED_FIELDS still None
    if not todo:
        return Resolved(config, ())
    chosen: dict[str, object] = {}
    choices: list[Choice] = []

    def value(name: str):
        return chosen[name] if name in chosen else getattr(config, name)

    def choose(name: str, v, why: str) -> None:
        chosen[name] = v
        choices.append(Choice(name, v, why))

    def current():
        return dataclasses.replace(config, **chosen)

    if target.tiny:
        for name in todo:
            choose(name, TINY[name], "the tiny target's CPU demo settings")
        return Resolved(current(), tuple(choices))
    need_facts = set(todo) - {"block_size", "num_draft_layers", "loss_weighting"}
    if need_facts and facts is None:
        raise ConfigError(f"TrainConfig fields {sorted(need_facts)} are unset (None = chosen for the target) and "
                          "nothing measured the data and the machine. Fix: start the run through prepare_run (the "
                          "Trainer, the CLI and torchrun do), or set them.")
    if "block_size" in todo:
        choose("block_size", PAPER_BLOCK, "paper default for real targets")
    if "num_draft_layers" in todo:
        choose("num_draft_layers", PAPER_LAYERS, "paper's depth; 5 beat 3 layers by +0.14 tau at 10k steps")
    need = config.variant_loss_weighting(config.drafter_variant)  # the variant's own weighting, if it has one
    if "loss_weighting" in todo and need:
        choose("loss_weighting", need[0], f"{config.drafter_variant} trains with {need[1]}")
    elif "loss_weighting" in todo:
        choose("loss_weighting", "dpace", f"D-PACE beat decay by +0.19 tau at 10k steps; gamma "
               f"{config.gamma if config.gamma is not None else default_gamma(value('block_size')):g} only for decay")
    if "seq_len" in todo:
        cap = seq_len_cap(target)
        longest = facts.longest_sample(current(), cap)
        seq = min(cap, max(2 * value("block_size"), SEQ_MULTIPLE, -(-longest // SEQ_MULTIPLE) * SEQ_MULTIPLE))
        where = f"the target's context {target.context:,}" if cap < PAPER_SEQ_LEN else f"paper {PAPER_SEQ_LEN}"
        longest_is = f"{longest:,} tokens" if longest < cap else f"at least {cap:,} tokens (longer ones truncated)"
        choose("seq_len", seq, f"longest sample {longest_is}, rounded up to {SEQ_MULTIPLE}, at most {where}")
    if "num_anchors" in todo:
        choose("num_anchors", max(1, min(value("seq_len") - 1, value("seq_len") // ANCHOR_DIVISOR)),
               f"seq_len / {ANCHOR_DIVISOR}, as the paper's 512 in 3072")
    if "batch_size" in todo:
        workers = len(config.devices)
        if facts.cuda:
            # each worker takes an equal share: on 3, 5, 6 or 7 GPUs the nearest multiples below (63, 30, 15, ...)
            tried = sorted({max(workers, b // workers * workers) for b in BATCHES}, reverse=True)
            fits = [b for b in tried if facts.batch_fits(dataclasses.replace(current(), batch_size=b,
                                                                             feature_store_gib=0.0,
                                                                             feature_store_host_gib=0.0))]
            batch = fits[0] if fits else tried[-1]
            why = (f"the largest of {'/'.join(map(str, tried))} the memory model fits beside the target; 64 matched "
                   "32 at equal tokens, 128 was behind" if fits else "nothing larger fits: see the memory error")
        else:
            batch = max(workers, CPU_BATCH // workers * workers)
            why = "the knob study's batch (no GPU memory to size it on a CPU)"
        choose("batch_size", batch, why)
    if "lr" in todo:
        b = value("batch_size")
        choose("lr", lr_for_batch(b), "paper's 6e-4" + (f" x sqrt({b}/32), as measured at 64" if b > 32 else ""))
    if "compile_drafter" in todo:
        choose("compile_drafter", "auto", "compiled: CUDA workers, fixed shapes" if facts.cuda
               else "eager on the CPU (auto compiles on CUDA only)")
    if "feature_store_gib" in todo:
        cfg = current()
        windows = facts.windows(cfg)
        epochs = cfg.steps * cfg.batch_size / max(1, windows)
        gib, host, why = 0.0, 0.0, ""
        if config.feature_cache:
            why = "off: features come from the feature cache"
        elif not facts.cuda:
            why = "off on the CPU"
        elif epochs <= 1:
            why = f"off: the data is seen {epochs:.2f} times (once at most), a kept window would never come back"
        else:
            gib, host, why = _store_size(facts, cfg, epochs, windows)
        choose("feature_store_gib", gib, why)
        if "feature_store_host_gib" in todo:
            choose("feature_store_host_gib", host, "off with the GPU store" if not gib else
                   "the windows the GPU has no room for" if host else "the GPU holds every window")
    elif "feature_store_host_gib" in todo:  # a GPU store the user sized: no host tier unless asked for
        choose("feature_store_host_gib", 0.0, "the GPU store as you sized it")
    return Resolved(current(), tuple(choices))


def _store_size(facts: RunFacts, cfg, epochs: float, windows: int) -> tuple[float, float, str]:
    """(GPU GiB, host GiB, why) of a store that holds every window: on the GPU when they fit beside the run, the rest
    in host memory; off when both together cannot hold them all, since a batch is served from the store only when it
    holds every window of it (a store of half the windows serves ~0.5**batch of the batches)."""
    exact = facts.store_gib(cfg)
    need = math.ceil(exact * 10) / 10  # asked in tenths of a GiB; the run keeps whole windows of it
    room = facts.store_room_gib(cfg)
    on = f"on: {epochs:.1f} epochs over {windows:,} windows ({need:,.1f} GiB)"
    if room is None:
        return need, need, on + ", fitted to the room beside the run when it starts"
    gpu, host = room
    if exact <= gpu:
        return need, 0.0, on + ", all on the GPU (they fit beside the target, the drafter and the step)"
    if exact <= gpu + host:
        rest = math.ceil((exact - gpu) * 10) / 10
        return need, rest, on + f", {gpu:,.0f} GiB on the GPU and the rest in host memory"
    return 0.0, 0.0, (f"off: the data's {windows:,} windows need {need:,.0f} GiB and the GPU ({gpu:,.0f}) and host "
                      f"({host:,.0f}) have less beside the run: a store of part of them seldom serves a whole batch")


_LABELS = {"block_size": "block", "num_draft_layers": "layers", "loss_weighting": "loss", "seq_len": "seq_len",
           "num_anchors": "anchors", "batch_size": "batch", "lr": "lr", "compile_drafter": "compile",
           "feature_store_gib": "store GiB", "feature_store_host_gib": "host store GiB"}


def _label(field: str) -> str:
    return _LABELS.get(field, field)


def _show(v) -> str:
    if isinstance(v, float) and v and v < 0.01:
        return f"{v:g}"
    return str(v)
