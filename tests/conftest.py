"""Shared test setup: CPU threads, the `gpu` marker skip, tiny random Qwen3 models for unit tests, and runs that
land in a temporary folder, never in the user's own runs/."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

# Under `make test` two workers share the CI machine's two cores: a second intra-op thread per process then spins
# against the other worker's (a tiny target's decode loop ran 7x slower in the suite than alone), so each worker and
# every process it starts (papermill kernels, CLI runs, torchrun ranks) gets one thread unless told otherwise.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ.get("DFLASH_TEST_THREADS", "1" if _WORKERS > 1 else "2")))

# A run left at runs_dir="runs" (a notebook's default, a browser test's kernel, a subprocess) goes to
# $DFLASH_LAB_RUNS: a folder of this session, so `make test` never adds runs to the user's runs/ list.
REPO_RUNS = Path(__file__).resolve().parents[1] / "runs"
SESSION_RUNS = tempfile.mkdtemp(prefix="dflash-test-runs-")
os.environ["DFLASH_LAB_RUNS"] = SESSION_RUNS
_REPO_RUNS_BEFORE: set[str] = set()
# Tokenized data the runs keep (TrainConfig.token_cache) goes to a folder of this session, not the user's cache.
SESSION_TOKENIZED = tempfile.mkdtemp(prefix="dflash-test-tokenized-")
os.environ["DFLASH_LAB_TOKENIZED"] = SESSION_TOKENIZED


def _entries(folder: Path) -> set[str]:
    return set(os.listdir(folder)) if folder.is_dir() else set()


def pytest_sessionstart(session):
    _REPO_RUNS_BEFORE.update(_entries(REPO_RUNS))


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_RUNS, ignore_errors=True)
    shutil.rmtree(SESSION_TOKENIZED, ignore_errors=True)
    new = sorted(_entries(REPO_RUNS) - _REPO_RUNS_BEFORE)
    if new:  # a test wrote into the user's runs/: say which entries, and fail the session
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"FAILED: tests added {new} to {REPO_RUNS}; tests must write runs into tmp_path or "
                                "$DFLASH_LAB_RUNS (set by tests/conftest.py)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (CUDA not available on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def bench_tiny_engine(devices=("cuda:0",), target_devices=None, *, seq_len: int = 256, num_anchors: int = 16,
                      block_size: int = 16, batch_size: int = 2, drafter: dict | None = None, **train):
    """The training engine on the bench's tiny target (vocabulary 1024, MASK 1023), lr 1e-3, fp32 unless
    `dtype` says otherwise: `train` goes to TrainConfig, `drafter` to DrafterConfig.from_target."""
    from dflash_lab.config import DrafterConfig, TrainConfig
    from dflash_lab.target.load import load_target_config, load_targets
    from dflash_lab.train.engine_build import build_engine
    from dflash_lab.train.placement import make_placement

    cfg = TrainConfig(target="bench:tiny", seq_len=seq_len, num_anchors=num_anchors, block_size=block_size,
                      batch_size=batch_size, devices=devices, target_devices=target_devices, mask_token_id=1023,
                      dtype=train.pop("dtype", "float32"), lr=1e-3, **train)
    tc = load_target_config("bench:tiny")
    dc = DrafterConfig.from_target(tc, block_size=block_size, mask_token_id=1023, **(drafter or {}))
    placement = make_placement(cfg.devices, cfg.target_devices)
    models = load_targets("bench:tiny", placement.target_devices,
                          dtype=torch.float32 if cfg.dtype == "float32" else torch.bfloat16)
    return build_engine(cfg, placement, models, dc, target_config=tc)


def make_tiny_qwen3(*, tie: bool = True, layers: int = 8, hidden: int = 64, vocab: int = 256, seed: int = 0,
                    layer_types=None, sliding_window=None):
    """A random-initialised Qwen3 for unit tests (not the trained embedded default)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=512, tie_word_embeddings=tie)
    return Qwen3ForCausalLM(cfg).eval()


@pytest.fixture
def tiny_qwen3():
    return make_tiny_qwen3()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module: decoding and generating with tiny models is per-op overhead, not matmuls,
    and on a busy 2-core machine 2 threads spin against each other (test_speculative: 11 min with 2 threads vs 36 s
    with 1; regeneration measured 20x)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
