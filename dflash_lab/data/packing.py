"""Packed sequences: several whole conversations per fixed-length window instead of one, right-padded.

Chat data is short next to seq_len (tiny data: ~100 tokens at seq_len 256; SmolLM2 chitchat: numbers in
docs/ablations.md), so most of an unpacked window is padding that the target and the drafter still pay for.
`pack_data` fills each window greedily with whole conversations: rows are visited in a seeded order and each goes
into the open window with the least room that still fits it (best fit; a conversation is never split, and one longer
than seq_len was already truncated at tokenization). Each token keeps its conversation id (`doc_ids`), from which
segments.py derives per-conversation positions and the masks that keep attention, anchors and labels inside one
conversation, so a packed window trains exactly what its conversations would alone (tests/test_packing.py). The
packing is fixed for a run (seeded by TrainConfig.seed); BatchSampler still shuffles the packed windows every epoch.
"""

from __future__ import annotations

import numpy as np
import torch

from .files import DataError
from .tokenize import TokenizedData


def pack_windows(lengths, seq_len: int, seed: int) -> list[list[int]]:
    """Best-fit packing of rows with `lengths` (each <= seq_len) visited in a seeded order -> windows, each a list of
    row indices in placement order. Deterministic for (lengths, seq_len, seed).

    Each row goes into the open window with the LEAST room that still fits it (a new window if none does). Windows
    are bucketed by their free tokens, so a row costs one scan of a (seq_len,) count array: 800k rows at seq_len
    3072 pack in seconds, where first fit over a list of windows is quadratic."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if (lengths > seq_len).any():
        raise ValueError(f"a row of length {int(lengths.max())} exceeds seq_len={seq_len}; truncate first")
    if (lengths < 1).any():
        raise ValueError("rows must hold at least one token")
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).numpy()
    open_with = np.zeros(seq_len + 1, dtype=np.int64)  # open_with[f]: how many windows have exactly f tokens free
    buckets: list[list[int]] = [[] for _ in range(seq_len + 1)]  # their indices (last opened first)
    windows: list[list[int]] = []
    for r in order:
        n = int(lengths[r])
        free = n + int(np.argmax(open_with[n:] > 0))
        if open_with[free]:
            w = buckets[free].pop()
            open_with[free] -= 1
        else:  # no window has room: open one
            w, free = len(windows), seq_len
            windows.append([])
        windows[w].append(int(r))
        if free - n:
            buckets[free - n].append(w)
            open_with[free - n] += 1
    return windows


def fill_report(lengths, seq_len: int, seed: int = 0) -> dict:
    """How much of the windows real tokens fill at `seq_len`, unpacked (one row per window) and packed.

    fill = real tokens / (windows * seq_len); the inverse is the compute spent per real token. Used in the data
    report (prepare.py) and for the numbers in docs/ablations.md."""
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), seq_len)  # truncated as tokenization does
    tokens, rows = int(lengths.sum()), len(lengths)
    windows = len(pack_windows(lengths, seq_len, seed)) if rows else 0
    return {"seq_len": seq_len, "rows": rows, "tokens": tokens,
            "fill_unpacked": tokens / max(rows * seq_len, 1), "packed_windows": windows,
            "fill_packed": tokens / max(windows * seq_len, 1), "rows_per_window": rows / max(windows, 1)}


def pack_data(data: TokenizedData, *, seq_len: int, seed: int, pad_id: int | None = None,
              batch_size: int | None = None) -> TokenizedData:
    """Tokenized rows (one conversation each) -> packed windows with `doc_ids` (conversation 0, 1, ... from the
    left; the trailing padding is one more id of its own). Loss masks move with their tokens. With `batch_size`,
    fewer windows than one batch raise DataError saying that packing (not filtering) made them few."""
    if data.doc_ids is not None:
        raise ValueError("data is already packed")
    pad = int(pad_id if pad_id is not None else data.report.get("pad_id", 0))
    lengths = data.lengths.tolist()
    windows = pack_windows(lengths, seq_len, seed)
    n = len(windows)
    if batch_size is not None and n < batch_size:
        report = data.report
        dropped = report.get("dropped_short", 0) + getattr(report, "total_skipped", 0)
        kept = (f"all {len(lengths)} conversations kept" if not dropped else
                f"{len(lengths)} conversations kept, {dropped} dropped (see the data report)")
        raise DataError(f"packing {sum(lengths):,} tokens ({kept}) into windows of seq_len={seq_len} gives {n} "
                        f"window(s), fewer than batch_size={batch_size} (a batch is batch_size windows). Fix: "
                        f"lower batch_size to <= {n}, lower seq_len, set pack_sequences=False (then each of the "
                        f"{len(lengths)} conversations fills a row), or add data.")
    ids = torch.full((n, seq_len), pad, dtype=data.input_ids.dtype)
    mask = torch.zeros((n, seq_len), dtype=torch.bool)
    docs = torch.empty((n, seq_len), dtype=torch.int32)
    out_lengths, sample_ids = [], []
    for w, rows in enumerate(windows):
        at = 0
        for d, r in enumerate(rows):
            L = lengths[r]
            ids[w, at:at + L] = data.input_ids[r, :L]
            mask[w, at:at + L] = data.loss_mask[r, :L]
            docs[w, at:at + L] = d
            at += L
        docs[w, at:] = len(rows)  # padding: a document of its own
        out_lengths.append(at)
        sample_ids.append("+".join(data.sample_ids[r] for r in rows) if data.sample_ids else str(w))
    report = type(data.report)(data.report)
    report["packing"] = fill_report(lengths, seq_len, seed)
    report.update(padded_tokens=n * seq_len)
    return TokenizedData(ids, mask, torch.tensor(out_lengths, dtype=torch.long), report, sample_ids, docs)
