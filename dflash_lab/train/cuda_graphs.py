"""Capture a step as a plain `torch.cuda.CUDAGraph` inside the thread that runs it, replay it, check its inputs.

`GraphedStep(fn)` is called like `fn(**inputs)`. The first call takes its inputs as the STATIC buffers (the caller
owns them and keeps passing the same objects), warms `fn` up (compiles and autotunes happen here, outside the
capture), captures one call and replays it. Later calls copy any input that is not the static object itself into the
static buffer and replay; the outputs are the static output tensors, valid until the next call.

Before every replay the inputs are checked against the captured ones (shape, dtype, device; a FlexAttention
BlockMask field by field, and the same mask_mod). A mismatch runs `fn` eagerly for that call and records why
(`.status()`), so a user sees "eager: features shape (2, 3072, 20480) != captured (1, 3072, 20480)" instead of a
silent slowdown or a wrong answer. A capture that fails (an op that syncs, a CPU tensor) leaves the step eager with
the reason.

Why plain CUDA graphs and not CUDAGraph Trees (torch.compile mode="reduce-overhead"): trees keep thread-local state
and assume the thread that captured is the one that replays and that outputs are consumed before the next call; our
engine runs one worker thread per GPU, so we capture with capture_error_mode="thread_local" (other workers may keep
launching on their own GPUs meanwhile) and serialise captures with one process-wide lock.
"""

from __future__ import annotations

import threading
import time

import torch

_CAPTURE_LOCK = threading.Lock()


def _is_block_mask(x) -> bool:
    return type(x).__name__ == "BlockMask" and hasattr(x, "kv_num_blocks")


def _mask_fields(mask) -> dict:
    return {k: v for k, v in vars(mask).items()}


def same_mask_mod(a, b) -> bool:
    """The same function, or the same code closing over the very same tensors (a compiled create_block_mask may
    hand back a rebuilt function object; what the captured kernels read is the closure's tensors)."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_a is not code_b:
        return False
    cells_a, cells_b = a.__closure__ or (), b.__closure__ or ()
    if len(cells_a) != len(cells_b):
        return False
    for x, y in zip(cells_a, cells_b):
        u, v = x.cell_contents, y.cell_contents
        if isinstance(u, torch.Tensor) or isinstance(v, torch.Tensor) or callable(u):
            if u is not v:
                return False
        elif u != v:
            return False
    return True


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')} on {x.device}"
    return type(x).__name__


def input_mismatch(name: str, new, static) -> str | None:
    """Why `new` cannot be replayed in place of the captured `static` (None if it can)."""
    if new is static:
        return None
    if isinstance(static, torch.Tensor):
        if not isinstance(new, torch.Tensor):
            return f"{name}: got {type(new).__name__}, captured a tensor"
        for what in ("shape", "dtype", "device"):
            if getattr(new, what) != getattr(static, what):
                return f"{name}: {what} {_describe(new)} != captured {_describe(static)}"
        return None
    if _is_block_mask(static):
        if not _is_block_mask(new):
            return f"{name}: got {type(new).__name__}, captured a BlockMask"
        a, b = _mask_fields(new), _mask_fields(static)
        for k, sv in b.items():
            nv = a.get(k)
            if isinstance(sv, torch.Tensor) or isinstance(nv, torch.Tensor):
                if not (isinstance(sv, torch.Tensor) and isinstance(nv, torch.Tensor)):
                    return f"{name}.{k}: present in one BlockMask and None in the other"
                if sv.shape != nv.shape or sv.dtype != nv.dtype or sv.device != nv.device:
                    return f"{name}.{k}: {_describe(nv)} != captured {_describe(sv)}"
            elif k == "mask_mod":
                if not same_mask_mod(nv, sv):
                    return f"{name}: a different mask_mod than the captured one (build masks from the static anchors)"
            elif nv != sv:
                return f"{name}.{k}: {nv!r} != captured {sv!r}"
        return None
    if new != static:
        return f"{name}: {new!r} != captured {static!r}"
    return None


def copy_into(static, new) -> None:
    """Copy `new` into the static buffer (a tensor or a BlockMask's tensors)."""
    if new is static:
        return
    if isinstance(static, torch.Tensor):
        static.copy_(new, non_blocking=True)
    elif _is_block_mask(static):
        src = _mask_fields(new)
        for k, v in _mask_fields(static).items():
            if isinstance(v, torch.Tensor):
                v.copy_(src[k], non_blocking=True)


class GraphedStep:
    """fn(**inputs) -> outputs, captured once in the calling thread and replayed (see the module docstring)."""

    def __init__(self, fn, *, name: str, enabled: bool = True, warmup: int = 2, log=None,
                 disabled_reason: str = "cuda_graphs=False"):
        self.fn, self.name, self.enabled, self.warmup, self.log = fn, name, enabled, warmup, log
        self.static: dict | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs = None
        self.mode = "pending"
        self.reason: str | None = None if enabled else disabled_reason
        self.replays = 0
        self.eager_calls = 0
        self.fallbacks: dict[str, int] = {}
        self.capture_seconds = 0.0  # warm-ups + capture, the first call's overhead
        self.warmup_seconds: list[float] = []  # the first one includes every compile of the step

    def __call__(self, **inputs):
        if self.static is None:
            return self._first_call(inputs)
        if self.graph is None:  # eager (off, or the capture failed): nothing to stage, nothing to check
            self.eager_calls += 1
            return self.fn(**inputs)
        problems = [p for k in self.static for p in [input_mismatch(k, inputs.get(k), self.static[k])] if p]
        problems += [f"{k}: not captured" for k in inputs if k not in self.static]
        if problems:
            self._note_fallback("; ".join(problems))
            self.eager_calls += 1
            return self.fn(**inputs)
        for k, v in inputs.items():
            copy_into(self.static[k], v)
        self.graph.replay()
        self.replays += 1
        return self.outputs

    def _first_call(self, inputs: dict):
        self.static = dict(inputs)
        if not self.enabled:
            self.mode = "eager"
            self.eager_calls += 1
            return self.fn(**self.static)
        t0 = time.perf_counter()
        with _CAPTURE_LOCK:
            stream = torch.cuda.current_stream()
            for _ in range(self.warmup):  # compile / autotune / cuBLAS workspaces: all before the capture
                t = time.perf_counter()
                self.fn(**self.static)
                stream.synchronize()
                self.warmup_seconds.append(round(time.perf_counter() - t, 3))
            torch.cuda.empty_cache()  # warm-up activations go back to the driver, the graph pool takes them
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    outputs = self.fn(**self.static)
            except Exception as e:  # noqa: BLE001 - the step still runs, eagerly, and says why
                self.mode, self.reason = "eager", f"capture failed: {type(e).__name__}: {str(e)[:300]}"
                self._say(f"{self.name}: {self.reason}; running eagerly")
                torch.cuda.synchronize()
                self.eager_calls += 1
                return self.fn(**self.static)
        self.graph, self.outputs, self.mode = graph, outputs, "graph"
        self.capture_seconds = time.perf_counter() - t0
        self.graph.replay()  # capture records but does not run: this is the first real step
        self.replays += 1
        return self.outputs

    def _note_fallback(self, why: str) -> None:
        first = why not in self.fallbacks
        self.fallbacks[why] = self.fallbacks.get(why, 0) + 1
        if first:
            self._say(f"{self.name}: replay inputs differ from the captured ones ({why}); running this call eagerly")

    def _say(self, msg: str) -> None:
        if self.log is not None:
            self.log(msg)

    def status(self) -> dict:
        """mode ("graph" | "eager" | "pending"), why it is eager, replays, eager calls and fallback reasons."""
        return {"mode": self.mode, "reason": self.reason, "replays": self.replays, "eager_calls": self.eager_calls,
                "fallbacks": dict(self.fallbacks), "capture_s": round(self.capture_seconds, 3),
                "warmup_s": list(self.warmup_seconds)}

    def describe(self) -> str:
        if self.mode == "graph":
            extra = f", {sum(self.fallbacks.values())} eager fallback(s)" if self.fallbacks else ""
            return f"graph ({self.replays} replays{extra})"
        return f"{self.mode}: {self.reason}" if self.reason else self.mode
