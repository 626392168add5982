"""NVML sampler thread: per-GPU memory, kernel-busy %, power and temperature at ~2 Hz into a ring buffer + system.jsonl.

    mon = GpuMonitor(interval_s=0.5, jsonl_path=run_dir / "system.jsonl").start()
    mon.latest()   # {"time":..., "host": {...}, "gpus": [{"label": "cuda:0 (gpu 3)", "mem_used_gb": ...}, ...]}
    mon.stop()

Costs (one H200, docs/notebook-practice.md): utilization/power/temperature ~1 us, memory info ~5 us, torch's
allocator stats ~60 us per GPU; a sampler at 1-100 Hz did not measurably slow training. NVML refreshes utilization
only every ~200 ms, so sampling faster than ~5 Hz adds nothing. PCIe throughput costs ~21 ms and blocks, so it is
off by default and, when on, sampled at most every `pcie_interval_s`.

Which numbers these are:
- `mem_used_gb` / `mem_total_gb`: NVML memory info v2 ("used" by all processes on the GPU, driver-reserved memory
  reported apart in `mem_reserved_gb`); `mem_view` says "nvml_v2", or "nvml_v1" (used includes the driver reserve)
  on drivers without v2.
- `torch_reserved_gb` / `torch_allocated_gb`: this process's caching allocator (reserved >= allocated), only once
  CUDA is initialised here (the monitor never initialises CUDA itself).
- `kernel_busy_pct`: NVML "utilization.gpu" = share of time at least one kernel ran. A single spinning kernel reads
  100%; it is a liveness signal, not a speed. Speed is tokens/s and MFU.
NVML indices are physical and ignore CUDA_VISIBLE_DEVICES; CUDA ordinals follow it. GPUs are matched by UUID and
labelled "cuda:0 (gpu 3)" (CUDA ordinal, then NVML index). Without an NVIDIA GPU (or NVML), the monitor samples only
host CPU and RAM and says "no NVIDIA GPU" in `.status`; it never raises for that.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .metrics import JsonlSink, RingBuffer

GB = 2**30
NO_GPU = "no NVIDIA GPU"


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU as both CUDA (our process) and NVML (physical) see it."""

    cuda_index: int | None  # ordinal under CUDA_VISIBLE_DEVICES; None = not visible to this process
    nvml_index: int
    uuid: str
    name: str

    @property
    def label(self) -> str:
        if self.cuda_index is None:
            return f"gpu {self.nvml_index} (not visible)"
        return f"cuda:{self.cuda_index} (gpu {self.nvml_index})"


def _norm_uuid(u: str) -> str:
    u = str(u).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            u = u[len(prefix):]
    return u


def parse_visible_devices(value: str | None, nvml_uuids: list[str]) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES -> NVML indices in CUDA ordinal order; None = unset (all GPUs, ordinal i = index i).

    Entries are indices ("3,1") or UUIDs / unique UUID prefixes ("GPU-8f2a..."); CUDA stops at the first invalid
    entry, and so does this. Assumes CUDA_DEVICE_ORDER=PCI_BUS_ID when indices are used; when torch is available
    the monitor maps by UUID instead (`map_cuda_to_nvml`), which needs no such assumption.
    """
    if value is None:
        return None
    out: list[int] = []
    norm = [_norm_uuid(u) for u in nvml_uuids]
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            break
        if entry.lstrip("-").isdigit():
            i = int(entry)
            if not 0 <= i < len(nvml_uuids) or i in out:
                break
            out.append(i)
            continue
        want = _norm_uuid(entry)
        hits = [j for j, u in enumerate(norm) if u.startswith(want)]
        if len(hits) != 1 or hits[0] in out:
            break
        out.append(hits[0])
    return out


def map_cuda_to_nvml(cuda_uuids: list[str], nvml_uuids: list[str], nvml_names: list[str]) -> list[GpuIdentity]:
    """Match CUDA ordinals to NVML devices by UUID; NVML devices this process cannot see come last, unlabelled."""
    norm = {_norm_uuid(u): j for j, u in enumerate(nvml_uuids)}
    seen, out = set(), []
    for ci, cu in enumerate(cuda_uuids):
        j = norm.get(_norm_uuid(cu))
        if j is None:
            continue
        seen.add(j)
        out.append(GpuIdentity(ci, j, nvml_uuids[j], nvml_names[j]))
    out += [GpuIdentity(None, j, u, nvml_names[j]) for j, u in enumerate(nvml_uuids) if j not in seen]
    return out


def _torch_cuda():
    """torch.cuda if torch is already imported and CUDA is initialised here (never initialise it from the monitor)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda if torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a broken CUDA install must not break the monitor
        return None


class GpuMonitor:
    """Daemon sampler thread; `.start()`, `.stop()`, `.ring` (RingBuffer of samples), `.latest()`, `.status`."""

    def __init__(self, interval_s: float = 0.5, jsonl_path: str | Path | None = None, pcie: bool = False, *,
                 pcie_interval_s: float = 10.0, jsonl_interval_s: float = 2.0, capacity: int = 3600,
                 only_visible: bool = True):
        if not interval_s > 0:
            raise ValueError(f"GpuMonitor(interval_s={interval_s!r}): must be > 0 seconds; 0.5 (2 Hz) is the "
                             "default and NVML refreshes utilization only every ~0.2 s.")
        self.interval_s = float(interval_s)
        self.pcie, self.pcie_interval_s = pcie, float(pcie_interval_s)
        # Every sample goes to the ring; system.jsonl gets one line per `jsonl_interval_s` (a 2 Hz x 8-GPU stream is
        # ~100 MB a day; 0 writes every sample).
        self.jsonl_path = Path(jsonl_path) if jsonl_path else None
        self.jsonl_interval_s = float(jsonl_interval_s)
        self.only_visible = only_visible
        self.ring = RingBuffer(capacity)
        self.gpus: list[GpuIdentity] = []
        self.has_gpu = False
        self.status = "not started"
        self.last_error: str | None = None
        self.sample_seconds: list[float] = []  # cost of recent samples (the overhead benchmark reads it)
        self._nvml = None
        self._handles: list = []
        self._mem_v2 = True
        self._pcie_last: dict[int, tuple[float, float]] = {}
        self._pcie_time = 0.0
        self._jsonl_time = 0.0
        self._sink: JsonlSink | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = None

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> "GpuMonitor":
        if self._thread is not None and self._thread.is_alive():
            return self
        self._discover()
        if self.jsonl_path:
            self._sink = JsonlSink(self.jsonl_path)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dflash-gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 4 * self.interval_s))
        self._thread = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        self._shutdown_nvml()
        if self.has_gpu:
            self.status = f"stopped ({len(self.gpus)} GPU(s))"
        elif not self.status.startswith(NO_GPU):
            self.status = "stopped"

    def log_to(self, jsonl_path: str | Path) -> None:
        """Start (or move) the system.jsonl stream, e.g. once the run directory exists."""
        old, self.jsonl_path = self._sink, Path(jsonl_path)
        self._sink = JsonlSink(self.jsonl_path) if self.running else None
        if old is not None:
            old.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "GpuMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def latest(self) -> dict | None:
        return self.ring.last()

    # -- discovery ----------------------------------------------------------------------------------------------
    def _discover(self) -> None:
        try:
            import psutil

            self._proc = psutil.Process()
            psutil.cpu_percent(interval=None)  # prime: the first call has no interval to average over
        except Exception as e:  # noqa: BLE001
            self._proc = None
            self.last_error = f"psutil unavailable: {e}"
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVML missing = CPU machine; report, never raise
            self._set_no_gpu(f"NVML not available: {type(e).__name__}: {e}")
            return
        self._nvml = pynvml
        try:
            n = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            uuids = [_as_str(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
            names = [_as_str(pynvml.nvmlDeviceGetName(h)) for h in handles]
        except Exception as e:  # noqa: BLE001
            self._set_no_gpu(f"NVML found no usable device: {type(e).__name__}: {e}")
            return
        if not handles:
            self._set_no_gpu("NVML reports 0 devices")
            return
        gpus = self._map(uuids, names)
        if self.only_visible:
            gpus = [g for g in gpus if g.cuda_index is not None]
        if not gpus:
            self._set_no_gpu(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} hides all "
                             f"{len(handles)} GPU(s)")
            return
        self.gpus = gpus
        self._handles = [handles[g.nvml_index] for g in gpus]
        self.has_gpu = True
        self.status = f"sampling {len(gpus)} GPU(s) at {1 / self.interval_s:.1f} Hz: " + ", ".join(
            g.label for g in gpus)

    def _map(self, uuids: list[str], names: list[str]) -> list[GpuIdentity]:
        tc = _torch_cuda()
        if tc is not None:
            try:
                cuda_uuids = [str(tc.get_device_properties(i).uuid) for i in range(tc.device_count())]
                return map_cuda_to_nvml(cuda_uuids, uuids, names)
            except Exception:  # noqa: BLE001 - fall back to CUDA_VISIBLE_DEVICES
                pass
        order = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)
        if order is None:
            order = list(range(len(uuids)))
        return map_cuda_to_nvml([uuids[j] for j in order], uuids, names)

    def _set_no_gpu(self, why: str) -> None:
        self.has_gpu = False
        self.gpus = []
        self.status = f"{NO_GPU}: host CPU and RAM only ({why})"
        self._shutdown_nvml()

    def _shutdown_nvml(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down; nothing to report
                pass
        self._nvml, self._handles = None, []

    # -- sampling -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                rec = self.sample()
                self.ring.append(rec)
                if self._sink is not None and rec["time"] - self._jsonl_time >= self.jsonl_interval_s:
                    self._jsonl_time = rec["time"]
                    self._sink.log(rec)
            except Exception as e:  # noqa: BLE001 - keep sampling; say what failed
                self.last_error = f"{type(e).__name__}: {e}"
            cost = time.perf_counter() - t0
            self.sample_seconds.append(cost)
            if len(self.sample_seconds) > 1000:
                del self.sample_seconds[:500]
            self._stop.wait(max(0.0, self.interval_s - cost))

    def sample(self) -> dict:
        """One sample now (the thread calls this; callable directly for a one-off reading)."""
        now = time.time()
        rec: dict = {"time": round(now, 3), "host": self._host(), "gpus": []}
        if not self.has_gpu:
            rec["no_gpu"] = True
            return rec
        do_pcie = self.pcie and now - self._pcie_time >= self.pcie_interval_s
        if do_pcie:
            self._pcie_time = now
        tc = _torch_cuda()
        for g, h in zip(self.gpus, self._handles):
            rec["gpus"].append(self._gpu(g, h, tc, do_pcie))
        return rec

    def _host(self) -> dict:
        try:
            import psutil

            vm = psutil.virtual_memory()
            out = {"cpu_pct": psutil.cpu_percent(interval=None),
                   "ram_used_gb": round((vm.total - vm.available) / GB, 2), "ram_total_gb": round(vm.total / GB, 2)}
            if self._proc is not None:
                out["proc_rss_gb"] = round(self._proc.memory_info().rss / GB, 3)
            return out
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"}

    def _gpu(self, g: GpuIdentity, h, tc, do_pcie: bool) -> dict:
        nv = self._nvml
        d: dict = {"label": g.label, "cuda": g.cuda_index, "nvml": g.nvml_index, "name": g.name}
        try:
            if self._mem_v2:
                try:
                    m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                    d.update(mem_used_gb=round(m.used / GB, 3), mem_reserved_gb=round(m.reserved / GB, 3),
                             mem_total_gb=round(m.total / GB, 3), mem_view="nvml_v2")
                except Exception:  # noqa: BLE001 - old driver: v1 (used includes the driver reserve)
                    self._mem_v2 = False
            if not self._mem_v2:
                m = nv.nvmlDeviceGetMemoryInfo(h)
                d.update(mem_used_gb=round(m.used / GB, 3), mem_total_gb=round(m.total / GB, 3), mem_view="nvml_v1")
            d["kernel_busy_pct"] = nv.nvmlDeviceGetUtilizationRates(h).gpu
            d["power_w"] = round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)
            d["temp_c"] = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        except Exception as e:  # noqa: BLE001 - a lost GPU shows as an error on its row
            d["error"] = f"{type(e).__name__}: {e}"
        if do_pcie:
            try:
                tx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)  # KB/s, ~21 ms, blocking
                rx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)
                self._pcie_last[g.nvml_index] = (tx / 1e6, rx / 1e6)
            except Exception as e:  # noqa: BLE001
                d["pcie_error"] = f"{type(e).__name__}: {e}"
        if g.nvml_index in self._pcie_last:
            d["pcie_tx_gbps"], d["pcie_rx_gbps"] = (round(x, 3) for x in self._pcie_last[g.nvml_index])
        if tc is not None and g.cuda_index is not None:
            try:  # this process's caching allocator (~60 us): what PyTorch holds vs what tensors use
                stats = tc.memory_stats(g.cuda_index)
                d["torch_reserved_gb"] = round(stats.get("reserved_bytes.all.current", 0) / GB, 3)
                d["torch_allocated_gb"] = round(stats.get("allocated_bytes.all.current", 0) / GB, 3)
            except Exception:  # noqa: BLE001
                pass
        return d


def _as_str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
