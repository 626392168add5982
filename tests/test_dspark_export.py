"""A DSpark export as the engines load it: our config.json and tensors, then vLLM 0.34.0's and SGLang 0.5.23's own
DSpark config parsing and load_weights run on the CPU against it (tests/engine_source.py: their source files
executed unmodified, their imports stand-ins), full and pruned vocabulary: every parameter they declare is filled
with our tensor, or shared from the target where they say so."""

from __future__ import annotations

import json
import logging
import re
import types

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.evaluation.export import export_drafter
from dflash_lab.evaluation.export_variant import variant_export
from tests.conftest import make_tiny_qwen3
from tests.engine_source import HOW, Inert, engine_file, load_engine_module

V, PRUNED = 256, 96


def _drafter(pruned: bool, confidence: bool = True, target=None) -> DFlashDrafter:
    target = target if target is not None else make_tiny_qwen3()
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=8, mask_token_id=255,
                                   draft_vocab_size=PRUNED if pruned else None, drafter_variant="dspark",
                                   markov_rank=8, enable_confidence_head=confidence)
    d = DFlashDrafter(dc)
    d.init_weights(torch.Generator().manual_seed(0), std=0.1)
    if pruned:  # draft id i is target id 2i: offsets i
        d.d2t.copy_(torch.arange(PRUNED))
    return d


@pytest.fixture(params=[False, True], ids=["full", "pruned"])
def exported(request, tmp_path):
    """(drafter, export folder, log lines) of a DSpark drafter saved as a weights file + its config, exported."""
    target = make_tiny_qwen3()
    target.save_pretrained(tmp_path / "target")  # a pruned export carries the target head's rows: it reads them here
    d = _drafter(request.param, target=target)
    src = tmp_path / "src"
    src.mkdir()
    (src / "drafter_config.json").write_text(json.dumps(d.config.to_dict()))
    save_file({k: v.contiguous() for k, v in d.state_dict().items()}, str(src / "drafter.safetensors"))
    lines = []
    out = export_drafter(src / "drafter.safetensors", tmp_path / "export", log=lines.append,
                         target=str(tmp_path / "target"))
    return d, out, lines


def test_dspark_export_writes_the_heads_and_the_keys_the_engines_read(exported):
    d, out, lines = exported
    cfg = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    vd = d.config.draft_vocab_size or V
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and "auto_map" not in cfg
    assert (cfg["block_size"], cfg["sample_from_anchor"], cfg["dflash_lab"]["training_block_size"]) == (7, False, 8)
    assert (cfg["markov_rank"], cfg["markov_head_type"], cfg["draft_vocab_size"]) == (8, "vanilla", vd)
    assert cfg["enable_confidence_head"] is True and cfg["confidence_head_with_markov"] is True
    assert tensors["markov_head.markov_w1.weight"].shape == (V, 8)
    assert tensors["markov_head.markov_w2.weight"].shape == (vd, 8)
    assert tensors["confidence_head.proj.weight"].shape == (1, 64 + 8)
    assert tensors["confidence_head.proj.weight"].dtype == torch.float32  # both engines hold this head in fp32
    assert torch.equal(tensors["markov_head.markov_w2.weight"],
                       d.heads.markov_head.markov_w2.weight.detach().to(torch.bfloat16))
    assert not any(k.startswith("heads.") for k in tensors)
    sglang_note = [line for line in lines if line.startswith("SGLang 0.5.23 cannot serve")]
    assert len(sglang_note) == (1 if d.config.draft_vocab_size else 0)
    # what each engine drafts per step: the 7 drafts of an 8-slot training block, as the serving command says
    # (vLLM's num_speculative_tokens); the readings said 6 for vLLM and 7 for SGLang, the DFlash rule
    from dflash_lab.evaluation.serving_engines import engine_readings

    readings = engine_readings(cfg, set(tensors))
    assert {e: r["draft_tokens"] for e, r in readings.items()} == {"vllm": 7, "sglang": 7, "speculators": 7}
    assert any('"num_speculative_tokens": 7' in line for line in lines)


def test_a_dflash_drafter_exports_nothing_more():
    target = make_tiny_qwen3()
    dc = DrafterConfig.from_target(target.config, num_draft_layers=1, block_size=8, mask_token_id=255)
    part = variant_export(dc, DFlashDrafter(dc).state_dict(), torch.bfloat16)
    assert part.tensors == {} and part.config == {} and part.notes == []


# ---------------------------------------------------------------------------------------------------------------
# vLLM 0.34.0: qwen3_dspark.Qwen3DSparkForCausalLM.__init__ / load_weights and DSparkSpeculatorConfig, as shipped
# ---------------------------------------------------------------------------------------------------------------

def _need(engine: str, rel: str):
    path = engine_file(engine, rel)
    if not path.is_file():
        pytest.skip(HOW)
    return path


def _shape_checked_copy(param: torch.Tensor, loaded: torch.Tensor) -> None:
    """Stand-in for vLLM's / SGLang's default_weight_loader: the same shape assertion, then the copy."""
    assert param.size() == loaded.size(), f"Attempted to load weight ({loaded.size()}) into parameter ({param.size()})"
    param.data.copy_(loaded)


def _param(*shape, dtype=torch.float32, shards: dict | None = None) -> nn.Parameter:
    """A stand-in parameter of a declared shape; `shards` {shard id: (row offset, rows)} gives it the fused
    layers' weight_loader (q/k/v into qkv_proj, gate/up into gate_up_proj) reading the mapper's shard id."""
    p = nn.Parameter(torch.full(shape, float("nan"), dtype=dtype), requires_grad=False)
    if shards is not None:
        def load(param, loaded, shard_id=None):
            start, rows = shards[loaded.shard_id if shard_id is None else shard_id]
            assert loaded.shape == (rows, *param.shape[1:]), (loaded.shape, rows)
            param.data[start:start + rows].copy_(loaded)
        p.weight_loader = load
    return p


class VocabParallelEmbedding(nn.Module):
    """vLLM's embedding as a parameter holder of its declared shape (its loader tells tied embeddings by type)."""

    def __init__(self, num_embeddings, embedding_dim, *args, **kw):
        super().__init__()
        self.weight = _param(num_embeddings, embedding_dim)


def _vllm_layers(config):
    """vLLM's layer classes as parameter holders of their declared shapes."""

    class ParallelLMHead(VocabParallelEmbedding):
        def __init__(self, num_embeddings, embedding_dim, bias=False, quant_config=None, prefix="", **kw):
            super().__init__(num_embeddings, embedding_dim)

    class ReplicatedLinear(nn.Module):
        def __init__(self, input_size, output_size, bias=True, return_bias=True, params_dtype=None, prefix="", **kw):
            super().__init__()
            self.weight = _param(output_size, input_size, dtype=params_dtype or torch.float32)
            if bias:
                self.bias = _param(output_size, dtype=params_dtype or torch.float32)
            self.return_bias = return_bias

        def forward(self, x):  # one device: y = x W^T + b, and (y, None) where vLLM returns the bias apart
            y = nn.functional.linear(x, self.weight, getattr(self, "bias", None))
            return (y, None) if self.return_bias else y

    return ParallelLMHead, ReplicatedLinear


class LogitsProcessor:
    """vLLM's LogitsProcessor on one device without soft cap: hidden @ head^T, the first org_vocab_size columns,
    times `scale` (layers/logits_processor.py forward / _get_logits)."""

    def __init__(self, vocab_size, org_vocab_size=None, scale=1.0, **kw):
        self.org_vocab_size, self.scale = org_vocab_size or vocab_size, scale

    def __call__(self, lm_head, hidden_states, embedding_bias=None, skip_gather=False):
        logits = nn.functional.linear(hidden_states, lm_head.weight, embedding_bias)[..., :self.org_vocab_size]
        return logits * self.scale if self.scale != 1.0 else logits


def _vllm_backbone(utils, mapper):
    """DFlashQwen3Model as vLLM declares its parameters (fused qkv_proj / gate_up_proj, fc, norms, the embedding
    and mask_embedding) and loads them (AutoWeightsLoader with its hf_to_vllm_mapper)."""

    class DFlashQwen3Model(nn.Module):
        hf_to_vllm_mapper = mapper

        def __init__(self, *, vllm_config, start_layer_id=0, prefix=""):
            super().__init__()
            c = self.config = vllm_config.speculative_config.draft_model_config.hf_config
            self.quant_config = None
            H, I, hd, nh, nkv = c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads, \
                c.num_key_value_heads
            self.embed_tokens = VocabParallelEmbedding(c.vocab_size, H)
            self.mask_embedding = _param(H)
            self.layers = nn.ModuleList()
            for _ in range(c.num_hidden_layers):
                layer = nn.Module()
                attn, mlp = nn.Module(), nn.Module()
                q, kv = nh * hd, nkv * hd
                for name, p in (("qkv_proj", _param(q + 2 * kv, H, shards={"q": (0, q), "k": (q, kv),
                                                                          "v": (q + kv, kv)})),
                                ("o_proj", _param(H, q)), ("q_norm", _param(hd)), ("k_norm", _param(hd))):
                    sub = nn.Module()
                    sub.weight = p
                    setattr(attn, name, sub)
                for name, p in (("gate_up_proj", _param(2 * I, H, shards={0: (0, I), 1: (I, I)})),
                                ("down_proj", _param(H, I))):
                    sub = nn.Module()
                    sub.weight = p
                    setattr(mlp, name, sub)
                layer.self_attn, layer.mlp = attn, mlp
                for name in ("input_layernorm", "post_attention_layernorm"):
                    sub = nn.Module()
                    sub.weight = _param(H)
                    setattr(layer, name, sub)
                self.layers.append(layer)
            n_feat = len(c.dflash_config["target_layer_ids"])
            self.fc = nn.Module()
            self.fc.weight = _param(H, n_feat * H)
            for name in ("hidden_norm", "norm"):
                sub = nn.Module()
                sub.weight = _param(H)
                setattr(self, name, sub)

        def load_weights(self, weights):  # as vLLM's DFlashQwen3Model.load_weights without a context-KV fusion
            return utils.AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)

    return DFlashQwen3Model


def _load_vllm(hf_config, target_layers: int):
    """Qwen3DSparkForCausalLM built by its own __init__ on stand-in layers, vLLM's real AutoWeightsLoader and
    WeightsMapper (models/utils.py) and the backbone mapper of qwen3_dflash.py."""
    import re as std_re

    regex = {k: getattr(std_re, k) for k in dir(std_re) if not k.startswith("__")}  # `regex` is re's superset
    keep = ("torch", "typing", "collections", "itertools", "contextlib", "dataclasses", "functools", "abc",
            "transformers", "math", "io")
    weight_utils = {"default_weight_loader": _shape_checked_copy}
    embedding = {"VocabParallelEmbedding": VocabParallelEmbedding}
    reload = {"support_quantized_model_reload_from_hp_weights": lambda f: f}
    utils = load_engine_module(_need("vllm", "model_executor/models/utils.py"), "vllm.model_executor.models.utils",
                               {"regex": regex, "vllm.model_executor.model_loader.weight_utils": weight_utils,
                                "vllm.model_executor.model_loader.reload": reload,
                                "vllm.model_executor.layers.vocab_parallel_embedding": embedding}, keep_real=keep)
    dflash = load_engine_module(_need("vllm", "model_executor/models/qwen3_dflash.py"),
                                "vllm.model_executor.models.qwen3_dflash",
                                {"regex": regex, "vllm.model_executor.models.utils": vars(utils),
                                 "vllm.compilation.decorators": {"support_torch_compile": lambda cls: cls}},
                                keep_real=keep)
    mapper = dflash.DFlashQwen3Model.hf_to_vllm_mapper
    assert isinstance(mapper, utils.WeightsMapper), "qwen3_dflash.py's backbone mapper did not load"
    ParallelLMHead, ReplicatedLinear = _vllm_layers(hf_config)
    Backbone = _vllm_backbone(utils, mapper)

    class DFlashQwen3ForCausalLM(nn.Module):
        pass

    provided = {
        "vllm.model_executor.models.utils": vars(utils),
        "vllm.model_executor.models.qwen3_dflash": {"DFlashQwen3ForCausalLM": DFlashQwen3ForCausalLM,
                                                   "DFlashQwen3Model": Backbone},
        "vllm.model_executor.layers.vocab_parallel_embedding": {"ParallelLMHead": ParallelLMHead},
        "vllm.model_executor.layers.linear": {"ReplicatedLinear": ReplicatedLinear},
        "vllm.model_executor.layers.logits_processor": {"LogitsProcessor": LogitsProcessor},
        "vllm.logger": {"init_logger": logging.getLogger},
    }
    mod = load_engine_module(_need("vllm", "model_executor/models/qwen3_dspark.py"),
                             "vllm.model_executor.models.qwen3_dspark", provided, keep_real=keep)
    vllm_config = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(draft_model_config=types.SimpleNamespace(hf_config=hf_config)),
        model_config=types.SimpleNamespace(get_total_num_hidden_layers=lambda: target_layers,
                                           get_vocab_size=lambda: V, dtype=torch.float32))
    return mod.Qwen3DSparkForCausalLM(vllm_config=vllm_config)


def _hf_config(out):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(out))


def test_vllm_loads_every_dspark_parameter_from_the_export(exported):
    d, out, _ = exported
    model = _load_vllm(_hf_config(out), target_layers=d.config.num_target_layers)
    tensors = load_file(str(out / "model.safetensors"))
    model.load_weights((k, v.float() if v.is_floating_point() else v) for k, v in tensors.items())
    # shared from the target by load_dspark_model: the embedding always; the head only at the target's vocabulary
    pruned = d.config.draft_vocab_size is not None
    shared = {"model.embed_tokens.weight"} | (set() if pruned else {"lm_head.weight"})
    unfilled = {n for n, p in model.named_parameters() if p.is_floating_point() and p.isnan().any()} - shared
    # mask_embedding: vLLM's placeholder, unused unless a checkpoint ships one. A pruned head's rows are the DFlash
    # export's part (export.py writes lm_head = the target head's draft rows where it does): until it does, vLLM
    # neither loads nor shares that head, and this names it.
    head_missing = {"lm_head.weight"} if pruned and "lm_head.weight" not in tensors else set()
    assert unfilled == {"model.mask_embedding"} | head_missing
    heads = model.model
    assert torch.equal(heads.markov_head.markov_w2.weight, tensors["markov_head.markov_w2.weight"].float())
    assert torch.equal(heads.confidence_head.proj.bias, tensors["confidence_head.proj.bias"])
    qkv = heads.layers[1].self_attn.qkv_proj.weight
    k = tensors["layers.1.self_attn.k_proj.weight"].float()
    assert torch.equal(qkv[qkv.shape[0] - 2 * k.shape[0]: qkv.shape[0] - k.shape[0]], k)
    if d.config.draft_vocab_size:  # the d2t map, and the draft-vocabulary logits scattered up through it
        assert torch.equal(model.draft_id_to_target_id, tensors["d2t"])
        assert model.map_draft_to_target(torch.tensor([0, 5])).tolist() == [0, 10]
    else:
        assert model.draft_id_to_target_id is None
    assert model.model.confidence_head.with_markov  # confidence_head_with_markov read from the export


def test_vllm_dspark_config_reads_the_block_the_drafts_and_the_top_k_option(exported):
    d, out, _ = exported
    keep = ("torch", "typing", "collections")

    class DFlashSpeculatorConfig:
        pass

    mod = load_engine_module(_need("vllm", "v1/worker/gpu/spec_decode/dspark/config.py"),
                             "vllm.v1.worker.gpu.spec_decode.dspark.config",
                             {"vllm.v1.worker.gpu.spec_decode.dflash.config":
                              {"DFlashSpeculatorConfig": DFlashSpeculatorConfig}}, keep_real=keep)
    hf = _hf_config(out)
    draft = types.SimpleNamespace(hf_config=hf, architectures=hf.architectures, model=str(out / "dspark"))
    target = types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="qwen3"))
    spec = types.SimpleNamespace(draft_model_config=draft, target_model_config=target, num_speculative_tokens=None,
                                 dspark_draft_topk=4, draft_lm_head_quantization=None)
    mod.DSparkSpeculatorConfig.resolve_num_speculative_tokens(spec)
    assert spec.num_speculative_tokens == d.config.block_size - 1  # 7 drafts, our anchor the extra query
    mod.DSparkSpeculatorConfig.apply_options(spec)  # top-k is accepted for Qwen3DSparkModel within the vocabulary
    assert hf.dspark_draft_topk == 4
    spec.dspark_draft_topk = (d.config.draft_vocab_size or V) + 1
    with pytest.raises(ValueError, match="between 1 and the draft vocabulary size"):
        mod.DSparkSpeculatorConfig.apply_options(spec)
    assert getattr(hf, "sample_from_anchor", True) is False  # the speculator's 1 + N fill-in layout
    assert mod.DSparkSpeculatorConfig.matches(spec)  # the method is detected from a path naming dspark


# ---------------------------------------------------------------------------------------------------------------
# SGLang 0.5.23: models/dspark.py's DSparkDraftMixin (__init__, load_weights) and parse_dspark_draft_config
# ---------------------------------------------------------------------------------------------------------------

def _sglang_config_module():
    keep = ("torch", "typing", "collections", "dataclasses", "numbers", "json", "logging")
    utils = load_engine_module(_need("sglang", "srt/speculative/dflash_utils.py"),
                               "sglang.srt.speculative.dflash_utils", {}, keep_real=keep)
    return load_engine_module(_need("sglang", "srt/speculative/dspark_components/dspark_config.py"),
                              "sglang.srt.speculative.dspark_components.dspark_config",
                              {"sglang.srt.speculative.dflash_utils": vars(utils),
                               "msgspec": {"Struct": _Struct}}, keep_real=keep)


class _Struct:
    """msgspec.Struct's keyword construction (the wheel is not installed here)."""

    def __init_subclass__(cls, **kwargs):
        pass

    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_sglang_parses_the_dspark_config_of_the_export(exported):
    d, out, _ = exported
    cfg = _sglang_config_module().parse_dspark_draft_config(draft_hf_config=_hf_config(out))
    assert (cfg.gamma, cfg.markov_rank, cfg.markov_head_type) == (7, 8, "vanilla")
    assert (cfg.mask_token_id, cfg.target_layer_ids) == (255, list(d.config.target_layer_ids))


def test_sglang_loads_every_dspark_head_parameter_of_a_full_vocabulary_export(exported):
    """DSparkDraftMixin's own __init__ (build_markov_head, build_confidence_head) and load_weights: markov and
    confidence tensors through its checks (a missing confidence weight or an unknown markov name raises), the
    backbone's names handed to DFlashDraftModel.load_weights (checked against SGLang's DFlash model by the serving
    issue's test; here: exactly our backbone tensors). A pruned export's markov_w2 does not fit SGLang's full-vocab
    head: its loader's shape check refuses it, as the export's note says."""
    d, out, _ = exported
    config_mod = _sglang_config_module()
    handed = []

    class DFlashDraftModel(nn.Module):
        def __init__(self, config=None, quant_config=None, prefix=""):
            super().__init__()
            self.config, self.block_size = config, config.block_size
            self.is_nemotron_35_draft = False  # SGLang's DFlashDraftModel sets it from the config's architecture

        def load_weights(self, weights):
            handed.extend(name for name, _ in weights)

    keep = ("torch", "typing", "collections", "abc", "logging", "dataclasses")
    env = Inert()
    mod = load_engine_module(
        _need("sglang", "srt/models/dspark.py"), "sglang.srt.models.dspark",
        {"sglang.srt.models.dflash": {"DFlashDraftModel": DFlashDraftModel},
         "sglang.srt.speculative.dspark_components.dspark_config": vars(config_mod),
         "sglang.srt.model_loader.weight_utils": {"default_weight_loader": _shape_checked_copy},
         "sglang.srt.speculative.ragged_verify": {"read_ragged_verify_mode": lambda: "ragged",
                                                  "RaggedVerifyMode": types.SimpleNamespace(STATIC="static")},
         "sglang.srt.environ": {"envs": env}, "msgspec": {"Struct": _Struct}}, keep_real=keep)
    hf = _hf_config(out)
    model = mod.Qwen3DSparkModel(hf)
    tensors = load_file(str(out / "model.safetensors"))
    for p in model.parameters():
        p.data.fill_(float("nan"))
    if d.config.draft_vocab_size:
        refused = f"([{d.config.draft_vocab_size}, 8])) into parameter (torch.Size([{V}, 8]))"
        with pytest.raises(AssertionError, match=re.escape(refused)):
            model.load_weights((k, v.float()) for k, v in tensors.items() if k != "d2t")
        return
    model.load_weights((k, v.float()) for k, v in tensors.items())
    assert not any(p.isnan().any() for p in model.parameters())  # markov_w1, markov_w2, confidence proj
    assert torch.equal(model.markov_head.markov_w1.weight, tensors["markov_head.markov_w1.weight"].float())
    assert sorted(handed) == sorted(k for k in tensors if not k.startswith(("markov_head.", "confidence_head.")))
    assert model.gamma == 7 and model.sample_from_anchor is False


# ---------------------------------------------------------------------------------------------------------------
# Served as evaluated: the drafting options pinned in the commands, checked against the engines' own option names
# ---------------------------------------------------------------------------------------------------------------

def _vllm_speculative_fields() -> tuple[set, str]:
    """The field names of vLLM's SpeculativeConfig and the source of its DraftSampleMethod, read from its file."""
    import ast

    src = _need("vllm", "config/speculative.py").read_text()
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    method = next(ast.get_source_segment(src, n) for n in tree.body
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DraftSampleMethod")
    return fields, method


def test_serving_commands_pin_the_drafting_the_drafter_was_evaluated_with(exported):
    import shlex

    from dflash_lab.evaluation.export_serving import export_commands

    d, out, lines = exported
    fields, sample_method = _vllm_speculative_fields()
    sglang_env = _need("sglang", "srt/environ.py").read_text()
    assert "SGLANG_DSPARK_USE_GREEDY_DRAFT = EnvBool(False)" in sglang_env  # SGLang samples drafts by default

    def spec(cmds):
        words = shlex.split(cmds["vllm"])
        return json.loads(words[words.index("--speculative-config") + 1])

    pruned = d.config.draft_vocab_size is not None
    default = export_commands(out, "target")
    assert spec(default)["draft_sample_method"] == "greedy"  # evaluate's default: argmax drafts
    assert any("draft_sample_method" in line for line in lines)  # the export printed the pinned command
    assert ("sglang" in default) is (not pruned)
    if not pruned:
        assert default["sglang"].startswith("SGLANG_DSPARK_USE_GREEDY_DRAFT=1 python -m sglang.launch_server ")
    sampled = export_commands(out, "target", draft_sampling="sample")
    assert spec(sampled)["draft_sample_method"] == "probabilistic"
    if not pruned:
        assert sampled["sglang"].startswith("SGLANG_DSPARK_USE_GREEDY_DRAFT=0 ")
    topk = export_commands(out, "target", draft_topk=4, adaptive_verification=True)
    assert spec(topk)["dspark_draft_topk"] == 4 and spec(topk)["enable_adaptive_verification"] is True
    assert set(topk) == {"vllm"}  # SGLang has no top-k option and plans its verify budget its own way
    for cmds in (default, sampled, topk):  # every key one vLLM 0.34.0 option, every value one it accepts
        assert set(spec(cmds)) <= fields, set(spec(cmds)) - fields
        assert f'"{spec(cmds)["draft_sample_method"]}"' in sample_method
    with pytest.raises(ValueError, match="draft_sampling='coupled' has no serving equivalent"):
        export_commands(out, "target", draft_sampling="coupled")
    # the export's command line pins the same, printed as it writes the folder
    printed = []
    export_drafter(out.parent / "src" / "drafter.safetensors", out.parent / "export-sampled", log=printed.append,
                   target=str(out.parent / "target"), drafting={"draft_sampling": "sample", "draft_topk": 4})
    served = [line.split(": ", 1)[1] for line in printed if line.startswith("serve with vllm")]
    assert len(served) == 1 and spec({"vllm": served[0]})["draft_sample_method"] == "probabilistic"
    assert spec({"vllm": served[0]})["dspark_draft_topk"] == 4
    assert not any(line.startswith("serve with sglang") for line in printed)


def test_without_a_confidence_head_sglang_serves_only_static_and_adaptive_verification_is_refused(tmp_path):
    from dflash_lab.evaluation.serving_engines import serving_commands

    d = _drafter(False, confidence=False)
    part = variant_export(d.config, d.state_dict(), torch.bfloat16)
    assert not any(k.startswith("confidence_head.") for k in part.tensors)
    assert len(part.notes) == 1 and "SGLANG_RAGGED_VERIFY_MODE=static" in part.notes[0]
    cfg = {"block_size": 7, "vocab_size": V, **part.config}
    assert "sglang" in serving_commands(cfg, "/x", "t")
    with pytest.raises(ValueError, match="adaptive_verification needs the confidence head"):
        serving_commands(cfg, "/x", "t", adaptive_verification=True)
    dflash = {"block_size": 8, "vocab_size": V, "architectures": ["DFlashDraftModel"]}
    with pytest.raises(ValueError, match="this export is a DFlash drafter"):
        serving_commands(dflash, "/x", "t", draft_sampling="sample")
    src = tmp_path / "src"  # refused by the export before it writes anything
    src.mkdir()
    (src / "drafter_config.json").write_text(json.dumps(d.config.to_dict()))
    save_file({k: v.contiguous() for k, v in d.state_dict().items()}, str(src / "drafter.safetensors"))
    with pytest.raises(ValueError, match="adaptive_verification needs the confidence head"):
        export_drafter(src / "drafter.safetensors", tmp_path / "out", log=lambda *a: None,
                       drafting={"adaptive_verification": True})
    assert not (tmp_path / "out").exists()


def test_a_dspark_export_reads_back_as_the_drafter_that_was_exported(exported):
    from dflash_lab.evaluation.export import load_exported, resolve_drafter

    d, out, _ = exported
    cfg, back = load_exported(out)
    assert (cfg.drafter_variant, cfg.block_size, cfg.markov_rank) == ("dspark", 8, 8)
    assert cfg.enable_confidence_head and cfg.confidence_head_with_markov
    assert cfg.draft_vocab_size == d.config.draft_vocab_size and resolve_drafter(out).kind == "exported"
    own = d.state_dict()
    for name, t in back.state_dict().items():
        if name.startswith("rotary_emb.") or (name == "lm_head.weight" and cfg.draft_vocab_size):
            continue  # recomputed / the target's rows (export_check compares those)
        exported_as = torch.float32 if name.startswith("heads.confidence_head.") else torch.bfloat16
        want = own[name].to(exported_as).to(t.dtype) if own[name].is_floating_point() else own[name]
        assert torch.equal(t, want), name
    # an export without our dflash_lab block: the variant from its architecture, the block from its layout
    raw = json.loads((out / "config.json").read_text())
    raw.pop("dflash_lab")
    (out / "config.json").write_text(json.dumps(raw))
    cfg2, _ = load_exported(out)
    assert (cfg2.drafter_variant, cfg2.block_size, cfg2.markov_rank) == ("dspark", 8, 8)
