"""Honest training metrics: teacher-forced validation on held-out conversations and real tau while training.

Why: on SmolLM2-135M a run showed training accuracy 0.93 and simulated tau 13.2 while real speculative decoding
reached ~2.0 on held-out prompts (docs/tau-gap.md). Two numbers make the dashboard honest:

- validation (`val_acc`, `val_slot_acc`, `val_sim_tau`): the drafter in eval mode, no gradient, on a FIXED set of
  held-out sequences with anchors at EVERY valid position (deterministic, no sampling noise), scored by the same
  `step.block_stats` as the training metrics; and `val_chain_tau`, a replay of speculative decoding on that text
  (start each answer at its first token, jump by the teacher-forced acceptance length), which equals real tau when
  the text is the target's own greedy output;
- real tau (`real_tau`, its 95% bootstrap interval over prompts `real_tau_low` / `real_tau_high`, `real_tau_prompts`
  and `real_tau_sha256` of those prompts): real speculative decoding (target + current drafter weights) on fixed
  held-out prompts, temperature 0, 32 prompts x 128 new tokens by default. Only this number is what serving will
  see. Each time it is the best so far, the drafter's weights go to `<run>/checkpoints/best/drafter.safetensors`
  and `<run>/best.json` says which step, tau, interval and prompts (`evaluate --checkpoint best` takes them): the
  recipe's drafter peaked at step 1,000-1,400 of 2,000.

A `tau_gap` event (and a WARNING line) fires when the simulated and the real tau part ways.
"""

from __future__ import annotations

import copy
import time

import torch

from dflash_lab.drafter.blocks import build_block_batch
from dflash_lab.data.tokenize import DataError
from dflash_lab.evaluation.batched_decode import BatchedSpeculativeDecoder
from dflash_lab.evaluation.evaluate import heldout_run
from dflash_lab.evaluation.export import BEST, BEST_FILE, best_marker
from dflash_lab.evaluation.intervals import TauInterval
from .heldout_set import HELDOUT_SPLITS, ValidationSet, heldout_source, load_validation_set  # noqa: F401 (public)
from dflash_lab.drafter.step import DraftInputs, block_stats, build_masks, drafter_loss
from dflash_lab.runs.rundir import write_json
from dflash_lab.runs.run_end import save_drafter
from dflash_lab.target.features import FeatureExtractor, embedding_of, lm_head_weight
from dflash_lab.data.draft_vocab import draft_head

# Validation runs anchors in passes of this many blocks per sequence: the dense mask of one pass is
# VAL_BATCH x (N*B) x (S + N*B) booleans (4 x 1024 x 1536 = 6.3 MB at seq_len 512, B 16).
ANCHORS_PER_PASS = 64


def all_anchors(loss_mask: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every position p with loss_mask[p] and loss_mask[p+1] (the training anchor rule), in passes of at most
    ANCHORS_PER_PASS per sequence. Returns [(anchors (b, N) long, valid (b, N) bool)] with 0/False padding."""
    m = loss_mask.bool()
    cand = torch.zeros_like(m)
    cand[:, :-1] = m[:, :-1] & m[:, 1:]  # (b, S)
    b, S = m.shape
    counts = cand.sum(1)
    n_max = int(counts.max()) if b else 0
    # positions of candidates first, in order; the rest (S) sorts last
    pos = torch.where(cand, torch.arange(S)[None].expand(b, -1), torch.full((b, S), S))
    pos = pos.sort(dim=1).values[:, :max(n_max, 1)]
    passes = []
    for start in range(0, max(n_max, 1), ANCHORS_PER_PASS):
        chunk = pos[:, start:start + ANCHORS_PER_PASS]
        if chunk.shape[1] < ANCHORS_PER_PASS:
            chunk = torch.cat([chunk, chunk.new_full((b, ANCHORS_PER_PASS - chunk.shape[1]), S)], dim=1)
        valid = chunk < S
        passes.append((torch.where(valid, chunk, torch.zeros_like(chunk)), valid))
    return passes


@torch.no_grad()
def teacher_forced(drafter, extractor, embed, head_weight, input_ids: torch.Tensor, loss_mask: torch.Tensor, *,
                   block_size: int, mask_token_id: int, gamma: float, chunk_size: int = 4096) -> dict:
    """Teacher-forced correctness of the drafter at every valid anchor of (b, S) sequences (on the drafter's device).

    Returns {"correct", "has_loss"}: (b, N_all, B-1) bool, and "anchors", "valid": (b, N_all), in position order.
    The drafter sees the DATA tokens and the target's features of the DATA sequence, exactly as in training.
    """
    dev = head_weight.device
    head_weight, label_map = draft_head(drafter, head_weight)  # pruned head, out-of-vocab labels wrong
    input_ids, loss_mask = input_ids.to(dev), loss_mask.to(dev)
    features = extractor(input_ids)  # (b, S, n*H)
    S = input_ids.shape[1]
    ctx_pos = torch.arange(S, device=dev)[None].expand(input_ids.shape[0], -1)
    out = {"correct": [], "has_loss": [], "anchors": [], "valid": []}
    for anchors, valid in all_anchors(loss_mask.cpu()):
        anchors, valid = anchors.to(dev), valid.to(dev)
        bb = build_block_batch(input_ids, loss_mask, anchors, valid, block_size=block_size,
                               mask_token_id=mask_token_id, gamma=gamma)
        masks = build_masks(bb, seq_len=S, backend="sdpa", layer_types=drafter.config.layer_types,
                            sliding_window=drafter.config.sliding_window)
        _, raw = drafter_loss(drafter, embed, head_weight, features, DraftInputs(bb, masks, ctx_pos), chunk_size,
                              label_map=label_map)
        for k, v in (("correct", raw["correct"]), ("has_loss", raw["has_loss"]), ("anchors", anchors),
                     ("valid", valid)):
            out[k].append(v)
    return {k: torch.cat(v, dim=1) for k, v in out.items()}


def acceptance_lengths(correct: torch.Tensor, has_loss: torch.Tensor) -> torch.Tensor:
    """(b, N) per block: 1 + leading supervised slots predicted right (what one verify step would accept)."""
    return 1 + torch.cumprod((correct & has_loss).long(), dim=2).sum(2)


def chain_tau(lengths: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor) -> tuple[float, int, int]:
    """Replay speculative decoding on the data: start each answer at its first anchor, jump by the acceptance
    length, count iterations. Exactly what serving does when the target's greedy output IS the data.

    Returns (tau = tokens / iterations, tokens, iterations) pooled over all answers.
    """
    tokens = iters = 0
    L, A, V = lengths.tolist(), anchors.tolist(), valid.tolist()
    for row_l, row_a, row_v in zip(L, A, V):
        at = {a: n for a, n, v in zip(row_a, row_l, row_v) if v}
        prev = None
        for a in sorted(at):
            if prev is not None and a == prev + 1:  # inside a run of anchors: not an answer start
                prev = a
                continue
            prev = a
            p = a
            while p in at:  # one verify step from position p
                iters += 1
                tokens += at[p]
                p += at[p]
        # answers are maximal runs of consecutive anchors; the inner loop stops when a jump leaves the run
    return (tokens / iters if iters else 1.0), tokens, iters


# ------------------------------------------------------------------------------------------------------------------
# Settings resolved from the TrainConfig
# ------------------------------------------------------------------------------------------------------------------

def val_interval(cfg) -> int:
    """Steps between validations (0 = off): None = every max(50, steps // 10), about 10 per run."""
    return cfg.val_every if cfg.val_every is not None else max(50, cfg.steps // 10)


def real_tau_interval(cfg) -> int:
    """Steps between real-tau measurements (0 = off). Auto: off for the tiny target (a CPU suite builds many short
    trainers, and the demo's held-out tau comes from `evaluate` after training), every max(100, steps // 10) for
    real targets: at most ~10 measurements of real_tau_prompts x real_tau_new_tokens (32 x 128) per run."""
    if cfg.real_tau_every is not None:
        return cfg.real_tau_every
    return 0 if cfg.target == "tiny" else max(100, cfg.steps // 10)


def due(step: int, every: int, last_step: int) -> bool:
    """A periodic measurement runs on multiples of `every` and at the last step of a run that spans at least one
    interval (so a short run, e.g. a 5-step test, measures nothing)."""
    return every > 0 and (step % every == 0 or step == last_step >= every)


def tau_gap(sim_tau: float, real_tau: float) -> bool:
    """Simulated and real tau part ways: sim/real > 1.5 AND sim - real > 1 (both, so tau 1.4 vs 1.0 is no alarm)."""
    return sim_tau / max(real_tau, 1e-9) > 1.5 and sim_tau - real_tau > 1.0


# ------------------------------------------------------------------------------------------------------------------
# The validator the Trainer calls
# ------------------------------------------------------------------------------------------------------------------

class Validator:
    """Runs validation / real tau on their steps for a Trainer, on ONE device with a COPY of worker 0's drafter.

    The copy (allocated once, refreshed with `load_state_dict` each time) keeps the training replicas, their
    captured CUDA graphs, compiled forwards and gradient buffers untouched; everything runs under no_grad in eval
    mode on the device of the first target replica, then synchronises so no work is left in flight when the
    next training step starts.
    """

    def __init__(self, trainer):
        cfg = trainer.config
        self.val_every, self.real_every = val_interval(cfg), real_tau_interval(cfg)
        self.data: ValidationSet | None = None
        self._loaded = False
        self._copy = None
        self._extractor = None
        # the best held-out real tau so far (a resumed run continues from its best.json)
        marker = best_marker(trainer.run_dir) if trainer.run_dir else None
        self.best_tau = marker.get("real_tau") if marker else None
        if 0 < cfg.steps < self.val_every:  # `due` measures nothing in a run shorter than one interval: say so now
            trainer.log(f"validation: off for this run: its {cfg.steps} steps are fewer than one validation interval "
                        f"({self.val_every} steps). Fix: -p val_every N (TrainConfig(val_every=N)) to measure sooner")

    def _load(self, trainer) -> None:
        """The held-out set, once, at the first measurement due (a short run that measures nothing reads nothing)."""
        cfg, self._loaded = trainer.config, True
        try:
            self.data = load_validation_set(trainer.tokenizer, cfg, block_size=trainer.drafter_config.block_size,
                                            max_positions=trainer.drafter_config.max_position_embeddings)
        except DataError as e:  # never stop a training run for its validation set: say so and go on
            trainer.log(f"WARNING: validation and real tau are off: the held-out data is unusable ({e})")
            self.val_every = self.real_every = 0
            return
        if self.data is None:
            trainer.log(f"note: validation and real tau are off: no held-out conversations for data={cfg.data!r} "
                        "(looked for heldout.jsonl next to it or a heldout/test/validation split). Fix: "
                        "-p heldout_data FILE.jsonl (train.ipynb, explore.ipynb; Python: TrainConfig(heldout_data=...)),"
                        " or put a heldout.jsonl next to the data file.")
            self.val_every = self.real_every = 0
            return
        if not self.data.prompts:
            self.real_every = 0
        trainer.log(f"validation: {self.data.input_ids.shape[0]} held-out sequences from {self.data.source}"
                    + (f" every {self.val_every} steps" if self.val_every else " off")
                    + (f"; real tau on {len(self.data.prompts)} prompts x {cfg.real_tau_new_tokens} tokens every "
                       f"{self.real_every} steps" if self.real_every else "; real tau off")
                    + f" | held-out {self.data.choice_text()}"
                    + (f" | real-tau prompts: {self.data.counts['prompts_in_training']} of the file's distinct "
                       "prompts also in the training data, left out"
                       if self.data.counts.get("prompts_in_training") else ""))

    def due(self, step: int, last_step: int) -> tuple[bool, bool]:
        return due(step, self.val_every, last_step), due(step, self.real_every, last_step)

    def _drafter(self, trainer):
        src = trainer.drafter
        dev = next(trainer.target.parameters()).device
        if self._copy is None:  # deepcopy: device-to-device, no CPU init of a 1B-parameter drafter
            self._copy = copy.deepcopy(src).to(dev).requires_grad_(False).eval()
        else:
            self._copy.load_state_dict(src.state_dict())
        return self._copy

    @torch.no_grad()
    def run(self, trainer, record: dict) -> dict:
        """Measurements due at record["step"]: adds val_* / real_tau* keys to `record` and returns them."""
        if not any(self.due(record["step"], trainer.config.steps)):
            return {}
        if not self._loaded:
            self._load(trainer)
        do_val, do_real = self.due(record["step"], trainer.config.steps)
        if not (do_val or do_real):
            return {}
        try:
            return self._measure(trainer, record, do_val, do_real)
        except Exception as e:  # noqa: BLE001 - a measurement must never stop a training run: say so, stop measuring
            trainer.log(f"WARNING: validation failed at step {record['step']} ({type(e).__name__}: {e}); validation "
                        "and real tau are off for the rest of this run")
            self.val_every = self.real_every = 0
            return {}

    def _measure(self, trainer, record: dict, do_val: bool, do_real: bool) -> dict:
        drafter, target, out = self._drafter(trainer), trainer.target, {}
        t0 = time.perf_counter()
        if do_val:
            if self._extractor is None:  # its own instance: never the engine's captured extractor
                self._extractor = FeatureExtractor(target, drafter.config.target_layer_ids, fused_norms=False)
            out.update(validation_metrics(drafter, self._extractor, embedding_of(target), lm_head_weight(target),
                                          self.data, gamma=trainer.config.resolved_gamma,
                                          chunk_size=trainer.config.loss_chunk_size))
            out["val_s"] = round(time.perf_counter() - t0, 3)  # .tolist()/float() above synced the device
            t0 = time.perf_counter()
        if do_real:
            # the prompts share each verify (batched_decode.py): the same tokens and tau as one at a time, at a
            # fraction of the cost (tiny target on the CPU, 32 prompts x 128 tokens: 4.3 s instead of 124 s)
            new = trainer.config.real_tau_new_tokens
            length = max(map(len, self.data.prompts)) + new + 2 * drafter.config.block_size
            batch = BatchedSpeculativeDecoder.rows_for(target, drafter, length)
            run = heldout_run((target, drafter, trainer.tokenizer), prompts=self.data.prompts, max_new_tokens=new,
                              n_prompts=len(self.data.prompts), batch=batch)
            iv = run.interval(seed=trainer.config.seed)
            out.update(real_tau=run.tau, real_tau_low=iv.low, real_tau_high=iv.high,
                       real_tau_prompts=len(self.data.prompts), real_tau_sha256=self.data.prompts_sha256,
                       real_tau_rows=batch, real_tau_s=round(time.perf_counter() - t0, 3))
            self._mark_best(trainer, drafter, record["step"], out)
        dev = next(target.parameters()).device
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        record.update(out)
        return out


    def _mark_best(self, trainer, drafter, step: int, out: dict) -> None:
        """When this real tau is the best so far: the drafter's weights to checkpoints/best/ and best.json."""
        if self.best_tau is not None and out["real_tau"] <= self.best_tau:
            return
        self.best_tau = out["real_tau"]
        if trainer.run_dir is None:
            return
        weights = save_drafter(drafter, trainer.run_dir / "checkpoints" / BEST / "drafter.safetensors", step)
        write_json(trainer.run_dir / BEST_FILE, {
            "metric": "real_tau", "step": step, **{k: out[k] for k in ("real_tau", "real_tau_low", "real_tau_high",
                                                                      "real_tau_prompts", "real_tau_sha256")},
            "real_tau_new_tokens": trainer.config.real_tau_new_tokens, "prompts": self.data.source,
            "weights": str(weights.relative_to(trainer.run_dir))})
        out["real_tau_best"] = True
        iv = TauInterval(out["real_tau"], out["real_tau_low"], out["real_tau_high"], out["real_tau_prompts"])
        trainer.log(f"best held-out real tau so far: {iv.text()} at step {step} -> {weights.parent} "
                    "(evaluate --checkpoint best)")


VAL_BATCH = 4  # held-out sequences per teacher-forced pass (fixed, so compiled kernels see one shape)


def validation_metrics(drafter, extractor, embed, head_weight, data: ValidationSet, *, gamma: float,
                       chunk_size: int = 4096) -> dict:
    """val_acc, val_slot_acc (list), val_sim_tau on the fixed held-out set, via step.block_stats (as in training)."""
    B, mask_id = drafter.config.block_size, drafter.config.mask_token_id
    correct, has_loss = [], []
    tokens = iters = 0
    n = data.input_ids.shape[0]
    for i in range(0, n, VAL_BATCH):
        ids, m = data.input_ids[i:i + VAL_BATCH], data.loss_mask[i:i + VAL_BATCH]
        if ids.shape[0] < VAL_BATCH:  # pad with unsupervised rows: same shapes every pass
            pad = VAL_BATCH - ids.shape[0]
            ids = torch.cat([ids, ids[:1].expand(pad, -1)])
            m = torch.cat([m, torch.zeros_like(m[:1]).expand(pad, -1)])
        tf = teacher_forced(drafter, extractor, embed, head_weight, ids, m, block_size=B, mask_token_id=mask_id,
                            gamma=gamma, chunk_size=chunk_size)
        correct.append(tf["correct"].flatten(0, 1))
        has_loss.append(tf["has_loss"].flatten(0, 1))
        _, t, k = chain_tau(acceptance_lengths(tf["correct"], tf["has_loss"]), tf["anchors"], tf["valid"])
        tokens, iters = tokens + t, iters + k
    st = block_stats(torch.cat(correct)[None], torch.cat(has_loss)[None])  # (1, all blocks, B-1)
    return {"val_acc": float(st["acc"]), "val_sim_tau": float(st["sim_tau"]),
            "val_slot_acc": [round(float(a), 4) for a in st["slot_acc"]],
            "val_chain_tau": tokens / iters if iters else 1.0}


# ------------------------------------------------------------------------------------------------------------------
# What the progress output shows
# ------------------------------------------------------------------------------------------------------------------

SIM_WINDOW = 10  # training sim_tau is noisy per step: the gap check uses its mean over the last 10 steps


def tau_gap_event(record: dict, history: list[dict]) -> dict | None:
    """The `tau_gap` event's fields when this step measured real tau and the training sim_tau (mean of the last
    SIM_WINDOW steps) parts ways with it (see `tau_gap`); else None."""
    if "real_tau" not in record:
        return None
    recent = [r["sim_tau"] for r in history[-SIM_WINDOW:] if "sim_tau" in r and r.get("step") != record["step"]]
    sims = (recent + [record["sim_tau"]])[-SIM_WINDOW:]
    sim, real = sum(sims) / len(sims), record["real_tau"]
    if not tau_gap(sim, real):
        return None
    gap = {"step": record["step"], "sim_tau": round(sim, 4), "real_tau": round(real, 4),
           "ratio": round(sim / real, 3), "real_tau_prompts": record.get("real_tau_prompts")}
    for k in ("val_sim_tau", "val_chain_tau"):
        if k in record:
            gap[k] = round(record[k], 4)
    return gap


def validation_line(record: dict) -> str:
    """One progress line with what this step measured, beside the training numbers."""
    parts = [f"validation at step {record['step']}: train acc {record['acc']:.3f} sim tau {record['sim_tau']:.2f}"]
    if "val_acc" in record:
        parts.append(f"held-out acc {record['val_acc']:.3f} sim tau {record['val_sim_tau']:.2f} "
                     f"replayed tau {record['val_chain_tau']:.2f}")
    if "real_tau" in record:
        ci = (f" [{record['real_tau_low']:.2f}, {record['real_tau_high']:.2f}]"
              if record.get("real_tau_low") is not None else " [n/a]")
        parts.append(f"REAL tau {record['real_tau']:.2f}{ci} ({record['real_tau_prompts']} held-out prompts, 95% "
                     "interval)")
    return " | ".join(parts)


def validate_when_due(trainer, record: dict) -> None:
    """Held-out validation and real tau when due (Validator), into `record`; warns when sim and real tau part ways."""
    if trainer.validator is None:
        trainer.validator = Validator(trainer)
    if not any(trainer.validator.due(trainer.step_count, trainer.config.steps)):
        return
    phase, trainer.phase = trainer.phase, "validating"
    try:
        out = trainer.validator.run(trainer, record)
    finally:
        trainer.phase = phase
    if not out:  # e.g. no held-out data (the validator said so once)
        return
    trainer.log(validation_line(record))
    gap = tau_gap_event(record, trainer.history)
    if gap:
        trainer._event("tau_gap", **gap)
        trainer.log(f"WARNING: tau gap at step {gap['step']}: simulated tau {gap['sim_tau']:.2f} (training) vs REAL "
                    f"tau {gap['real_tau']:.2f} on held-out prompts; the training metric overstates acceptance, "
                    "trust real_tau (docs/tau-gap.md)")
