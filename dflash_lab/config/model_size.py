"""The one parameter model: how many parameters the target and the drafter have, from their configs alone.

Preflight (its report and ETA), placement (the "does it fit" check before loading) and the FLOP/MFU count
(metrics.flops_per_sequence) all read their numbers here, so they cannot disagree about the size of a model;
tests/test_model_size.py checks the closed forms against the real modules.
"""

from __future__ import annotations


def text_config(cfg):
    """The language-model part of a (possibly multimodal) HF config."""
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def layer_matmul_parameters(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Weights of one dense decoder layer's matmuls (q, k, v, o, gate, up, down): 2x this = FLOPs per token."""
    return hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * intermediate


def target_parameters(target_config) -> int:
    """Parameter count of a decoder-only HF LM from its config (dense and Qwen-style MoE)."""
    tc = text_config(target_config)
    H, L, V = tc.hidden_size, tc.num_hidden_layers, tc.vocab_size
    nh = tc.num_attention_heads
    nkv = getattr(tc, "num_key_value_heads", None) or nh
    hd = getattr(tc, "head_dim", None) or H // nh
    attn = H * nh * hd * 2 + H * nkv * hd * 2 + 2 * hd  # q, o, k, v (+ q_norm/k_norm)
    experts = getattr(tc, "num_experts", 0) or getattr(tc, "num_local_experts", 0) or 0
    if experts:
        mlp = experts * 3 * H * tc.moe_intermediate_size + H * experts
        shared = getattr(tc, "shared_expert_intermediate_size", 0) or 0
        mlp += 3 * H * shared + (H if shared else 0)
    else:
        mlp = 3 * H * tc.intermediate_size
    per_layer = attn + mlp + 2 * H  # + input/post-attention norms
    head = 0 if getattr(tc, "tie_word_embeddings", False) else V * H
    return V * H + L * per_layer + H + head


def drafter_matmul_parameters(drafter_config) -> int:
    """The drafter's trainable matmul weights: every layer's projections + the feature fusion `fc` (n*H -> H)."""
    d = drafter_config
    layer = layer_matmul_parameters(d.hidden_size, d.intermediate_size, d.num_attention_heads,
                                    d.num_key_value_heads, d.head_dim)
    return d.num_hidden_layers * layer + d.num_target_features * d.hidden_size * d.hidden_size


def _has_dspark_heads(d) -> bool:
    """Whether the drafter carries DSpark's Markov and confidence heads. By the variant's name: this floor cannot ask
    drafter/variants.py's table, so tests/test_dspark.py checks the counts below against the real heads of every
    variant in it."""
    return getattr(d, "drafter_variant", "dflash") == "dspark"


def confidence_head_inputs(d) -> int:
    """Inputs of DSpark's confidence head: the slot's hidden state (H), and its Markov embedding (r) beside it only
    when confidence_head_with_markov; 0 without a confidence head."""
    if not d.enable_confidence_head:
        return 0
    return d.hidden_size + (d.markov_rank if d.confidence_head_with_markov else 0)


def variant_head_parameters(drafter_config) -> int:
    """The parameters of the variant's heads (drafter/variants.py).
    DSpark: markov_w1 (target vocab x r) + markov_w2 (draft vocab x r) + the confidence head (H [+ r] weights + 1)."""
    d = drafter_config
    if not _has_dspark_heads(d):
        return 0
    r, v_draft = d.markov_rank, d.draft_vocab_size or d.vocab_size
    confidence = confidence_head_inputs(d) + 1 if d.enable_confidence_head else 0
    return d.vocab_size * r + v_draft * r + confidence


def variant_head_flops_per_row(drafter_config) -> int:
    """Training FLOPs of the variant's heads per supervised slot, forward and backward. DSpark: the Markov bias
    (r -> draft vocab) fused into the LM head's chunks, 3x its forward (forward, the embedding's gradient,
    markov_w2's gradient), + the confidence head's (H [+ r]) -> 1, 3x; the embedding itself is a gather."""
    d = drafter_config
    if not _has_dspark_heads(d):
        return 0
    r = d.markov_rank
    return 3 * 2 * (r * (d.draft_vocab_size or d.vocab_size) + confidence_head_inputs(d))


def drafter_parameters(drafter_config) -> int:
    """All trainable drafter parameters: the matmuls + per layer 2 norms (H) and q/k norms (head_dim), + the
    feature norm and the final norm (H each), + the variant's heads. No embedding or LM head (the target's,
    frozen)."""
    d = drafter_config
    norms = d.num_hidden_layers * (2 * d.hidden_size + 2 * d.head_dim) + 2 * d.hidden_size
    return drafter_matmul_parameters(d) + norms + variant_head_parameters(d)
