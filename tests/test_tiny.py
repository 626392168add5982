"""The embedded tiny target: loads with the Auto classes, renders ChatML, keeps <|mask|> unused, answers exactly."""
import hashlib
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from dflash_lab.tiny import (TINY_HELDOUT_DATA, TINY_TARGET_DIR, TINY_TRAIN_DATA, ensure_tiny_target,
                             tiny_data_path, tiny_heldout_path)
from dflash_lab.tiny import tasks


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure_tiny_target())


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return AutoModelForCausalLM.from_pretrained(ensure_tiny_target()).eval()


@pytest.fixture(scope="module")
def train_convs():
    return _read(tiny_data_path())


@pytest.fixture(scope="module")
def heldout():
    return _read(tiny_heldout_path())


def test_paths_point_into_committed_assets():
    assert ensure_tiny_target() == TINY_TARGET_DIR
    assert tiny_data_path() == TINY_TRAIN_DATA and tiny_heldout_path() == TINY_HELDOUT_DATA
    for p in (TINY_TARGET_DIR / "model.safetensors", TINY_TARGET_DIR / "tokenizer.json", TINY_TRAIN_DATA,
              TINY_HELDOUT_DATA):
        assert p.is_file(), p
    info = json.loads((TINY_TARGET_DIR / "build_info.json").read_text())
    digest = hashlib.sha256((TINY_TARGET_DIR / "model.safetensors").read_bytes()).hexdigest()
    assert info["model_safetensors_sha256"] == digest
    assert (TINY_TARGET_DIR / "model.safetensors").stat().st_size <= 5_000_000


def test_config_is_qwen3_8_layers_tied(model, tokenizer):
    cfg = AutoConfig.from_pretrained(TINY_TARGET_DIR)
    assert cfg.model_type == "qwen3" and cfg.num_hidden_layers == 8 and cfg.tie_word_embeddings
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (128, 4, 2, 32)
    assert cfg.vocab_size % 64 == 0 and len(tokenizer) < cfg.vocab_size < len(tokenizer) + 64
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert model.dtype == torch.float32
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (im_end, eot, eot)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_renders_chatml(tokenizer):
    msgs = [{"role": "user", "content": "Count from 1 to 3."}, {"role": "assistant", "content": "1 2 3"},
            {"role": "user", "content": "Now do the same from 4 to 6."}, {"role": "assistant", "content": "4 5 6"}]
    assert tokenizer.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>user\nCount from 1 to 3.<|im_end|>\n<|im_start|>assistant\n1 2 3<|im_end|>\n"
        "<|im_start|>user\nNow do the same from 4 to 6.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n4 5 6<|im_end|>\n")
    head = "<|im_start|>user\nCount from 1 to 3.<|im_end|>\n<|im_start|>assistant\n"
    render = lambda **kw: tokenizer.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True, **kw)
    assert render(enable_thinking=False) == head + "<think>\n\n</think>\n\n"
    assert render(enable_thinking=True) == head and render() == head


def test_reasoning_kept_only_after_last_user(tokenizer):
    think = {"role": "assistant", "content": "<think>\nI count up.\n</think>\n\n1 2 3"}
    one = tokenizer.apply_chat_template([{"role": "user", "content": "Count from 1 to 3."}, think], tokenize=False)
    assert "<think>\nI count up.\n</think>\n\n1 2 3<|im_end|>" in one
    two = tokenizer.apply_chat_template([{"role": "user", "content": "Count from 1 to 3."}, think,
                                         {"role": "user", "content": "Again."}], tokenize=False)
    assert "I count up" not in two and "<|im_start|>assistant\n1 2 3<|im_end|>" in two


def test_assistant_mask_covers_answers(tokenizer):
    msgs = [{"role": "user", "content": "Count from 1 to 3."}, {"role": "assistant", "content": "1 2 3"}]
    enc = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    kept = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m]
    assert tokenizer.decode(kept) == "<think>\n\n</think>\n\n1 2 3<|im_end|>"


def test_generation_prompt_tokens_match_full_chat(tokenizer, heldout):
    """The prompt's tokens are a prefix of the full chat's tokens (no merge across the prompt/answer boundary)."""
    for conv in heldout[:20]:
        full = tokenizer.apply_chat_template(conv["messages"], tokenize=True, return_dict=True)["input_ids"]
        text = tokenizer.apply_chat_template(conv["messages"][:-1], tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert list(full[:len(prompt)]) == list(prompt)


def test_mask_token_reserved_and_unused(model, tokenizer, train_convs):
    mask_id = tokenizer.mask_token_id
    assert tokenizer.mask_token == "<|mask|>" and mask_id is not None
    assert 0 <= mask_id < model.config.vocab_size
    for conv in train_convs[:300]:
        ids = tokenizer.apply_chat_template(conv["messages"], tokenize=True, return_dict=True)["input_ids"]
        assert mask_id not in ids


def test_trained_target_predicts_heldout_answers(model, tokenizer, heldout):
    """Trained, not random: teacher-forced next-token accuracy on held-out assistant tokens (measured 0.975 on
    40 conversations; a random-init model scores ~0.001). Greedy generation can still slip on a prompt's first
    number (the 1.1M-parameter model copies digits imperfectly) and then keeps the structure (counts on)."""
    from dflash_lab.data.tokenize import tokenize_conversation

    correct = total = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 40 batch-1 forwards of a 1.1M model: latency-bound, 1 thread is fastest
    try:
        for conv in heldout[:40]:
            ids, mask = tokenize_conversation(tokenizer, conv["messages"])[:2]
            x = torch.tensor([ids])
            with torch.no_grad():
                pred = model(x).logits[0, :-1].argmax(-1)
            supervised = torch.tensor(mask[1:], dtype=torch.bool)
            correct += int((pred[supervised] == x[0, 1:][supervised]).sum())
            total += int(supervised.sum())
    finally:
        torch.set_num_threads(threads)
    assert total > 3000 and correct / total >= 0.95, (correct, total)


def test_data_counts_and_min_assistant_tokens(tokenizer, train_convs, heldout):
    assert 3000 <= len(train_convs) <= 5000 and len(heldout) == 100
    train_prompts = {tasks.prompt_key(c) for c in train_convs}
    assert not train_prompts & {tasks.prompt_key(c) for c in heldout}
    two_turn = sum(len(c["messages"]) == 4 for c in train_convs) / len(train_convs)
    assert 0.10 < two_turn < 0.20
    for conv in train_convs + heldout:
        roles = [m["role"] for m in conv["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        n = sum(len(tokenizer.encode(tasks.split_thinking(m["content"])[1], add_special_tokens=False))
                for m in conv["messages"] if m["role"] == "assistant")
        assert n >= 40, conv


def test_task_generator_is_deterministic():
    a = tasks.generate_conversations(50, seed=7)
    assert a == tasks.generate_conversations(50, seed=7)
    assert a != tasks.generate_conversations(50, seed=8)
    train, heldout = tasks.make_datasets(0, 200, 20)
    assert (train, heldout) == tasks.make_datasets(0, 200, 20)


# --- the build script and the committed assets agree -----------------------------------------------------------------
def test_committed_assets_match_the_recorded_sha256():
    from dflash_lab.tiny import build

    recorded = build.read_manifest()
    assert sorted(recorded) == sorted(build.REPRODUCIBLE)
    assert build.manifest(build.ASSETS_DIR) == recorded
    info = json.loads((build.ASSETS_DIR / build.MODEL_SUBDIR / "build_info.json").read_text())
    assert recorded[f"{build.MODEL_SUBDIR}/model.safetensors"] == info["model_safetensors_sha256"]


def test_build_steps_reproduce_the_committed_tokenizer_and_token_count(train_convs):
    """The build's data + tokenizer steps, from the committed data, give the committed tokenizer exactly (the
    committed file also holds the left-padding state the build's greedy evaluation leaves on it) and the recorded
    train-token count; the model step is checked by the manifest (a full build takes ~15 min)."""
    from dflash_lab.tiny import build

    tok = build.train_tokenizer(train_convs)
    new = json.loads(tok.backend_tokenizer.to_str())
    old = json.loads((build.ASSETS_DIR / build.MODEL_SUBDIR / "tokenizer.json").read_text())
    assert new["padding"] is None and old["padding"]["direction"] == "Left"
    assert {k: v for k, v in new.items() if k != "padding"} == {k: v for k, v in old.items() if k != "padding"}
    n_tok = sum(len(build.encode_conversation(tok, c)[0]) for c in train_convs)
    assert n_tok == json.loads((build.ASSETS_DIR / build.MODEL_SUBDIR / "build_info.json").read_text())[
        "train_tokens"] == 392114
