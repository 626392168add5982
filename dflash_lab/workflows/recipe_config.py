"""Every knob of the real-target recipe (recipe.py) as one frozen, validated dataclass; the notebook's parameters.

The defaults are the best configuration measured on one H200 that fits a 10-minute call: every human chitchat first
turn (~6,960) plus 26,000 first turns the target writes itself (~23,000 kept), all answered by the target (<= 192
tokens; the data-scaling study, bench/results/2026-12-01-h200-scaling2-smollm2/), then 6,000 steps of 32 windows of
320 tokens, a 3-layer drafter with a 16,384-id draft vocabulary and the feature store (~27 ms a step), trained
against the target's own T=1 distribution (distill_weight=1.0: the T=1 tau of sampled drafts, T=0 unchanged). The
step count is what fits beside the data (~150 s) and the evaluation, from the measured phase times; it is the run of
bench/results/2026-12-02-h200-distill-ab/ (4,636 steps of it trained in 195 s): real tau 2.92 [2.68, 3.19] on 64
held-out chitchat prompts (none of them in training), 2.38 [2.24, 2.54] on held-out target-written ones and 2.01
[1.92, 2.11] on the general set (block 16, T=0, bf16), 2.17x / 1.83x / 1.51x over the target alone at batch 1.
1,500 steps, the default before, read 2.71 (chitchat, with greetings that also occur in training) and 1.66
(general). Tau still grows ~0.2 per doubling of steps there: the "long" preset is the next lever.

These defaults are sized for a GPU. On a CPU they would run for hours (6.4M answer tokens to generate, 61M
training tokens), so a recipe on device="cpu" whose work passes CPU_LIMITS is refused before anything is written,
unless allow_cpu_full_size=True: the CPU is for the smoke run (notebooks/recipes/smollm2.ipynb's first cell), whose
work is ~560 answer tokens and ~200 training tokens.

Presets (`RecipeConfig.from_preset(name, **settings)`, the notebook's `preset` parameter): "10min" is the defaults
above, one 10-minute call; "long" writes twice the target-written data (n_self 60,000) and trains 7,500 steps of
64 windows (2.5x the defaults' tokens) over several calls, with a 5-layer compiled drafter and lr 8.5e-4 (6e-4 x
sqrt 2; 5 layers since 2026-12-06, see PRESETS).
It was 15,000 steps on the defaults' data until that run (below) showed those steps bought nothing past 5,000.
Batch 64 is the faster step per token (571.8k tokens/s against 505.4k at batch 32, and 248.3k for the engine
before the store; one H200, bench/results/2026-12-02-h200-long-arms/), and at equal tokens it trained as well:
5,000 steps of 64 read 3.02 / 2.48 / 2.11 (held-out chitchat / target-written / general, T=0) against 2.99 / 2.51 /
2.14 for 9,000 steps of 32. The 15,000-step version, run as a preset on one H200
(bench/results/2026-12-02-h200-long-preset/: two calls, exact resume at step 7,018, 583k tokens/s), showed that on
the default data more steps stop paying: held-out
accuracy stays at ~0.37 from step 5,000 (11 epochs of 26,799 windows) while training accuracy climbs to 0.51, and
real tau on 32 held-out chitchat prompts peaks at 3.31 there and drifts to 3.00 by step 12,500; the recipe logs the
step where held-out stopped rising (`held_out_stopped_at`). The lever past that point is more target-written data
(n_self; the feature store needs ~1.8 MiB a window, so ~60k windows fit an H200): with 59,453 conversations and
7,500 steps held-out accuracy still rose at the end (0.325 / 0.385 / 0.403 at 2,500 / 5,000 / 7,500) and the final
evaluation read 3.08 / 2.64 / 2.20 (held-out chitchat / target-written / general, T=0, 64 prompts each;
bench/results/2026-12-03-h200-long-data/), the preset since. The 10-minute defaults stay at
batch 32 uncompiled: compiling costs ~40 s before the first step, what the faster step saves over their ~6,000 steps.
Its `call_time_budget_s` of 480 s bounds each call (recipe_clock.py): training stops at a step boundary with a
checkpoint when the call's share is spent, and waits for the next call when the first one's data (~250 s on the
H200, more on an H100) left it less than a minute (on a machine of your own, `-p call_time_budget_s 0` trains in
one go). Running the same command
again with the same `work_dir` continues: data phases whose outputs are complete for the same settings are reused
(DATA_SETTINGS says which settings each depends on), training resumes its run exactly, and evaluation and export
wait until training has finished every step (`evaluate_partial=True` evaluates a partial drafter anyway):

    KEEP_WORK=1 RECIPE_ARGS="-p preset long" bash bench/recipe_smollm2.sh stage2     # one 10-minute call; repeat it
    papermill notebooks/recipes/smollm2.ipynb out.ipynb -p preset long -p device cuda:0 -p work_dir W   # or this

until results.json holds an `export` phase (while the log says `[recipe] train: stopped (resumable) at step N of 7500:
run the recipe again with the same work_dir to continue`, go on). Measured end to end on one H100 with the bound at
550 s: three calls, 369 / 506 / 320 s (bench/results/2026-12-06-h100-long-preset5/); at 480 s expect four.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from dflash_lab.config import TrainConfig
from dflash_lab.config.drafter_config import DRAFTER_VARIANTS
from dflash_lab.config.errors import fail
from dflash_lab.config.field_types import check_field_types
from dflash_lab.evaluation.acceptance import DRAFT_SAMPLING
from dflash_lab.evaluation.prompt_sets import NAMES as PROMPT_SET_NAMES
from dflash_lab.target import models
from dflash_lab.target.sampling import temperature_problem

TINY = "tiny"  # the embedded tiny target: the recipe's tests run every phase on it in seconds
# Work a CPU run may do without allow_cpu_full_size: a bound far above the smoke run's (560 answer tokens, 192
# training tokens) and far below the defaults' (6.4M, 15.4M), between "minutes" and "hours"; not a measured rate.
CPU_LIMITS = {"answer_tokens": 50_000, "train_tokens": 1_000_000}
# Named starting points: the fields each sets on top of the defaults. "long": twice the target-written data (59,453
# conversations, ~250 s to write on the H200 in the first call) and 7,500 steps of 64 windows at the compiled step
# with the store (~100 GiB for its ~56k windows; on an 80 GB card the ~17k it has no room for in host memory), the
# 16,384-id head and a 5-layer drafter: ~8 minutes of training over 2-3 calls of 480 s (call_time_budget_s; the
# first call writes the data); real tau every 2,500 steps. Until 2026-12-06 a per-call training budget of 270 s: the
# call budget gives training what each call has left (~400 s) instead. Measured with 3 layers in
# bench/results/2026-12-03-h200-long-data/ (held-out accuracy still rising at its last step). 5 layers since 10,000
# steps of 32 on the default pool read +0.14 / +0.14 / +0.08 real tau over 3 (held-out chitchat / target-written /
# general; held-out accuracy 0.424 against 0.394, bench/results/2026-12-06-h100-layers5-anchors128/) at ~1.55x the
# step time: a long run is where the drafter's capacity, not its steps, limits it. The 10-minute defaults keep 3
# layers: at their ~6,000 steps the slower 5-layer step gains nothing at equal time, and on a 135M target its drafts
# cost more to decode.
PRESETS: dict[str, dict] = {
    "10min": {},
    "long": {"n_self": 60_000, "feature_store_gib": 100.0, "feature_store_host_gib": 48.0, "steps": 7_500,
             "batch_size": 64, "lr": 8.5e-4, "call_time_budget_s": 480.0, "real_tau_every": 2_500,
             "compile_drafter": True, "num_draft_layers": 5},
}
# The settings each data phase's output depends on, its inputs' included: a rerun in the same work_dir reuses a
# phase's complete output only when every one of them equals what that output was made with (recipe_reuse.py).
_SELF = ("model", "device", "seed", "n_self", "self_heldout", "self_heldout_fraction", "regen_batch_size",
         "regen_max_new_tokens", "regen_temperature", "regen_dtype", "seq_len", "block_size")
_BUILD = ("model", "heldout", "variant", "n_train", "seq_len", "block_size")
_REGEN = _BUILD + ("device", "seed", "regen_batch_size", "regen_max_new_tokens", "regen_temperature", "regen_dtype",
                   "match_check")
DATA_SETTINGS: dict[str, tuple[str, ...]] = {
    "self_prompts": _SELF, "build_data": _BUILD, "regenerate": _REGEN,
    "mix_data": tuple(dict.fromkeys(_SELF + _REGEN)),
}


@dataclass(frozen=True, kw_only=True)
class RecipeConfig:
    """Every knob of the recipe; the notebook's parameters map 1:1 onto these fields."""

    model: str = "smollm2-135m-instruct"
    """A name from dflash_lab.target.models.KNOWN_MODELS, or "tiny" (the embedded target, for tests)."""
    work_dir: str = "runs/recipe-smollm2"
    """Data, regenerated answers, the training run, the export and results.json go here."""
    device: str = "cpu"
    """"cpu" or "cuda:0": one device runs every phase."""
    heldout: int = 200
    """Chitchat conversations held out of training (fixed split by sha256 of the id)."""
    variant: str = "first"
    """"first" (first user turn only) or "all" (every turn, regenerated with its history)."""
    n_train: int = 7000
    """Chitchat training conversations regenerated (the first n of the fixed train split; 7,000 = all ~6,960)."""
    n_self: int = 26000
    """First user turns the target writes itself (fewer are kept: duplicates and bad turns go), each answered by the
    target; 0 = the chitchat-only recipe (no self_prompts / mix phase)."""
    self_heldout: int = 256
    """Target-written conversations held out of training: the "self-heldout" evaluation set."""
    self_heldout_fraction: float = 0.02
    """Part of the text-hash range that may be held out (data/self_prompts.py): 0.01 of 26,000 left 216 kept
    prompts on the H200, fewer than 256; 0.02 leaves ~430 to choose from; a tiny n_self needs a larger part to
    hold anything out."""
    regen_batch_size: int = 512
    """Rows the generation engine (or HF generate on the CPU) runs at once, for answers and target-written turns."""
    regen_max_new_tokens: int = 192
    """Longest answer, chitchat and target-written alike."""
    regen_temperature: float = 0.0
    """Temperature of the target's answers that TRAIN (chitchat and target-written; top-p and top-k off): 0 =
    greedy, the continuation T=0 serving accepts; 1.0 = the continuations the target samples when served at T=1, so
    the drafter learns the distribution sampled acceptance is judged against. The held-out chitchat answers stay
    greedy (they feed the teacher-forced validation); sampled answers are seeded per conversation (reproducible).
    Measured on SmolLM2 at 3,000 steps (bench/results/2026-12-04-h200-sampled-answers/): T=1 answers cost T=0 tau
    (held-out chitchat 2.03 against 2.62); their effect at T=1 there is not yet measured, so greedy stays default."""
    regen_dtype: str = "auto"
    """"auto" = bfloat16 on CUDA (the precision the drafter is served against; the engine writes ~100k new tokens/s
    on an H200), float32 on the CPU; or "float32" / "bfloat16"."""
    match_check: int = 0
    """Prompts on which batched greedy is compared with single-sequence greedy before regenerating (0 = skip). Off
    by default: it answers each prompt once more ALONE through HF generate (~2-3 s per 192-token answer on a GPU,
    minutes on a CPU), and in bf16 batched greedy is known to flip near-tied argmaxes, so the check would restate
    that at a cost; set e.g. 8 to measure it (float32 matched 8/8)."""
    steps: int = 6000
    seq_len: int = 320
    """Tokens per training window: a prompt (at most seq_len - 2 * block_size tokens) plus its answer (<= 192)."""
    batch_size: int = 32
    num_anchors: int = 64
    block_size: int = 16
    num_draft_layers: int = 3
    lr: float = 6e-4
    draft_vocab_size: int | None = 16384
    """Draft vocabulary (TrainConfig.draft_vocab_size): the N most frequent supervised ids; None = the full one. At
    10,000 distilled steps on this recipe's data the full 49,152 ids read 3.06 / 2.67 / 2.28 (held-out chitchat /
    target-written / general, T=0, 64 prompts) against 3.13 / 2.64 / 2.28 with 16,384, its step at ~375k tokens/s
    against 533k for a 16,384-id arm without distillation (one H100, bench/results/2026-12-06-h100-vocab-topk64/)."""
    feature_store_gib: float = 60.0
    """Device memory that keeps each training window's target features for later epochs (TrainConfig.
    feature_store_gib): the ~30k windows of the default data need ~55 GiB in bf16; 0 = recompute. On a GPU with
    less room the store keeps the windows that fit and says so (the long preset's ~56k windows on an 80 GB card)."""
    feature_store_host_gib: float = 0.0
    """TrainConfig.feature_store_host_gib: host memory for the windows the GPU store has no room for (a batch is served
    from the store only when it holds all of its windows). The long preset takes up to 48 GiB: on an H200 its GPU
    store holds every window and this stays unused; on an 80 GB card ~17k windows (~30 GiB) live here."""
    feature_store_dtype: str = "auto"
    """TrainConfig.feature_store_dtype: "auto" keeps the features in bf16; "float8" halves a window (0.89 MiB at
    seq 320), so ~110k windows fit in 95 GiB of an H200 where bf16 holds ~55k. It rounds SmolLM2's features by
    2.2% (relative L2) and cost the tiny target's drafter 0.02 held-out accuracy after ~80 epochs
    (bench/results/2026-12-03-cpu-fp8-features/); its tau effect on SmolLM2 is not measured yet."""
    compile_drafter: bool = False
    """torch.compile the drafter (TrainConfig.compile_drafter): ~30 s before the first step, then a faster step."""
    loss_weighting: str = "dpace"
    """TrainConfig.loss_weighting: "dpace" (D-PACE) or "decay" (the paper's exp(-(k-1)/gamma)). D-PACE: at 10,000
    steps on this recipe's data, held-out accuracy 0.397 against 0.366 and real tau higher on all three held-out
    sets (64 prompts each: chitchat 3.20 vs 3.00, target-written 2.61 vs 2.51, general 2.20 vs 2.10; one H200,
    bench/results/2026-12-03-h200-knob-grid), at the same step time."""
    drafter_variant: str = "dflash"
    """TrainConfig.drafter_variant: "dflash" or "dspark" (DFlash plus DSpark's Markov and confidence heads, trained
    with loss_weighting="decay", the weights it is published with). At the long preset's settings and ~11.5
    GPU-minutes on its data (one H100, bench/results/2026-12-07-h100-long-dspark/), dspark against dflash on 64
    held-out prompts a set: T=0 chitchat 3.64 [3.27, 4.03] against 3.25 [2.97, 3.56], target-written 3.19 against
    2.93, general 2.56 against 2.43, T=1 1.60 against 1.67, speedups level (2.40x against 2.37x on chitchat): no
    interval apart at either temperature, so dflash stays; "dspark" for the higher greedy acceptance."""
    distill_weight: float = 1.0
    """TrainConfig.distill_weight: the share of each position's loss against the target's own T=1 distribution
    over its top `distill_top_k` ids (what sampled serving accepts); 0 = the data's tokens only. 1.0: at 10,000
    steps of 32 on this recipe's data (one H100, bench/results/2026-12-06-h100-distill-t1/) T=1 tau (real
    speculative sampling) on 32 held-out chitchat prompts with drafts sampled from the drafter 1.59 [1.51, 1.68]
    against 1.40 [1.36, 1.45] with hard labels (coupled drafts 1.52 against 1.38; argmax drafts 1.25 against
    1.24), T=0 within the intervals (3.13 / 2.64 / 2.28 against 3.21 / 2.62 / 2.20 on held-out chitchat /
    target-written / general, 64 prompts each, block 16), +0.5 ms a step once the store holds the windows."""
    distill_top_k: int = 16
    """TrainConfig.distill_top_k: the target's most probable ids each position keeps as distillation's target. A
    drafter that learned them exactly accepts a sampled draft with at most their mass: on held-out chitchat the perfect
    distilled drafter's T=1 tau is 2.26 with 16 ids, 2.51 with 64, 2.82 with all (bench/results/
    2026-12-06-cpu-top-k-ceiling/); each id costs 8 bytes a position in the feature store. Trained 10,000 steps with
    64 ids, a drafter read 1.66 [1.59, 1.74] at T=1 against 1.59 [1.51, 1.68] with 16 (32 prompts, sampled drafts;
    T=0 level; bench/results/2026-12-06-h100-vocab-topk64/): not separated, so 16 stays."""
    real_tau_every: int = 2000
    """Real speculative decoding on held-out prompts every N steps while training (0 = off); held-out validation
    (teacher-forced accuracy, simulated and replayed tau) runs on the same held-out chitchat conversations."""
    real_tau_prompts: int = 32
    """Held-out prompts of each real-tau measurement while training."""
    eval_prompts: int = 64
    """Prompts per evaluation set (N of its distinct prompts, spread evenly over its file)."""
    eval_max_new_tokens: int = 128
    eval_sets: tuple[str, ...] = ("chitchat-heldout", "self-heldout", "general")
    """Prompt sets of the final evaluation: "chitchat-heldout" and "self-heldout" are the recipe's own held-out
    files, any other name of evaluation/prompt_sets.py (e.g. "general") or a JSONL file is used as it is."""
    eval_block_sizes: tuple[int, ...] = (16,)
    """Block sizes evaluated at temperature 0, in this order."""
    eval_temperatures: tuple[float, ...] = (0.0, 1.0)
    eval_draft_sampling: tuple[str, ...] = ("sample",)
    """How the drafter drafts at temperatures above 0, one evaluation pass each: "sample" (each slot drawn from the
    drafter's distribution: what a distilled drafter's T=1 tau reaches), "argmax" (its top-1, what vLLM and SGLang
    draft by default: accepted with the target's probability, so bounded by how peaked the target is, 1.52 on
    SmolLM2's held-out chitchat whatever the drafter) or "coupled". Each pass costs ~40 s on an H200 beside a
    10-minute call's ~9 minutes: add "argmax" where that figure is wanted."""
    eval_sampled_block_size: int = 16
    """Temperatures above 0 are evaluated at this block size only (0 = at every size of eval_block_sizes): sampled
    tau is the second question, and each pair costs a full pass over every set."""
    eval_sampled_sets: tuple[str, ...] = ("chitchat-heldout",)
    """Sets of eval_sets evaluated at temperatures above 0 (() = every one): the sampled-serving aim is on chitchat,
    and each set at T=1 costs as much as at T=0 (~40 s on the H200 with the target-alone pass)."""
    eval_budget_s: float = 180.0
    """No new (block size, temperature) evaluation starts after this many seconds of evaluation."""
    eval_untrained: bool = False
    """Also decode with an untrained drafter (the floor a trained one must beat). It is the slowest decoder of the
    evaluation (tau ~1: every token its own target pass), ~40% of the evaluation's time on the H200: on, the T=0
    pass alone spends the 180 s budget and no sampled figure is left for a 10-minute call."""
    threads: int | None = None
    """torch CPU threads (None = leave torch's setting)."""
    seed: int = 0
    train_time_budget_s: float | None = None
    """Wall-time budget of the training phase (TrainConfig.time_budget_s, loading the target included): when spent,
    training stops at a step boundary with a checkpoint and a rerun with the same work_dir resumes it (the "long"
    preset); None = train every step in this call."""
    call_time_budget_s: float | None = None
    """Wall seconds this invocation of the recipe may take (a lent GPU's call), counted from the Recipe's creation;
    None = no bound. Training gets what the data phases left, at most train_time_budget_s, less a minute, and less
    eval_budget_s unless a resumed run's measured speed says it cannot also be evaluated in this call (a run that
    finds in training that it cannot finish in the call trains through that share too); with less than a minute it
    does not start, and a rerun with the same work_dir goes on; an evaluation pass starts only with a minute, or the
    previous pass's time, left (recipe_clock.py). E.g. 480 for a 10-minute call: the long preset's first call spends
    ~250 s on the data on an H200 (~215 s on an H100 for the data of 2026-12-06), so its training starts late or in
    the next call instead of being killed with the call."""
    evaluate_partial: bool = False
    """Evaluate and export a drafter whose training stopped on its budget before its last step; False skips both
    (recorded in results.json) until a rerun with the same work_dir has trained every step."""
    allow_cpu_full_size: bool = False
    """Run on device="cpu" although the settings pass CPU_LIMITS (hours of work); False refuses such a run."""

    def __post_init__(self) -> None:
        def bad(name, why, fix):  # TrainConfig's message: the field, its value, why, the fix
            fail("RecipeConfig", name, getattr(self, name), why, fix)

        check_field_types(self, fail)
        if self.model != TINY and not models.is_known(self.model):
            bad("model", "unknown model name", f"use one of {sorted(models.KNOWN_MODELS)} (or \"tiny\")")
        if self.variant not in ("first", "all"):
            bad("variant", "unknown data variant", 'use "first" or "all"')
        if not self.feature_store_host_gib >= 0:
            bad("feature_store_host_gib", "must be a number of GiB >= 0", "use 0 (GPU only) or e.g. 48")
        if self.feature_store_dtype not in ("auto", "float8"):
            bad("feature_store_dtype", "unknown storage", 'use "auto" (bf16) or "float8" (half the memory)')
        if not self.eval_draft_sampling or any(m not in DRAFT_SAMPLING for m in self.eval_draft_sampling):
            bad("eval_draft_sampling", "unknown or no draft sampling", f"use one or more of {list(DRAFT_SAMPLING)}")
        if self.loss_weighting not in ("dpace", "decay"):
            bad("loss_weighting", "unknown loss weighting", 'use "dpace" (D-PACE) or "decay" (the paper\'s)')
        if self.drafter_variant not in DRAFTER_VARIANTS:
            bad("drafter_variant", "unknown drafter variant", f"use one of {DRAFTER_VARIANTS}")
        need = TrainConfig.variant_loss_weighting(self.drafter_variant)
        if need and self.loss_weighting != need[0]:
            bad("loss_weighting", f"{self.drafter_variant} trains with {need[1]}",
                f'use loss_weighting="{need[0]}" with drafter_variant="{self.drafter_variant}"')
        if self.regen_dtype not in ("auto", "float32", "bfloat16"):
            bad("regen_dtype", "unknown dtype", 'use "auto" (bf16 on CUDA, fp32 on the CPU), "float32" or "bfloat16"')
        for name in ("heldout", "n_train", "regen_batch_size", "regen_max_new_tokens", "steps", "seq_len",
                     "batch_size", "num_anchors", "block_size", "num_draft_layers", "eval_prompts",
                     "eval_max_new_tokens", "real_tau_prompts"):
            if getattr(self, name) < 1:
                bad(name, "must be an integer >= 1", f"set {name} >= 1")
        for name, fix in (("n_self", "use 0 for the chitchat-only recipe, or e.g. 26000"),
                          ("self_heldout", "use e.g. 256, or 0 for no self-heldout set"),
                          ("match_check", "use 0 (off) or e.g. 8"), ("real_tau_every", "use 0 (off) or e.g. 500"),
                          ("eval_sampled_block_size", "use 0 (every block size) or e.g. 16")):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0", fix)
        if not 0 <= self.regen_temperature <= 2:
            bad("regen_temperature", "must be in [0, 2]", "use 0 (greedy answers) or the serving temperature, e.g. 1.0")
        object.__setattr__(self, "regen_temperature", float(self.regen_temperature))
        if not 0 < self.self_heldout_fraction < 1:
            bad("self_heldout_fraction", "must be in (0, 1)", "use e.g. 0.01 (0.3 for a tiny n_self)")
        if not self.lr > 0:
            bad("lr", "must be > 0", "use e.g. 6e-4")
        if self.seq_len <= 2 * self.block_size:
            bad("seq_len", f"leaves no prompt room beside 2 blocks of {self.block_size} answer tokens",
                f"use seq_len > {2 * self.block_size}, e.g. 320")
        if not self.eval_sets:
            bad("eval_sets", "names no prompt set", 'use e.g. ("chitchat-heldout", "self-heldout", "general")')
        for s in self.eval_sets:
            if s not in PROMPT_SET_NAMES and not s.endswith(".jsonl"):
                bad("eval_sets", f"{s!r} is neither a prompt set name nor a .jsonl file",
                    f"use names of {', '.join(PROMPT_SET_NAMES)} or JSONL files")
        if len(set(self.eval_sets)) < len(self.eval_sets):
            bad("eval_sets", "names a set twice", "name each set once")
        if any(x not in self.eval_sets for x in self.eval_sampled_sets):
            bad("eval_sampled_sets", f"names a set that eval_sets {self.eval_sets} does not evaluate",
                "use a subset of eval_sets, or () for every one")
        if not self.eval_block_sizes or any(b < 1 for b in self.eval_block_sizes):
            bad("eval_block_sizes", "needs block sizes >= 1", "use e.g. (16, 8)")
        if not self.eval_temperatures or any(temperature_problem(t) for t in self.eval_temperatures):
            bad("eval_temperatures", "needs finite temperatures >= 0", "use e.g. (0.0, 1.0)")
        object.__setattr__(self, "eval_temperatures", tuple(float(t) for t in self.eval_temperatures))
        if not self.eval_budget_s > 0:
            bad("eval_budget_s", "must be > 0", "use e.g. 180")
        if self.train_time_budget_s is not None and not self.train_time_budget_s > 0:
            bad("train_time_budget_s", "must be a positive number of seconds", "use e.g. 420, or None for no budget")
        if self.call_time_budget_s is not None and not self.call_time_budget_s > 0:
            bad("call_time_budget_s", "must be a positive number of seconds", "use e.g. 480, or None for no bound")

    @classmethod
    def from_preset(cls, name: str, *, explicit=None, **settings) -> RecipeConfig:
        """The preset `name` (PRESETS) with `settings` on top. `explicit`: the names the user set (the notebook
        passes notebook_params' set_by_user and every parameter's value); a preset's field not among them keeps the
        preset's value. None = every name of `settings` was set."""
        if name not in PRESETS:
            fail("RecipeConfig", "preset", name, "unknown preset", f"use one of {sorted(PRESETS)}")
        chosen = set(settings) if explicit is None else set(explicit)
        preset = {k: v for k, v in PRESETS[name].items() if k not in chosen}
        return cls(**{**settings, **preset})

    def data_settings(self, phase: str) -> dict:
        """The settings `phase`'s output depends on (DATA_SETTINGS), with their values."""
        return {k: getattr(self, k) for k in DATA_SETTINGS[phase]}

    def cpu_work(self) -> dict[str, int]:
        """The work that decides whether a CPU run is a smoke run: answer tokens the target writes (every chitchat
        and target-written prompt, at most regen_max_new_tokens each) and tokens the drafter trains on."""
        answers = (self.n_train + self.heldout + self.n_self) * self.regen_max_new_tokens
        return {"answer_tokens": answers, "train_tokens": self.steps * self.batch_size * self.seq_len}

    def check_device(self) -> None:
        """Refuse a GPU-sized recipe on the CPU (see the module docstring) unless allow_cpu_full_size=True."""
        if self.device != "cpu" or self.allow_cpu_full_size:
            return
        over = {k: v for k, v in self.cpu_work().items() if v > CPU_LIMITS[k]}
        if over:
            work = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in over.items())
            fail("RecipeConfig", "allow_cpu_full_size", False,
                 f'device="cpu" with settings sized for a GPU ({work}, above the CPU limits {CPU_LIMITS}): hours of '
                 "work on a CPU",
                 'run on a GPU (device="cuda:0"), shrink the settings as in the notebook\'s CPU smoke run, or set '
                 "allow_cpu_full_size=True to run it on the CPU anyway")

    @property
    def eval_pairs(self) -> list[tuple[int, float]]:
        """(block size, temperature) pairs in evaluation order: every block size at T=0, the sampled block size at
        every T > 0."""
        sampled = (self.eval_sampled_block_size,) if self.eval_sampled_block_size else self.eval_block_sizes
        return [(B, t) for t in self.eval_temperatures for B in (self.eval_block_sizes if t == 0 else sampled)]

    @property
    def max_prompt_tokens(self) -> int:
        """Longest prompt that trains: it must leave room for at least 2 blocks of answer inside the window."""
        return self.seq_len - 2 * self.block_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def train_config(self, data: Path, heldout: Path | None = None) -> TrainConfig:
        return TrainConfig(target=self.model, data=str(data), run_name="recipe", runs_dir=str(Path(self.work_dir) /
                           "runs"), steps=self.steps, seq_len=self.seq_len, batch_size=self.batch_size,
                           block_size=self.block_size, num_anchors=self.num_anchors,
                           num_draft_layers=self.num_draft_layers, lr=self.lr, seed=self.seed,
                           devices=(self.device,), heldout_data=str(heldout) if heldout else "",
                           real_tau_every=self.real_tau_every, val_every=self.real_tau_every,
                           real_tau_prompts=self.real_tau_prompts, log_every=max(1, min(50, self.steps // 20)),
                           time_budget_s=self.train_time_budget_s, draft_vocab_size=self.draft_vocab_size,
                           feature_store_gib=self.feature_store_gib if self.device != "cpu" else 0.0,
                           feature_store_dtype=self.feature_store_dtype if self.device != "cpu" else "auto",
                           feature_store_host_gib=self.feature_store_host_gib if self.device != "cpu" else 0.0,
                           compile_drafter=self.compile_drafter, distill_weight=self.distill_weight,
                           distill_top_k=self.distill_top_k, loss_weighting=self.loss_weighting,
                           drafter_variant=self.drafter_variant)
