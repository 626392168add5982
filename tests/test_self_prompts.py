"""Target-written prompts: the user header of any chat template, the filters and duplicate removal on crafted
inputs (numbers asserted), the held-out split staying fixed as N grows, the report's arithmetic, and sampling on the
tiny target: deterministic under a seed, the first N turns unchanged when more are asked for, multi-turn."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_lab.config.errors import ConfigError
from dflash_lab.data.chat_formats import DataError, read_chat_data
from dflash_lab.data.prompt_filters import (MinHashIndex, dedup, filter_reason, heldout_unit, is_heldout, jaccard,
                                            normalize, repeated_trigram_ratio, shingles)
from dflash_lab.data.prompt_report import distinct_n, length_histogram
from dflash_lab.data.self_prompts import SelfPromptConfig, main, output_paths, write_self_prompts
from dflash_lab.data.user_turns import SENTINEL, UserTurnFormat
from dflash_lab.target.load import load_target, load_tokenizer
from dflash_lab.target.sampling import GenerationSettings

# Templates written for these tests in the formats of three model families (the tiny target's own is a fourth).
CHATML_DEFAULT_SYSTEM = (  # SmolLM2 / Qwen2.5 style: a default system turn when the conversation has none
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_STYLE = (
    "{{ '<|begin_of_text|>' }}{% if messages[0]['role'] != 'system' %}{{ '<|start_header_id|>system<|end_header_id|>"
    "\\n\\nCutting Knowledge Date: December 2023<|eot_id|>' }}{% endif %}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
PLAIN_TEXT = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


def _tokenizer(template=None, extra_special=()):
    tok = load_tokenizer("tiny")
    if extra_special:
        tok.add_special_tokens({"additional_special_tokens": list(extra_special)})
    if template is not None:
        tok.chat_template = template
    return tok


# ---------------------------------------------------------------------------------------------------------------
# The user header
# ---------------------------------------------------------------------------------------------------------------

def test_user_header_of_the_tiny_template():
    tok = _tokenizer()
    f = UserTurnFormat.of(tok)
    assert f.first_prefix == "<|im_start|>user\n"
    assert f.end_of_turn == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in f.stop_ids
    assert "<|im_start|>" in f.markers and "<think>" in f.markers
    history = [{"role": "user", "content": "Count to 3."}, {"role": "assistant", "content": "1, 2, 3"}]
    # the answer is no longer the last turn, so this template renders it without its <think> block
    assert f.user_prefix(tok, history) == ("<|im_start|>user\nCount to 3.<|im_end|>\n<|im_start|>assistant\n"
                                           "1, 2, 3<|im_end|>\n<|im_start|>user\n")


def test_user_header_with_a_default_system_turn():
    tok = _tokenizer(CHATML_DEFAULT_SYSTEM)
    f = UserTurnFormat.of(tok)
    assert f.first_prefix == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    assert f.end_of_turn == "<|im_end|>"
    later = f.user_prefix(tok, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])
    assert later == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                     "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n")


def test_user_header_of_a_llama3_style_template():
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = _tokenizer(LLAMA3_STYLE, specials)
    f = UserTurnFormat.of(tok)
    assert f.first_prefix == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                              "December 2023<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n")
    assert f.end_of_turn == "<|eot_id|>"
    assert tok.convert_tokens_to_ids("<|eot_id|>") in f.stop_ids
    assert all(s in f.markers for s in specials)
    # the prefix tokenizes to the template's own special tokens (no BOS added twice)
    ids = tok(f.first_prefix, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>") and ids.count(ids[0]) == 1


def test_a_template_that_does_not_close_user_turns_with_a_special_token_is_refused():
    with pytest.raises(DataError, match="does not close a user turn with a special token"):
        UserTurnFormat.of(_tokenizer(PLAIN_TEXT))
    echo_twice = "{% for m in messages %}{{ m['content'] + m['content'] + '<|im_end|>' }}{% endfor %}"
    with pytest.raises(DataError, match="2 times"):
        UserTurnFormat.of(_tokenizer(echo_twice))
    assert SENTINEL not in UserTurnFormat.of(_tokenizer()).first_prefix


# ---------------------------------------------------------------------------------------------------------------
# Filters and duplicates on crafted inputs
# ---------------------------------------------------------------------------------------------------------------

CRAFTED = [  # (text, finish_reason, expected reason)
    ("What is the capital of France?", "stop", None),
    ("Write a haiku about autumn leaves falling on a quiet pond.", "stop", None),
    ("What is 12*13?", "stop", None),
    ("Explain how a bicycle gear works and why lower gears make hills", "length", "truncated"),
    ("   \n\t ", "stop", "empty"),
    ("", "stop", "empty"),
    ("Tell me a joke<|im_start|>assistant", "stop", "template_tokens"),
    ("How do I <think> about this?", "stop", "template_tokens"),
    ("Hello \x07 world, how are you?", "stop", "control_chars"),
    ("Broken bytes \ufffd\ufffd here in the text", "stop", "control_chars"),
    ("1234 5678 + 9999 = ? ## %% $$", "stop", "low_letter_ratio"),
    ("Why? " + "!" * 30, "stop", "repetitive"),
    ("please help me " * 6, "stop", "repetitive"),
    ("I want to learn to cook, I want to learn to cook, I want to learn to cook today", "stop", "repetitive"),
]


def test_each_filter_on_crafted_turns():
    markers = tuple(UserTurnFormat.of(_tokenizer()).markers)
    got = [filter_reason(t, fin, markers=markers) for t, fin, _ in CRAFTED]
    assert got == [want for _, _, want in CRAFTED]
    from collections import Counter

    assert Counter(got) == {None: 3, "empty": 2, "template_tokens": 2, "control_chars": 2, "repetitive": 3,
                            "truncated": 1, "low_letter_ratio": 1}
    assert repeated_trigram_ratio("please help me " * 6) == pytest.approx(1 - 3 / 16)
    assert repeated_trigram_ratio("a b c d e") == 0.0


def test_exact_and_near_duplicates():
    base = "can you give me a list of the five biggest challenges that new entrepreneurs face in their first year"
    texts = [
        base,                                                   # 0 kept
        "  Can you give me a LIST of the five biggest challenges that new entrepreneurs face in their first year ",
        "I'm struggling with a situation at work and need some advice on what to do",  # 2 kept
        base.replace("biggest", "largest"),                     # 3: one word changed -> near duplicate of 0
        base.replace("five biggest", "ten most common"),        # 4: two words -> three, Jaccard 0.59 -> kept
        "i'm struggling with a situation at work and need some advice on what to do",  # 5: exact of 2 (case)
        "Hi", "hi", "Hello",                                    # 6 kept, 7 exact of 6, 8 kept
    ]
    # 17 trigrams each, 3 differ: exactly at the threshold 0.7
    assert jaccard(shingles(texts[0]), shingles(texts[3])) == pytest.approx(14 / 20)
    assert jaccard(shingles(texts[0]), shingles(texts[4])) == pytest.approx(13 / 22)
    r = dedup(texts, near_threshold=0.7)
    assert r.kept == [0, 2, 4, 6, 8]
    assert r.exact == [(1, 0), (5, 2), (7, 6)]
    assert r.near == [(3, 0)]
    assert dedup(texts, near_threshold=None).kept == [0, 2, 3, 4, 6, 8]
    assert dedup(texts, near_threshold=0.5).near == [(3, 0), (4, 0)]
    assert normalize("  A\u00a0 B\n") == "a b"


def test_minhash_finds_the_near_duplicates_an_all_pairs_search_finds():
    """The MinHash index only proposes candidates: on 300 texts of 16-30 words from a 40-word vocabulary, 60 of them
    copies with one word changed (Jaccard 0.7-0.92 to their original, many right at the threshold), it must keep
    exactly what the greedy all-pairs exact-Jaccard rule keeps."""
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(40)]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(16, 30))) for _ in range(240)]
    for _ in range(60):
        w = rng.choice(texts).split()
        w[rng.randrange(len(w))] = rng.choice(vocab)
        texts.append(" ".join(w))
    kept, sets = [], []
    for i, t in enumerate(texts):
        sh = shingles(t)
        if normalize(t) in {normalize(texts[k]) for k in kept}:
            continue
        if any(jaccard(sh, s) >= 0.7 for s in sets):
            continue
        kept.append(i)
        sets.append(sh)
    r = dedup(texts, near_threshold=0.7)
    assert r.kept == kept
    assert (len(kept), len(r.exact), len(r.near)) == (250, 1, 49)
    assert sum(jaccard(shingles(texts[i]), shingles(texts[j])) < 0.75 for i, j in r.near) == 13
    idx = MinHashIndex(0.7)
    assert (idx.bands, idx.rows) == (32, 4) and idx.candidate_probability == pytest.approx(0.9998, abs=1e-4)
    assert (MinHashIndex(0.5).bands, MinHashIndex(0.5).rows) == (42, 3)
    assert (idx.signature(shingles(texts[0])) == MinHashIndex(0.7).signature(shingles(texts[0]))).all()
    assert (idx.signatures([shingles(t) for t in texts[:50]], chunk=64)
            == np.stack([idx.signature(shingles(t)) for t in texts[:50]])).all()


def test_heldout_split_is_fixed_by_the_text_and_stable_as_n_grows():
    texts = [f"Question number {i}: how do I make bread {i * 7 % 13} times faster?" for i in range(4000)]
    small = [t for t in texts[:1000] if is_heldout(t, 0.05)]
    large = [t for t in texts if is_heldout(t, 0.05)]
    assert large[:len(small)] == small  # the first 1,000 texts are split the same way inside 4,000
    assert 30 <= len(small) <= 70 and 150 <= len(large) <= 250
    assert heldout_unit(texts[0]) == heldout_unit("  QUESTION number 0: how do I make bread 0 times faster? ")
    assert is_heldout(texts[0], 1.0) and not is_heldout(texts[0], 0.0)


def test_report_statistics():
    assert distinct_n(["a b c", "a b d"], 1) == pytest.approx(4 / 6, abs=1e-4)
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)
    assert distinct_n(["a b c", "a b d"], 3) == pytest.approx(2 / 2)
    h = length_histogram([1, 2, 3, 8, 9, 15, 16, 40])
    assert [(b["range"], b["count"]) for b in h] == [("1", 1), ("2-3", 2), ("4-7", 0), ("8-15", 3), ("16-31", 1),
                                                     ("32-63", 1)]


def test_config_and_paths_refuse_bad_values():
    with pytest.raises(ConfigError, match=r"SelfPromptConfig\.user_sampling=.* is invalid: needs temperature > 0"):
        SelfPromptConfig(n=10, user_sampling=GenerationSettings(temperature=0))
    with pytest.raises(ConfigError, match="needs answers"):
        SelfPromptConfig(n=10, turns=2, answers=False)
    with pytest.raises(ConfigError, match=r"SelfPromptConfig\.answer_sampling=.* another enable_thinking"):
        SelfPromptConfig(n=10, answer_sampling=GenerationSettings(enable_thinking=False))
    with pytest.raises(ConfigError, match=r"SelfPromptConfig\.user_sampling=.* leaves no room in max_len=128"):
        SelfPromptConfig(n=10, max_len=128)
    # both samplings are the engine's one settings type, checked where they are built
    with pytest.raises(ConfigError, match=r"GenerationSettings\.top_k=-1 is invalid: must be an integer >= 0"):
        GenerationSettings(top_k=-1)
    for name in ("self-heldout.jsonl", "a.heldout.jsonl", "heldout.jsonl", "self.report.json", "self.txt"):
        with pytest.raises(DataError, match=rf"--out x/{name} is not a training file name .*Fix: e\.g\. --out "
                                            r"x/self\.jsonl\."):
            output_paths(f"x/{name}")
    p = output_paths("runs/d/self.jsonl")
    assert str(p["heldout"]) == "runs/d/self.heldout.jsonl" and str(p["report_json"]) == "runs/d/self.report.json"


# ---------------------------------------------------------------------------------------------------------------
# Sampling on the tiny target
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1M-parameter model is per-step overhead: one thread is fastest
    yield load_target("tiny"), load_tokenizer("tiny")
    torch.set_num_threads(old)


def _run(tiny, out, *, seed=0, max_answer_tokens=16, **kw):
    model, tok = tiny
    cfg = dict(n=24, batch_size=16, heldout=4, heldout_fraction=0.1,
               user_sampling=GenerationSettings(max_new_tokens=40, temperature=1.0, top_p=0.95, seed=seed),
               answer_sampling=GenerationSettings(max_new_tokens=max_answer_tokens, seed=seed))
    cfg.update(kw)
    lines = []
    report = write_self_prompts("tiny", out, SelfPromptConfig(**cfg), model=model, tokenizer=tok, log=lines.append)
    return report, lines


def _first_turns(path):
    return [(r["id"], r["messages"][0]["content"]) for r in map(json.loads, path.read_text().splitlines())]


def test_tiny_target_writes_prompts_deterministically(tiny, tmp_path):
    a, _ = _run(tiny, tmp_path / "a" / "self.jsonl")
    b, _ = _run(tiny, tmp_path / "b" / "self.jsonl")
    held = (tmp_path / "a" / "self.heldout.jsonl").read_bytes()
    c, _ = _run(tiny, tmp_path / "a" / "seed1.jsonl", seed=1)  # a second run into the same folder, another --out
    assert (tmp_path / "a" / "self.jsonl").read_bytes() == (tmp_path / "b" / "self.jsonl").read_bytes()
    assert held == (tmp_path / "a" / "self.heldout.jsonl").read_bytes() == \
        (tmp_path / "b" / "self.heldout.jsonl").read_bytes()  # not replaced by the second run's
    assert a["heldout_out"] == str(tmp_path / "a" / "self.heldout.jsonl") and a["heldout"] == len(held.splitlines())
    assert c["heldout_out"] == str(tmp_path / "a" / "seed1.heldout.jsonl") and c["heldout"] >= 1
    # training on the folder reads both runs' training files and nothing else: no held-out prompt, no report line
    folder = read_chat_data(tmp_path / "a")
    assert len(folder) == a["train"] + c["train"] and folder.report["skipped"] == {}
    assert sorted(Path(f).name for f in folder.report["files"]["read"]) == ["seed1.jsonl", "self.jsonl"]
    assert sorted(Path(f).name for f in folder.report["files"]["skipped"]) == [
        "seed1.heldout.jsonl", "seed1.report.json", "seed1.report.txt", "self.heldout.jsonl", "self.report.json",
        "self.report.txt"]
    assert a["examples"] == b["examples"] and a["examples"] != c["examples"]
    # every sampled turn is accounted for, and kept ones split into train / held out / unused held-out
    assert a["sampled"] == 24 == sum(a["filtered"].values()) + a["exact_duplicates"] + a["near_duplicates"] + a["kept"]
    assert a["kept"] == a["train"] + a["heldout"] + a["heldout_unused"]
    assert a["kept"] >= 12 and len(set(a["examples"])) == len(a["examples"])
    data = read_chat_data(tmp_path / "a" / "self.jsonl")  # the training reader takes the file as it is
    assert len(data) == a["train"] and data.report["skipped"] == {}
    rec = json.loads((tmp_path / "a" / "self.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant"]
    assert rec["generation"]["user"]["temperature"] == 1.0 and rec["generation"]["answer"]["temperature"] == 0.0
    saved = json.loads((tmp_path / "a" / "self.report.json").read_text())
    assert saved["settings"]["target_checksum"]["model.safetensors"].startswith("44b4550035fb")
    assert saved["settings"]["user_prefix"] == "<|im_start|>user\n" and saved["kept"] == a["kept"]
    assert "most common openings" in (tmp_path / "a" / "self.report.txt").read_text()
    assert "<table>" in a._repr_html_()


def test_first_turns_do_not_change_when_more_are_sampled(tiny, tmp_path):
    small, _ = _run(tiny, tmp_path / "s" / "self.jsonl", n=12, answers=False, heldout_fraction=0.0, heldout=0)
    large, _ = _run(tiny, tmp_path / "l" / "self.jsonl", n=24, answers=False, heldout_fraction=0.0, heldout=0)
    s, l_ = _first_turns(tmp_path / "s" / "self.jsonl"), _first_turns(tmp_path / "l" / "self.jsonl")
    assert s and l_[:len(s)] == s


def test_multi_turn_alternates_target_written_user_turns_and_answers(tiny, tmp_path):
    report, _ = _run(tiny, tmp_path / "m" / "self.jsonl", n=12, turns=2, max_answer_tokens=24)
    recs = [json.loads(x) for x in (tmp_path / "m" / "self.jsonl").read_text().splitlines()]
    assert recs and all([m["role"] for m in r["messages"]] == ["user", "assistant"] * (len(r["messages"]) // 2)
                        for r in recs)
    turns = report["turns"]["user_turns"]
    assert sum(turns.values()) == len(recs) + report["heldout"]
    assert set(turns) <= {"1", "2"}
    ended = sum(report["turns"]["ended_early"].values())
    assert turns.get("1", 0) == ended  # a conversation stops at one user turn only for a counted reason


def test_command_line_errors_are_one_line(capsys):
    assert main(["--target", "tiny", "--n", "0", "--out", "/tmp/x.jsonl"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: SelfPromptConfig.n=0") and out.count("\n") == 1
