"""The TrainConfig fields every step benchmark pins, so a row means one configuration across commits.

A run left to choose them picks per target (config/recipe_defaults.py: D-PACE, an lr for the batch, a feature store
when the data repeats). A benchmark row names its shape, not those choices, so benchmarks/step.py and
benchmarks/entry_points.py both pin them to what they trained with before the choices existed: the paper's lr and
decay weighting, no feature store (entry_points sweeps feature_store_gib itself and overrides that one).
"""

from __future__ import annotations

from dflash_lab.config.recipe_defaults import PAPER_LR

PINNED = {"lr": PAPER_LR, "loss_weighting": "decay", "feature_store_gib": 0.0, "feature_store_host_gib": 0.0}
