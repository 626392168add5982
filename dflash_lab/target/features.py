"""Run a loaded target for the drafter: embedding + decoder layers 0..max(ids) only, features out.

`FeatureExtractor` returns the concatenated OUTPUTS of `target_layer_ids` (DFlash id i = HF hidden_states[i + 1]);
no layer above the last needed one and no LM head runs (unless distillation asks for the target's distribution),
and nothing is shifted: feature t stays aligned with token t. Packed windows (`doc_ids`, segments.py): attention is causal AND within one conversation, and position ids
restart at 0 per conversation, so each conversation's features equal those of it run alone. Also the accessors
the rest of the library uses on a loaded target (decoder, embedding, LM head weight). Loading it is targets.py.
"""

from __future__ import annotations

import torch
from torch import nn

from .segments import document_positions
from .load import TargetLoadError
from .soft_labels import top_k_distribution


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack (`model.model` for *ForCausalLM), with embed_tokens, layers, rotary_emb."""
    inner = getattr(model, "model", model)
    if hasattr(inner, "language_model"):
        inner = inner.language_model
    for attr in ("embed_tokens", "layers"):
        if not hasattr(inner, attr):
            raise TargetLoadError(f"target {type(model).__name__} has no decoder with `{attr}`: only decoder-only "
                                  "Hugging Face LMs with model.layers are supported.")
    return inner


def embedding_of(model: nn.Module) -> nn.Embedding:
    return model.get_input_embeddings()


def lm_head_weight(model: nn.Module) -> torch.Tensor:
    """The target's output head weight (V, H). With tie_word_embeddings this IS the embedding (SpecForge#473)."""
    head = model.get_output_embeddings()
    if head is None:
        return model.get_input_embeddings().weight
    return head.weight


def _fused_rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if hidden_states.dtype != self.weight.dtype:
        return type(self).forward(self, hidden_states)
    return torch.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)


def fuse_rms_norms(module: nn.Module) -> int:
    """Run the Hugging Face RMSNorms under `module` as one fused kernel (fp32 math inside, one rounding) instead of
    ~6 elementwise kernels each: 136 norms are ~15 ms of a Qwen3-8B paper-shape forward on an H200. Same function
    up to bf16 rounding. Returns how many norms were switched."""
    n = 0
    for m in module.modules():
        if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon") and hasattr(m, "weight"):
            m.forward = _fused_rms_norm_forward.__get__(m)
            n += 1
    return n


class FeatureExtractor:
    """Runs a frozen target up to max(target_layer_ids) and returns the selected layers' outputs, concatenated.

    Masks and RoPE tables depend only on (batch, length, device), so they are built once per shape and reused:
    a call then launches only the layers' own kernels (and can be captured in a CUDA graph).
    """

    def __init__(self, model: nn.Module, target_layer_ids: tuple[int, ...], *, fused_norms: bool = True,
                 fp8: bool = False, compile: bool = False, soft_top_k: int = 0, soft_temperature: float = 1.0):
        """`soft_top_k` > 0: every layer, the final norm and the LM head run too, and a call returns
        (features, top-k ids, top-k log-probabilities) of the target's next-token distribution at
        `soft_temperature` (soft_labels.py): distillation's targets."""
        self.model = model
        self.decoder = decoder_of(model)
        self.layer_ids = tuple(target_layer_ids)
        n = len(self.decoder.layers)
        self.soft_top_k, self.soft_temperature = soft_top_k, soft_temperature
        if soft_top_k and not hasattr(self.decoder, "norm"):
            raise TargetLoadError(f"target {type(model).__name__} has no final norm (`model.norm`), which "
                                  "distillation needs for the target's logits. Fix: set distill_weight=0.")
        self.num_layers_run = n if soft_top_k else max(self.layer_ids) + 1
        if max(self.layer_ids) + 1 > n:
            raise TargetLoadError(f"target_layer_ids {self.layer_ids} need {max(self.layer_ids) + 1} layers but the "
                                  f"target has {n}. Fix: use ids < {n}.")
        self._cache: dict = {}
        if fused_norms and self.device.type == "cuda":
            fuse_rms_norms(self.decoder.layers[:self.num_layers_run])
        self.fp8 = fp8  # perf: FP8 linears for extraction only (fp8.py); the bf16 weights stay
        if fp8:
            from .fp8 import fp8_frozen_linears

            fp8_frozen_linears(self.decoder.layers[:self.num_layers_run])
        # perf: compile the layer loop (RoPE, norms, residual glue, FP8 casts) once; captured like eager
        self._layers = torch.compile(self._run_layers, dynamic=False) if compile else self._run_layers

    @property
    def device(self) -> torch.device:
        return self.decoder.embed_tokens.weight.device

    def _static(self, input_ids: torch.Tensor, hidden: torch.Tensor):
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        key = (tuple(input_ids.shape), input_ids.device, hidden.dtype)
        if key not in self._cache:
            dec = self.decoder
            b, S = input_ids.shape
            position_ids = torch.arange(S, device=input_ids.device)[None].expand(b, -1)
            kw = dict(config=dec.config, inputs_embeds=hidden, attention_mask=None, past_key_values=None,
                      position_ids=position_ids)
            masks = {"full_attention": create_causal_mask(**kw)}
            layer_types = getattr(dec.config, "layer_types", None) or ["full_attention"] * len(dec.layers)
            if "sliding_attention" in layer_types:
                masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
            rope = dec.rotary_emb(hidden, position_ids)
            self._cache = {key: (position_ids, masks, layer_types, rope)}  # one shape at a time
        return self._cache[key]

    def _packed(self, doc_ids: torch.Tensor, hidden: torch.Tensor):
        """Masks and RoPE of packed windows: built every call from `doc_ids` (data, not shape) with static-shape
        tensor ops only, so a CUDA graph captures them. position_ids=None keeps transformers from re-detecting
        packing from the positions (a host sync); the same-document rule is passed explicitly instead."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        dec = self.decoder
        position_ids = document_positions(doc_ids)  # (b, S): 0 at each conversation start

        def same_doc(batch_idx, head_idx, q_idx, kv_idx):
            return doc_ids[batch_idx, q_idx] == doc_ids[batch_idx, kv_idx]

        kw = dict(config=dec.config, inputs_embeds=hidden, attention_mask=None, past_key_values=None,
                  position_ids=None, and_mask_function=same_doc)
        masks = {"full_attention": create_causal_mask(**kw)}
        layer_types = getattr(dec.config, "layer_types", None) or ["full_attention"] * len(dec.layers)
        if "sliding_attention" in layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        return position_ids, masks, layer_types, dec.rotary_emb(hidden, position_ids)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None):
        """input_ids (b, S) right-padded -> features (b, S, n*H); with soft_top_k also the top-k (ids, log-probs),
        each (b, S, k). Right padding never changes earlier positions under causal attention, so no padding mask is
        needed. `doc_ids` (b, S): packed windows (None = unpacked)."""
        if self.fp8:
            from .fp8 import fp8_scope

            with fp8_scope():
                return self._extract(input_ids, doc_ids)
        return self._extract(input_ids, doc_ids)

    def _extract(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.decoder.embed_tokens(input_ids)
        if doc_ids is None:
            position_ids, masks, layer_types, rope = self._static(input_ids, hidden)
        else:
            position_ids, masks, layer_types, rope = self._packed(doc_ids, hidden)
        return self._layers(hidden, masks, rope, position_ids, tuple(layer_types))

    def _run_layers(self, hidden, masks, rope, position_ids, layer_types) -> torch.Tensor:
        dec = self.decoder
        out = []
        wanted = set(self.layer_ids)
        for i in range(self.num_layers_run):  # layers above max(ids) never run
            hidden = dec.layers[i](hidden, attention_mask=masks[layer_types[i]], position_embeddings=rope,
                                   position_ids=position_ids, past_key_values=None, use_cache=False)
            if isinstance(hidden, tuple):
                hidden = hidden[0]
            if i in wanted:
                out.append(hidden)
        features = torch.cat(out, dim=-1)  # (b, S, n*H)
        if not self.soft_top_k:
            return features
        ids, logp = top_k_distribution(hidden, dec.norm, lm_head_weight(self.model), k=self.soft_top_k,
                                       temperature=self.soft_temperature)
        return features, ids, logp
