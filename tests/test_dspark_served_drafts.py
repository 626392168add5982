"""The drafts a served DSpark drafter makes are the drafts we evaluated: vLLM 0.34.0's own drafting loop
(DSparkSpeculator._sample_sequential: the Markov chain, or its top-k candidates) and SGLang 0.5.23's
(dspark_draft.draft_markov_block), each driving the heads its own model class loaded from our export, against our
markov_block and slot_confidence (evaluation/markov_draft.py) on the same backbone hidden states and anchors.

The engines' files run unmodified on the CPU (tests/engine_source.py); what they would get from their GPU runtime is
given to them here and named where it is. The Markov head is scaled up so that its bias changes most argmax picks:
a bias read from the wrong token, or added in the wrong space, would change the drafts."""

from __future__ import annotations

import json
import logging
import types

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dflash_lab.data.draft_vocab import draft_head, to_target_ids
from dflash_lab.evaluation.export import export_drafter
from dflash_lab.evaluation.markov_draft import markov_block, slot_confidence
from tests.conftest import make_tiny_qwen3
from tests.engine_source import Inert, load_engine_module
from tests.test_dspark_export import (V, _drafter, _hf_config, _load_vllm, _need, _shape_checked_copy,
                                      _sglang_config_module, _Struct)

REQUESTS = 3  # blocks drafted side by side, as a batch of requests


def _exported(tmp_path, pruned: bool):
    """(drafter, the target, its fp32 export): a DSpark drafter whose Markov bias dominates its base logits."""
    target = make_tiny_qwen3()
    target.save_pretrained(tmp_path / "target")
    d = _drafter(pruned, target=target).eval()
    with torch.no_grad():
        d.heads.markov_head.markov_w1.weight.mul_(40)
        d.heads.markov_head.markov_w2.weight.mul_(10)
    src = tmp_path / "src"
    src.mkdir()
    (src / "drafter_config.json").write_text(json.dumps(d.config.to_dict()))
    save_file({k: v.contiguous() for k, v in d.state_dict().items()}, str(src / "drafter.safetensors"))
    out = export_drafter(src / "drafter.safetensors", tmp_path / "export", log=lambda *a: None,
                         target=str(tmp_path / "target"), dtype="float32")
    return d, target, out


def _ours(d, head: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor, topk=None):
    """Our drafts and confidences per request: (R, K) each."""
    K = d.config.block_size - 1
    drafts, conf = [], []
    for r in range(len(anchors)):
        h = hidden[r * K:(r + 1) * K]
        block = markov_block(d.heads, h @ head.T, anchors[r:r + 1], lambda x: to_target_ids(d, x), topk=topk)
        drafts.append(block.drafts)
        conf.append(slot_confidence(d.heads, h, block.embeds))
    return torch.stack(drafts), torch.stack(conf)


def _vllm_speculator():
    keep = ("torch", "typing", "collections", "abc", "logging", "dataclasses")
    mod = load_engine_module(_need("vllm", "v1/worker/gpu/spec_decode/dspark/speculator.py"),
                             "vllm.v1.worker.gpu.spec_decode.dspark.speculator",
                             {"vllm.v1.worker.gpu.spec_decode.dflash.speculator": {"DFlashSpeculator": object},
                              # the greedy kernel's result: the first maximum of each row
                              "vllm.v1.worker.gpu.sample.greedy_argmax": {"greedy_argmax": lambda x: x.argmax(-1)},
                              "vllm.logger": {"init_logger": logging.getLogger}}, keep_real=keep)
    return mod.DSparkSpeculator


@pytest.mark.parametrize("topk", [None, 5], ids=["chain", "top-5"])
@pytest.mark.parametrize("pruned", [False, True], ids=["full", "pruned"])
@torch.no_grad()
def test_vllm_drafts_and_confidences_equal_ours(tmp_path, pruned, topk):
    d, target, out = _exported(tmp_path, pruned)
    model = _load_vllm(_hf_config(out), target_layers=d.config.num_target_layers)
    model.load_weights((k, v.float() if v.is_floating_point() else v)
                       for k, v in load_file(str(out / "model.safetensors")).items())
    head_w = target.lm_head.weight.detach().float()
    if not pruned:  # the target's head, shared by load_dspark_model when the export has none
        model.lm_head.weight.data.copy_(head_w)
    K, H, R = d.config.block_size - 1, d.config.hidden_size, REQUESTS
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(R * K, H, generator=g) * 3
    anchors = torch.randint(0, V, (R,), generator=g)
    ids = torch.full((R * (1 + K),), d.config.mask_token_id)
    ids[torch.arange(R) * (1 + K)] = anchors  # the 1 + K queries of a request, the anchor first
    # the state DSparkSpeculator.__init__ / its input preparation would hold for R requests at batch positions 0..
    spec = types.SimpleNamespace(
        model=model, num_speculative_steps=K, use_confidence_head=True, _draft_topk=topk, _fuse_markov_bias=False,
        draft_logits=None, _maybe_predict_acceptance=lambda *a: None, _step_cols=torch.arange(K),
        sample_indices=torch.arange(R * K), sample_idx_mapping=torch.arange(R * K), sample_pos=torch.arange(R * K),
        input_buffers=types.SimpleNamespace(input_ids=ids), _anchor_idx=torch.arange(R) * (1 + K),
        draft_tokens=torch.zeros(R, K, dtype=torch.long), draft_token_confidence_probs=torch.zeros(R, K))
    S = _vllm_speculator()
    for name in ("_sample_sequential", "_sample_sequential_topk", "_sample_markov_chain", "_markov_step",
                 "_sample_logits"):
        setattr(spec, name, types.MethodType(getattr(S, name), spec))
    spec._sample_sequential(R, hidden)

    head, _ = draft_head(d, head_w)
    drafts, conf = _ours(d, head, hidden, anchors, topk)
    assert torch.equal(spec.draft_tokens, drafts)
    torch.testing.assert_close(spec.draft_token_confidence_probs, conf, rtol=0, atol=1e-6)
    plain = to_target_ids(d, (hidden @ head.T).view(R, K, -1).argmax(-1))
    assert (plain != drafts).sum() >= R * K // 2  # the bias decided most drafts: a wrong one would show


@torch.no_grad()
def test_sglang_drafts_and_confidences_equal_ours(tmp_path):
    d, target, out = _exported(tmp_path, pruned=False)  # SGLang serves the full vocabulary only

    class DFlashDraftModel(nn.Module):  # the backbone: its loading is tests/test_dspark_export.py's
        def __init__(self, config=None, quant_config=None, prefix=""):
            super().__init__()
            self.config, self.block_size, self.is_nemotron_35_draft = config, config.block_size, False

        def load_weights(self, weights):
            list(weights)

    class MarkovSampleStep:  # the Triton kernel's temperature-0 branch: argmax of base logits plus the bias
        @staticmethod
        def execute(*, base_logits, bias, temperatures, **kw):
            assert (temperatures == 0).all()
            return (base_logits.float() + bias.float()).argmax(-1)

    keep = ("torch", "typing", "collections", "abc", "logging", "dataclasses")
    checks = {"Bucket": Inert(), "InClosedRange": Inert(), "Invariant": Inert(), "NotNaN": Inert(),
              "expect": lambda invariant, x: x}
    model_mod = load_engine_module(
        _need("sglang", "srt/models/dspark.py"), "sglang.srt.models.dspark",
        {"sglang.srt.models.dflash": {"DFlashDraftModel": DFlashDraftModel},
         "sglang.srt.speculative.dspark_components.dspark_config": vars(_sglang_config_module()),
         "sglang.srt.model_loader.weight_utils": {"default_weight_loader": _shape_checked_copy},
         # a non-static verify mode, where SGLang builds the confidence head
         "sglang.srt.speculative.ragged_verify": {"read_ragged_verify_mode": lambda: "compact",
                                                  "RaggedVerifyMode": types.SimpleNamespace(STATIC="static")},
         "sglang.srt.utils.invariants": checks, "sglang.srt.environ": {"envs": Inert()},
         "msgspec": {"Struct": _Struct}}, keep_real=keep)
    draft_mod = load_engine_module(
        _need("sglang", "srt/speculative/dspark_components/dspark_draft.py"),
        "sglang.srt.speculative.dspark_components.dspark_draft",
        {"sglang.kernels.ops.speculative.dspark.markov_sample": {"MarkovSampleStep": MarkovSampleStep},
         "sglang.srt.utils.invariants": checks, "msgspec": {"Struct": _Struct}},
        keep_real=keep + ("functools", "bisect"))
    model = model_mod.Qwen3DSparkModel(_hf_config(out))
    model.load_weights((k, v.float()) for k, v in load_file(str(out / "model.safetensors")).items())

    K, H, R = d.config.block_size - 1, d.config.hidden_size, REQUESTS
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(R * K, H, generator=g) * 3
    anchors = torch.randint(0, V, (R,), generator=g)
    head_w = target.lm_head.weight.detach().float()  # SGLang drafts over the target's head
    drafts, _ = draft_mod.draft_markov_block(
        markov_head=model.markov_head, base_logits=(hidden @ head_w.T).view(R, K, -1), anchor_tokens=anchors,
        draft_hidden=hidden.view(R, K, -1), step_temperatures=torch.zeros(R),
        noise=types.SimpleNamespace(key=0, offset=torch.zeros(1, dtype=torch.long)),
        tp_sync=types.SimpleNamespace(sync=lambda site, x: x), greedy_draft=True)
    conf, _ = model.compute_confidence(anchor_tokens=anchors, draft_tokens=drafts, confidence_features=hidden)

    ours, our_conf = _ours(d, head_w, hidden, anchors)
    assert torch.equal(drafts, ours)
    torch.testing.assert_close(conf, our_conf, rtol=0, atol=1e-6)
