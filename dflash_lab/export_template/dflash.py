"""DFlashDraftModel: the remote-code model of an exported DFlash drafter (written by dflash_lab.evaluation.export).

    model = AutoModel.from_pretrained(out_dir, trust_remote_code=True)
    hidden = model(target_hidden, noise_embedding, position_ids)   # normed hidden (b, Q, H)
    logits = model.draft_logits(hidden, target.lm_head.weight)    # the target's head (a pruned drafter: its rows)

Self-contained (torch + transformers only). The drafter drafts a block [last token, MASK x (B-1)] in one pass,
conditioned on the target's hidden states of `dflash_config.target_layer_ids` (id i = output of target layer i =
HF hidden_states[i + 1]). Those features are concatenated, fused by `fc` + `hidden_norm`, and enter every draft layer
only as extra keys/values through the layer's own k_proj/v_proj (+ k_norm): K = [ctx | block], Q = block.
Full-attention layers see all context and the whole block; sliding-attention layers see context within
`sliding_window` and are causal inside the block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x (b, heads, T, d); cos/sin (b, T, d)
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def extract_context_feature(hidden_states, layer_ids) -> torch.Tensor:
    """Concatenate the target's HF hidden_states of the DFlash layer ids (id i -> hidden_states[i + 1])."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        H, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(H, self.num_heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(H, self.num_kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(H, self.num_kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * d, H, bias=config.attention_bias)
        self.q_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)

    def forward(self, hidden, context, cos, sin, mask):
        # hidden (b, Q, H) normed block stream; context (b, S, H) fused features; cos/sin over [context | block]
        b, Q, _ = hidden.shape
        S = context.shape[1]
        both = torch.cat([context, hidden], dim=1)  # the same k_proj / v_proj serve context and block
        k = self.k_norm(self.k_proj(both).view(b, S + Q, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(both).view(b, S + Q, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = self.q_norm(self.q_proj(hidden).view(b, Q, self.num_heads, self.head_dim)).transpose(1, 2)
        k = apply_rope(k, cos, sin)
        q = apply_rope(q, cos[:, S:], sin[:, S:])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (b, h, Q, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, Q, -1))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.attention_type = config.layer_types[layer_idx]
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden, context, cos, sin, mask):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), context, cos, sin, mask)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashDraftModel(PreTrainedModel):
    config_class = Qwen3Config
    base_model_prefix = ""
    _no_split_modules = ["DFlashDecoderLayer"]
    _supports_sdpa = True

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        dflash = config.dflash_config
        self.block_size = config.block_size
        self.mask_token_id = dflash["mask_token_id"]
        self.target_layer_ids = list(dflash["target_layer_ids"])
        H, n = config.hidden_size, len(self.target_layer_ids)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(n * H, H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        # A pruned draft vocabulary: lm_head holds the target head's rows of the draft ids (row i = target row
        # i + d2t[i]); logits over it are draft ids, draft id i = target id i + d2t[i] (draft_logits)
        if getattr(config, "draft_vocab_size", None) and config.draft_vocab_size != config.vocab_size:
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.post_init()

    def draft_logits(self, hidden: torch.Tensor, target_head: torch.Tensor) -> torch.Tensor:
        """Logits over the target vocabulary (b, Q, V): the target's head for a full-vocabulary drafter; for a
        pruned one its own rows scattered to their target ids, -inf elsewhere (as vLLM computes them)."""
        if not hasattr(self, "lm_head"):
            return F.linear(hidden, target_head.to(hidden.dtype))
        out = hidden.new_full((*hidden.shape[:-1], self.config.vocab_size), float("-inf"))
        out[..., torch.arange(self.d2t.numel(), device=hidden.device) + self.d2t] = self.lm_head(hidden)
        return out

    def get_input_embeddings(self):
        return None  # the target's embedding is used (frozen); the drafter has none

    def _masks(self, S: int, Q: int, position_ids: torch.Tensor, device) -> dict:
        masks = {"full_attention": None}  # every block query sees all context and the whole block
        if "sliding_attention" in self.config.layer_types:
            window = self.config.sliding_window
            q_pos = position_ids[:, S:, None]  # (b, Q, 1)
            ctx = (q_pos - position_ids[:, None, :S]) < window  # (b, Q, S)
            own = torch.ones(Q, Q, dtype=torch.bool, device=device).tril()[None].expand(ctx.shape[0], -1, -1)
            masks["sliding_attention"] = torch.cat([ctx, own], dim=-1)[:, None]
        return masks

    def forward(self, target_hidden: torch.Tensor, noise_embedding: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """target_hidden (b, S, n*H) concatenated target features of the context tokens; noise_embedding (b, Q, H)
        the target's embedding of [last token, MASK...]; position_ids (b, S + Q) absolute positions of context then
        block; attention_mask: optional bool (b, 1, Q, S + Q) (True = attend) overriding the inference masks.
        Returns the final-normed hidden states (b, Q, H); apply the target's lm_head for logits."""
        context = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))  # (b, S, H)
        hidden = noise_embedding.to(self.fc.weight.dtype)
        S, Q = context.shape[1], hidden.shape[1]
        cos, sin = self.rotary_emb(hidden, position_ids)  # (b, S + Q, d)
        masks = self._masks(S, Q, position_ids, hidden.device)
        for layer in self.layers:
            mask = attention_mask if attention_mask is not None else masks[layer.attention_type]
            hidden = layer(hidden, context, cos, sin, mask)
        return self.norm(hidden)
