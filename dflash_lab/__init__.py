"""dflash-lab: train DFlash block-diffusion speculative drafters against a frozen target LLM.

The library is headless (torch + transformers only); the Jupyter layer lives in `widgets/`.
"""

import os

# OpenMP's idle threads wait for the next parallel region passively (futex), not by spinning, unless the user chose.
# libgomp (torch's CPU thread pool) spins 300,000 rounds per wait while it manages no more threads than there are
# cores, and 1,000 once it manages more. On a loaded 2-core machine, explore.ipynb's live dashboard builds the
# Trainer on a thread that then exits, so its first run trained with exactly 2 managed threads (full spin) while
# papermill, train.ipynb and a second Run All had 4 (throttled). Measured in fresh kernels (jupyter_client, live
# dashboard, load 6-9 from other jobs): the first 20 steps took 60-99 s (18.4 s CPU in each of the drafter's two
# threads over 25 steps: the spinning) against 4.0-4.5 s with a passive wait or a main-thread team, and 1.9 + 1.5 s
# of CPU. Read once, when torch loads libgomp: set before the first `import torch` of the process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .config import ConfigError, DrafterConfig, TrainConfig  # noqa: E402 - after the OpenMP setting
from .train.placement import devices_for  # noqa: E402
from .config.target_defaults import default_target_layer_ids  # noqa: E402

__all__ = ["ConfigError", "DrafterConfig", "TrainConfig", "default_target_layer_ids", "devices_for", "Trainer"]
__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: `import dflash_lab` stays cheap (no transformers import) until the Trainer is used.
    if name == "Trainer":
        from .train.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'dflash_lab' has no attribute {name!r}")
