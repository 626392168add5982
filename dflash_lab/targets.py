"""Load the frozen target and run only the layers the drafter needs.

`load_target` takes "tiny" (the embedded default), a local Hugging Face model directory or a hub id, and returns
the model in eval mode with requires_grad off. `FeatureExtractor` runs embedding + decoder layers 0..max(ids) and
returns the concatenated OUTPUTS of `target_layer_ids` (DFlash id i = HF hidden_states[i + 1]); no layer above the
last needed one and no LM head runs, and nothing is shifted: feature t stays aligned with token t.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class TargetLoadError(RuntimeError):
    pass


def resolve_target_path(target: str) -> str:
    """"tiny" -> the embedded model dir; an existing dir -> itself; a path-like string that does not exist -> error;
    anything else is treated as a Hugging Face hub id."""
    if target == "tiny":
        from .tiny import ensure_tiny_target

        return str(ensure_tiny_target())
    p = Path(target).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise TargetLoadError(
                f"target directory {p} has no config.json. Expected a Hugging Face model directory (config.json, "
                "model*.safetensors, tokenizer files), e.g. one written by save_pretrained().")
        return str(p)
    if target.startswith((".", "/", "~")) or target.count("/") > 1:
        raise TargetLoadError(
            f"target directory {p} does not exist. Expected a Hugging Face model directory (config.json, "
            "model*.safetensors, tokenizer files) or a hub id like 'Qwen/Qwen3-8B'.")
    return target


def load_tokenizer(target: str):
    from transformers import AutoTokenizer

    path = resolve_target_path(target)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise TargetLoadError(f"could not load a tokenizer for target {target!r} ({path}): {e}. "
                              "HINT: the directory must contain tokenizer.json / tokenizer_config.json.") from e


def load_target(target: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> nn.Module:
    """Load a frozen causal LM. bf16 on GPUs, fp32 on CPU by default of the caller."""
    from transformers import AutoModelForCausalLM

    path = resolve_target_path(target)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=None)
    except OSError as e:
        raise TargetLoadError(f"could not load target {target!r} ({path}): {e}. HINT: pass a local model directory "
                              "or make sure the hub id is cached (HF_HUB_OFFLINE=1 works only with a cache).") from e
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


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


class FeatureExtractor:
    """Runs a frozen target up to max(target_layer_ids) and returns the selected layers' outputs, concatenated."""

    def __init__(self, model: nn.Module, target_layer_ids: tuple[int, ...]):
        self.model = model
        self.decoder = decoder_of(model)
        self.layer_ids = tuple(target_layer_ids)
        self.num_layers_run = max(self.layer_ids) + 1
        n = len(self.decoder.layers)
        if self.num_layers_run > n:
            raise TargetLoadError(f"target_layer_ids {self.layer_ids} need {self.num_layers_run} layers but the target "
                                  f"has {n}. Fix: use ids < {n}.")

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (b, S) right-padded -> features (b, S, n*H). Right padding never changes earlier positions
        under causal attention, so no padding mask is needed."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        dec = self.decoder
        hidden = dec.embed_tokens(input_ids)
        b, S = input_ids.shape
        position_ids = torch.arange(S, device=input_ids.device)[None].expand(b, -1)
        kw = dict(config=dec.config, inputs_embeds=hidden, attention_mask=None, past_key_values=None,
                  position_ids=position_ids)
        masks = {"full_attention": create_causal_mask(**kw)}
        layer_types = getattr(dec.config, "layer_types", None) or ["full_attention"] * len(dec.layers)
        if "sliding_attention" in layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        rope = dec.rotary_emb(hidden, position_ids)
        out = []
        wanted = set(self.layer_ids)
        for i in range(self.num_layers_run):
            hidden = dec.layers[i](hidden, attention_mask=masks[layer_types[i]], position_embeddings=rope,
                                   position_ids=position_ids, past_key_values=None, use_cache=False)
            if isinstance(hidden, tuple):
                hidden = hidden[0]
            if i in wanted:
                out.append(hidden)
        return torch.cat(out, dim=-1)  # (b, S, n*H)
