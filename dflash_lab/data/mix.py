"""Mix chat data sources with stated proportions into one file: exact counts, seeded, with or without replacement.

    python -m dflash_lab.data.mix --mix chitchat.jsonl:0.3,self.jsonl:0.7 --n 100000 --out mix.jsonl [--replacement]

Counts are the proportions times n, rounded by largest remainder so they sum to exactly n. Without replacement
(the default) each source gives that many distinct records, drawn by a seeded permutation; a source too small for
its share is an error that names the largest n that fits. With replacement a small source is repeated: whole
passes over freshly seeded permutations, then part of one more, so no record is used more than once more often
than any other (repeats get ids ending in "#2", "#3", ...). The mixed records are shuffled together (seeded) and
written in the OpenAI chat format {"id": "<source>/<id>", "messages", "source", "mix_source"} (plus a source's
"generation" field), with `<out stem>.report.json` stating counts, proportions, seed and the replacement mode.
Records that training would not use (no assistant turn, malformed) are skipped and counted, so the proportions hold
for the conversations that train.
"""

from __future__ import annotations

import html
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from .chat_formats import DataError, normalize_record
from .files import FileIssue, RecordIssue, find_data_files, iter_records


@dataclass(frozen=True)
class Source:
    path: Path
    proportion: float
    label: str


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """"a.jsonl:0.3,b.jsonl:0.7" -> [("a.jsonl", 0.3), ("b.jsonl", 0.7)]."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        path, sep, prop = item.rpartition(":")
        try:
            value = float(prop)
        except ValueError:
            value = None
        if not sep or not path or value is None:
            raise DataError(f"--mix item {item!r} is not FILE:PROPORTION. Fix: write e.g. "
                            "--mix chitchat.jsonl:0.3,self.jsonl:0.7")
        out.append((path, value))
    return out


def mix_counts(proportions: list[float], n: int) -> list[int]:
    """Records per source: floor(p * n), then the remaining ones to the largest remainders (earlier source on ties)."""
    raw = [p * n for p in proportions]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[:n - sum(counts)]:
        counts[i] += 1
    return counts


def _sources(items: list[tuple[str | Path, float]]) -> list[Source]:
    if not items:
        raise DataError("no sources to mix. Fix: pass --mix FILE:PROPORTION,FILE:PROPORTION")
    for path, p in items:
        if not p > 0:
            raise DataError(f"source {path} has proportion {p}; proportions must be > 0. Fix: drop the source or "
                            "give it a positive share.")
    total = sum(p for _, p in items)
    if abs(total - 1.0) > 1e-6:
        raise DataError(f"the proportions sum to {total:g}, not 1. Fix: state shares that sum to 1, e.g. "
                        + ",".join(f"{Path(path).name}:{p / total:.4g}" for path, p in items))
    labels: dict[str, int] = {}
    out = []
    for path, p in items:
        stem = Path(path).name.split(".")[0] or "source"
        labels[stem] = labels.get(stem, 0) + 1
        out.append(Source(Path(path), p, stem if labels[stem] == 1 else f"{stem}-{labels[stem]}"))
    return out


def check_paths(srcs: list[Source], out: Path) -> None:
    """Refuse, before anything is read, an output that is a source or lies inside a source folder (the next mix
    would read it and its report back in: not the same file under the same seed), and a source listed twice or
    inside another listed folder (its records could be drawn twice in a mix without replacement)."""
    dst = out.resolve()
    for s in srcs:
        src = s.path.resolve()
        if dst == src:
            raise DataError(f"--out {out} is also a source; writing it would destroy that source. Fix: write "
                            "elsewhere.")
        if src in dst.parents:
            raise DataError(f"--out {out} lies inside the source folder {s.path}: a second mix would read this "
                            f"output and its report back in as data. Fix: write outside it, e.g. "
                            f"--out {src.parent / (src.name + '-mix.jsonl')}.")
    for i, a in enumerate(srcs):
        for b in srcs[i + 1:]:
            pa, pb = a.path.resolve(), b.path.resolve()
            if pa == pb or pa in pb.parents or pb in pa.parents:
                inner, outer = (b, a) if pa in pb.parents else (a, b)
                how = "is listed twice" if pa == pb else f"lies inside the source folder {outer.path}"
                raise DataError(f"source {inner.path} {how}: its records could be drawn twice into one mix. Fix: "
                                f"list it once (with proportion {a.proportion + b.proportion:g} for both shares)"
                                + ("" if pa == pb else ", or move it out of that folder") + ".")


def read_source(src: Source, *, require_assistant: bool = True) -> tuple[list[dict], dict]:
    """Usable records of one source as output records, and the skip counts {reason: n}."""
    if not src.path.exists():
        raise DataError(f"source {src.path} does not exist. Fix: check the path in --mix.")
    files, skipped_files = find_data_files(src.path)
    records, skipped, seen = [], {}, set()
    for f in files:
        # ids name the file's path inside a source folder: same-named files in two subfolders stay apart
        name = f.relative_to(src.path).as_posix() if src.path.is_dir() and src.path in f.parents else f.name
        for where, rec in iter_records(f):
            try:
                if isinstance(rec, FileIssue):
                    raise RecordIssue(rec.reason, rec.detail)
                if isinstance(rec, RecordIssue):
                    raise rec
                msgs, _ = normalize_record(rec, where, require_assistant=require_assistant)
            except RecordIssue as issue:
                skipped[issue.reason] = skipped.get(issue.reason, 0) + 1
                continue
            rid = rec.get("id") if isinstance(rec.get("id"), (str, int)) else name + where[len(str(f)):]
            rid = f"{src.label}/{rid}" if f"{src.label}/{rid}" not in seen else f"{src.label}/{rid}@{where}"
            seen.add(rid)
            out = {"id": rid, "messages": msgs, "source": where, "mix_source": src.label}
            if isinstance(rec.get("generation"), dict):
                out["generation"] = rec["generation"]
            records.append(out)
    if skipped_files:
        skipped["skipped_files"] = len(skipped_files)
    return records, skipped


def _largest_fitting_n(sources: list[Source], available: list[int]) -> int:
    n = int(min(a / s.proportion for s, a in zip(sources, available)))
    while n > 0 and any(c > a for c, a in zip(mix_counts([s.proportion for s in sources], n), available)):
        n -= 1
    return n


def _draw(records: list[dict], count: int, rng: random.Random, replacement: bool) -> list[dict]:
    if not replacement or count <= len(records):
        return [records[i] for i in rng.sample(range(len(records)), count)]
    out, rep = [], 1
    while len(out) < count:
        order = rng.sample(range(len(records)), len(records))[:count - len(out)]
        out += [records[i] if rep == 1 else {**records[i], "id": f"{records[i]['id']}#{rep}"} for i in order]
        rep += 1
    return out


class MixReport(dict):
    """Keys: out, n, seed, replacement, sources [{label, path, proportion, available, count, actual, repeats,
    skipped}]."""

    def lines(self) -> list[str]:
        mode = "with replacement (small sources repeated)" if self["replacement"] else "without replacement"
        out = [f"mixed {self['n']:,} conversations -> {self['out']} (seed {self['seed']}, {mode})"]
        for s in self["sources"]:
            out.append(f"  {s['label']:<16} {s['count']:>8,} ({100 * s['actual']:.2f}%, "
                       f"asked {100 * s['proportion']:.2f}%)"
                       f" of {s['available']:,} usable in {s['path']}"
                       + (f"; {s['repeats']:,} repeats" if s["repeats"] else "")
                       + (f"; skipped {s['skipped']}" if s["skipped"] else ""))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(f"<tr><td>{e(s['label'])}</td><td>{s['count']:,}</td><td>{100 * s['actual']:.2f}%</td>"
                       f"<td>{100 * s['proportion']:.2f}%</td><td>{s['available']:,}</td><td>{s['repeats']:,}</td>"
                       f"<td>{e(str(s['skipped'] or ''))}</td></tr>" for s in self["sources"])
        return (f"<div><b>{e(self.lines()[0])}</b><table><tr><th>source</th><th>count</th><th>share</th>"
                f"<th>asked</th><th>usable</th><th>repeats</th><th>skipped</th></tr>{rows}</table></div>")


def mix(sources: list[tuple[str | Path, float]], out: str | Path, n: int, *, seed: int = 0,
        replacement: bool = False, require_assistant: bool = True, log=print) -> MixReport:
    """Write `n` records drawn from `sources` [(path, proportion), ...] to `out`; return (and write) the report."""
    if not isinstance(n, int) or n < 1:
        raise DataError(f"n={n!r} must be an integer >= 1. Fix: pass --n with the number of conversations to write.")
    srcs = _sources(sources)
    out = Path(out)
    check_paths(srcs, out)
    read = [read_source(s, require_assistant=require_assistant) for s in srcs]
    available = [len(r) for r, _ in read]
    counts = mix_counts([s.proportion for s in srcs], n)
    for s, a, c, (_, skipped) in zip(srcs, available, counts, read):
        if a == 0:
            raise DataError(f"source {s.path} has no usable conversation (skipped {skipped}). Fix: check its format "
                            "or drop it from --mix.")
        if c > a and not replacement:
            raise DataError(f"source {s.label} ({s.path}) has {a:,} usable conversations but the mix asks for {c:,} "
                            f"({s.proportion:g} of {n:,}). Fix: lower --n to {_largest_fitting_n(srcs, available):,} "
                            "(the most these sources give without replacement), lower its proportion, or pass "
                            "--replacement to repeat its records.")
    chosen = []
    for k, (s, c, (records, _)) in enumerate(zip(srcs, counts, read)):
        chosen.append(_draw(records, c, random.Random(f"mix:{seed}:{k}:{s.label}"), replacement))
    rows = [r for part in chosen for r in part]
    random.Random(f"mix:{seed}:order").shuffle(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    report = MixReport(out=str(out), n=n, seed=seed, replacement=replacement, sources=[
        {"label": s.label, "path": str(s.path), "proportion": s.proportion, "available": a, "count": c,
         "actual": round(c / n, 6), "repeats": max(0, c - a), "skipped": skipped}
        for s, a, c, (_, skipped) in zip(srcs, available, counts, read)])
    stem = out.with_suffix("") if out.suffix else out
    Path(f"{stem}.report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(str(report))
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mix", required=True, help="FILE:PROPORTION,FILE:PROPORTION,... (proportions sum to 1)")
    p.add_argument("--n", type=int, required=True, help="conversations to write")
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replacement", action="store_true",
                   help="repeat the records of a source too small for its share (default: refuse)")
    p.add_argument("--allow-prompts-only", action="store_true",
                   help="also count records without an assistant turn (a prompts file to regenerate)")
    a = p.parse_args(argv)
    try:
        mix(parse_mix(a.mix), a.out, a.n, seed=a.seed, replacement=a.replacement,
            require_assistant=not a.allow_prompts_only, log=lambda s: print(s, flush=True))
    except DataError as e:
        print(f"error: {e}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
