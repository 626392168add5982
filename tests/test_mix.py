"""Mixing chat sources: exact counts for the stated proportions, seeded, without replacement (distinct records, an
error naming the largest n that fits) and with replacement (repeats balanced and renamed), skipped records counted."""

import json
from collections import Counter

import pytest

from dflash_lab.data.chat_formats import DataError, read_chat_data
from dflash_lab.data.mix import main, mix, mix_counts, parse_mix


def _source(path, name, n, *, bad=0):
    lines = [json.dumps({"id": f"{name}{i}", "messages": [{"role": "user", "content": f"{name} question {i}"},
                                                          {"role": "assistant", "content": f"answer {i}"}]})
             for i in range(n)]
    lines += [json.dumps({"messages": [{"role": "user", "content": "no answer"}]})] * bad + ["{not json"] * bad
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def sources(tmp_path):
    return (_source(tmp_path / "chitchat.jsonl", "c", 40, bad=2), _source(tmp_path / "self.jsonl", "s", 200),
            tmp_path)


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_counts_follow_the_proportions_exactly():
    assert mix_counts([0.3, 0.7], 101) == [30, 71]  # 30.3 / 70.7: the one left goes to the larger remainder
    assert mix_counts([1 / 3, 1 / 3, 1 / 3], 100) == [34, 33, 33]  # ties: the earlier source
    assert sum(mix_counts([0.15, 0.35, 0.5], 99_999)) == 99_999
    assert parse_mix("a.jsonl:0.3, dir/b:c.jsonl:0.7") == [("a.jsonl", 0.3), ("dir/b:c.jsonl", 0.7)]
    with pytest.raises(DataError, match="FILE:PROPORTION"):
        parse_mix("a.jsonl")


def test_mix_without_replacement(sources):
    c, s, tmp = sources
    out = tmp / "mix.jsonl"
    report = mix([(c, 0.3), (s, 0.7)], out, 101, seed=5, log=lambda _: None)
    rows = _rows(out)
    assert Counter(r["mix_source"] for r in rows) == {"chitchat": 30, "self": 71}
    assert len({r["id"] for r in rows}) == 101 and not any("#" in r["id"] for r in rows)
    assert [x["count"] for x in report["sources"]] == [30, 71]
    assert report["sources"][0]["available"] == 40  # the record without an answer and the bad line are not usable
    assert report["sources"][0]["skipped"] == {"no_assistant": 2, "malformed_json": 2}
    assert json.loads((tmp / "mix.report.json").read_text())["replacement"] is False
    assert len(read_chat_data(out)) == 101  # training reads the mix as it is
    again = tmp / "again.jsonl"
    mix([(c, 0.3), (s, 0.7)], again, 101, seed=5, log=lambda _: None)
    assert again.read_bytes() == out.read_bytes()
    other = tmp / "other.jsonl"
    mix([(c, 0.3), (s, 0.7)], other, 101, seed=6, log=lambda _: None)
    assert other.read_bytes() != out.read_bytes()


def test_a_source_too_small_is_an_error_that_names_the_fix(sources):
    c, s, tmp = sources
    with pytest.raises(DataError) as e:
        mix([(c, 0.5), (s, 0.5)], tmp / "m.jsonl", 100, log=lambda _: None)
    msg = str(e.value)
    assert "chitchat" in msg and "40 usable" in msg and "asks for 50" in msg
    assert "lower --n to 80" in msg and "--replacement" in msg
    assert not (tmp / "m.jsonl").exists()


def test_mix_with_replacement_repeats_records_evenly(sources):
    c, s, tmp = sources
    out = tmp / "rep.jsonl"
    report = mix([(c, 0.5), (s, 0.5)], out, 250, replacement=True, log=lambda _: None)
    rows = _rows(out)
    chit = [r for r in rows if r["mix_source"] == "chitchat"]
    assert len(chit) == 125 and report["sources"][0]["repeats"] == 85
    uses = Counter(r["id"].split("#")[0] for r in chit)
    assert set(uses.values()) == {3, 4} and sum(uses.values()) == 125  # 40 records: 3 passes + 5 of a fourth
    assert len({r["id"] for r in rows}) == 250


def test_proportions_must_sum_to_one_and_errors_are_one_line(sources, capsys):
    c, s, tmp = sources
    with pytest.raises(DataError, match="sum to 0.9"):
        mix([(c, 0.2), (s, 0.7)], tmp / "x.jsonl", 10, log=lambda _: None)
    with pytest.raises(DataError, match="also a source"):
        mix([(c, 0.5), (s, 0.5)], c, 10, log=lambda _: None)
    assert main(["--mix", f"{c}:0.5,{tmp / 'missing.jsonl'}:0.5", "--n", "10", "--out", str(tmp / "y.jsonl")]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: source") and "does not exist" in out and out.count("\n") == 1


def test_an_out_inside_a_source_folder_and_a_source_listed_twice_are_refused(sources):
    """A mix into its own source folder would read its output and report back in on the next run (another file under
    the same seed); a file listed twice, or inside a listed folder, could give one record twice without replacement."""
    c, s, tmp = sources
    folder = tmp / "pool"
    folder.mkdir()
    _source(folder / "a.jsonl", "a", 30)
    out = folder / "mix.jsonl"
    with pytest.raises(DataError, match=rf"--out {out} lies inside the source folder {folder}: a second mix would read "
                                        rf"this output and its report back in as data\. Fix: write outside it, e\.g\. "
                                        rf"--out {tmp / 'pool-mix.jsonl'}\."):
        mix([(folder, 0.5), (s, 0.5)], out, 10, log=lambda _: None)
    assert not out.exists()
    with pytest.raises(DataError, match=rf"source {c} is listed twice: its records could be drawn twice into one mix\. "
                                        r"Fix: list it once \(with proportion 0\.6 for both shares\)\."):
        mix([(c, 0.3), (s, 0.4), (c, 0.3)], tmp / "x.jsonl", 10, log=lambda _: None)
    with pytest.raises(DataError, match=rf"source {folder / 'a.jsonl'} lies inside the source folder {folder}"):
        mix([(folder, 0.5), (folder / "a.jsonl", 0.5)], tmp / "x.jsonl", 10, log=lambda _: None)
    report = mix([(folder, 0.5), (s, 0.5)], tmp / "pool-mix.jsonl", 20, log=lambda _: None)
    rows = _rows(tmp / "pool-mix.jsonl")
    assert len(rows) == len({r["id"] for r in rows}) == 20 and report["sources"][0]["count"] == 10
