"""GpuMonitor: no-GPU state, sampling rate into the ring buffer, system.jsonl lines, UUID <-> CUDA ordinal mapping."""

import json
import time

import pytest

from dflash_lab.runs.gpu_monitor import NO_GPU, GpuMonitor, _norm_uuid, map_cuda_to_nvml, parse_visible_devices


def _nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:  # noqa: BLE001
        return False


HAS_NVML = _nvml_available()

NVML_UUIDS = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000", "GPU-dddd4444-0000"]
NAMES = ["H200"] * 4


def test_visible_devices_by_index_uuid_and_invalid_entries():
    assert parse_visible_devices(None, NVML_UUIDS) is None
    assert parse_visible_devices("3,1", NVML_UUIDS) == [3, 1]
    assert parse_visible_devices("GPU-cccc3333-0000,0", NVML_UUIDS) == [2, 0]
    assert parse_visible_devices("GPU-bbbb", NVML_UUIDS) == [1]  # unique prefix, as CUDA accepts
    assert parse_visible_devices("2,7,0", NVML_UUIDS) == [2]  # CUDA stops at the first invalid entry
    assert parse_visible_devices("", NVML_UUIDS) == []
    assert parse_visible_devices("-1", NVML_UUIDS) == []


def test_map_by_uuid_labels_cuda_ordinal_and_physical_index():
    # torch reports UUIDs without the "GPU-" prefix and in CUDA's order: ordinal 0 is physical GPU 3.
    gpus = map_cuda_to_nvml(["dddd4444-0000", "bbbb2222-0000"], NVML_UUIDS, NAMES)
    assert [g.label for g in gpus[:2]] == ["cuda:0 (gpu 3)", "cuda:1 (gpu 1)"]
    assert [(g.cuda_index, g.nvml_index) for g in gpus] == [(0, 3), (1, 1), (None, 0), (None, 2)]
    assert gpus[2].label == "gpu 0 (not visible)"


def test_bad_interval_is_rejected_with_the_value():
    with pytest.raises(ValueError, match="interval_s=0"):
        GpuMonitor(interval_s=0)


def _until(cond, what: str, timeout_s: float = 120.0) -> None:
    """Wait for what a sampler thread makes (a bound on a hang only: a loaded machine runs it late, not wrong)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.skipif(HAS_NVML, reason="this machine has an NVIDIA GPU; the no-GPU state is tested on CPU machines")
def test_no_gpu_state_samples_host_only_into_ring_and_jsonl(tmp_path):
    path = tmp_path / "system.jsonl"
    mon = GpuMonitor(interval_s=0.05, jsonl_path=path, jsonl_interval_s=0)
    assert mon.status == "not started"
    t0 = time.monotonic()
    mon.start()
    assert mon.status.startswith(NO_GPU) and "host CPU and RAM only" in mon.status
    assert mon.has_gpu is False and mon.gpus == []
    _until(lambda: len(mon.ring) >= 4, "4 samples")
    mon.stop()
    elapsed = time.monotonic() - t0
    assert not mon.running
    samples = mon.ring.snapshot()
    # 20 Hz at most: the sampler never runs ahead of its interval (a busy machine only makes it late)
    assert 4 <= len(samples) <= elapsed / 0.05 + 2, (len(samples), elapsed)
    times = [s["time"] for s in samples]
    assert times == sorted(times)
    last = mon.latest()
    assert last is samples[-1]
    assert last["no_gpu"] is True and last["gpus"] == []
    host = last["host"]
    assert 0 < host["ram_used_gb"] <= host["ram_total_gb"]
    assert 0 <= host["cpu_pct"] <= 100
    assert host["proc_rss_gb"] > 0.005  # this python process holds more than 5 MB
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == len(samples)  # jsonl_interval_s=0: every sample is a line
    assert [x["time"] for x in lines] == times
    t0 = time.thread_time()  # this thread's CPU time: what a sample costs, not how busy the machine is
    mon.sample()
    assert time.thread_time() - t0 < 0.05  # a host-only sample costs well under the interval


@pytest.mark.skipif(HAS_NVML, reason="this machine has an NVIDIA GPU")
def test_jsonl_is_thinned_to_its_interval_and_log_to_moves_it(tmp_path):
    path = tmp_path / "system.jsonl"
    mon = GpuMonitor(interval_s=0.02, jsonl_interval_s=0.2).start()
    _until(lambda: len(mon.ring) >= 3, "3 samples")
    mon.log_to(path)  # the run dir appears after the monitor started

    def lines():
        return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []

    _until(lambda: len(lines()) >= 4, "4 lines of system.jsonl")
    mon.stop()
    times = [x["time"] for x in lines()]
    # each line at least 0.2 s after the one before, not one line per 20 ms sample (times from the samples' own
    # clock: a loaded machine spaces them out, never closer)
    assert all(b - a >= 0.2 - 1e-9 for a, b in zip(times, times[1:])), times
    assert len([r for r in mon.ring.snapshot() if r["time"] >= times[0]]) > len(times)


@pytest.mark.gpu
def test_gpu_sample_has_memory_busy_power_and_torch_allocator(tmp_path):
    import torch

    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")  # 256 MiB held by this process
    mon = GpuMonitor(interval_s=0.1, jsonl_path=tmp_path / "system.jsonl")
    mon.start()
    time.sleep(0.5)
    mon.stop()
    assert mon.has_gpu, mon.status
    g = mon.latest()["gpus"][0]
    assert g["label"].startswith("cuda:0 (gpu ")
    assert g["mem_view"] in ("nvml_v2", "nvml_v1")
    assert 0 < g["mem_used_gb"] <= g["mem_total_gb"]
    assert 0 <= g["kernel_busy_pct"] <= 100 and g["power_w"] > 0 and 0 < g["temp_c"] < 120
    assert g["torch_allocated_gb"] >= 0.25 and g["torch_reserved_gb"] >= g["torch_allocated_gb"]
    import pynvml  # the row labelled cuda:0 is the physical GPU whose UUID torch reports for ordinal 0

    pynvml.nvmlInit()
    nv_uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(g["nvml"]))
    pynvml.nvmlShutdown()
    assert _norm_uuid(nv_uuid) == _norm_uuid(str(torch.cuda.get_device_properties(0).uuid))
    del x
