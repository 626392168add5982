"""Clean a pile of generated prompts: normalise, drop exact and near duplicates, filter bad turns, split off a
fixed held-out set.

Everything here is a pure function of the texts (no model, no randomness beyond fixed hash seeds), so the same
input always gives the same kept set in the same order:
- exact duplicates: equal after NFKC, case folding and whitespace collapsing; the first occurrence is kept;
- near duplicates: word-3-gram shingle sets whose Jaccard similarity is >= a threshold (0.7 by default). MinHash
  (128 hash functions in b bands of r rows, a locality-sensitive index) only proposes candidates; each candidate
  pair is confirmed with the exact Jaccard of the two sets, so no pair below the threshold is ever removed. r is
  the largest for which a pair AT the threshold becomes a candidate with probability 1 - (1 - t^r)^b >= 0.99
  (t = 0.7: 32 bands of 4, 0.9998; t = 0.5: 42 of 3, 0.996), so pairs further below it rarely cost a comparison and the
  work stays near-linear: 100k prompts take seconds, not the 5e9 comparisons of all pairs;
- filters, one reason per turn (the first that applies, in FILTER_REASONS order), each counted;
- held-out membership by a hash of the normalised text (u in [0, 1) below `fraction`), so a prompt is held out or
  not whatever else was generated: the split stays fixed as N grows, and no held-out prompt is ever trained on.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

FILTER_REASONS = {
    "truncated": "hit the token limit before the end-of-turn token (the turn is cut off mid-sentence)",
    "empty": "nothing but whitespace",
    "template_tokens": "holds a special token of the tokenizer or a role header (the model wrote template markup)",
    "control_chars": "holds control, unassigned or private-use characters, or U+FFFD from broken byte sequences",
    "repetitive": "repeats itself: too many repeated word 3-grams, or one character run too long",
    "low_letter_ratio": "too few letters among its non-space characters (symbols, digits, byte soup)",
}

_WS = re.compile(r"\s+")
_WORD = re.compile(r"\w+", re.UNICODE)


def normalize(text: str) -> str:
    """The text exact-duplicate detection and held-out hashing see: NFKC, case-folded, whitespace collapsed."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def words(text: str) -> list[str]:
    return _WORD.findall(normalize(text))


# ---------------------------------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class FilterConfig:
    """Thresholds of the turn filters; recorded in the report."""

    min_letter_ratio: float = 0.3
    """Letters / non-space characters below this = low_letter_ratio ("What is 12*13?" has 0.55)."""
    max_repeated_trigram_ratio: float = 0.35
    """1 - distinct/total word 3-grams above this = repetitive (prose sits near 0; a phrase said 4 times, 0.7)."""
    min_words_for_repetition: int = 10
    """Shorter turns are not judged by their 3-grams (too few to mean anything)."""
    max_char_run: int = 24
    """A single character repeated this many times in a row = repetitive ("!!!!..." loops)."""

    def __post_init__(self) -> None:
        for name, lo, hi in (("min_letter_ratio", 0, 1), ("max_repeated_trigram_ratio", 0, 1)):
            v = getattr(self, name)
            if not lo <= v <= hi:
                raise ValueError(f"FilterConfig.{name}={v!r} must be in [{lo}, {hi}]. Fix: use e.g. "
                                 f"{getattr(FilterConfig, name)}.")
        for name in ("min_words_for_repetition", "max_char_run"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 2:
                raise ValueError(f"FilterConfig.{name}={getattr(self, name)!r} must be an integer >= 2.")


def repeated_trigram_ratio(text: str | list[str]) -> float:
    """1 - distinct word 3-grams / all word 3-grams (0 when there are none); text or its words."""
    w = words(text) if isinstance(text, str) else text
    grams = list(zip(w, w[1:], w[2:]))
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def letter_ratio(text: str) -> float:
    chars = len(text) - sum(map(str.isspace, text))
    return sum(map(str.isalpha, text)) / chars if chars else 0.0


# C0/C1 controls but newline, tab and carriage return; surrogates; private use; the replacement character.
_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ue000-\uf8ff\ufffd]")


def has_bad_chars(text: str) -> bool:
    """Control, surrogate, private-use, unassigned or replacement characters (categories Cc, Cs, Co, Cn)."""
    if _BAD.search(text):
        return True
    return not text.isascii() and any(unicodedata.category(c) in ("Cn", "Co", "Cs") for c in text if ord(c) > 127)


@functools.lru_cache(maxsize=8)
def _run_re(n: int) -> re.Pattern:
    return re.compile(r"(.)\1{%d,}" % (n - 1), re.DOTALL)


def has_char_run(text: str, n: int) -> bool:
    """One character repeated n or more times in a row."""
    return _run_re(n).search(text) is not None


def filter_reason(text: str, finish_reason: str, *, markers: tuple[str, ...] = (),
                  config: FilterConfig = FilterConfig()) -> str | None:
    """Why a generated turn must go (a FILTER_REASONS key), or None to keep it. `markers`: strings that must not
    appear in a turn (the tokenizer's special tokens, the template's role headers)."""
    if finish_reason == "length":
        return "truncated"
    if not text.strip():
        return "empty"
    if any(m and m in text for m in markers):
        return "template_tokens"
    if has_bad_chars(text):
        return "control_chars"
    if has_char_run(text, config.max_char_run):
        return "repetitive"
    w = words(text)
    if len(w) >= config.min_words_for_repetition and repeated_trigram_ratio(w) > config.max_repeated_trigram_ratio:
        return "repetitive"
    if letter_ratio(text) < config.min_letter_ratio:
        return "low_letter_ratio"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Duplicates
# ---------------------------------------------------------------------------------------------------------------

_PRIME = (1 << 31) - 1  # hash values and coefficients stay below 2^31, so a * x + b fits in int64


def _hash31(s: str) -> int:
    return zlib.crc32(s.encode("utf-8")) % _PRIME  # a collision only adds a candidate: exact Jaccard decides


def shingles(text: str, k: int = 3) -> frozenset[str]:
    """Word k-grams of the normalised text; a text of fewer than k words is one shingle (itself)."""
    w = words(text)
    if len(w) < k:
        return frozenset([" ".join(w)])
    return frozenset(" ".join(w[i:i + k]) for i in range(len(w) - k + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class MinHashIndex:
    """Near-duplicate finder: MinHash signatures in a banded LSH index, candidates confirmed by exact Jaccard.

    Deterministic: the hash functions come from a fixed seed and texts are added in order."""

    def __init__(self, threshold: float = 0.7, *, num_perm: int = 128, recall: float = 0.99, seed: int = 1):
        if not 0 < threshold <= 1:
            raise ValueError(f"near-duplicate threshold={threshold!r} must be in (0, 1]. Fix: use e.g. 0.7.")
        self.rows = max((r for r in range(1, num_perm + 1) if 1 - (1 - threshold ** r) ** (num_perm // r) >= recall),
                        default=1)
        self.bands = num_perm // self.rows
        num_perm = self.bands * self.rows
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, _PRIME, size=(num_perm, 1), dtype=np.int64)
        self.b = rng.integers(0, _PRIME, size=(num_perm, 1), dtype=np.int64)
        self.threshold = threshold
        self.candidate_probability = 1 - (1 - threshold ** self.rows) ** self.bands
        self.buckets: list[dict[bytes, list[int]]] = [{} for _ in range(self.bands)]
        self.sets: list[frozenset] = []

    def signature(self, sh: frozenset) -> np.ndarray:
        return self.signatures([sh])[0]

    def signatures(self, sets: list[frozenset], chunk: int = 1 << 16) -> np.ndarray:
        """(len(sets), num_perm) MinHash signatures, over the shingles of many sets at once (~chunk per pass)."""
        out = np.empty((len(sets), self.a.shape[0]), dtype=np.int64)
        # One buffer for every pass: allocating a fresh (num_perm, chunk) array per pass cost 7x the arithmetic.
        buf = np.empty((self.a.shape[0], max([chunk] + [len(sh) for sh in sets])), dtype=np.int64)
        i = 0
        while i < len(sets):
            j, n = i, 0
            while j < len(sets) and (n == 0 or n + len(sets[j]) <= chunk):
                n += len(sets[j])
                j += 1
            x = np.fromiter((_hash31(s) for sh in sets[i:j] for s in sh), dtype=np.int64, count=n)[None, :]
            starts = np.cumsum([0] + [len(sh) for sh in sets[i:j - 1]])
            y = buf[:, :n]  # (num_perm, shingles)
            np.multiply(self.a, x, out=y)
            np.add(y, self.b, out=y)
            np.remainder(y, _PRIME, out=y)
            out[i:j] = np.minimum.reduceat(y, starts, axis=1).T  # (docs, num_perm)
            i = j
        return out

    def find(self, sh: frozenset, sig: np.ndarray | None = None) -> tuple[int | None, list[bytes]]:
        """(index of the first added set with Jaccard >= threshold, or None; this set's band keys)."""
        sig = self.signature(sh) if sig is None else sig
        keys = [sig[i * self.rows:(i + 1) * self.rows].tobytes() for i in range(self.bands)]
        candidates = sorted({j for band, key in zip(self.buckets, keys) for j in band.get(key, ())})
        for j in candidates:
            if jaccard(sh, self.sets[j]) >= self.threshold:
                return j, keys
        return None, keys

    def add(self, sh: frozenset, keys: list[bytes]) -> int:
        j = len(self.sets)
        self.sets.append(sh)
        for band, key in zip(self.buckets, keys):
            band.setdefault(key, []).append(j)
        return j


@dataclass
class DedupResult:
    kept: list[int] = field(default_factory=list)
    """Indices of the kept texts, in input order."""
    exact: list[tuple[int, int]] = field(default_factory=list)
    """(dropped index, index of the kept text it equals)."""
    near: list[tuple[int, int]] = field(default_factory=list)
    """(dropped index, index of the kept text it nearly equals)."""


def dedup(texts: list[str], *, near_threshold: float | None = 0.7) -> DedupResult:
    """Keep the first of every group of exact (normalised) and near (word-3-gram Jaccard >= threshold) duplicates.
    near_threshold=None keeps near duplicates."""
    out = DedupResult()
    first: dict[str, int] = {}
    unique = []
    for i, t in enumerate(texts):
        key = normalize(t)
        if key in first:
            out.exact.append((i, first[key]))
        else:
            first[key] = i
            unique.append(i)
    if near_threshold is None:
        out.kept = unique
        return out
    index = MinHashIndex(near_threshold)
    sets = [shingles(texts[i]) for i in unique]
    owner: list[int] = []  # MinHash slot -> input index
    for i, sh, sig in zip(unique, sets, index.signatures(sets)):
        j, keys = index.find(sh, sig)
        if j is not None:
            out.near.append((i, owner[j]))
            continue
        index.add(sh, keys)
        owner.append(i)
        out.kept.append(i)
    out.exact.sort()
    return out


# ---------------------------------------------------------------------------------------------------------------
# The held-out split
# ---------------------------------------------------------------------------------------------------------------

def heldout_unit(text: str) -> float:
    """A number in [0, 1) fixed by the normalised text alone (blake2b), the same on every machine and run."""
    h = hashlib.blake2b(b"dflash-heldout:" + normalize(text).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0 ** 64


def is_heldout(text: str, fraction: float) -> bool:
    return heldout_unit(text) < fraction


def opening(text: str, n: int = 3) -> str:
    """The first n words, lower-cased: what "most common openings" counts."""
    return " ".join(words(text)[:n])


def count_openings(texts: list[str], top: int = 20) -> list[tuple[str, int]]:
    return Counter(opening(t) for t in texts).most_common(top)
