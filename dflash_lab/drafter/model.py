"""The DFlash draft model in one file, leaves first: RMSNorm, RoPE, attention with KV injection, MLP, layer, model.

The drafter owns NO embedding and NO LM head: it reads the target's frozen `embed_tokens` and `lm_head` (passed in
by the caller). Target features of `target_layer_ids` are fused once (`fc` + `hidden_norm`) into a context stream
that enters EVERY draft layer only as extra keys/values, through the same k_proj/v_proj (+ k_norm on K) as the
draft stream: no input_layernorm, no Q, no MLP and no residual for the context. Parameter names match the exported
checkpoint (`layers.{i}.self_attn.q_proj.weight`, `fc.weight`, `hidden_norm.weight`, `norm.weight`).

Attention takes a dense boolean mask over [context | draft stream] (SDPA; CPU, tests, decoding) or a FlexAttention
BlockMask (GPU training): over [context | draft stream] too, or, for short windows, over the context alone with
each block's own slots attended to beside it (attend_blocks); blocks.py builds every mask and says which. Rows of
padding blocks carry no loss and no other row reads them: they output zeros, except on the split path, where they
output what their own slots give.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash_lab.config import DrafterConfig
from .variants import variant_of


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype == self.weight.dtype:
            # One fused kernel each way (fp32 math inside, one rounding) instead of ~6 elementwise passes over x:
            # ~25 norms per step make this ~10% of an eager paper-shape step otherwise.
            return torch.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin for absolute positions, computed by the same rules as the target (rope_theta / rope_scaling)."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        rope = {"rope_type": "default", "rope_theta": config.rope_theta}
        if config.rope_scaling:
            rope = {**config.rope_scaling, "rope_theta": config.rope_theta}
            rope.setdefault("rope_type", rope.get("type", "default"))
        hf = Qwen3Config(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                         head_dim=config.head_dim, max_position_embeddings=config.max_position_embeddings,
                         rope_parameters=rope)
        self.inner = Qwen3RotaryEmbedding(hf)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner(x, position_ids)  # each (b, T, head_dim)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (b, heads, T, d); cos/sin: (b, T, d)
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """q (b, h, Q, d), k/v (b, kvh, KV, d); mask: dense bool (b, 1, Q, KV) or a FlexAttention BlockMask over KV."""
    if isinstance(mask, torch.Tensor):
        # SDPA turns fully-masked rows into NaN: let them see one key, then zero their output ("sees nothing").
        seen = mask.any(-1, keepdim=True)  # (b, 1, Q, 1)
        safe = mask | ~seen & (torch.arange(mask.shape[-1], device=mask.device) == 0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, enable_gqa=True)
        return out * seen.to(out.dtype)
    return flex_attention(q, k, v, block_mask=mask, enable_gqa=True)


_attend_blocks = None


def attend_blocks(q: torch.Tensor, context_kv: tuple, draft_kv: tuple, context_mask, *, block_size: int,
                  causal: bool) -> torch.Tensor:
    """The DFlash attention in two parts merged exactly through their log-sum-exps: FlexAttention over the context
    keys (context_mask: BlockMask (b, 1, Q, S)) and each block's own B slots as one batched matmul (causal inside
    the block on sliding layers). One flex call over [context | every block] spends key tiles of each query tile on
    slots of blocks it may not see. q (b, h, Q, d); context_kv: (b, kvh, S, d) each; draft_kv: (b, kvh, Q, d) each.
    On CUDA compiled as one function, also when the drafter is not (eager, the merge's elementwise passes cost more
    than the split saves: 3.05 against 2.18 ms a layer at the recipe shape on an H100; compiled 1.65)."""
    global _attend_blocks
    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        if _attend_blocks is None:
            _attend_blocks = torch.compile(_attend_blocks_eager, dynamic=False)
        return _attend_blocks(q, context_kv, draft_kv, context_mask, block_size=block_size, causal=causal)
    return _attend_blocks_eager(q, context_kv, draft_kv, context_mask, block_size=block_size, causal=causal)


def _attend_blocks_eager(q, context_kv, draft_kv, context_mask, *, block_size: int, causal: bool) -> torch.Tensor:
    b, h, Q, d = q.shape
    kvh, B = draft_kv[0].shape[1], block_size
    o_ctx, lse_ctx = flex_attention(q, *context_kv, block_mask=context_mask, enable_gqa=True, return_lse=True)
    qb = q.reshape(b, kvh, h // kvh, Q // B, B, d)  # query head j reads key head j // (h / kvh), as GQA does
    kb, vb = (t.reshape(b, kvh, 1, Q // B, B, d) for t in draft_kv)
    s = (qb @ kb.transpose(-1, -2)).float() * d ** -0.5  # (b, kvh, h / kvh, N, B, B)
    if causal:
        s = s.masked_fill(torch.ones(B, B, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse_own = s.logsumexp(-1)
    o_own = (torch.exp(s - lse_own[..., None]).to(q.dtype) @ vb).reshape(b, h, Q, d)
    lse_own = lse_own.reshape(b, h, Q)
    lse = torch.logaddexp(lse_ctx, lse_own)  # lse_ctx is -inf where a block sees no context (anchor 0, padding)
    out = o_ctx.float() * torch.exp(lse_ctx - lse)[..., None] + o_own.float() * torch.exp(lse_own - lse)[..., None]
    return out.to(q.dtype)


_flex = None


def flex_attention(q, k, v, *, block_mask, enable_gqa, return_lse: bool = False):
    """FlexAttention, compiled once per process on CUDA (uncompiled flex is a slow reference implementation).
    return_lse: also the rows' natural-log log-sum-exp (b, h, Q), differentiable."""
    global _flex
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention as _flex_eager

    aux = AuxRequest(lse=True) if return_lse else None
    if q.device.type != "cuda" or torch.compiler.is_compiling():  # inside a compiled caller: traced as it is
        out = _flex_eager(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa, return_aux=aux)
    else:
        if _flex is None:
            _flex = torch.compile(_flex_eager, dynamic=False)
        out = _flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa, return_aux=aux)
    return (out[0], out[1].lse) if return_lse else out


class DFlashAttention(nn.Module):
    """GQA attention whose keys/values are [context | draft stream]; queries come from the draft stream only."""

    def __init__(self, config: DrafterConfig, causal_in_block: bool = False):
        super().__init__()
        H, nh, nkv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = nh, nkv, d
        self.block_size, self.causal_in_block = config.block_size, causal_in_block  # sliding layers: causal
        self.q_proj = nn.Linear(H, nh * d, bias=False)
        self.k_proj = nn.Linear(H, nkv * d, bias=False)
        self.v_proj = nn.Linear(H, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, H, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, T, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v  # (b, kvh, T, d)

    def forward(self, hidden: torch.Tensor, context: torch.Tensor, draft_rope, context_rope, mask,
                context_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        # hidden: (b, Q, H) normed draft stream; context: (b, S, H) fused target features (NOT normed again).
        b, Q, _ = hidden.shape
        q = self.q_norm(self.q_proj(hidden).view(b, Q, self.num_heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, *draft_rope)  # (b, h, Q, d)
        k_draft, v_draft = self.project_kv(hidden, *draft_rope)
        if context_kv is None:
            context_kv = self.project_kv(context, *context_rope)  # same k_proj/v_proj as the draft stream
        if isinstance(mask, torch.Tensor) or mask.seq_lengths[1] != context_kv[0].shape[2]:
            k = torch.cat([context_kv[0], k_draft], dim=2)  # one attention over [context | draft stream]
            v = torch.cat([context_kv[1], v_draft], dim=2)
            out = attend(q, k, v, mask)  # (b, h, Q, d)
        else:  # a BlockMask over the context alone: each block's own slots are attended to beside it
            out = attend_blocks(q, context_kv, (k_draft, v_draft), mask, block_size=self.block_size,
                                causal=self.causal_in_block)
        return self.o_proj(out.transpose(1, 2).reshape(b, Q, -1))


class MLP(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DrafterConfig, layer_idx: int):
        super().__init__()
        self.attention_type = config.layer_types[layer_idx]
        # Which mask this layer reads: one per distinct window, built outside the (compiled, captured) step, so a
        # window is data of the mask, never a per-layer Python value dynamo would specialise on.
        self.mask_key = config.mask_keys[layer_idx]
        self.self_attn = DFlashAttention(config, causal_in_block=config.windows[layer_idx] is not None)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden, context, draft_rope, context_rope, mask, context_kv=None):
        residual = hidden
        hidden = residual + self.self_attn(self.input_layernorm(hidden), context, draft_rope, context_rope, mask,
                                           context_kv)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashDrafter(nn.Module):
    """Draft model: fuse target features once, run the draft layers over the block stream, final norm.

    forward() returns normed hidden states (b, Q, H); logits = target lm_head(hidden), applied by the caller in
    chunks (step.py) so N*B x vocab logits are never materialised.
    """

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        H, n = config.hidden_size, config.num_target_features
        self.fc = nn.Linear(n * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        if config.draft_vocab_size is not None:  # draft id i is target id i + d2t[i] (EAGLE-3 offsets)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        # The variant's heads (drafter/variants.py), None for DFlash; registered after the backbone so its init draws
        # come first, bit for bit as without them.
        heads = variant_of(config).heads
        self.heads = heads(config) if heads is not None else None

    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Deterministic init: normal(0, std) for Linear weights and embeddings, ones for norms, zeros for biases."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "norm" in name.split(".")[-2]:
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                with torch.no_grad():
                    # on the generator's device: a CUDA generator inits 1B parameters in ms (CPU: ~20 s)
                    p.copy_(torch.randn(p.shape, generator=generator, device=generator.device) * std)

    def fuse_context(self, target_features: torch.Tensor) -> torch.Tensor:
        # target_features: (b, S, n*H) = concat of the selected target layers' outputs, no shift.
        return self.hidden_norm(self.fc(target_features))  # (b, S, H)

    def forward(self, target_features: torch.Tensor, draft_embeds: torch.Tensor, draft_position_ids: torch.Tensor,
                context_position_ids: torch.Tensor, masks: dict) -> torch.Tensor:
        """target_features (b, S, n*H); draft_embeds (b, Q, H) frozen target embedding of the block ids;
        masks: {mask key: mask} (dense bool or BlockMask), keys from `config.window_masks` / `DrafterConfig.mask_keys`:
        "full_attention", "sliding_attention" (the config's sliding_window) and "sliding_attention_<w>" per other
        window."""
        context = self.fuse_context(target_features.to(self.fc.weight.dtype))
        hidden = draft_embeds.to(self.fc.weight.dtype)
        draft_rope = self.rotary_emb(hidden, draft_position_ids)
        context_rope = self.rotary_emb(context, context_position_ids)
        for layer in self.layers:
            hidden = layer(hidden, context, draft_rope, context_rope, masks[layer.mask_key])
        return self.norm(hidden)  # (b, Q, H)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
