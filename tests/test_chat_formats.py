"""Chat data files: both formats in JSONL / JSON / Parquet / `datasets` dirs read alike; every bad record is named
(file, line, what) and either raises or is counted in the report; nothing is dropped silently."""

import json
from pathlib import Path

import pytest

from dflash_lab.data.chat_formats import DataError, DataReport, from_messages, read_chat_data

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


# --- data loads lose nothing silently --------------------------------------------------------------------------------
def test_directory_reads_nested_upper_case_and_compressed_files_and_reports_every_skip(tmp_path):
    import bz2
    import gzip
    import lzma

    import pyarrow as pa
    import pyarrow.parquet as pq

    line = "".join(json.dumps({"messages": m}) + "\n" for m in CONVS).encode()
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / ".cache").mkdir()
    (tmp_path / "A.JSONL").write_bytes(line)
    (tmp_path / "sub" / "b.jsonl.gz").write_bytes(gzip.compress(line))
    (tmp_path / "sub" / "deeper" / "c.Json.BZ2").write_bytes(bz2.compress(json.dumps(
        [{"messages": m} for m in CONVS]).encode()))
    (tmp_path / "sub" / "d.jsonl.xz").write_bytes(lzma.compress(line))
    pq.write_table(pa.Table.from_pylist([{"messages": m} for m in CONVS]), tmp_path / "sub" / "E.PARQUET")
    skipped = {"f.jsonl.zst": ".zst compression has no reader", "notes.txt": "not a data file (extension .txt",
               ".hidden.jsonl": "hidden file", "g.parquet.gz": "compressed Parquet file", ".cache": "hidden folder"}
    for name in skipped:
        if name != ".cache":
            (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".cache" / "h.jsonl").write_bytes(line)
    (tmp_path / "sub" / "empty.parquet").write_bytes(b"")
    (tmp_path / "sub" / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    many = "".join(json.dumps({"messages": CONVS[0], "id": i}) + "\n" for i in range(300)).encode()
    (tmp_path / "sub" / "cut.jsonl.gz").write_bytes(gzip.compress(many)[:-200])  # a download that stopped

    chat = read_chat_data(tmp_path)
    files = chat.report["files"]
    cut = files["read"][str(tmp_path / "sub" / "cut.jsonl.gz")]
    assert 100 < cut < 300  # the lines before the cut are kept
    assert files["read"] == {str(tmp_path / n): r for n, r in [
        ("A.JSONL", 2), ("sub/E.PARQUET", 2), ("sub/b.jsonl.gz", 2), ("sub/corrupt.parquet", 0),
        ("sub/cut.jsonl.gz", cut), ("sub/d.jsonl.xz", 2), ("sub/deeper/c.Json.BZ2", 2), ("sub/empty.parquet", 0)]}
    assert {Path(f).name: why for f, why in files["skipped"].items()}.keys() == skipped.keys()
    for f, why in files["skipped"].items():
        assert skipped[Path(f).name] in why, (f, why)
    assert len(chat) == 10 + cut and all(c.messages in CONVS for c in chat.conversations)
    assert chat.report["skipped"] == {"unreadable_file": 3}
    ex = chat.report["examples"]["unreadable_file"]
    assert ex[0].startswith(f"{tmp_path / 'sub' / 'corrupt.parquet'}:row 0: Parquet cannot be read")
    assert ex[1] == (f"{tmp_path / 'sub' / 'cut.jsonl.gz'}:{cut + 1}: cannot be read from line {cut + 1} on (EOFError: "
                     "Compressed file ended before the end-of-stream marker was reached)")
    assert ex[2].startswith(f"{tmp_path / 'sub' / 'empty.parquet'}:row 0: Parquet cannot be read")
    assert "files: 8 read, 5 skipped" in str(chat.report) and "skipped file" in str(chat.report)
    with pytest.raises(DataError, match=r"corrupt.parquet:row 0: Parquet cannot be read .*\[unreadable_file\]"):
        read_chat_data(tmp_path, on_error="raise")


ODD = [  # (record line, reason, detail) - odd types in every field, invalid Unicode, assistant-only
    ('{"messages": [{"role": ["user"], "content": "hi"}, {"role": "assistant", "content": "x"}]}', "bad_message",
     "string 'role'"),
    ('{"messages": [{"role": 3, "content": "hi"}, {"role": "assistant", "content": "x"}]}', "bad_message", "role"),
    ('{"messages": [{"role": "user", "content": {"a": 1}}, {"role": "assistant", "content": "x"}]}', "bad_message",
     "content is dict"),
    ('{"messages": [{"role": "user", "content": "hi", "name": 5}, {"role": "assistant", "content": "x"}]}',
     "bad_message", "name=5"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "tool_calls": "f()"}]}',
     "bad_message", "tool_calls of type str"),
    ('{"messages": [{"role": "user", "content": "hi \\ud800"}, {"role": "assistant", "content": "x"}]}',
     "unreadable", "lone surrogate"),
    ('{"messages": [{"role": "assistant", "content": "only me"}]}', "no_prompt", "starts with an assistant"),
    ('{"conversations": [{"from": ["human"], "value": "hi"}, {"from": "gpt", "value": "x"}]}', "bad_message",
     "needs 'from'"),
    ('{"messages": {"role": "user"}}', "no_messages", "expected 'messages'"),
    ('"just a string"', "not_an_object", "record is a str"),
    ('{"messages": [{"role": "user", "content": "' + "[" * 100 + '"}]', "malformed_json", "not valid JSON"),
]


def test_odd_types_in_any_field_are_counted_never_abort(tmp_path):
    good = json.dumps({"id": [1, 2], "messages": CONVS[0]})  # an odd-typed id is ignored, not fatal
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join([good] + [line for line, _, _ in ODD]) + "\n")
    chat = read_chat_data(path)
    assert len(chat) == 1 and chat.ids == ["odd.jsonl:1"]
    rep = chat.report
    from collections import Counter

    assert rep["skipped"] == Counter(reason for _, reason, _ in ODD) and rep["records"] == len(ODD) + 1
    for lineno, (line, reason, detail) in enumerate(ODD, 2):
        one = tmp_path / f"one{lineno}.jsonl"
        one.write_text(good + "\n" + line + "\n")
        assert read_chat_data(one).report["examples"][reason][0].startswith(f"{one}:2: ")
        with pytest.raises(DataError) as e:
            read_chat_data(one, on_error="raise")
        assert str(e.value).startswith(f"{one}:2: ") and detail in str(e.value) and f"[{reason}]" in str(e.value)


def _fuzz_value(rng, depth=0):
    kinds = ["none", "bool", "int", "float", "str", "surrogate", "list", "dict"][: 6 if depth > 2 else 8]
    k = rng.choice(kinds)
    if k == "list":
        return [_fuzz_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if k == "dict":
        return {rng.choice(["role", "content", "from", "value", "type", "text", "x"]): _fuzz_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return {"none": None, "bool": rng.random() < 0.5, "int": rng.randint(-5, 5), "float": rng.random() * 1e3,
            "str": rng.choice(["", " ", "hi", "assistant", "user", "<|im_end|>", "é" * 3]),
            "surrogate": "a\ud83d"}[k]


def _fuzz_record(rng):
    """A valid conversation with 0-3 random mutations anywhere, or raw garbage."""
    roll = rng.random()
    if roll < 0.08:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))).replace(b"\n", b" ")
    if roll < 0.12:
        return json.dumps({"messages": CONVS[1]}).encode()[: rng.randint(1, 60)]  # cut off
    rec = ({"messages": json.loads(json.dumps(rng.choice(CONVS)))} if rng.random() < 0.5
           else json.loads(json.dumps(_sharegpt(rng.choice(CONVS)))))
    for _ in range(rng.randint(0, 3)):
        key = "messages" if "messages" in rec else "conversations"
        target, slot = rec, rng.choice([key, "id", "system", key, key])
        if slot in (key,) and isinstance(rec.get(key), list) and rec[key] and rng.random() < 0.8:
            target = rng.choice(rec[key]) if isinstance(rec[key], list) else rec
            slot = rng.choice(list(target) + ["name", "tool_calls", "reasoning_content"]) if isinstance(
                target, dict) else slot
        if isinstance(target, dict):
            target[slot] = _fuzz_value(rng)
    if rng.random() < 0.05:
        rec = _fuzz_value(rng)
    return json.dumps(rec).encode()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fuzz_reader_never_aborts_and_accounts_for_every_line(tmp_path, seed):
    import random

    rng = random.Random(seed)
    lines = [json.dumps({"messages": CONVS[0]}).encode()] + [_fuzz_record(rng) for _ in range(300)]
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    nonblank = sum(1 for line in lines if line.strip())
    chat = read_chat_data(path)
    rep = chat.report
    assert rep["records"] == nonblank and len(chat) + rep.total_skipped == nonblank
    assert 10 < len(chat) < nonblank and len(rep["skipped"]) >= 4  # both outcomes and several reasons happen
    for reason, examples in rep["examples"].items():
        assert all(e.startswith(f"{path}:") for e in examples), reason
    for conv in chat.conversations:  # what is kept is well-formed
        assert all(isinstance(m["content"], str) and m["role"] in ("system", "user", "assistant", "tool")
                   for m in conv.messages)
        json.dumps(conv.messages, ensure_ascii=False).encode("utf-8")
    first_bad = min(int(ex[0][len(str(path)) + 1:].split(":")[0]) for ex in rep["examples"].values())
    with pytest.raises(DataError, match=rf"^{path}:{first_bad}: "):
        read_chat_data(path, on_error="raise")


def test_same_named_files_in_a_folder_give_distinct_ids_that_name_their_file(tmp_path):
    """Three a/x.jsonl, b/x.jsonl, c/x.jsonl without ids (and one id repeated in each): every id distinct, fixed
    by the file's path in the folder (two files once shared 'x.jsonl:1@x.jsonl:1': a resume refused, or one
    conversation was never answered)."""
    for sub in "abc":
        (tmp_path / sub).mkdir()
        _write_jsonl(tmp_path / sub / "x.jsonl", [{"messages": CONVS[0]}, {"id": "same", "messages": CONVS[1]}])
    chat = read_chat_data(tmp_path)
    assert chat.ids == ["a/x.jsonl:1", "same", "b/x.jsonl:1", "same@b/x.jsonl:2", "c/x.jsonl:1", "same@c/x.jsonl:2"]
    assert read_chat_data(tmp_path / "b").ids == ["x.jsonl:1", "same"]  # the data path's own files: as before
    (tmp_path / "d").mkdir()
    _write_jsonl(tmp_path / "d" / "y.jsonl", [{"id": "same@b/x.jsonl:2", "messages": CONVS[0]}])
    assert read_chat_data(tmp_path).ids[-1] == "same@b/x.jsonl:2@d/y.jsonl:1"  # an id that spells another one


def test_a_data_folder_read_leaves_held_out_files_and_the_tools_reports_out(tmp_path):
    from dflash_lab.data.files import find_data_files

    names = ["train.jsonl", "heldout.jsonl", "self.heldout.jsonl", "chitchat-heldout.jsonl.gz", "self.report.json",
             "regen.jsonl.meta.json", "regen.jsonl"]
    for n in names:
        _write_jsonl(tmp_path / n, [{"messages": CONVS[0]}])
    files, skipped = find_data_files(tmp_path)
    assert [f.name for f in files] == ["regen.jsonl", "train.jsonl"]
    assert sum("held-out file: never training data" in skipped[str(tmp_path / n)] for n in names[1:4]) == 3
    assert sum("report or settings file" in skipped[str(tmp_path / n)] for n in names[4:6]) == 2
    assert find_data_files(tmp_path / "heldout.jsonl")[0] == [tmp_path / "heldout.jsonl"]  # named: read as asked


def test_a_truncated_line_is_reported_as_cut_off_not_as_a_control_character():
    from dflash_lab.data.files import _parse_line

    issue = _parse_line(b'{"messages": [{"role": "user", "content": "hel\n')  # the writer stopped mid-record
    text = str(issue)
    assert "Invalid control character" not in text
    assert "cut-off (truncated) line" in text and "unterminated string starting at column 43" in text
    assert "Expecting value at column 7" in str(_parse_line(b'{"a": x}\n'))  # a bad value mid-line stays itself
