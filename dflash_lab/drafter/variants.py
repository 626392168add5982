"""The drafter variants, one explicit table: what each adds to the DFlash backbone, and nothing wired by name.

The model, the training step, the decoders and the export ASK a variant (`variant_of(config)`) for its heads, its
loss and what it exports; none of them branches on the variant's name. A new variant is one module beside the
drafter (its heads and loss), one line in `VARIANTS`, its name in `config.drafter_config.DRAFTER_VARIANTS` (the
config floor cannot import this table; tests/test_dspark.py checks that the two agree) and its tests
(docs/layout.md says how).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from . import dspark


@dataclass(frozen=True)
class Variant:
    """heads: class built from the DrafterConfig (None: the backbone alone); head_loss: the variant's loss over the
    supervised rows in place of step.py's chunked CE (None: the DFlash CE); metrics: the extra loss terms and
    statistics its step logs, in the order its loss returns them; export_config_keys: DrafterConfig fields the
    exported config.json carries for this variant only; export_tensor_prefix: where its parameters sit in the
    drafter's state dict (stripped on export, so the names are the ones the engines load); prefix_only: supervise only
    each block's contiguous supervised prefix (blocks.build_block_batch)."""

    name: str
    heads: type[nn.Module] | None
    head_loss: Callable | None
    metrics: tuple[str, ...]
    export_config_keys: tuple[str, ...]
    prefix_only: bool = False
    export_tensor_prefix: str = "heads."


VARIANTS: dict[str, Variant] = {
    "dflash": Variant("dflash", None, None, (), ()),
    "dspark": Variant("dspark", dspark.DSparkHeads, dspark.dspark_head_loss, dspark.METRICS,
                      ("markov_rank", "enable_confidence_head", "confidence_head_with_markov"), prefix_only=True),
}


def variant_of(config) -> Variant:
    """The Variant of a DrafterConfig (or TrainConfig): its `drafter_variant`, validated by the config."""
    return VARIANTS[config.drafter_variant]
