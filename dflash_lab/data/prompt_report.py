"""What a set of target-written prompts is: counts, what was removed and why, lengths, diversity, openings.

`PromptReport` is a plain dict (written as JSON next to the data) with a text view (`str`, what the command prints)
and an HTML view (`_repr_html_`, what a notebook shows). Diversity is distinct-n: distinct word n-grams / all word
n-grams over the kept user turns (1.0 = no n-gram repeats anywhere; a set of near-identical greetings scores low).
"""

from __future__ import annotations

import html
import statistics

from .prompt_filters import FILTER_REASONS, count_openings, words


def distinct_n(texts: list[str] | list[list[str]], n: int) -> float:
    """Distinct word n-grams / all word n-grams over all texts (or their word lists); 0.0 when there are none."""
    grams: set = set()
    total = 0
    for t in texts:
        w = words(t) if isinstance(t, str) else t
        grams.update(zip(*(w[i:] for i in range(n))))
        total += max(0, len(w) - n + 1)
    return round(len(grams) / total, 4) if total else 0.0


def length_histogram(lengths: list[int]) -> list[dict]:
    """Counts per power-of-two token range: [{"range": "16-31", "lo": 16, "hi": 31, "count": 7}, ...]."""
    if not lengths:
        return []
    out, lo = [], 0
    while lo <= max(lengths):
        hi = 0 if lo == 0 else 2 * lo - 1
        out.append({"range": f"{lo}-{hi}" if hi != lo else f"{lo}", "lo": lo, "hi": hi,
                    "count": sum(lo <= x <= hi for x in lengths)})
        lo = 1 if lo == 0 else 2 * lo
    while out and out[0]["count"] == 0:
        out.pop(0)
    return out


def length_summary(lengths: list[int]) -> dict:
    if not lengths:
        return {"mean": 0.0, "median": 0, "p90": 0, "max": 0}
    s = sorted(lengths)
    return {"mean": round(statistics.fmean(s), 1), "median": s[len(s) // 2], "p90": s[int(0.9 * (len(s) - 1))],
            "max": s[-1]}


class PromptReport(dict):
    """Keys: settings, sampled, filtered {reason: n}, filter_examples {reason: [text, ...]}, exact_duplicates,
    near_duplicates, kept, train, heldout, heldout_unused, heldout_fraction, out, heldout_out, length_tokens
    {mean, median, p90, max}, length_histogram, distinct {1, 2, 3}, openings [[words, n], ...], examples,
    seconds (all), sample_seconds (first turns), prompts_per_s and first_turn_tokens_per_s (first turns), turns
    {user_turns {k: conversations}, answers_truncated, ended_early {reason: n}}, heldout_in_training (held-out
    conversations that share a prompt with the training file, by normalised text: data/heldout_overlap.py; None
    when not checked)."""

    @classmethod
    def build(cls, *, settings: dict, sampled: int, filtered: dict, filter_examples: dict, exact: int, near: int,
              first_turns: list[str], user_turns: list[str], first_turn_tokens: list[int], train: int, heldout: int,
              heldout_unused: int, heldout_fraction: float, out: str, heldout_out: str, seconds: float,
              sample_seconds: float, first_turn_new_tokens: int, turns: dict,
              heldout_in_training: int | None = None) -> "PromptReport":
        user_words = [words(t) for t in user_turns]
        return cls(
            settings=settings, sampled=sampled, filtered=dict(sorted(filtered.items(), key=lambda kv: -kv[1])),
            filter_examples=filter_examples, exact_duplicates=exact, near_duplicates=near, kept=len(first_turns),
            train=train, heldout=heldout, heldout_unused=heldout_unused, heldout_fraction=heldout_fraction,
            out=out, heldout_out=heldout_out, length_tokens=length_summary(first_turn_tokens),
            length_histogram=length_histogram(first_turn_tokens),
            distinct={str(n): distinct_n(user_words, n) for n in (1, 2, 3)},
            openings=[[o, c] for o, c in count_openings(first_turns)], examples=first_turns[:10],
            seconds=round(seconds, 2), sample_seconds=round(sample_seconds, 2),
            prompts_per_s=round(sampled / sample_seconds, 2) if sample_seconds > 0 else 0.0,
            first_turn_tokens_per_s=round(first_turn_new_tokens / sample_seconds, 1) if sample_seconds > 0 else 0.0,
            turns=turns, heldout_in_training=heldout_in_training)

    def lines(self) -> list[str]:
        s = self["settings"]
        u = s.get("user_sampling") or {}
        kept = max(self["kept"], 1)
        out = [f"target-written prompts from {s.get('target')} ({s.get('target_checksum') or 'no checksum'}): "
               f"T={u.get('temperature')} top_p={u.get('top_p')} top_k={u.get('top_k')} seed={u.get('seed')} "
               f"max_prompt_tokens={u.get('max_new_tokens')} turns={s.get('turns')}",
               f"sampled {self['sampled']:,} first turns in {self['sample_seconds']} s ({self['prompts_per_s']:,} "
               f"prompts/s, {self['first_turn_tokens_per_s']:,} new tok/s; {self['seconds']} s in all)",
               f"filtered {sum(self['filtered'].values()):,}; exact duplicates {self['exact_duplicates']:,}; "
               f"near duplicates {self['near_duplicates']:,}; kept {self['kept']:,}",
               f"written: {self['train']:,} -> {self['out']}; held out {self['heldout']:,} -> {self['heldout_out']} "
               f"(fraction {self['heldout_fraction']}; {self['heldout_unused']:,} more held-out prompts not written "
               "and not trained on)"]
        for reason, n in self["filtered"].items():
            out.append(f"  filtered {n:,} {reason}: {FILTER_REASONS.get(reason, reason)}")
            out += [f"      e.g. {ex!r}" for ex in self["filter_examples"].get(reason, [])[:2]]
        t = self["turns"]
        if t:
            out.append(f"user turns per conversation {t['user_turns']}; answers cut at the token limit "
                       f"{t['answers_truncated']:,}; conversations ended early {t['ended_early'] or 0}")
        found = self.get("heldout_in_training")
        out.append("held-out conversations that share a prompt with the training file: "
                   + ("not checked" if found is None else f"{found:,} (by normalised text)"))
        lt = self["length_tokens"]
        out.append(f"first-turn length (tokens): mean {lt['mean']}, median {lt['median']}, p90 {lt['p90']}, "
                   f"max {lt['max']}")
        top = max((b["count"] for b in self["length_histogram"]), default=1)
        for b in self["length_histogram"]:
            bar = "#" * max(1 if b["count"] else 0, 40 * b["count"] // top)
            out.append(f"  {b['range']:>9} {b['count']:>7,} {bar}")
        d = self["distinct"]
        out.append(f"distinct-1/2/3 (user turns): {d['1']} / {d['2']} / {d['3']}")
        out.append("most common openings (first 3 words):")
        out += [f"  {c:>6,} ({100 * c / kept:4.1f}%)  {o!r}" for o, c in self["openings"][:10]]
        out.append("examples:")
        out += [f"  {i + 1:>2}. {_short(t)}" for i, t in enumerate(self["examples"])]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        e = html.escape
        s = self["settings"]
        u = s.get("user_sampling") or {}
        rows = [("target", f"{s.get('target')} ({s.get('target_checksum') or 'no checksum'})"),
                ("sampling", f"T={u.get('temperature')} top_p={u.get('top_p')} top_k={u.get('top_k')} "
                             f"seed={u.get('seed')} max tokens {u.get('max_new_tokens')}"),
                ("sampled", f"{self['sampled']:,} ({self['prompts_per_s']} prompts/s)"),
                ("exact / near duplicates removed", f"{self['exact_duplicates']:,} / {self['near_duplicates']:,}"),
                ("kept", f"{self['kept']:,}"), ("written (train)", f"{self['train']:,}"),
                ("held out", f"{self['heldout']:,} ({self['heldout_unused']:,} more not written)"),
                ("held out and also in training", "not checked" if self.get("heldout_in_training") is None
                 else f"{self['heldout_in_training']:,}"),
                ("distinct-1/2/3", " / ".join(str(self["distinct"][k]) for k in ("1", "2", "3")))]
        rows += [(f"filtered: {r}", f"{n:,}") for r, n in self["filtered"].items()]
        body = "".join(f"<tr><td style='text-align:left'>{e(k)}</td><td style='text-align:left'>{e(str(v))}</td></tr>"
                       for k, v in rows)
        top = max((b["count"] for b in self["length_histogram"]), default=1)
        hist = "".join(f"<tr><td style='text-align:right'>{e(b['range'])}</td><td style='text-align:left'>"
                       f"<span style='display:inline-block;background:#60a5fa;height:0.8em;width:"
                       f"{200 * b['count'] // top}px'></span> {b['count']:,}</td></tr>"
                       for b in self["length_histogram"])
        opens = "".join(f"<li>{e(o)} <small>({c:,})</small></li>" for o, c in self["openings"][:10])
        ex = "".join(f"<li>{e(_short(t, 200))}</li>" for t in self["examples"])
        return (f"<div><b>Target-written prompts</b><table>{body}</table><b>first-turn length (tokens)</b>"
                f"<table>{hist}</table><b>most common openings</b><ol>{opens}</ol><b>examples</b><ol>{ex}</ol></div>")


def _short(text: str, n: int = 140) -> str:
    t = " ".join(text.split())
    return t if len(t) <= n else t[:n - 3] + "..."
