"""Exact assistant-only loss masks (token by token, multi-turn, templates that rewrite earlier turns, thinking on/off),
filtering / truncation / padding with counts, bad input, and batches that are a pure function of (seed, step)."""

import json

import numpy as np
import pytest
import torch

from dflash_lab.data.chat_formats import DataError
from dflash_lab.drafter.batches import BatchSampler
from dflash_lab.data.tokenize import (ChatTemplate, load_dataset, read_conversations, tokenize_conversation,
                             tokenize_dataset)


@pytest.fixture(scope="module")
def tok():
    from dflash_lab.target.load import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def tiny_chat():
    from dflash_lab.data.tokenize import resolve_data_path

    return read_conversations(resolve_data_path("tiny"))


def spans(tok, ids, mask):
    """Decoded supervised spans, one string per contiguous run of mask == 1."""
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            out.append(tok.decode(cur, skip_special_tokens=False))
            cur = []
    if cur:
        out.append(tok.decode(cur, skip_special_tokens=False))
    return out


MULTI = [{"role": "user", "content": "Count from 1 to 3. Think first."},
         {"role": "assistant", "content": "<think>\nI count up.\n</think>\n\n1 2 3"},
         {"role": "user", "content": "Now from 4 to 6."},
         {"role": "assistant", "content": "<think>\nAgain.\n</think>\n\n4 5 6"}]
PLAIN = [{"role": "user", "content": "Count from 1 to 3."}, {"role": "assistant", "content": "1 2 3"},
         {"role": "user", "content": "Now from 4 to 6."}, {"role": "assistant", "content": "4 5 6"}]


def test_tiny_template_masks_equal_its_generation_markers_token_by_token(tok, tiny_chat):
    """Every conversation of the tiny set (single/multi-turn, with/without reasoning): the render-based mask equals
    HF's {% generation %} assistant mask exactly, and the ids equal apply_chat_template's."""
    multi = sum(sum(m["role"] == "assistant" for m in c) > 1 for c in tiny_chat)
    thinking = sum("</think>" in c[-1]["content"] for c in tiny_chat)
    assert multi > 100 and thinking > 50  # the set exercises rewritten earlier turns and reasoning
    a = tokenize_dataset(tok, tiny_chat, seq_len=512, block_size=16)
    b = tokenize_dataset(tok, tiny_chat, seq_len=512, block_size=16, mask_method="generation")
    assert a.report["kept"] == b.report["kept"] == len(tiny_chat) and not a.report["skipped"]
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    i = next(k for k, c in enumerate(tiny_chat) if len(c) > 2)
    ref = tok.apply_chat_template(tiny_chat[i], tokenize=True, return_dict=True)["input_ids"]
    assert a.input_ids[i, :a.lengths[i]].tolist() == list(ref)


def test_multi_turn_spans_are_exactly_the_assistant_text_and_end_of_turn(tok):
    ids, mask = tokenize_conversation(tok, MULTI)
    # the template drops the earlier turn's reasoning; the final turn keeps it; <|im_end|> is supervised, "\n" not
    assert spans(tok, ids, mask) == ["1 2 3<|im_end|>", "<think>\nAgain.\n</think>\n\n4 5 6<|im_end|>"]
    assert "I count up." not in tok.decode(ids)
    ids, mask = tokenize_conversation(tok, PLAIN)
    assert spans(tok, ids, mask) == ["1 2 3<|im_end|>", "<think>\n\n</think>\n\n4 5 6<|im_end|>"]
    assert tok.decode([t for t, m in zip(ids, mask) if not m]).count("<|im_start|>") == 4  # headers never supervised
    # reasoning given as a separate field, and a turn that is only reasoning
    ids, mask = tokenize_conversation(tok, [PLAIN[0], {"role": "assistant", "content": "1 2 3",
                                                       "reasoning_content": "Start at 1."}])
    assert spans(tok, ids, mask) == ["<think>\nStart at 1.\n</think>\n\n1 2 3<|im_end|>"]
    ids, mask = tokenize_conversation(tok, [PLAIN[0], {"role": "assistant", "content": "<think>\nHm.\n</think>"}])
    assert spans(tok, ids, mask) == ["<think>\nHm.\n</think>\n\n<|im_end|>"]


def test_thinking_off_does_not_supervise_the_prefilled_empty_think_block(tok, tiny_chat):
    ids, mask = tokenize_conversation(tok, PLAIN, enable_thinking=False)
    assert spans(tok, ids, mask) == ["1 2 3<|im_end|>", "4 5 6<|im_end|>"]
    plain = [c for c in tiny_chat.conversations if "</think>" not in c.messages[-1]["content"]][:300]
    from dflash_lab.data.chat_formats import ChatData

    sub = ChatData(plain)
    on = tokenize_dataset(tok, sub, seq_len=512, block_size=4)
    off = tokenize_dataset(tok, sub, seq_len=512, block_size=4, enable_thinking=False)
    assert torch.equal(on.input_ids, off.input_ids)  # the conversation renders the same; only the mask differs
    assert not (off.loss_mask & ~on.loss_mask).any()  # thinking-off supervises a subset ...
    for i in range(len(plain)):  # ... missing exactly the pre-filled block of the final turn
        assert tok.decode(on.input_ids[i][on.loss_mask[i] & ~off.loss_mask[i]]) == "<think>\n\n</think>\n\n"
    assert not off.report["warnings"]
    # data WITH reasoning while serving thinking-off: counted and warned about, never silent
    ids, mask = tokenize_conversation(tok, MULTI, enable_thinking=False)
    assert spans(tok, ids, mask) == ["1 2 3<|im_end|>", "Again.\n</think>\n\n4 5 6<|im_end|>"]
    mixed = tokenize_dataset(tok, [MULTI, PLAIN], seq_len=128, block_size=2, enable_thinking=False)
    assert mixed.report["warnings"][0].startswith("1 final assistant turns do not continue the serving prompt")


# A second template that rewrites earlier turns differently: it injects a default system prompt, trims every message,
# drops reasoning from every assistant turn but the LAST MESSAGE, and ends assistant turns with <|endoftext|>.
REWRITING_TEMPLATE = r"""{%- if messages[0].role != 'system' -%}{{- '<|im_start|>system\nYou are a tiny bot.<|im_end|>\n' -}}{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
{{- '<|im_start|>bot\n' -}}
{%- generation -%}
{%- if loop.last -%}{{- m.content | trim -}}{%- else -%}{{- m.content.split('</think>')[-1] | trim -}}{%- endif -%}
{{- '<|endoftext|>' -}}
{%- endgeneration -%}
{{- '\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + '\n' + (m.content | trim) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>bot\n' -}}{%- endif -%}"""


@pytest.fixture(scope="module")
def rewriting_tok(tok):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = REWRITING_TEMPLATE
    return t


def test_second_template_that_rewrites_earlier_turns(rewriting_tok, tiny_chat):
    t = rewriting_tok
    tmpl = ChatTemplate(t)
    assert tmpl.end_of_turn == "<|endoftext|>" and not tmpl.supports_thinking
    three = MULTI + [{"role": "user", "content": "  And 7 to 9.  "},
                     {"role": "assistant", "content": "  <think>\nLast.\n</think>\n\n7 8 9  "}]
    ids, mask = tokenize_conversation(t, three)
    assert spans(t, ids, mask) == ["1 2 3<|endoftext|>", "4 5 6<|endoftext|>",
                                   "<think>\nLast.\n</think>\n\n7 8 9<|endoftext|>"]
    text = t.decode(ids)
    assert "You are a tiny bot." in text and "Again." not in text  # injected system prompt; rewritten turn 2
    # cross-check against this template's own generation markers, token by token, on 400 tiny conversations
    from dflash_lab.data.chat_formats import ChatData

    sub = ChatData(tiny_chat.conversations[:400])
    a = tokenize_dataset(t, sub, seq_len=512, block_size=16)
    b = tokenize_dataset(t, sub, seq_len=512, block_size=16, mask_method="generation")
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    with pytest.raises(DataError, match="has no thinking switch"):
        tokenize_conversation(t, PLAIN, enable_thinking=False)


def test_filtering_truncation_and_padding_counts(tok, tiny_chat):
    from dflash_lab.data.chat_formats import ChatData

    sub = ChatData(tiny_chat.conversations[:200])
    full = tokenize_dataset(tok, sub, seq_len=512, block_size=2)
    lengths, sup = full.lengths.numpy(), full.loss_mask.sum(1).numpy()
    seq_len = 96
    # expected from the untruncated masks: truncated rows keep their first seq_len tokens
    trunc_sup = np.array([full.loss_mask[i, :seq_len].sum().item() for i in range(len(full))])
    block = int(np.median(trunc_sup)) // 2  # a threshold 2 * block in the middle: some kept, some dropped
    keep = trunc_sup >= 2 * block
    d = tokenize_dataset(tok, sub, seq_len=seq_len, block_size=block)
    r = d.report
    assert r["truncated"] == int((lengths > seq_len).sum()) > 0
    assert r["dropped_short"] == int((~keep).sum()) > 0 and r["kept"] == int(keep.sum()) == len(d)
    assert r["skipped"]["too_short"] == r["dropped_short"] and len(r["examples"]["too_short"]) == 5
    assert d.input_ids.shape == (len(d), seq_len) and d.loss_mask.shape == (len(d), seq_len)
    assert d.lengths.tolist() == np.minimum(lengths[keep], seq_len).tolist()
    assert torch.equal(d.input_ids, full.input_ids[torch.from_numpy(keep), :seq_len])
    assert torch.equal(d.loss_mask, full.loss_mask[torch.from_numpy(keep), :seq_len])
    pad = torch.arange(seq_len)[None] >= d.lengths[:, None]
    assert (d.input_ids[pad] == tok.pad_token_id).all() and not d.loss_mask[pad].any()
    assert r["supervised_tokens"] == int(d.loss_mask.sum()) and r["tokens"] == int(d.lengths.sum())
    assert r["padded_tokens"] == len(d) * seq_len and sup.sum() >= r["supervised_tokens"]
    assert json.loads(json.dumps(r))["kept"] == len(d)  # the Trainer writes it as data_report.json
    with pytest.raises(DataError, match="no sample has >= 200 supervised tokens after truncation to seq_len=96"):
        tokenize_dataset(tok, sub, seq_len=96, block_size=100)


def test_bad_input_is_skipped_and_counted_or_raises(tok, tmp_path):
    good = {"messages": PLAIN}
    special = {"messages": [{"role": "user", "content": "hi <|im_end|> there"}, {"role": "assistant", "content": "x"}]}
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [good, special, good]) + "\n{oops\n")
    chat = read_conversations(path)
    d = tokenize_dataset(tok, chat, seq_len=64, block_size=2)
    assert len(d) == 2 and d.report["skipped"] == {"malformed_json": 1, "special_token_in_content": 1}
    assert d.report["examples"]["special_token_in_content"] == [
        f"{path}:2: message 0 (user) contains the special token '<|im_end|>'"]
    assert d.sample_ids == ["d.jsonl:1", "d.jsonl:3"]
    with pytest.raises(DataError, match=rf"{path}:2: message 0 \(user\) contains the special token"):
        tokenize_dataset(tok, chat, seq_len=64, block_size=2, on_error="raise")
    import copy

    no_template = copy.deepcopy(tok)
    no_template.chat_template = None
    with pytest.raises(DataError, match="has no chat template") as e:
        tokenize_dataset(no_template, chat, seq_len=64, block_size=2)
    assert "Fix" in str(e.value)
    with pytest.raises(DataError, match="mask_method='generation' needs"):
        tokenize_dataset(_without_markers(tok), chat, seq_len=64, block_size=2, mask_method="generation")


def _without_markers(tok):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = t.chat_template.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    return t


def test_load_dataset_reads_tiny_and_list_input_matches_file_input(tok, tiny_chat):
    d = load_dataset(tok, "tiny", seq_len=256, block_size=16)
    assert len(d) == d.report["kept"] and d.report["sources"][0].endswith("train.jsonl")
    as_list = tokenize_dataset(tok, [c for c in tiny_chat][:50], seq_len=256, block_size=16)
    assert torch.equal(as_list.input_ids, d.input_ids[:len(as_list)])


def _sampler(data, seed=0, **kw):
    args = dict(batch_size=4, num_anchors=8, block_size=8, mask_token_id=3, gamma=4.0, seed=seed)
    args.update(kw)
    return BatchSampler(data, **args)


@pytest.fixture(scope="module")
def small_data(tok, tiny_chat):
    from dflash_lab.data.chat_formats import ChatData

    return tokenize_dataset(tok, ChatData(tiny_chat.conversations[:42]), seq_len=160, block_size=8)


def test_batches_are_a_pure_function_of_seed_and_step(small_data):
    a, b = _sampler(small_data), _sampler(small_data)
    steps = [0, 7, 3, 25, 10, 9, 10]  # random access, across epochs, repeated
    first = {s: a.batch(s) for s in steps}
    for s in reversed(steps):  # a fresh sampler (= a resumed run) reproduces every batch exactly
        x, y = first[s], b.batch(s)
        for f in ("input_ids", "loss_mask", "anchors", "anchor_valid", "draft_ids", "labels", "loss_weights"):
            assert torch.equal(getattr(x, f), getattr(y, f)), (s, f)
    assert not torch.equal(a.batch(0).input_ids, _sampler(small_data, seed=1).batch(0).input_ids)


def test_epochs_shuffle_deterministically_and_resample_anchors(small_data):
    s = _sampler(small_data)
    spe = s.steps_per_epoch
    assert spe == len(small_data) // 4 == 10 and s.position(23) == (2, 3)
    orders = [torch.cat([s.indices(e * spe + i) for i in range(spe)]) for e in range(3)]
    for o in orders:
        assert len(set(o.tolist())) == spe * 4  # each sample at most once per epoch; 2 left over
    assert not torch.equal(orders[0], orders[1]) and not torch.equal(orders[1], orders[2])
    # the same sample in two epochs gets different anchors; anchors always sit on supervised (p, p+1)
    sample = int(orders[0][0])
    where = [next((e * spe + i // 4, i % 4) for i, v in enumerate(orders[e].tolist()) if v == sample)
             for e in range(2)]
    a0 = s.batch(where[0][0]).anchors[where[0][1]]
    a1 = s.batch(where[1][0]).anchors[where[1][1]]
    assert not torch.equal(a0, a1)
    for step in range(spe):
        bb = s.batch(step)
        m = bb.loss_mask
        ok = m.gather(1, bb.anchors) & m.gather(1, (bb.anchors + 1).clamp(max=m.shape[1] - 1))
        assert ok[bb.anchor_valid].all() and bb.input_ids.dtype == torch.long
    with pytest.raises(DataError, match="fewer than batch_size=64"):
        _sampler(small_data, batch_size=64)


def test_validate_cli_prints_the_report(capsys):
    from dflash_lab.data.__main__ import main

    assert main(["tiny", "--seq-len", "256", "--block-size", "16", "--thinking", "off"]) == 0
    out = capsys.readouterr().out
    assert "records read: 3200" in out and "thinking False; mask render" in out and "kept " in out


# --- bounded memory on pathological records; template failures are one record's problem ------------------------------
class _LengthSpy:
    """The real tokenizer, recording the longest text it is asked to tokenize."""

    def __init__(self, tok):
        self._tok, self.longest = tok, 0

    def __call__(self, text, **kw):
        self.longest = max([self.longest] + [len(t) for t in ([text] if isinstance(text, str) else text)])
        return self._tok(text, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_a_huge_record_is_cut_before_tokenizing_and_keeps_exact_tokens(tok):
    line = "Item 7 is a red ball made of glass; item 8 is a blue cube made of steel.\n"
    huge = [{"role": "user", "content": "Describe the items."}, {"role": "assistant", "content": line * 40_000}]
    spy = _LengthSpy(tok)
    data = tokenize_dataset(spy, [huge, PLAIN], seq_len=256, block_size=4)
    assert len(huge[1]["content"]) > 2_900_000 and spy.longest <= 32 * 256  # 3 MB record, 8 KB tokenized
    assert data.report["truncated"] == 1 and data.lengths.tolist() == [256, int(data.lengths[1])]
    medium = [huge[0], {"role": "assistant", "content": line * 2_000}]  # short enough to tokenize whole, to compare
    ids, mask = tokenize_conversation(tok, medium)  # the whole text tokenized (23k tokens)
    got = tokenize_dataset(tok, [medium], seq_len=256, block_size=4)
    assert len(ids) > 20_000 and got.input_ids[0].tolist() == ids[:256]
    assert got.loss_mask[0].tolist() == [bool(m) for m in mask[:256]] and sum(mask[:256]) > 200


def test_a_template_error_skips_that_record_or_names_it(tok):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = ("{% if 'boom' in messages[-1]['content'] %}{{ raise_exception('no boom here') }}{% endif %}"
                       + tok.chat_template)
    boom = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "boom " * 20}]
    data = tokenize_dataset(t, [PLAIN, boom, PLAIN], seq_len=64, block_size=2)
    assert len(data) == 2 and data.report["skipped"] == {"template_error": 1}
    assert data.report["examples"]["template_error"] == ["conversations[1]: TemplateError: no boom here"]
    with pytest.raises(DataError, match=r"conversations\[1\]: TemplateError: no boom here \[template_error\]"):
        tokenize_dataset(t, [PLAIN, boom], seq_len=64, block_size=2, on_error="raise")


def test_stored_generated_ids_are_trained_on_where_they_decode_to_the_text(tok, tmp_path):
    """A regenerated record with generation.token_ids (--keep-token-ids): the answer is trained on as those ids
    (here a non-canonical spelling, one character per token), not re-tokenized; a record whose ids no longer decode
    to its text (edited) is re-tokenized; both are counted."""
    canonical = tok("1 2 3 4 5", add_special_tokens=False)["input_ids"]
    chars = [i for t in tok.convert_ids_to_tokens(canonical) for i in tok.convert_tokens_to_ids(list(t))]
    assert tok.decode(chars) == "1 2 3 4 5" and len(chars) > len(canonical)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    msgs = [{"role": "user", "content": "Count from 1 to 5."}, {"role": "assistant", "content": "1 2 3 4 5"}]
    edited = [msgs[0], {"role": "assistant", "content": "1 2 3 4 6"}]
    path = tmp_path / "regen.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": m, "generation": {"token_ids": [chars + [stop]]}}) + "\n"
                            for i, m in (("kept", msgs), ("edited", edited))))
    data = tokenize_dataset(tok, read_conversations(path), seq_len=64, block_size=2)
    assert data.report["answer_ids"] == {"used": 1, "text_differs": 1}
    plain = tokenize_dataset(tok, [msgs, edited], seq_len=64, block_size=2)
    kept = data.input_ids[0, :data.lengths[0]].tolist()
    sup = [t for t, m in zip(kept, data.loss_mask[0].tolist()) if m]
    plain_sup = [t for t, m in zip(plain.input_ids[0].tolist(), plain.loss_mask[0].tolist()) if m]
    head = len(plain_sup) - len(canonical) - 1  # the template's empty think block before the answer
    assert sup == plain_sup[:head] + chars + [stop]  # the generated ids in place of the re-tokenized text
    assert data.lengths[0] == plain.lengths[0] + len(chars) - len(canonical)
    prompt = plain.input_ids[0, :plain.lengths[0]].tolist()
    assert kept[:kept.index(chars[0])] == prompt[:prompt.index(canonical[0])]  # the same prompt ids before it
    assert torch.equal(data.input_ids[1], plain.input_ids[1]) and torch.equal(data.loss_mask[1], plain.loss_mask[1])


@pytest.mark.parametrize("case,words", [
    ("system_only", "holds no usable conversation (3 records read)"),
    ("missing", "does not exist"),
    ("unknown_target", "no-such-target"),
    ("big_block", "no sample has >= 512 supervised tokens"),
])
def test_validate_cli_says_each_problem_it_exists_to_catch_in_one_line(tmp_path, capsys, case, words):
    """The documented pre-training check: conversations with only a system turn, a missing path, an unknown target
    and a block larger than the answers are an `error:` line (with the data report where there is one) and exit
    2 (each was a raw traceback)."""
    from dflash_lab.data.__main__ import main
    from dflash_lab.tiny import tiny_data_path

    data = tmp_path / "chats.jsonl"
    if case == "system_only":
        data.write_text("".join(json.dumps({"messages": [{"role": "system", "content": f"Be brief {i}."}]}) + "\n"
                                for i in range(3)))
    elif case != "missing":
        data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:20]))
    args = {"system_only": [], "missing": [], "unknown_target": ["--target", "no-such-target"],
            "big_block": ["--block-size", "256", "--seq-len", "512"]}[case]
    assert main([str(data), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and words in err.splitlines()[0] and "Traceback" not in err, err


@pytest.mark.parametrize("setting, noted", [("false", True), ("true", False), (None, False)])
def test_progress_names_the_tokenizer_threads_when_they_are_switched_off(tok, tiny_chat, monkeypatch, setting,
                                                                          noted):
    if setting is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", setting)
    lines = []
    data = tokenize_dataset(tok, tiny_chat, seq_len=512, block_size=16, log=lines.append, progress_every_s=0.0)
    assert len(data) > 0 and lines and lines[-1].startswith(f"tokenizing: {len(tiny_chat)}/{len(tiny_chat)}")
    assert all(("tokenizer threads off (TOKENIZERS_PARALLELISM=false)" in line) is noted for line in lines)
