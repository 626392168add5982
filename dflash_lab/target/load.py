"""Load frozen target replicas onto their devices with progress, and run only the layers the drafter needs.

Targets are named by a string:
- "tiny": the embedded tiny target (CPU tests, demo);
- a local Hugging Face model directory, or a hub id (must be in the local HF cache when offline);
- a known real model name, e.g. "smollm2-135m-instruct" (`python -m dflash_lab.target.models get NAME` converts it once);
- "bench:<name>": a REAL architecture from `dflash_lab/bench_configs/<name>.json` (e.g. bench:qwen3-8b, the dense
  32B-class bench:qwen3-32b) with random weights made directly on the GPU: benchmarks need no download. These use
  the tiny tokenizer (their token ids are valid rows of the large vocabulary).

`load_targets` loads one replica per device, concurrently (one thread per device), tensor by tensor from the
safetensors files (or random init), and reports `LoadProgress` (tensors loaded / total, GB, seconds, device memory
after load) to a callback that logs and widgets consume. The model skeleton is built on the meta device, so no
memory is touched twice and a 32B bf16 target lands on a GPU at the speed of its reads.

Running a loaded target (only the layers the drafter needs) is features.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from . import models

BENCH_PREFIX = "bench:"
BENCH_CONFIG_DIR = Path(__file__).resolve().parents[1] / "bench_configs"
# A hub id is `org/name` (letters, digits, '-', '_', '.'); a bare name like "smollm2" is a typo far more often than
# one of the hub's few org-less legacy ids, which still work once they are in the local cache.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class TargetLoadError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------------------------
# Naming a target
# ---------------------------------------------------------------------------------------------------------------

def bench_config_names() -> list[str]:
    return sorted(p.stem for p in BENCH_CONFIG_DIR.glob("*.json"))


def bench_config_path(target: str) -> Path:
    name = target[len(BENCH_PREFIX):]
    p = BENCH_CONFIG_DIR / f"{name}.json"
    if not p.is_file():
        raise TargetLoadError(f"unknown benchmark target {target!r}. Known: "
                              f"{', '.join(BENCH_PREFIX + n for n in bench_config_names())}.")
    return p


def is_bench_target(target: str) -> bool:
    return isinstance(target, str) and target.startswith(BENCH_PREFIX)


def resolve_target_path(target: str) -> str:
    """"tiny" -> the embedded model dir; "bench:<name>" -> itself (checked); a known real model name
    (`dflash_lab.target.models.KNOWN_MODELS`, e.g. "smollm2-135m-instruct") -> its converted cache folder (error naming
    `python -m dflash_lab.target.models get NAME` if not converted); an existing dir -> itself; a path-like string that does
    not exist -> error; anything else must be a Hugging Face hub id that is cached or reachable (check_hub_id), else
    an error at once naming the known names."""
    if models.is_known(target):
        try:
            return str(models.resolve(target))
        except models.ModelNotReady as e:
            raise TargetLoadError(str(e)) from e
    if target == "tiny":
        from dflash_lab.tiny import ensure_tiny_target

        return str(ensure_tiny_target())
    if is_bench_target(target):
        bench_config_path(target)
        return target
    p = Path(target).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise TargetLoadError(
                f"target directory {p} has no config.json. Expected a Hugging Face model directory (config.json, "
                "model*.safetensors, tokenizer files), e.g. one written by save_pretrained().")
        return str(p)
    if target.startswith((".", "/", "~")) or target.count("/") > 1:
        raise TargetLoadError(
            f"target directory {p} does not exist. Expected a Hugging Face model directory (config.json, "
            "model*.safetensors, tokenizer files) or a hub id like 'Qwen/Qwen3-8B'.")
    check_hub_id(target)
    return target


def known_target_names() -> list[str]:
    return ["tiny", *sorted(models.KNOWN_MODELS)]


def unknown_target_message(target: str, why: str = "") -> str:
    """One line naming every kind of target there is, and the closest known name when one is close."""
    import difflib

    names = known_target_names()
    close = difflib.get_close_matches(target, names, n=1, cutoff=0.5) or [n for n in names if n.startswith(target)]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"unknown target {target!r}{hint}{': ' + why if why else ''}. Known names: {', '.join(names)}; or a "
            "local Hugging Face folder (config.json, *.safetensors, tokenizer files); or a hub id like "
            "'Qwen/Qwen3-8B' when online (or already in the Hugging Face cache).")


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - a malformed id is simply not cached
        return False


@functools.lru_cache(maxsize=4)
def _hub_reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    """One TCP connect to the hub's host (milliseconds, or at most `timeout_s`), instead of the ~55 s that
    transformers spends retrying a hub it cannot reach before it says so."""
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout_s).close()
        return True
    except OSError:
        return False


def check_hub_id(target: str) -> None:
    """A name that is neither known nor a folder must be a hub id we can get: in the local Hugging Face cache, or of
    the form org/name with the hub reachable. Anything else fails at once, naming what a target can be."""
    if _in_hub_cache(target):
        return
    if not _HUB_ID.fullmatch(target):
        raise TargetLoadError(unknown_target_message(target))
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise TargetLoadError(unknown_target_message(target, "not in the Hugging Face cache and HF_HUB_OFFLINE is set"))
    if not _hub_reachable(constants.ENDPOINT):
        raise TargetLoadError(unknown_target_message(
            target, f"not in the Hugging Face cache, and {constants.ENDPOINT} cannot be reached from this machine"))


def load_tokenizer(target: str):
    """The target's tokenizer; bench:* targets (random weights) use the tiny tokenizer and chat template."""
    path = resolve_target_path("tiny" if is_bench_target(target) else target)  # a bad name fails before the import
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise TargetLoadError(f"could not load a tokenizer for target {target!r} ({path}): {e}. "
                              "HINT: the directory must contain tokenizer.json / tokenizer_config.json.") from e


def load_target_config(target: str):
    """The target's Hugging Face config, without loading any weight (placement checks run on it)."""
    path = resolve_target_path(target)
    from transformers import AutoConfig

    if is_bench_target(target):
        fields = {k: v for k, v in json.loads(bench_config_path(target).read_text()).items()
                  if not k.startswith("_")}
        fields.pop("torch_dtype", None)
        cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
        cfg.name_or_path = target
        return cfg
    try:
        return AutoConfig.from_pretrained(path)
    except OSError as e:
        raise TargetLoadError(f"could not read the config of target {target!r} ({path}): {e}. HINT: pass a local "
                              "model directory or make sure the hub id is cached (HF_HUB_OFFLINE=1 needs a cache).") from e


# ---------------------------------------------------------------------------------------------------------------
# Loading with progress
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class LoadProgress:
    """One progress report of one replica's load (the callback gets many; `done` marks the last)."""

    replica: int
    device: str
    source: str
    tensors_done: int
    tensors_total: int
    gb_done: float
    gb_total: float
    seconds: float
    done: bool = False
    memory_gb: float | None = None  # device memory allocated after the load (GPU only)

    def line(self) -> str:
        pct = 100.0 * self.gb_done / max(self.gb_total, 1e-9)
        s = (f"target replica {self.replica} on {self.device}: {self.tensors_done}/{self.tensors_total} tensors, "
             f"{self.gb_done:.1f}/{self.gb_total:.1f} GB ({pct:.0f}%), {self.seconds:.1f} s")
        if self.done:
            rate = self.gb_total / max(self.seconds, 1e-9)
            s += f", done ({rate:.1f} GB/s)"
            if self.memory_gb is not None:
                s += f", {self.memory_gb:.1f} GB allocated on {self.device}"
        return s

    def as_dict(self) -> dict:
        return asdict(self)


ProgressFn = Callable[[LoadProgress], None]


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    return sorted(path.glob("*.safetensors"))


def _local_dir(target: str) -> Path:
    path = resolve_target_path(target)
    p = Path(path)
    if p.is_dir():
        return p
    try:  # a hub id: the cached snapshot (downloads when online and not cached)
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=path, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as e:  # noqa: BLE001 - re-raised with the fix
        raise TargetLoadError(f"could not find the weights of {target!r} locally or on the hub ({e}). HINT: "
                              "download them first (huggingface-cli download ...) or pass a local directory.") from e


def _skeleton(config, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def _param_slots(model: nn.Module) -> dict[str, list[tuple[nn.Module, str]]]:
    """name -> every (module, attribute) that holds the same tensor (tied weights share one entry)."""
    first_name: dict[int, str] = {}
    slots: dict[str, list[tuple[nn.Module, str]]] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, p in list(mod._parameters.items()):
            if p is None:
                continue
            full = f"{mod_name}.{attr}" if mod_name else attr
            key = first_name.setdefault(id(p), full)
            slots.setdefault(key, []).append((mod, attr))
            if key != full:
                slots.setdefault(full, slots[key])
    return slots


def _unique_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return list(model.named_parameters())  # duplicates (tied weights) removed


def _set_param(slots, name: str, tensor: torch.Tensor) -> None:
    p = nn.Parameter(tensor, requires_grad=False)
    for mod, attr in slots[name]:
        mod._parameters[attr] = p


def _fix_buffers(model: nn.Module, device: torch.device) -> None:
    """Buffers built on the meta device (RoPE inv_freq) are recomputed on `device` by rebuilding their module."""
    for mod_name, mod in list(model.named_modules()):
        if not any(b is not None and b.is_meta for b in mod._buffers.values()):
            continue
        cfg = getattr(mod, "config", None) or model.config
        parent_name, _, child = mod_name.rpartition(".")
        if not mod_name:
            raise TargetLoadError(f"{type(model).__name__} holds buffers of its own; cannot rebuild them on {device}.")
        try:
            with torch.device(device):
                new = type(mod)(config=cfg)
        except TypeError as e:
            raise TargetLoadError(f"cannot rebuild buffers of {mod_name} ({type(mod).__name__}) on {device}: {e}. "
                                  "Only Hugging Face decoder LMs whose buffers are RoPE tables are supported.") from e
        model.get_submodule(parent_name)._modules[child] = new
    left = [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise TargetLoadError(f"buffers {left[:3]} were not initialised on {device}.")


def load_target(target: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                progress: ProgressFn | None = None, replica: int = 0, seed: int = 0,
                progress_every_s: float = 0.5) -> nn.Module:
    """Load one frozen causal LM onto `device` in `dtype`, tensor by tensor, reporting progress."""
    device = torch.device(device)
    config = load_target_config(target)
    t0 = time.perf_counter()
    model = _skeleton(config, dtype)
    slots = _param_slots(model)
    params = _unique_params(model)
    total_bytes = sum(p.numel() for _, p in params) * torch.empty((), dtype=dtype).element_size()
    state = {"n": 0, "bytes": 0, "last": 0.0}
    source = f"random init ({bench_config_path(target).name})" if is_bench_target(target) else str(target)

    def report(done=False, force=False):
        now = time.perf_counter()
        if progress is None or not (force or done or now - state["last"] >= progress_every_s):
            return
        state["last"] = now
        mem = None
        if done and device.type == "cuda":
            mem = torch.cuda.memory_allocated(device) / 1e9
        progress(LoadProgress(replica=replica, device=str(device), source=source, tensors_done=state["n"],
                              tensors_total=len(params), gb_done=state["bytes"] / 1e9, gb_total=total_bytes / 1e9,
                              seconds=now - t0, done=done, memory_gb=mem))

    report(force=True)
    if is_bench_target(target):
        std = float(getattr(config.get_text_config(), "initializer_range", 0.02))
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in params:
                t = torch.empty(p.shape, dtype=dtype, device=device)
                if p.dim() == 1:  # RMSNorm scales
                    t.fill_(1.0)
                else:
                    t.normal_(0.0, std, generator=gen)
                _set_param(slots, name, t)
                state["n"] += 1
                state["bytes"] += t.numel() * t.element_size()
                report()
    else:
        from safetensors import safe_open

        files = _safetensors_files(_local_dir(target))
        if not files:
            raise TargetLoadError(f"target {target!r} has no *.safetensors weights. HINT: convert it with "
                                  "save_pretrained(..., safe_serialization=True).")
        wanted = {name for name, _ in params}
        loaded = set()
        for f in files:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for key in st.keys():
                    if key not in slots:
                        continue  # e.g. lm_head.weight of a checkpoint whose config ties it
                    t = st.get_tensor(key).to(device, non_blocking=False).to(dtype)
                    _set_param(slots, key, t)
                    canonical = next(n for n in wanted if slots[n] is slots[key]) if key not in wanted else key
                    if canonical not in loaded:
                        loaded.add(canonical)
                        state["n"] += 1
                        state["bytes"] += t.numel() * t.element_size()
                    report()
        missing = sorted(wanted - loaded)
        if missing:
            raise TargetLoadError(f"target {target!r}: {len(missing)} weights are missing from its safetensors files "
                                  f"(e.g. {missing[:3]}). HINT: the directory must hold the full model.")
    _fix_buffers(model, device)
    model.eval()
    model.requires_grad_(False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    report(done=True)
    return model


def read_head_weight(target: str) -> torch.Tensor:
    """The target's LM head (V, H), read from its safetensors files alone (no model is loaded): the export writes a
    pruned drafter's rows of it. A tied head is read under any name that shares it (the embedding)."""
    return _read_one_weight(target, "head")


def read_embedding_weight(target: str) -> torch.Tensor:
    """The target's input embedding (V, H), read like `read_head_weight`."""
    return _read_one_weight(target, "embedding")


def _read_one_weight(target: str, which: str) -> torch.Tensor:
    if is_bench_target(target):
        raise TargetLoadError(f"target {target!r} is a benchmark shape with random weights: it has no {which} to "
                              "read. Fix: pass a model directory or a known model name.")
    from safetensors import safe_open

    model = _skeleton(load_target_config(target), torch.float32)
    slots = _param_slots(model)
    weight = (model.get_output_embeddings() if which == "head" else model.get_input_embeddings()).weight
    names = {n for n, held in slots.items() if any(getattr(m, a) is weight for m, a in held)}
    for f in _safetensors_files(_local_dir(target)):
        with safe_open(str(f), framework="pt", device="cpu") as st:
            hit = sorted(names & set(st.keys()))
            if hit:
                return st.get_tensor(hit[0])
    raise TargetLoadError(f"target {target!r}: no {which} ({sorted(names)}) in its safetensors files. HINT: the "
                          "directory must hold the full model.")


def load_targets(target: str, devices, *, dtype: torch.dtype | Callable[[torch.device], torch.dtype],
                 progress: ProgressFn | None = None, seed: int = 0) -> list[nn.Module]:
    """One replica per device, loaded concurrently (one thread per distinct device). Entries naming the same CPU
    share one model (CPU workers read it concurrently; forward is read-only)."""
    devs = [torch.device(d) for d in devices]
    distinct = list(dict.fromkeys(devs))
    lock = threading.Lock()

    def safe_progress(p: LoadProgress):
        if progress is not None:
            with lock:
                progress(p)

    def one(i: int, dev: torch.device):
        dt = dtype(dev) if callable(dtype) else dtype
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        return load_target(target, device=dev, dtype=dt, progress=safe_progress, replica=i, seed=seed)

    models: dict[torch.device, nn.Module] = {}
    with cf.ThreadPoolExecutor(max_workers=len(distinct), thread_name_prefix="dflash-load") as pool:
        futures = {dev: pool.submit(one, i, dev) for i, dev in enumerate(distinct)}
        errors = []
        for dev, fut in futures.items():
            try:
                models[dev] = fut.result()
            except BaseException as e:  # noqa: BLE001 - collected and re-raised with the device
                errors.append((dev, e))
        if errors:
            dev, e = errors[0]
            raise TargetLoadError(f"loading target {target!r} on {dev} failed: {type(e).__name__}: {e}") from e
    return [models[d] for d in devs]
