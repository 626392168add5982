"""Validation of TrainConfig's perf knobs: per-layer attention windows, torch.compile modes, FP8."""

from __future__ import annotations

from .errors import fail
from .windows import check_layer_windows

COMPILE_MODES = (None, "default", "max-autotune-no-cudagraphs")
CUDAGRAPH_TREE_MODES = ("reduce-overhead", "max-autotune")


def check_perf_fields(cfg) -> None:
    """The perf knobs of a TrainConfig: per-layer windows, torch.compile, FP8 (raises ConfigError naming the fix)."""
    c = "TrainConfig"
    if cfg.layer_windows and (cfg.layer_types or cfg.num_draft_layers is not None):
        types = cfg.layer_types or ("full_attention",) * cfg.num_draft_layers
        object.__setattr__(cfg, "layer_windows", check_layer_windows(c, types, cfg.sliding_window,
                                                                     cfg.layer_windows))
    if cfg.compile_drafter not in (True, False, "auto", None):
        fail(c, "compile_drafter", cfg.compile_drafter, "must be True, False or \"auto\"",
             'use False (eager + CUDA graphs), True (compile everywhere) or "auto" (compile on CUDA workers only)')
    if cfg.compile_mode in CUDAGRAPH_TREE_MODES:
        fail(c, "compile_mode", cfg.compile_mode,
             "it turns on CUDAGraph Trees, whose thread-local state breaks in the engine's worker threads (one "
             "thread per GPU captures and replays; trees assume one thread) and would capture on top of the "
             "engine's own CUDA-graph capture",
             'leave compile_mode=None (or "max-autotune-no-cudagraphs") with cuda_graphs=True: the engine '
             "captures the compiled step as a plain CUDA graph itself")
    if cfg.compile_mode not in COMPILE_MODES:
        fail(c, "compile_mode", cfg.compile_mode, "unknown torch.compile mode", f"use one of {COMPILE_MODES}")
    if cfg.compile_mode is not None and cfg.compile_drafter is False:
        fail(c, "compile_mode", cfg.compile_mode, "it has no effect without compile_drafter=True",
             "set compile_drafter=True or leave compile_mode=None")
    for name in ("target_fp8", "drafter_fp8", "drafter_fp8_weight_grad", "compile_target"):
        if not isinstance(getattr(cfg, name), bool):
            fail(c, name, getattr(cfg, name), "must be True or False", f"set {name}=False (bf16) or True")
    if cfg.drafter_fp8_weight_grad and not cfg.drafter_fp8:
        fail(c, "drafter_fp8_weight_grad", True, "it only applies to an FP8 drafter",
             "set drafter_fp8=True as well, or leave drafter_fp8_weight_grad=False")
    if cfg.compile_target and cfg.feature_cache:
        fail(c, "compile_target", True, "with a feature_cache no target layer runs",
             "set compile_target=False")
    if cfg.target_fp8 and cfg.feature_cache:
        fail(c, "target_fp8", True, "with a feature_cache no target layer runs (features are read from disk)",
             "set target_fp8=False, or build the cache from an FP8 target instead")
    store = cfg.feature_store_gib  # None: chosen for the run (recipe_defaults.py)
    if store is not None and (isinstance(store, bool) or not isinstance(store, (int, float)) or not store >= 0):
        fail(c, "feature_store_gib", store, "must be a number of GiB >= 0",
             "use 0 (recompute the features every step) or e.g. 40 on an H200")
    if cfg.feature_store_dtype not in ("auto", "float8"):
        fail(c, "feature_store_dtype", cfg.feature_store_dtype, "unknown storage",
             'use "auto" (the features\' own dtype) or "float8" (half the memory)')
    if cfg.feature_store_dtype != "auto" and store is not None and not store:
        fail(c, "feature_store_dtype", cfg.feature_store_dtype, "applies only to a feature store",
             "set feature_store_gib > 0 as well, or leave feature_store_dtype=\"auto\"")
    host = cfg.feature_store_host_gib
    if host is not None and (isinstance(host, bool) or not isinstance(host, (int, float)) or not host >= 0):
        fail(c, "feature_store_host_gib", host, "must be a number of GiB >= 0",
             "use 0 (the store lives on the GPU only) or e.g. 48 (host memory for windows the GPU has no room for)")
    if host and store is not None and not store:
        fail(c, "feature_store_host_gib", host, "holds the windows a GPU store has no room for",
             "set feature_store_gib > 0 as well (the GPU part), or feature_store_host_gib=0")
    if store and cfg.feature_cache:
        fail(c, "feature_store_gib", store, "with a feature_cache the features are read from disk, not computed",
             "set feature_store_gib=0, or feature_cache=None to keep online features in device memory")
