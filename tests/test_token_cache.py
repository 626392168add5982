"""The tokenized-data cache: a second run on the same data reads exactly what tokenizing gives, and anything that
changes the result (the data's bytes, a setting, the tokenizer) is a different entry; a broken entry is a miss."""

import shutil

import pytest
import torch

from dflash_lab.config import TrainConfig
from dflash_lab.config.train_config import ConfigError
from dflash_lab.data import token_cache
from dflash_lab.data.tokenize import load_dataset
from dflash_lab.target.load import load_tokenizer
from dflash_lab.tiny import tiny_data_path

SETTINGS = dict(seq_len=128, block_size=8)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture
def data(tmp_path):
    """The first 200 conversations of the tiny chat set, in a file a test may edit."""
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:200]))
    return path


def _same(a, b):
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert torch.equal(a.lengths, b.lengths) and a.sample_ids == b.sample_ids
    assert dict(a.report) == dict(b.report)


def test_second_read_comes_from_the_cache_and_equals_tokenizing(tok, data, tmp_path, monkeypatch):
    root, logs = tmp_path / "cache", []
    first = token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root, log=logs.append)
    assert len(list(root.glob("*.pt"))) == 1 and not list(root.glob("*.tmp"))
    assert any("saved to the cache" in m for m in logs)

    calls = []
    monkeypatch.setattr(token_cache, "load_dataset", lambda *a, **k: calls.append(1))  # a hit must not tokenize
    logs.clear()
    second = token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root, log=logs.append)
    assert calls == [] and any("read from the cache" in m for m in logs)
    _same(second, first)
    _same(second, load_dataset(tok, str(data), **SETTINGS))
    assert len(second) == len(first) > 150 and second.input_ids.dtype == torch.int32


def test_edited_data_and_other_settings_are_other_entries(tok, data, tmp_path):
    root = tmp_path / "cache"
    base = token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root)
    shorter = token_cache.load_dataset_cached(tok, str(data), seq_len=64, block_size=8, root=root)
    assert shorter.input_ids.shape[1] == 64 and base.input_ids.shape[1] == 128
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:150]))  # the same path, other bytes: other data
    edited = token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root)
    _same(edited, load_dataset(tok, str(data), **SETTINGS))
    assert len(edited) < len(base)
    assert len(list(root.glob("*.pt"))) == 3


def test_tokenizer_digest_sees_the_chat_template_and_the_vocabulary(tok):
    other = load_tokenizer("tiny")
    assert token_cache.tokenizer_digest(other) == token_cache.tokenizer_digest(tok)
    other.chat_template = (tok.chat_template or "") + "{# edited #}"
    assert token_cache.tokenizer_digest(other) != token_cache.tokenizer_digest(tok)
    grown = load_tokenizer("tiny")
    grown.add_tokens(["<a-new-token>"])
    assert token_cache.tokenizer_digest(grown) != token_cache.tokenizer_digest(tok)


def test_a_directory_digest_covers_every_file_by_name(tmp_path, data):
    d = tmp_path / "set"
    d.mkdir()
    shutil.copy(data, d / "a.jsonl")
    one = token_cache.data_digest(d)
    shutil.copy(data, d / "b.jsonl")
    two = token_cache.data_digest(d)
    (d / "b.jsonl").rename(d / "c.jsonl")
    assert len({one, two, token_cache.data_digest(d)}) == 3


@pytest.mark.parametrize("damage", ["garbage", "foreign"])
def test_a_broken_or_foreign_entry_is_tokenized_again_and_rewritten(tok, data, tmp_path, damage):
    root, logs = tmp_path / "cache", []
    first = token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root)
    (entry,) = root.glob("*.pt")
    if damage == "garbage":
        entry.write_bytes(b"not a torch file")
    else:  # another data set's entry under this key's name
        token_cache.load_dataset_cached(tok, "tiny", **SETTINGS, root=tmp_path / "other")
        (foreign,) = (tmp_path / "other").glob("*.pt")
        shutil.copy(foreign, entry)
    again = token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root, log=logs.append)
    assert any("cannot be used" in m for m in logs) and any("saved to the cache" in m for m in logs)
    _same(again, first)
    logs.clear()
    _same(token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root, log=logs.append), first)
    assert any("read from the cache" in m for m in logs)


def test_a_cache_that_cannot_be_written_only_costs_the_next_run(tok, data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    logs = []
    out = token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=blocker / "cache", log=logs.append)
    _same(out, load_dataset(tok, str(data), **SETTINGS))
    assert any("not cached" in m and "Fix:" in m for m in logs)


def test_cache_dir_follows_its_variable_then_the_lab_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(token_cache.DIR_ENV, str(tmp_path / "tok"))
    assert token_cache.cache_dir() == tmp_path / "tok"
    monkeypatch.delenv(token_cache.DIR_ENV)
    monkeypatch.setenv("DFLASH_LAB_CACHE", str(tmp_path / "lab"))
    assert token_cache.cache_dir() == tmp_path / "lab" / "tokenized"


def test_token_cache_must_be_a_bool():
    assert TrainConfig().token_cache is True
    with pytest.raises(ConfigError, match=r"token_cache='no' is invalid.*Fix:"):
        TrainConfig(token_cache="no")


def test_an_entry_holds_the_real_tokens_only_and_the_cli_lists_and_clears(tok, data, tmp_path, capsys):
    root = tmp_path / "cache"
    out = token_cache.load_dataset_cached(tok, str(data), seq_len=512, block_size=8, root=root)
    ((entry, size, _),) = token_cache.entries(root)
    padded = out.input_ids.numel() * 4  # int32 ids alone, at rows x seq_len
    assert int(out.lengths.sum()) * 5 < size < padded / 2  # ~5 bytes a real token (id + mask), far below padded
    assert token_cache.main(["--dir", str(root)]) == 0
    assert f"{entry.name}" in capsys.readouterr().out
    assert token_cache.main(["--dir", str(root), "--clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out and token_cache.entries(root) == []


def test_runs_starting_together_in_threads_all_get_the_data_and_leave_one_whole_entry(tok, data, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path / "cache"
    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda _: token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root),
                             range(3)))
    for out in outs[1:]:
        _same(out, outs[0])
    assert len(token_cache.entries(root)) == 1 and not list(root.glob("*.tmp"))
    logs = []
    _same(token_cache.load_dataset_cached(tok, str(data), **SETTINGS, root=root, log=logs.append), outs[0])
    assert any("read from the cache" in m for m in logs)
