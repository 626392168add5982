"""One preparation step for every way to start a run: `TrainConfig -> PreparedRun`, before any model loads.

    prepared = prepare_run(config)          # tokenizer, configs, data, sampler, placement, resume state
    prepared.dtype("cuda:0"), prepared.attention("cuda:0")   # decided once per device, here

The notebook Trainer (trainer.py), every torchrun rank (rank_trainer.py), bench.py and preflight.py start from it,
so every path honours the same settings by construction: the data format, the error policy, the thinking mode, the
feature cache, the devices. (Two copies of this set-up drifted once: torchrun ranks silently lost three data
settings and the feature cache.) What it does NOT do is load weights: the Trainer loads a target per placement
device, a torchrun rank only its own (or none on a drafter-only rank).

On resume the effective config is the checkpoint's, with the fields the user set explicitly on top (resume.py);
`PreparedRun.config` is that effective config, and `overrides` lists what the user changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from dflash_lab.runs import checkpoint, resume_checks
from dflash_lab.config import DrafterConfig, TrainConfig
from dflash_lab.config.feature_checks import check_distill_vocab
from dflash_lab.config.recipe_defaults import Resolved, TargetFacts, resolve_defaults
from dflash_lab.drafter.batches import BatchSampler
from dflash_lab.data.tokenize import TokenizedData, load_dataset
from dflash_lab.data.token_cache import load_dataset_cached
from dflash_lab.drafter.loss_weights import loss_weighting_of
from dflash_lab.data.draft_vocab import DraftVocab, build_draft_vocab, check_same_vocab
from dflash_lab.data.feature_cache import CachedFeatureExtractor
from .feature_store import GIB, check_holds_a_window, feature_width, row_bytes
from .placement import (DevicePlan, Placement, PlacementError, check_placement, device_plan, make_placement,
                        resolve_dtype)
from .resume import Override, resumed_config
from .schedule import LRSchedule
from dflash_lab.target.load import load_target_config, load_tokenizer
from dflash_lab.target.features import FeatureExtractor
from dflash_lab.data.packing import fill_report, pack_data

def plan_device(config: TrainConfig, device: str | torch.device) -> DevicePlan:
    """`config.dtype` / `config.attention` decided for `device` (placement.device_plan: the one place)."""
    return device_plan(device, dtype=config.dtype, attention=config.attention)


def make_feature_extractor(config: TrainConfig, drafter_config: DrafterConfig, target_model, plan: DevicePlan):
    """Online: run `target_model` up to the last needed layer. With `config.feature_cache`: read the cached features
    (only the target's embedding and LM head are used). The one place both training paths get features from."""
    if not config.feature_cache:
        return FeatureExtractor(target_model, drafter_config.target_layer_ids, fp8=config.target_fp8,
                                compile=config.compile_target, soft_top_k=distill_top_k(config),
                                soft_temperature=config.distill_temperature)
    return CachedFeatureExtractor(config.feature_cache, layer_ids=drafter_config.target_layer_ids, dtype=plan.dtype)


def check_distill_placement(cfg: TrainConfig, placement: Placement) -> None:
    """Distillation's targets come out of the target forward beside the features, which only a colocated placement
    hands to its drafter as they are (split placements copy features alone); refused before anything loads."""
    if cfg.distill_weight > 0 and not placement.colocated:
        raise ValueError(f"distill_weight={cfg.distill_weight} needs each drafter GPU to run its own target replica "
                         f"(a colocated placement), but this one is {placement.describe()}. Fix: give every drafter "
                         "device its target (target_devices=None), or set distill_weight=0.")


def distill_top_k(config: TrainConfig) -> int:
    """Top-k of the target's distribution each window needs (0 = no distillation: features only)."""
    return config.distill_top_k if config.distill_weight > 0 else 0


HOST_KEEP_FREE = 8 * GIB  # host memory a host-tier store leaves to the data, the tokenizer and the kernel


def host_room_bytes() -> int:
    """Host memory a feature store's host tier may take: what the machine has available, less HOST_KEEP_FREE."""
    import psutil

    return max(0, psutil.virtual_memory().available - HOST_KEEP_FREE)


def store_rows(*, windows: int, per_row: int, gib: float, host_gib: float, fitted: int | None = None,
               host_room: int | None = None, replicas: int = 1) -> tuple[int, int, bool]:
    """(windows a store keeps on the GPU, in host memory, whether the GPU's room cut the first): never more than the
    data's `windows`; `fitted` = what the GPU has room for (check_placement / preflight), `host_room` = host bytes
    the `replicas` on this machine share. The run and preflight both size a store with this."""
    rows = min(int(gib * GIB // per_row), windows)
    gpu_full = fitted is not None and fitted < rows
    rows = rows if fitted is None else min(rows, fitted)
    host = 0
    if host_gib and rows < windows:  # the windows the GPU has no room for, in host memory
        host = min(windows - rows, int(host_gib * GIB // per_row))
        if host_room is not None:
            host = min(host, host_room // (per_row * replicas))
    return rows, host, gpu_full


def store_note(*, windows: int, rows: int, host_rows: int, per_row: int, devices, batch: int, gpu_full: bool,
               fp8_row: int) -> str:
    """The line a run logs when its feature store holds fewer windows than the data has: how many, where, the share
    of batches it can serve (a batch is served only whole), and what would hold them all."""
    where = ", ".join(dict.fromkeys(devices))
    held = rows + host_rows
    share = (held / windows) ** batch  # every window of a batch of `batch` drawn at random must be held
    room = ", all the room the GPU has beside the run" if gpu_full else ""
    host = f" + {host_rows:,} in host memory ({host_rows * per_row / GIB:.1f} GiB)" if host_rows else ""
    fixes = [f"feature_store_host_gib={math.ceil((windows - rows) * per_row / GIB)} keeps the other "
             f"{windows - rows:,} in host memory (if the machine has it)"]
    if fp8_row:
        fixes.append(f'feature_store_dtype="float8" holds {min(windows, rows * per_row // fp8_row):,} in the same '
                     "GPU memory")
    if not gpu_full:
        fixes.insert(0, f"feature_store_gib={math.ceil(windows * per_row / GIB)} holds every window on the GPU")
    return (f"WARNING: feature store: {rows:,} windows on {where} ({rows * per_row / GIB:.1f} GiB{room}){host} of "
            f"the data's {windows:,}: a batch is served from the store only when it holds all {batch} of its "
            f"windows, about {share:.1%} of batches here; the target computes the others. Fix: "
            + "; or ".join(fixes) + ".")


@dataclass(frozen=True)
class PreparedRun:
    """Everything a run needs before it loads a model; identical for the notebook and torchrun paths."""

    config: TrainConfig  # the effective config (on resume: the checkpoint's plus the user's overrides)
    tokenizer: Any
    target_config: Any
    drafter_config: DrafterConfig
    data: TokenizedData
    sampler: BatchSampler
    placement: Placement
    plans: dict[str, DevicePlan]  # one per placement device
    memory_estimate: dict  # placement.check_placement's report ({} on CPU)
    schedule: LRSchedule
    resume: checkpoint.Checkpoint | None = None
    overrides: tuple[Override, ...] = field(default=())
    draft_vocab: DraftVocab | None = None  # None = the full target vocabulary
    settings: Resolved | None = None  # the values chosen for fields left unset, and why (recipe_defaults.py)
    # windows each target replica's feature store keeps on its GPU (the data's windows, or fewer where the GPU has
    # no room for more beside the run: check_placement fits it) and in host memory (feature_store_host_gib)
    feature_store_rows: int = 0
    feature_store_host_rows: int = 0

    def plan(self, device: str | torch.device) -> DevicePlan:
        key = str(torch.device(device))
        if key == "cuda":
            key = "cuda:0"
        plan = self.plans.get(key)
        return plan if plan is not None else plan_device(self.config, device)

    def dtype(self, device: str | torch.device) -> torch.dtype:
        return self.plan(device).dtype

    def attention(self, device: str | torch.device) -> str:
        return self.plan(device).attention

    def feature_extractor(self, target_model, device: str | torch.device):
        return make_feature_extractor(self.config, self.drafter_config, target_model, self.plan(device))

    def summary(self) -> dict:
        """A comparable description of the prepared inputs (tests compare two paths with it)."""
        cfg, b = self.config, self.sampler.batch(0)
        return {"config": cfg.to_dict(), "drafter_config": self.drafter_config.to_dict(),
                "data_report": dict(self.data.report), "num_samples": len(self.data),
                "input_ids": self.data.input_ids.tolist(), "loss_mask": self.data.loss_mask.tolist(),
                "batch0_anchors": b.anchors.tolist(), "placement": self.placement.describe(),
                "plans": {k: (str(v.dtype), v.attention) for k, v in self.plans.items()},
                "resume_step": self.resume.step if self.resume is not None else None,
                "schedule": self.schedule.to_dict(),
                "overrides": [tuple(o) for o in self.overrides]}


# Below this share of real tokens in unpacked windows, the run says what packing would give: on long-tailed chat
# data (a few long conversations set seq_len) most of every step's compute is padding.
FILL_HINT_BELOW = 0.5


def prepare_run(config: TrainConfig, *, explicit=None, placement: Placement | None = None, log=print,
                check_memory: bool = True) -> PreparedRun:
    """TrainConfig -> PreparedRun. Reads and checks a checkpoint first (a bad resume fails before anything loads),
    then tokenizer, target config, drafter config, placement + memory check, data, sampler.

    `explicit`: the config fields the user set (resume: only these override the checkpoint's config; None = the
    fields that differ from TrainConfig's defaults). `placement`: a torchrun rank passes its own device; by default
    `config.devices` / `config.target_devices`.
    """
    resume = None
    overrides: tuple[Override, ...] = ()
    if config.resume_from:
        resume = checkpoint.load_checkpoint(config.resume_from)
        config, overrides = resumed_config(resume, config, explicit=explicit, log=log)
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(config.target)
    target_config = load_target_config(config.target)
    check_distill_vocab(config, target_config.vocab_size)
    # Devices, batch split and free GPU memory are checked BEFORE anything loads (placement.py).
    placement = placement if placement is not None else make_placement(config.devices, config.target_devices)
    # Fields left unset are chosen for this target, data and machine, the same way on every path (recipe_defaults.py);
    # a resumed config is the checkpoint's, already whole.
    settings, facts = resolve_settings(config, tokenizer=tokenizer, target_config=target_config, placement=placement,
                                       log=log, check_memory=check_memory)
    cfg = settings.config
    drafter_config = drafter_config_of(cfg, target_config, tokenizer)
    check_distill_placement(cfg, placement)
    plans = {d: plan_device(cfg, d) for d in placement.devices}
    if cfg.feature_cache:  # a wrong cache (layers, path) fails now, not after the target loaded
        CachedFeatureExtractor(cfg.feature_cache, layer_ids=drafter_config.target_layer_ids)
    data = facts.data_for(cfg)
    if data.report.total_skipped and log is not None:  # never silent: counts here, file:line in data_report.json
        first = next(e for examples in data.report["examples"].values() for e in examples)
        log(f"data: kept {len(data)} of {data.report['records']} records, skipped {data.report['skipped']} (e.g. "
            f"{first}); the run folder's data_report.json names the file:line of the first "
            f"{data.report.MAX_EXAMPLES} of each reason")
    data.report["fill"] = fill = fill_report(data.lengths.tolist(), cfg.seq_len, cfg.seed)  # real tokens / window
    if not cfg.pack_sequences and fill["fill_unpacked"] < FILL_HINT_BELOW and log is not None:
        log(f"data: real tokens fill {fill['fill_unpacked']:.0%} of the {fill['rows']:,} windows of {cfg.seq_len} "
            "tokens; the target and the drafter compute the padding too. Packed (pack_sequences=True) they would fill "
            f"{fill['fill_packed']:.0%} of {fill['packed_windows']:,} windows; or set a shorter seq_len (longer "
            "samples are truncated)")
    if cfg.pack_sequences:  # several whole conversations per window (packing.py)
        data = pack_data(data, seq_len=cfg.seq_len, seed=cfg.seed, batch_size=cfg.batch_size)
        if log is not None:
            log(f"data: packed {fill['rows']} conversations into {fill['packed_windows']} windows of {cfg.seq_len} "
                f"tokens (fill {fill['fill_unpacked']:.1%} -> {fill['fill_packed']:.1%})")
    memory, rows, host_rows = {}, 0, 0
    if cfg.feature_store_gib:  # features kept for later epochs
        row = dict(seq_len=cfg.seq_len, width=feature_width(drafter_config),
                   dtype=plan_device(cfg, placement.target_devices[0]).dtype, soft_top_k=distill_top_k(cfg),
                   groups=drafter_config.num_target_features)
        per_row = row_bytes(**row, storage=cfg.feature_store_dtype)
        check_holds_a_window(cfg.feature_store_gib, per_row, cfg.seq_len, row["width"])
        # the windows asked for, before the GPU's room is known (store_rows: the one sizing rule)
        rows = store_rows(windows=len(data), per_row=per_row, gib=cfg.feature_store_gib, host_gib=0)[0]
    if check_memory:  # after the data (tokens only, no weights yet); the store is fitted to the GPU's room
        memory = check_placement(placement, target_config=target_config, drafter_config=drafter_config,
                                 seq_len=cfg.seq_len, num_anchors=cfg.num_anchors, batch_size=cfg.batch_size,
                                 chunk_size=cfg.loss_chunk_size, plan=lambda d: plan_device(cfg, d),
                                 feature_store_bytes=rows * per_row if rows else 0,
                                 store_row_bytes=per_row if rows else 0)
    if rows:
        fitted = [r["feature_store_rows"] for r in memory.values() if "feature_store_rows" in r]
        rows, host_rows, gpu_full = store_rows(
            windows=len(data), per_row=per_row, gib=cfg.feature_store_gib, host_gib=cfg.feature_store_host_gib,
            fitted=fitted[0] if fitted else None, host_room=host_room_bytes() if check_memory else None,
            replicas=len(dict.fromkeys(placement.target_devices)))  # each replica keeps its own
        if rows + host_rows < len(data) and log is not None:
            log(store_note(windows=len(data), rows=rows, host_rows=host_rows, per_row=per_row,
                           devices=placement.target_devices,
                           batch=max(1, cfg.batch_size // len(placement.drafter_devices)), gpu_full=gpu_full,
                           fp8_row=row_bytes(**row, storage="float8") if cfg.feature_store_dtype == "auto" else 0))
    draft_vocab = None
    if cfg.draft_vocab_size is not None:  # top-d supervised ids of the TRAINING data; coverage reported
        draft_vocab = build_draft_vocab(data.input_ids, data.loss_mask, size=cfg.draft_vocab_size,
                                        vocab_size=drafter_config.vocab_size, log=log)
        data.report["draft_vocab"] = draft_vocab.report()
        if log is not None:
            log(f"draft vocab: {draft_vocab.size} of {draft_vocab.vocab_size} ids cover "
                f"{draft_vocab.coverage:.2%} of {draft_vocab.supervised_tokens} supervised tokens")
    sampler = BatchSampler(data, batch_size=cfg.batch_size, num_anchors=cfg.num_anchors, block_size=cfg.block_size,
                           mask_token_id=drafter_config.mask_token_id, gamma=cfg.resolved_gamma, seed=cfg.seed,
                           weighting=loss_weighting_of(cfg))
    if resume is not None:
        resume_checks.check_resume(resume, data=data, sampler=sampler, drafter_config=drafter_config.to_dict(),
                                    log=log)
        check_same_vocab(resume.drafter.get("d2t"), draft_vocab, resume.path)
    return PreparedRun(config=cfg, tokenizer=tokenizer, target_config=target_config, drafter_config=drafter_config,
                       data=data, sampler=sampler, placement=placement, plans=plans, memory_estimate=memory,
                       feature_store_rows=rows, feature_store_host_rows=host_rows,
                       schedule=LRSchedule.of(cfg), resume=resume, overrides=overrides, draft_vocab=draft_vocab,
                       settings=settings)


def resolve_settings(config: TrainConfig, *, tokenizer=None, target_config=None, placement: Placement | None = None,
                     log=print, check_memory: bool = True, **machine) -> tuple[Resolved, "RunFacts"]:
    """The values chosen for `config`'s unset fields on this target, data and machine (recipe_defaults.py), logged as
    the run's first settings line, and the facts measured for them (the data, tokenized once). Every way to start a
    run comes through here: prepare_run (Trainer, torchrun ranks, preflight), launch.prepare_run and the CLI, which
    write the chosen values into config.json so every rank reads the same. `machine`: RunFacts' stand-ins for
    this machine's memory (mem_get_info, host_room)."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.target)
    target_config = target_config if target_config is not None else load_target_config(config.target)
    placement = placement if placement is not None else make_placement(config.devices, config.target_devices)
    facts = RunFacts(config, tokenizer, target_config, placement, log=log, check_memory=check_memory, **machine)
    settings = resolve_defaults(config, target=TargetFacts.of(config.target, target_config), facts=facts)
    if settings.choices and log is not None:
        log(settings.line())
    return settings, facts


def drafter_config_of(cfg: TrainConfig, target_config, tokenizer) -> DrafterConfig:
    """The drafter's shape for a resolved `cfg` on this target (MASK id: the config's, else the tokenizer's)."""
    mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else getattr(tokenizer, "mask_token_id", None)
    return DrafterConfig.from_target(
        target_config, num_draft_layers=cfg.num_draft_layers, num_target_features=cfg.num_target_features,
        target_layer_ids=cfg.target_layer_ids, block_size=cfg.block_size, mask_token_id=mask_id,
        layer_types=cfg.layer_types, sliding_window=cfg.sliding_window, layer_windows=cfg.layer_windows,
        draft_vocab_size=cfg.draft_vocab_size, drafter_variant=cfg.drafter_variant, markov_rank=cfg.markov_rank,
        enable_confidence_head=cfg.enable_confidence_head, confidence_head_with_markov=cfg.confidence_head_with_markov)


class RunFacts:
    """What recipe_defaults.resolve_defaults asks about the data and the machine, measured here: the data is
    tokenized once (at the longest window a resolved run may use, then cut to the one chosen), the memory model
    says which batch fits, the store's row size gives the GiB every window needs."""

    def __init__(self, config: TrainConfig, tokenizer, target_config, placement: Placement, *, log=print,
                 check_memory: bool = True, mem_get_info=None, host_room: int | None = None):
        """`mem_get_info(device) -> (free, total)` and `host_room` (bytes) stand for this machine's GPUs and host
        memory (check_placement, host_room_bytes) where a plan is made for another machine, and in tests."""
        self.config, self.tokenizer, self.target_config, self.placement = config, tokenizer, target_config, placement
        self.log, self.check_memory = log, check_memory
        self.mem_get_info, self.host_room = mem_get_info, host_room
        self.cuda = placement.is_cuda
        self._data: tuple[int, int, TokenizedData] | None = None  # (seq_len, block_size, data) tokenized
        self._given: TokenizedData | None = None

    def given(self, data: TokenizedData) -> "RunFacts":
        """Facts about `data` as tokenized already (preflight of a plan): it stands for the data at every window."""
        self._given = data
        return self

    def _load(self, cfg: TrainConfig, seq_len: int) -> TokenizedData:
        if self._given is not None:
            return self._given
        if self._data is None or self._data[:2] != (seq_len, cfg.block_size):
            read = load_dataset_cached if cfg.token_cache else load_dataset
            data = read(self.tokenizer, cfg.data, seq_len=seq_len, block_size=cfg.block_size,
                        enable_thinking=cfg.enable_thinking, data_format=cfg.data_format, on_error=cfg.data_errors,
                        log=self.log)
            self._data = (seq_len, cfg.block_size, data)
        return self._data[2]

    def longest_sample(self, cfg: TrainConfig, cap: int) -> int:
        return int(self._load(cfg, cap).lengths.max())

    def windows(self, cfg: TrainConfig) -> int:
        data = self.data_for(cfg)
        if cfg.pack_sequences:
            return fill_report(data.lengths.tolist(), cfg.seq_len, cfg.seed)["packed_windows"]
        return len(data)

    def data_for(self, cfg: TrainConfig) -> TokenizedData:
        """The data at cfg.seq_len: the tokenized copy cut to it when it was read at a longer window that no
        sample filled beyond it (the same rows, truncations and skips), else read now."""
        if self._data is not None and self._data[1] == cfg.block_size and self._data[0] > cfg.seq_len:
            data = self._data[2]
            if int(data.lengths.max()) <= cfg.seq_len:
                return cut_to(data, cfg.seq_len)
        return self._load(cfg, cfg.seq_len)

    def batch_fits(self, cfg: TrainConfig) -> bool:
        if not self.check_memory:
            return True
        try:
            check_placement(self.placement, target_config=self.target_config,
                            drafter_config=drafter_config_of(cfg, self.target_config, self.tokenizer),
                            seq_len=cfg.seq_len, num_anchors=cfg.num_anchors, batch_size=cfg.batch_size,
                            chunk_size=cfg.loss_chunk_size, plan=lambda d: plan_device(cfg, d),
                            mem_get_info=self.mem_get_info)
        except PlacementError:
            return False
        return True

    def _row_bytes(self, cfg: TrainConfig, dc: DrafterConfig) -> int:
        return row_bytes(seq_len=cfg.seq_len, width=feature_width(dc), soft_top_k=distill_top_k(cfg),
                         dtype=plan_device(cfg, self.placement.target_devices[0]).dtype,
                         groups=dc.num_target_features, storage=cfg.feature_store_dtype)

    def store_gib(self, cfg: TrainConfig) -> float:
        dc = drafter_config_of(cfg, self.target_config, self.tokenizer)
        return self.windows(cfg) * self._row_bytes(cfg, dc) / GIB

    def store_room_gib(self, cfg: TrainConfig) -> tuple[float, float] | None:
        if not (self.check_memory and self.placement.is_cuda):
            return None
        dc = drafter_config_of(cfg, self.target_config, self.tokenizer)
        per_row, windows = self._row_bytes(cfg, dc), self.windows(cfg)
        report = check_placement(self.placement, target_config=self.target_config, drafter_config=dc,
                                 seq_len=cfg.seq_len, num_anchors=cfg.num_anchors, batch_size=cfg.batch_size,
                                 chunk_size=cfg.loss_chunk_size, plan=lambda d: plan_device(cfg, d),
                                 feature_store_bytes=windows * per_row, store_row_bytes=per_row,
                                 mem_get_info=self.mem_get_info)
        fitted = [r["feature_store_rows"] for r in report.values() if "feature_store_rows" in r]
        replicas = len(dict.fromkeys(self.placement.target_devices))  # each keeps its own host tier
        host = self.host_room if self.host_room is not None else host_room_bytes()
        return (fitted[0] if fitted else 0) * per_row / GIB, host / replicas / GIB


def cut_to(data: TokenizedData, seq_len: int) -> TokenizedData:
    """`data` (no row longer than `seq_len`) in windows of `seq_len`: the padding beyond it dropped."""
    report = type(data.report)(data.report)
    report.update(seq_len=seq_len, padded_tokens=len(data) * seq_len)
    return TokenizedData(data.input_ids[:, :seq_len].contiguous(), data.loss_mask[:, :seq_len].contiguous(),
                         data.lengths, report, data.sample_ids,
                         None if data.doc_ids is None else data.doc_ids[:, :seq_len].contiguous())
