"""The drafter's shape as a frozen, validated dataclass, in the field names of the exported `config.json`.

`DrafterConfig` is derived from the target's config (`DrafterConfig.from_target`: same hidden size, heads, RoPE and
vocabulary; section 4 of docs/dflash-method.md), so export is a plain dump. `config.py` re-exports it beside
`TrainConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, fail
from .feature_checks import check_draft_vocab_size
from .field_types import check_field_types, field_default
from .target_defaults import KNOWN_MASK_TOKEN_IDS, KNOWN_MASK_TOKEN_IDS_BY_VOCAB, default_target_layer_ids
from .windows import check_layer_windows, layer_windows_of, mask_key

LAYER_TYPES = ("full_attention", "sliding_attention")
ATTENTION_BACKENDS = ("auto", "flex", "sdpa")
DRAFTER_VARIANTS = ("dflash", "dspark")
"""The names of drafter/variants.py's table (this floor cannot import it; tests/test_dspark.py checks they agree)."""


def check_variant_fields(c: str, cfg) -> None:
    """drafter_variant is a known name; the DSpark heads' shape is sane (checked for every variant: a default is)."""
    if cfg.drafter_variant not in DRAFTER_VARIANTS:
        fail(c, "drafter_variant", cfg.drafter_variant, "unknown drafter variant",
             f"use one of {DRAFTER_VARIANTS} (a new variant is a line in drafter/variants.py: docs/layout.md)")
    if isinstance(cfg.markov_rank, bool) or not isinstance(cfg.markov_rank, int) or cfg.markov_rank < 1:
        fail(c, "markov_rank", cfg.markov_rank, "the Markov head's rank must be a positive integer",
             f"use {field_default(DrafterConfig, 'markov_rank')} (DeepSpec's published rank)")

@dataclass(frozen=True, kw_only=True)
class DrafterConfig:
    """Shape of the DFlash draft model. Field names follow the exported Qwen3-style `config.json`."""

    hidden_size: int
    """Drafter hidden size; must equal the target's (the fused context is added to the target's space)."""
    target_hidden_size: int
    """The target's hidden size, kept to check the drafter against it."""
    intermediate_size: int
    """SwiGLU MLP width of each draft layer (copied from the target by default)."""
    num_hidden_layers: int = 5
    """Number of draft decoder layers (paper: 5; 8 for some MoE targets)."""
    num_attention_heads: int
    """Query heads per draft layer."""
    num_key_value_heads: int
    """Key/value heads per draft layer (GQA)."""
    head_dim: int
    """Per-head dimension."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon, copied from the target."""
    rope_theta: float = 1_000_000.0
    """RoPE base, copied from the target."""
    rope_scaling: dict | None = None
    """RoPE scaling dict, copied from the target (None = plain RoPE)."""
    max_position_embeddings: int = 40960
    """Copied from the target."""
    vocab_size: int
    """The target's vocabulary size (embedding rows); the drafter has no embedding of its own."""
    tie_word_embeddings: bool = False
    """Whether the target ties its LM head to its embedding; the drafter uses the target's head either way."""
    block_size: int = 16
    """Tokens drafted per pass: the anchor plus block_size - 1 MASK slots."""
    mask_token_id: int
    """Reserved, unused row of the target's embedding used as MASK; never learned, never resized."""
    num_target_layers: int
    """Number of decoder layers of the target."""
    target_layer_ids: tuple[int, ...]
    """Target layers whose OUTPUT feeds the drafter (DFlash convention: id i = HF hidden_states[i + 1])."""
    layer_types: tuple[str, ...] = ()
    """Per draft layer: "full_attention" or "sliding_attention"; empty means all full attention."""
    sliding_window: int | None = None
    """Window of the sliding-attention layers (required if any layer slides)."""
    # perf
    layer_windows: tuple[int | None, ...] = ()
    """Per draft layer window: None on full-attention layers, a positive int on sliding ones; empty = every sliding
    layer uses `sliding_window`. Several distinct values train fine (one mask per window) but cannot be exported
    (config.json has one `sliding_window`)."""
    # draft vocabulary
    draft_vocab_size: int | None = None
    """Ids the drafter predicts (a `d2t` buffer maps them to target ids, draft_vocab.py); None = the whole target
    vocabulary."""
    # variant (drafter/variants.py): what sits on the backbone; the DSpark fields are the config.json keys vLLM reads
    drafter_variant: str = "dflash"
    """"dflash" (the backbone alone) or "dspark" (plus a Markov head and a confidence head, drafter/dspark.py)."""
    markov_rank: int = 256
    """dspark: rank r of the Markov head (markov_w1: target vocab x r, markov_w2: r x draft vocab)."""
    enable_confidence_head: bool = True
    """dspark: whether the drafter has the confidence head (predicted acceptance per slot)."""
    confidence_head_with_markov: bool = True
    """dspark: whether the confidence head also reads the slot's Markov embedding beside its hidden state."""

    def __post_init__(self) -> None:
        c = "DrafterConfig"
        check_field_types(self, fail)
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                fail(c, name, v, "must be a positive integer", f"set {name} to a value >= 1")
        if self.hidden_size != self.target_hidden_size:
            fail(c, "hidden_size", self.hidden_size,
                 f"the drafter's hidden size must equal the target's hidden size ({self.target_hidden_size})",
                 f"use hidden_size={self.target_hidden_size} (DrafterConfig.from_target does this)")
        if self.num_attention_heads % self.num_key_value_heads:
            fail(c, "num_key_value_heads", self.num_key_value_heads,
                 f"num_attention_heads={self.num_attention_heads} is not a multiple of it",
                 "use a divisor of num_attention_heads")
        if not isinstance(self.block_size, int) or self.block_size < 2:
            fail(c, "block_size", self.block_size, "a block needs the anchor plus at least one MASK slot",
                 "use block_size >= 2 (16 is the paper's default; 10 and 8 are also used)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            fail(c, "mask_token_id", self.mask_token_id,
                 f"it is outside the target vocabulary [0, {self.vocab_size})",
                 "pick a reserved, unused row of the target's embedding (Qwen3: 151669), never resize the vocab")
        ids = tuple(self.target_layer_ids)
        if not ids:
            fail(c, "target_layer_ids", ids, "at least one target layer is needed", "pass e.g. (1, 9, 17, 25, 33)")
        bad = [i for i in ids if not 0 <= i < self.num_target_layers]
        if bad:
            fail(c, "target_layer_ids", ids,
                 f"ids {bad} are out of range for a target with {self.num_target_layers} layers "
                 f"(valid: 0..{self.num_target_layers - 1})",
                 "use ids in range, or leave them unset for the default rule")
        if ids[-1] == self.num_target_layers - 1:
            # The last layer's output has three readings: raw (dflash-lab, vLLM), after the target's final norm
            # (z-lab's hidden_states[L]) and none at all (SGLang captures before layers 1..L-1 and fails to load):
            # a drafter conditioned on it is not served as it was trained.
            fail(c, "target_layer_ids", ids,
                 f"id {ids[-1]} is the target's last layer (L - 1 with L = {self.num_target_layers}), whose output the "
                 "serving engines read differently (raw in vLLM, after the final norm in z-lab's code, refused by "
                 "SGLang)",
                 f"use ids up to {self.num_target_layers - 2}, or leave them unset for the default rule (1 .. L - 3)")
        if len(set(ids)) != len(ids) or list(ids) != sorted(ids):
            fail(c, "target_layer_ids", ids, "ids must be strictly increasing and distinct",
                 "sort them and drop duplicates")
        object.__setattr__(self, "target_layer_ids", ids)
        types = tuple(self.layer_types) or ("full_attention",) * self.num_hidden_layers
        for t in types:
            if t not in LAYER_TYPES:
                fail(c, "layer_types", types, f"unknown layer type {t!r}", f"use only {LAYER_TYPES}")
        if len(types) != self.num_hidden_layers:
            fail(c, "layer_types", types, f"it has {len(types)} entries for {self.num_hidden_layers} draft layers",
                 "give one type per draft layer")
        object.__setattr__(self, "layer_types", types)
        # Plain RoPE is `rope_scaling: null` in a Qwen3 config.json; transformers 5 reports it as a dict with
        # rope_type "default", which transformers 4.x warns about when it reads the export. Numerics are the same.
        if isinstance(self.rope_scaling, dict) and (self.rope_scaling.get("rope_type")
                                                    or self.rope_scaling.get("type", "default")) == "default":
            object.__setattr__(self, "rope_scaling", None)
        object.__setattr__(self, "layer_windows", check_layer_windows(c, types, self.sliding_window,
                                                                      self.layer_windows))
        check_draft_vocab_size(self.draft_vocab_size, self.vocab_size)
        check_variant_fields(c, self)

    @property
    def windows(self) -> tuple[int | None, ...]:
        """The attention window of each draft layer (None = full attention)."""
        return layer_windows_of(self.layer_types, self.sliding_window, self.layer_windows)

    @property
    def mask_keys(self) -> tuple[str, ...]:
        """Per draft layer, the key of its mask in the `masks` dict (one mask per distinct window)."""
        return tuple(mask_key(w, self.sliding_window) for w in self.windows)

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_target(cls, target_config: Any, *, num_draft_layers: int = 5, num_target_features: int = 5,
                    target_layer_ids: tuple[int, ...] | None = None, block_size: int = 16,
                    mask_token_id: int | None = None, layer_types: tuple[str, ...] = (),
                    sliding_window: int | None = None, layer_windows: tuple = (),
                    draft_vocab_size: int | None = None, drafter_variant: str = "dflash",
                    markov_rank: int | None = None, enable_confidence_head: bool = True,
                    confidence_head_with_markov: bool = True) -> "DrafterConfig":
        """Derive the drafter from a Hugging Face target config: same hidden size, heads, RoPE and vocabulary.
        markov_rank None: the field's default (DeepSpec's rank)."""
        tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        L = tc.num_hidden_layers
        ids = tuple(target_layer_ids) if target_layer_ids else default_target_layer_ids(L, num_target_features)
        if mask_token_id is None:
            model_type = getattr(tc, "model_type", "")
            mask_token_id = KNOWN_MASK_TOKEN_IDS_BY_VOCAB.get((model_type, tc.vocab_size),
                                                              KNOWN_MASK_TOKEN_IDS.get(model_type))
            if mask_token_id is None or mask_token_id >= tc.vocab_size:
                raise ConfigError(
                    f"mask_token_id is not set and no default is known for model_type={tc.model_type!r} with "
                    f"vocab_size={tc.vocab_size}. Fix: pass mask_token_id = a reserved, unused embedding row "
                    "(e.g. the tokenizer's mask token or an unused special token).")
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        rope_params = getattr(tc, "rope_parameters", None) or {}
        rope_theta = getattr(tc, "rope_theta", None) or rope_params.get("rope_theta", 10000.0)
        rope_scaling = getattr(tc, "rope_scaling", None)
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = dict(rope_params)
        return cls(
            hidden_size=tc.hidden_size, target_hidden_size=tc.hidden_size,
            intermediate_size=tc.intermediate_size, num_hidden_layers=num_draft_layers,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
            head_dim=head_dim, rms_norm_eps=tc.rms_norm_eps, rope_theta=float(rope_theta),
            rope_scaling=rope_scaling, max_position_embeddings=tc.max_position_embeddings,
            vocab_size=tc.vocab_size, tie_word_embeddings=bool(getattr(tc, "tie_word_embeddings", False)),
            block_size=block_size, mask_token_id=int(mask_token_id), num_target_layers=L, target_layer_ids=ids,
            layer_types=tuple(layer_types), sliding_window=sliding_window, layer_windows=tuple(layer_windows or ()),
            draft_vocab_size=draft_vocab_size, drafter_variant=drafter_variant,
            markov_rank=field_default(cls, "markov_rank") if markov_rank is None else markov_rank,
            enable_confidence_head=enable_confidence_head, confidence_head_with_markov=confidence_head_with_markov,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
