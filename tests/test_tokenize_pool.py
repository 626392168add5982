"""Tokenizing in worker processes: the same rows, masks, ids and report as one process, to the byte; a pool that
cannot start leaves the data the same; the number of workers is chosen by the data's size or set, and a bad setting
names the fix."""

import json

import pytest
import torch

from dflash_lab.data import tokenize_pool
from dflash_lab.data.tokenize import CHUNK, ChatTemplate, DataError, load_dataset
from dflash_lab.target.load import load_tokenizer
from dflash_lab.tiny import tiny_data_path

SETTINGS = dict(seq_len=96, block_size=8)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three chunks of the tiny chat set, the second holding a record that tokenizing refuses (a special token in
    its text) and short ones the drop rule takes."""
    lines = tiny_data_path().read_text().splitlines()[:2 * CHUNK + 100]
    lines[CHUNK + 7] = json.dumps({"messages": [{"role": "user", "content": "hi <|im_end|> there"},
                                                {"role": "assistant", "content": "hello, an answer long enough"}]})
    path = tmp_path_factory.mktemp("pool") / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _same(a, b) -> None:
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert torch.equal(a.lengths, b.lengths) and a.sample_ids == b.sample_ids
    assert json.dumps(a.report, sort_keys=True, default=str) == json.dumps(b.report, sort_keys=True, default=str)


def test_two_worker_processes_give_what_one_process_gives(tok, data, monkeypatch):
    monkeypatch.setenv(tokenize_pool.WORKERS_ENV, "1")
    alone = load_dataset(tok, str(data), **SETTINGS)
    monkeypatch.setenv(tokenize_pool.WORKERS_ENV, "2")
    said = []
    pooled = load_dataset(tok, str(data), **SETTINGS, log=said.append)
    assert said[0] == f"tokenizing in 2 processes ({tokenize_pool.WORKERS_ENV} sets how many)"
    _same(alone, pooled)
    assert len(pooled) > 2 * CHUNK - 50 and pooled.report["skipped"]["special_token_in_content"] == 1


class _Unpicklable:
    """A tokenizer no worker can receive (pickling it fails), which works in this process."""

    def __init__(self, tok):
        self.__dict__["_tok"] = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *a, **k):
        return self._tok(*a, **k)

    def __reduce__(self):
        raise TypeError("this tokenizer stays in its process")


def test_a_pool_that_cannot_start_is_logged_and_the_chunks_are_done_here(tok, data):
    from dflash_lab.data import tokenize
    from dflash_lab.data.tokenize import read_conversations

    chat = read_conversations(data)
    tmpl = ChatTemplate(tok)
    chunks = [chat.conversations[c:c + CHUNK] for c in range(0, len(chat), CHUNK)]
    encode = dict(mask_method="render", on_error="skip", seq_len=SETTINGS["seq_len"])
    here = lambda convs: tokenize.encode_chunk(tmpl, convs, **encode)  # noqa: E731
    said = []
    pooled = list(tokenize_pool.ordered_map(tokenize._pool_encode, chunks, here=here, workers=2,
                                            initializer=tokenize._pool_start, log=said.append,
                                            initargs=(_Unpicklable(tok), None, encode)))
    alone = [here(c) for c in chunks]
    assert any("failed (TypeError: this tokenizer stays in its process)" in s and "3 chunks left" in s for s in said)
    assert len(pooled) == len(alone) == 3
    for (c1, e1, s1, m1, a1), (c2, e2, s2, m2, a2) in zip(pooled, alone):
        assert [c.id for c in c1] == [c.id for c in c2] and (s1, m1, a1) == (s2, m2, a2)
        assert all(i1 == i2 and (k1 == k2).all() for (i1, k1), (i2, k2) in zip(e1, e2))


def test_a_record_refused_in_a_worker_reaches_the_caller_as_from_this_process(tok, data, monkeypatch):
    """on_error="raise": the worker's DataError names the record, as one process would, with no retry here."""
    monkeypatch.setenv(tokenize_pool.WORKERS_ENV, "2")
    said = []
    with pytest.raises(DataError, match=rf"chat.jsonl:{CHUNK + 8}: message 0 \(user\) contains the special token"):
        load_dataset(tok, str(data), **SETTINGS, on_error="raise", log=said.append)
    assert not any("failed" in s for s in said)


def test_workers_follow_the_datas_size_and_the_setting(monkeypatch):
    monkeypatch.delenv(tokenize_pool.WORKERS_ENV, raising=False)
    monkeypatch.setattr(tokenize_pool, "cpu_cores", lambda: 16)
    assert tokenize_pool.workers_for(tokenize_pool.MIN_CONVERSATIONS - 1) == 1  # starting workers would cost more
    assert tokenize_pool.workers_for(60_000) == tokenize_pool.MAX_WORKERS == 8
    monkeypatch.setattr(tokenize_pool, "cpu_cores", lambda: 2)
    assert tokenize_pool.workers_for(60_000) == 1  # two cores: the pool's start is not paid back
    monkeypatch.setenv(tokenize_pool.WORKERS_ENV, "0")
    assert tokenize_pool.workers_for(60_000) == 1
    monkeypatch.setenv(tokenize_pool.WORKERS_ENV, "eight")
    with pytest.raises(DataError, match="DFLASH_LAB_TOKENIZE_WORKERS='eight' is not a number.*Fix"):
        tokenize_pool.workers_for(10)
