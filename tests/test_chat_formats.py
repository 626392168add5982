"""Chat data files: both formats in JSONL / JSON / Parquet / `datasets` dirs read alike; every bad record is named
(file, line, what) and either raises or is counted in the report; nothing is dropped silently."""

import json
from pathlib import Path

import pytest

from dflash_lab.chat_formats import DataError, DataReport, from_messages, read_chat_data

FIXTURES = Path(__file__).parent / "fixtures"

CONVS = [
    [{"role": "user", "content": "Count from 1 to 5."}, {"role": "assistant", "content": "1 2 3 4 5"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Spell cat."},
     {"role": "assistant", "content": "c a t"}, {"role": "user", "content": "Now dog."},
     {"role": "assistant", "content": "d o g"}],
]
SHAREGPT_ROLE = {"user": "human", "assistant": "gpt"}


def _sharegpt(msgs):
    rec = {"conversations": [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in msgs
                             if m["role"] != "system"]}
    system = [m["content"] for m in msgs if m["role"] == "system"]
    rec["system"] = system[0] if system else ""  # every record has the key (Parquet infers columns from row 0)
    return rec


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_both_formats_in_every_container_read_identically(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    openai = [{"messages": m} for m in CONVS]
    sharegpt = [_sharegpt(m) for m in CONVS]
    files = {
        "openai.jsonl": _write_jsonl(tmp_path / "openai.jsonl", openai),
        "sharegpt.jsonl": _write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt),
        "openai.json": tmp_path / "openai.json",
    }
    files["openai.json"].write_text(json.dumps(openai))
    for name, recs in (("openai.parquet", openai), ("sharegpt.parquet", sharegpt)):
        pq.write_table(pa.Table.from_pylist(recs), tmp_path / name)
        files[name] = tmp_path / name
    for name, path in files.items():
        chat = read_chat_data(path)
        assert [c.messages for c in chat.conversations] == CONVS, name
        assert chat.report["records"] == 2 and chat.report["conversations"] == 2 and not chat.report["skipped"]
        assert chat.report["formats"] == {("sharegpt" if "sharegpt" in name else "openai"): 2}
    chat = read_chat_data(files["openai.jsonl"])
    assert chat.sources == [f"{files['openai.jsonl']}:1", f"{files['openai.jsonl']}:2"]
    assert chat.ids == ["openai.jsonl:1", "openai.jsonl:2"]
    parquet = read_chat_data(files["openai.parquet"])
    assert parquet.sources[1].endswith("openai.parquet:row 1")
    # a directory of data files is read in name order
    assert len(read_chat_data(tmp_path)) == 10


def test_hf_datasets_save_to_disk_directories():
    """Fixtures written by `datasets` 4.4.1 save_to_disk(); read with `datasets` if installed, else with pyarrow."""
    chat = read_chat_data(FIXTURES / "hf_dataset_openai")
    assert chat.ids == ["a", "b"] and [c.messages for c in chat.conversations] == CONVS
    assert chat.report["skipped"] == {"unknown_role": 1}
    assert chat.report["examples"]["unknown_role"][0].endswith("hf_dataset_openai:row 2: message 1 has role 'wizard';"
                                                                " known roles: ['system', 'user', 'assistant', "
                                                                "'tool', 'developer', 'function']")
    assert [c.messages for c in read_chat_data(FIXTURES / "hf_datasetdict_openai").conversations] == CONVS
    with pytest.raises(DataError, match="no usable conversation"):
        read_chat_data(FIXTURES / "hf_datasetdict_openai", split="test")
    with pytest.raises(DataError, match=r"splits \['train', 'test'\]; choose one"):
        read_chat_data(FIXTURES / "hf_datasetdict_openai", split="validation")
    assert read_chat_data(FIXTURES / "hf_dataset_sharegpt")[0] == CONVS[0]


def test_hf_datasets_roundtrip_with_datasets_installed(tmp_path):
    datasets = pytest.importorskip("datasets", reason="`datasets` is optional and not installed here; the "
                                                      "committed fixtures cover its on-disk format")
    datasets.Dataset.from_list([{"messages": m} for m in CONVS]).save_to_disk(str(tmp_path / "ds"))
    assert [c.messages for c in read_chat_data(tmp_path / "ds").conversations] == CONVS


BAD_LINES = [
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', None),
    ('{"messages": [{"role": "user", "content": "hi"}, ', ("malformed_json", "not valid JSON")),
    ('[1, 2]', ("not_an_object", "record is a list")),
    ('{"prompt": "hi", "response": "yo"}', ("no_messages", "expected 'messages' (OpenAI) or 'conversations'")),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}',
     ("unknown_role", "message 1 has role 'robot'")),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]}',
     ("empty_assistant", "assistant message 1 is empty")),
    ('{"messages": [{"role": "user", "content": "hi"}]}', ("no_assistant", "no assistant message")),
    ('{"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}', ("bad_message", "has no 'content'")),
    ('{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]}',
     ("bad_message", "content is int")),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}, '
     '{"role": "assistant", "content": "x"}]}', ("unsupported_content", "content part of type 'image_url'")),
    ('{"conversations": [{"from": "human", "value": "hi"}, {"from": "alien", "value": "x"}]}',
     ("unknown_role", "turn 1 has from='alien'")),
    ('{"messages": []}', ("no_messages", "the message list is empty")),
]


@pytest.fixture
def bad_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    raw = "\n".join(line for line, _ in BAD_LINES) + "\n\n"
    path.write_bytes(raw.encode() + b'{"messages": "\xff\xfe"}\n')  # + a line that is not UTF-8
    return path


def test_each_bad_record_is_counted_with_file_line_and_reason(bad_file):
    chat = read_chat_data(bad_file)
    rep = chat.report
    assert len(chat) == 1 and rep["records"] == len(BAD_LINES) + 1
    expected = {}
    for lineno, (_, issue) in enumerate(BAD_LINES, 1):
        if issue:
            expected[issue[0]] = expected.get(issue[0], 0) + 1
            hits = [e for e in rep["examples"][issue[0]] if e.startswith(f"{bad_file}:{lineno}: ")]
            assert len(hits) == 1 and issue[1] in hits[0], (lineno, rep["examples"][issue[0]])
    expected["unreadable"] = 1
    assert rep["skipped"] == expected
    assert rep.total_skipped == len(BAD_LINES)  # all bad lines + the non-UTF-8 one, the good one kept
    assert rep["examples"]["unreadable"] == [f"{bad_file}:{len(BAD_LINES) + 2}: byte 14 is not valid UTF-8"]
    text = str(rep)
    assert "skipped 2: a message has a role the chat template does not know [unknown_role]" in text
    html = rep._repr_html_()
    assert "unknown_role" in html and f"{bad_file}:5" in html and "<table>" in html


@pytest.mark.parametrize("lineno", [i for i, (_, issue) in enumerate(BAD_LINES, 1) if issue][:6])
def test_raise_mode_names_file_line_and_problem(tmp_path, lineno):
    good, (line, (reason, what)) = BAD_LINES[0][0], BAD_LINES[lineno - 1]
    path = tmp_path / "one_bad.jsonl"
    path.write_text("\n".join([good] * (lineno - 1) + [line, good]) + "\n")
    with pytest.raises(DataError) as e:
        read_chat_data(path, on_error="raise")
    msg = str(e.value)
    assert msg.startswith(f"{path}:{lineno}: ") and what in msg and f"[{reason}]" in msg and "Fix" in msg


def test_content_parts_reasoning_aliases_and_format_hints(tmp_path):
    rec = {"id": 7, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "reasoning": "greet back"}]}
    chat = read_chat_data(_write_jsonl(tmp_path / "x.jsonl", [rec, rec]))
    assert chat[0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "yo", "reasoning_content": "greet back"}]
    assert chat.ids == ["7", "7@x.jsonl:2"]  # duplicate ids are made unique (regeneration resumes by id)
    sg = _write_jsonl(tmp_path / "sg.jsonl", [_sharegpt(CONVS[0])])
    with pytest.raises(DataError, match="it looks like ShareGPT: use data_format='sharegpt'"):
        read_chat_data(sg, data_format="openai", on_error="raise")
    assert read_chat_data(sg, data_format="sharegpt")[0] == CONVS[0]
    with pytest.raises(DataError, match="data_format='xml' is unknown"):
        read_chat_data(sg, data_format="xml")


def test_unusable_files_and_paths_raise_clearly(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_chat_data(tmp_path / "nope.jsonl")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(DataError, match="holds no .jsonl/.json/.parquet"):
        read_chat_data(empty_dir)
    allbad = _write_jsonl(tmp_path / "allbad.jsonl", [{"text": "x"}, {"text": "y"}])
    with pytest.raises(DataError) as e:
        read_chat_data(allbad)
    assert "no usable conversation (2 records read)" in str(e.value) and "no_messages" in str(e.value)


def test_in_memory_lists_get_the_same_validation():
    chat = from_messages([CONVS[0], [{"role": "user", "content": "x"}], CONVS[1]])
    assert len(chat) == 2 and chat.report["skipped"] == {"no_assistant": 1}
    assert chat.report["examples"]["no_assistant"] == ["conversations[1]: the conversation has no assistant message"]
    prompts = from_messages([[{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]],
                            require_assistant=False)
    assert len(prompts) == 1  # regeneration input: assistant turns are placeholders
    assert isinstance(chat.report, DataReport) and json.loads(json.dumps(chat.report))["conversations"] == 2
