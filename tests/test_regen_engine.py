"""Regeneration on the generation engine (data/regen_engine.py) with the tiny target: every turn re-enters the queue
with its regenerated history and gets the answer a fresh call on that history gets; sampled records do not depend
on the input order; the HFGenerator drop-in writes what HF `generate` writes; the round-trip check; long
conversations cut at a turn boundary; a stop request."""

import functools
import json
import threading

import pytest
import torch

from dflash_lab.data.chat_formats import read_chat_data
from dflash_lab.data.regen_engine import (EngineGenerator, RoundTrip, answers_to_write, conversation_key,
                                          regenerate_with_engine)
from dflash_lab.data.regen_local import HFGenerator
from dflash_lab.data.regenerate import regenerate
from dflash_lab.target.sampling import GenerationSettings

GREEDY = GenerationSettings(max_new_tokens=64, enable_thinking=False)  # tiny answers are 45-105 tokens
SAMPLED = GenerationSettings(max_new_tokens=64, enable_thinking=False, temperature=1.0, top_p=0.95, seed=3)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


@functools.lru_cache(maxsize=1)
def tiny():
    from dflash_lab.target.load import load_target, load_tokenizer

    return load_target("tiny"), load_tokenizer("tiny")


@functools.lru_cache(maxsize=1)
def conversations():
    """6 held-out tiny conversations, 3 of them with two user turns (9 answers to write)."""
    from dflash_lab.tiny import tiny_heldout_path

    convs = read_chat_data(tiny_heldout_path(), require_assistant=False).conversations
    multi = [c for c in convs if len(c.messages) > 2][:3]
    return multi + [c for c in convs if len(c.messages) == 2][:3]


def hf(sampling=GREEDY):
    model, tok = tiny()
    return HFGenerator(model, tok, sampling)


def run(convs, sampling=GREEDY, **kw):
    recs = []
    stats = regenerate_with_engine([hf(sampling)], convs, recs.append, {"model": "tiny"},
                                   log=None, **{"max_batch": 4, "max_len": 512, **kw})
    return {r["id"]: r for r in recs}, stats


@functools.lru_cache(maxsize=1)
def greedy_run():
    return run(conversations())


def test_every_turn_answers_each_turn_given_the_regenerated_history():
    convs = conversations()
    recs, stats = greedy_run()
    assert sorted(recs) == sorted(c.id for c in convs) and stats["written"] == len(convs)
    assert stats["turns"] == sum(answers_to_write(c.messages) for c in convs) == 9
    asked, written = [], []  # every answered turn: (its regenerated history, what the record says)
    for conv in convs:
        msgs = recs[conv.id]["messages"]
        assert [m["role"] for m in msgs] == [m["role"] for m in conv.messages]
        assert [m["content"] for m in msgs if m["role"] == "user"] == \
               [m["content"] for m in conv.messages if m["role"] == "user"]
        gen = recs[conv.id]["generation"]
        for turn, k in enumerate(k for k, m in enumerate(msgs) if m["role"] == "assistant"):
            asked.append(msgs[:k])
            written.append((msgs[k]["content"], gen["finish_reasons"][turn], gen["new_tokens"][turn]))
    assert EngineGenerator(hf(), max_batch=16, max_len=512)(asked, seed=0) == written  # one fresh call
    assert stats["new_tokens"] == sum(sum(r["generation"]["new_tokens"]) for r in recs.values())
    assert stats["round_trip"]["answers"] == 9 and stats["round_trip"]["mismatch_rate"] == 0.0


def test_records_are_what_the_hf_back_end_of_regenerate_writes(tmp_path):
    """The same conversations through regenerate() (HF `generate`, batched, round by round): the same messages,
    finish reasons and token counts, record for record."""
    src = tmp_path / "convs.jsonl"
    src.write_text("".join(json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in conversations()))
    out = tmp_path / "hf.jsonl"
    regenerate(src, out, target="tiny", batch_size=6, sampling=GREEDY, models={"cpu": tiny()[0]}, log=lambda *a: None)
    theirs = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    ours, _ = greedy_run()
    assert sorted(theirs) == sorted(ours)
    for i, r in ours.items():
        assert r["messages"] == theirs[i]["messages"]
        for k in ("finish_reasons", "new_tokens"):
            assert r["generation"][k] == theirs[i]["generation"][k]


def test_sampled_records_do_not_depend_on_input_order_or_rows():
    convs = conversations()
    a, _ = run(convs, SAMPLED)
    b, _ = run(convs[::-1], SAMPLED, max_batch=2, steps_per_sync=3)
    assert a == b
    greedy, _ = greedy_run()
    assert sum(a[i]["messages"] != greedy[i]["messages"] for i in a) >= 4
    assert conversation_key("x") == conversation_key("x") != conversation_key("y") and conversation_key("x") < 2 ** 44


def test_the_drop_in_writes_what_hf_generate_writes():
    """EngineGenerator in HFGenerator's place: the same (text, finish_reason, new_tokens) as batched HF greedy."""
    histories = [[m for m in c.messages[:1]] for c in conversations()]
    long = GenerationSettings(max_new_tokens=128, enable_thinking=False)  # long enough for some answers to end
    ours = EngineGenerator(hf(long), max_batch=4, max_len=512)(histories, seed=0)
    theirs = hf(long)(histories, seed=0)
    assert ours == theirs
    assert {f for _, f, _ in ours} == {"stop", "length"}


def test_records_can_keep_the_answer_ids_as_generated():
    convs = conversations()[:3]
    recs, _ = run(convs, keep_token_ids=True)
    greedy, _ = greedy_run()
    _, tok = tiny()
    for i, r in recs.items():
        g = r["generation"]
        answers = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        assert len(g["token_ids"]) == len(answers) and [len(t) for t in g["token_ids"]] == g["new_tokens"]
        for ids, text, finish in zip(g["token_ids"], answers, g["finish_reasons"]):
            assert tok.decode(ids[:-1] if finish == "stop" else ids) == text
        assert "token_ids" not in greedy[i]["generation"] and r["messages"] == greedy[i]["messages"]


def test_round_trip_tells_a_non_canonical_answer_apart():
    gen = EngineGenerator(hf(), max_batch=1, max_len=512)
    _, tok = tiny()
    history = [{"role": "user", "content": "Count from 1 to 5."}]
    canonical = tok("1 2 3 4 5", add_special_tokens=False)["input_ids"]
    assert gen.check_round_trip(history, "1 2 3 4 5", canonical) == "same"
    # the same text spelled with other ids (one character per token): the conversation tokenizes it back otherwise
    spelled = [tok.convert_tokens_to_ids(t) for t in tok.convert_ids_to_tokens(canonical)]
    chars = [i for t in tok.convert_ids_to_tokens(canonical) for i in tok.convert_tokens_to_ids(list(t))]
    assert spelled == canonical and len(chars) > len(canonical)
    assert tok.decode(chars) == "1 2 3 4 5"
    assert gen.check_round_trip(history, tok.decode(chars), chars) == "differs"
    rt = gen.round_trip.to_dict()
    assert rt["same"] == 1 and rt["differs"] == 1 and rt["mismatch_rate"] == 0.5 and rt["examples"]
    assert RoundTrip().to_dict()["mismatch_rate"] == 0.0


def test_conversations_are_cut_at_a_turn_boundary_when_rows_run_out():
    """max_len 112 with 64 new tokens per answer: later turns of the long conversations no longer fit: kept up to
    the last answer; a conversation whose first prompt leaves no room for a whole answer is not written."""
    convs = conversations()
    recs, stats = run(convs, max_len=112)
    assert stats["cut_at_max_len"] >= 1 and stats["too_long"] == 0
    for r in recs.values():
        assert r["messages"][-1]["role"] == "assistant"
        assert len(r["generation"]["finish_reasons"]) == sum(m["role"] == "assistant" for m in r["messages"])
    first_lens = [len(EngineGenerator(hf(), max_len=90).encode(c.messages[:1])) for c in convs]
    tight, stats = run(convs, max_len=90)
    assert stats["too_long"] == sum(n + 64 > 90 for n in first_lens) >= 1
    assert len(tight) == len(convs) - stats["too_long"] >= 1


def test_a_stop_request_ends_the_run_without_writing_half_conversations():
    stop = threading.Event()
    stop.set()
    recs = []
    stats = regenerate_with_engine([hf()], conversations(), recs.append, {}, stop=stop, log=None,
                                   max_batch=4, max_len=512)
    assert recs == [] and stats["written"] == 0
    json.dumps(stats)  # the counts are JSON-able (they go to the run's meta file)


def test_follow_ups_go_ahead_of_waiting_first_turns_and_long_chains_start_first():
    """A conversation's turns are a chain: its next turn is taken before fresh first turns, and the conversations
    with the most turns start first, so the run does not end with long chains answering alone at a few rows."""
    from dflash_lab.target.gen_queue import Generated, PromptItem, PromptQueue, longest_chain_first

    turns = {0: 1, 1: 3, 2: 1, 3: 2}  # conversation -> answers to write
    items = [PromptItem(c * 10, [1] * (5 - c)) for c in turns]  # key = conversation * 10 + turn
    order = longest_chain_first(items, {it.key: turns[it.key // 10] for it in items})
    assert [it.key // 10 for it in order] == [1, 3, 2, 0]  # most turns first, then shortest prompt

    def follow(key, _gen):
        c, t = divmod(key, 10)
        return PromptItem(key + 1, [1] * 9) if t + 1 < turns[c] else None

    taken = []
    for first in (True, False):
        queue = PromptQueue(order, on_finish=follow, follow_ups_first=first)
        seq = []
        try:
            while True:  # one row: take one prompt, answer it, let the finisher queue its follow-up
                got = queue.take(1)
                if not got:
                    break
                seq.append(got[0].key)
                queue.finish(got[0].key, Generated(token_ids=[7], finish_reason="stop"))
                queue.settle()
        finally:
            queue.close()
        taken.append(seq)
    assert taken[0] == [10, 11, 12, 30, 31, 20, 0]  # each chain runs to its end before the next starts
    assert taken[1] == [10, 30, 20, 0, 11, 31, 12]  # behind the waiting prompts: the longest chain ends last


def test_the_cache_is_sized_to_the_work_not_to_the_batch_size():
    """3 conversations with max_batch 4,096: 3 rows, each as long as the longest row a conversation can take."""
    convs = conversations()[3:]  # one answer each: the row is the first prompt + max_new_tokens exactly
    recs, stats = run(convs, max_batch=4096)
    assert len(recs) == 3 and stats["cache"]["rows"] == 3
    longest = max(len(EngineGenerator(hf(), max_len=512).encode(c.messages[:1])) for c in convs) + 64
    assert longest <= stats["cache"]["length"] <= longest * 5 // 4 + 16  # the next length bucket, not max_len 512
    # K and V of 8 layers, 2 KV heads of 32 dims, fp32: 1,536 bytes per row and position
    assert stats["cache"]["gib_per_device"] == round(3 * stats["cache"]["length"] * 8 * 2 * 2 * 32 * 4 / 2 ** 30, 4)


def test_a_cache_beyond_free_memory_is_one_error_naming_both_sizes_and_the_flag(monkeypatch):
    from dflash_lab.data.chat_formats import DataError
    from dflash_lab.target import generate

    monkeypatch.setattr(generate, "free_bytes", lambda device: 2 ** 20)  # 1 MiB free
    with pytest.raises(DataError, match=r"cpu cannot hold the engine's KV cache for 3 rows x \d+ positions: it "
                                        r"needs 0\.0\d GiB, 0\.00 GiB is free\. Fix: --batch-size \d \(rows that fit"):
        run(conversations()[3:], max_batch=4096)


def long_context_model(context: int = 4096):
    """A one-layer random Qwen3 on the tiny tokenizer with `context` positions whose every answer is its stop token
    (final norm zeroed: all logits 0, argmax token 0, which is made its eos): rows of any length, answers at once."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tiny()[1]), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=context)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.generation_config.eos_token_id = 0
    return model


def test_rows_hold_the_targets_context_not_2048_positions(tmp_path):
    """max_new_tokens 2,100 on a 4,096-position target: every conversation is answered (the engine once capped
    rows at 2,048 positions and wrote none)."""
    from dflash_lab.data.regenerate import regenerate

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": c.id, "messages": c.messages[:1]}) + "\n" for c in conversations()[3:]))
    stats = regenerate(src, tmp_path / "out.jsonl", sampling=GenerationSettings(max_new_tokens=2100, enable_thinking=False),
                       models={"cpu": long_context_model()}, backend="engine", log=lambda s: None)
    assert stats.samples == 3 and not stats.skipped
    assert stats.engine_cache["rows"] == 3 and 2100 < stats.engine_cache["length"] <= 2700
    assert [len(json.loads(ln)["messages"]) for ln in (tmp_path / "out.jsonl").read_text().splitlines()] == [2] * 3


@pytest.mark.parametrize("backend", ["engine", "hf"])
def test_nothing_answerable_exits_non_zero_naming_the_max_new_tokens_that_fit(tmp_path, capsys, backend):
    """The CLI's default --max-new-tokens 2048 on the tiny target (1,024 positions): no conversation fits; the run
    says so with the flag and value that fit, and exits 2 (it exited 0 having written nothing)."""
    from dflash_lab.data.regenerate import main

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": c.id, "messages": c.messages[:1]}) + "\n" for c in conversations()[3:]))
    assert main(["--data", str(src), "--out", str(tmp_path / "out.jsonl"), "--backend", backend,
                 "--thinking", "off"]) == 2
    err = capsys.readouterr().err
    shortest = min(len(EngineGenerator(hf(), max_len=512).encode(c.messages[:1])) for c in conversations()[3:])
    assert err.startswith("error: none of the 3 conversations could be answered: every first prompt (the shortest "
                          f"has {shortest} tokens) plus --max-new-tokens 2048 exceeds the target's 1,024 positions. "
                          f"Fix: --max-new-tokens {1024 - shortest} or less.")
