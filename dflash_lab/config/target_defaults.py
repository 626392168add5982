"""Defaults derived from the target when a config leaves them unset: MASK token ids, feature layer ids, loss gamma."""

from __future__ import annotations

from .errors import ConfigError

# Reserved, unused embedding rows that the published DFlash drafters use as MASK (docs/dflash-method.md section 1).
KNOWN_MASK_TOKEN_IDS = {"qwen3": 151669, "qwen3_moe": 151669, "qwen3_5": 248070, "qwen3_next": 248070, "gpt_oss": 200000}
# --- real targets: model_type "llama" is shared by many vocabularies, so key by (model_type, vocab_size).
# 49,152 = the SmolLM/SmolLM2 tokenizer, which has no mask token and no spare embedding rows: id 7 is "<gh_stars>",
# a StarCoder-style repository-metadata special token that no chat template emits and chat text never contains
# (tests/test_real_target.py checks the chitchat data). See dflash_lab/target/models.py.
KNOWN_MASK_TOKEN_IDS_BY_VOCAB = {("llama", 49152): 7}
DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_target_layer_ids(num_target_layers: int, num_features: int) -> tuple[int, ...]:
    """DFlash rule: `num_features` ids evenly spaced from 1 to L-3, `round(1 + k*(L-4)/(n-1))`.

    Id i means the OUTPUT of target decoder layer i (= HF `hidden_states[i + 1]`). Qwen3-8B (L=36, n=5) ->
    (1, 9, 17, 25, 33). n = 1 -> (L // 2,).
    """
    if num_features == 1:
        return (num_target_layers // 2,)
    if num_target_layers < 4:
        raise ConfigError(
            f"num_target_layers={num_target_layers} is too small for the default layer-id rule (needs >= 4). "
            "Fix: pass target_layer_ids explicitly."
        )
    span = num_target_layers - 4
    return tuple(round(1 + k * span / (num_features - 1)) for k in range(num_features))


def default_gamma(block_size: int) -> float:
    """Loss decay gamma: 7 for B=16, 5 for B=10, 4 for B=8 (paper); otherwise interpolated as B * 7/16."""
    return DEFAULT_GAMMA.get(block_size, max(1.0, block_size * 7.0 / 16.0))
