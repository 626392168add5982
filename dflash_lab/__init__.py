"""dflash-lab: train DFlash block-diffusion speculative drafters against a frozen target LLM.

The library is headless (torch + transformers only); the Jupyter layer lives in `widgets/`.
"""

from .config import ConfigError, DrafterConfig, TrainConfig
from .train.placement import devices_for
from .config.target_defaults import default_target_layer_ids

__all__ = ["ConfigError", "DrafterConfig", "TrainConfig", "default_target_layer_ids", "devices_for", "Trainer"]
__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: `import dflash_lab` stays cheap (no transformers import) until the Trainer is used.
    if name == "Trainer":
        from .train.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'dflash_lab' has no attribute {name!r}")
