"""Target loading: bundled benchmark configs, local safetensors directories, progress reports, concurrent replicas,
and the feature extractor that stops after the last needed layer."""

import pytest
import torch

from dflash_lab.target.features import FeatureExtractor, embedding_of, lm_head_weight
from dflash_lab.target.load import (LoadProgress, TargetLoadError, bench_config_names, load_target, load_target_config,
                                load_targets)
from tests.conftest import make_tiny_qwen3


def test_bundled_configs_are_real_architectures():
    assert {"qwen3-8b", "qwen3-32b", "tiny"} <= set(bench_config_names())
    c = load_target_config("bench:qwen3-32b")
    assert (c.hidden_size, c.num_hidden_layers, c.model_type) == (5120, 64, "qwen3")
    with pytest.raises(TargetLoadError, match="unknown benchmark target 'bench:nope'. Known: .*bench:qwen3-8b"):
        load_target_config("bench:nope")


def test_random_init_reports_progress_and_replicas_share_a_cpu():
    reports: list[LoadProgress] = []
    models = load_targets("bench:tiny", ["cpu", "cpu"], dtype=torch.float32, progress=reports.append)
    assert models[0] is models[1]  # one model per distinct device
    last = reports[-1]
    n = len(list(models[0].parameters()))
    assert last.done and last.tensors_done == last.tensors_total == n and last.gb_done == pytest.approx(last.gb_total)
    assert "done" in last.line() and last.device == "cpu" and last.memory_gb is None
    assert lm_head_weight(models[0]) is embedding_of(models[0]).weight  # tie_word_embeddings kept
    assert all(not p.requires_grad for p in models[0].parameters())
    inv = models[0].model.rotary_emb.inv_freq
    assert not inv.is_meta and inv[0] == 1.0  # RoPE tables rebuilt on the device, not left on meta


def test_local_directory_loads_exact_weights_with_progress(tmp_path):
    ref = make_tiny_qwen3(tie=False, layers=4, hidden=64, vocab=256, seed=3)
    ref.save_pretrained(tmp_path / "m")
    reports = []
    m = load_target(str(tmp_path / "m"), dtype=torch.float32, progress=reports.append)
    for (name, a), (_, b) in zip(ref.named_parameters(), m.named_parameters()):
        assert torch.equal(a, b), name
    assert reports[-1].done and reports[-1].tensors_done == len(list(ref.parameters()))
    ids = torch.randint(0, 256, (2, 24))
    assert torch.allclose(ref(ids).logits, m(ids).logits, atol=1e-5)


def test_missing_weights_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    ref = make_tiny_qwen3(tie=False, layers=4, hidden=64, vocab=256)
    ref.save_pretrained(tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    sd = load_file(str(f))
    sd.pop("model.layers.2.mlp.up_proj.weight")
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(TargetLoadError, match="1 weights are missing.*model.layers.2.mlp.up_proj.weight"):
        load_target(str(tmp_path / "m"))


def test_feature_extractor_stops_after_last_needed_layer_and_matches_hf():
    model = make_tiny_qwen3(layers=8)
    ran = []
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda mod, inp, out, i=i: ran.append(i))
    fe = FeatureExtractor(model, (1, 3, 5))
    ids = torch.randint(0, 256, (2, 20))
    feats = fe(ids)
    assert ran == list(range(6))  # layers 6 and 7 never run
    hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.allclose(feats, torch.cat([hs[i + 1] for i in (1, 3, 5)], -1), atol=1e-5)
    ran.clear()
    assert torch.equal(fe(ids), feats) and ran == list(range(6))  # cached masks/RoPE: same result on reuse
