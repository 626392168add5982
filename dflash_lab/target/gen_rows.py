"""The host side of an engine's rows: which prompt occupies each row, the tokens it has so far, where it stands.

The engine keeps one decode chunk in flight while the host reads the previous one, so two clocks are kept per row:
`pos`, the position of its next input token after every chunk LAUNCHED (what the next chunk's length bucket
needs), and `tokens`, what the chunks PROCESSED so far gave it. A row refilled while a chunk is in flight starts
with the next chunk (`since`): the in-flight chunk's outputs for that row belong to its previous occupant and are
dropped, as are a finished row's outputs after its end.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .gen_queue import Generated, PromptItem


@dataclass
class Row:
    item: PromptItem
    limit: int  # new tokens this occupant may get
    tokens: list[int]  # processed so far
    pos: int  # position of the next input token after every launched chunk
    since: int  # first chunk whose outputs are this occupant's

    @property
    def launched_tokens(self) -> int:
        """Tokens this occupant will have once every launched chunk is processed (if it does not stop)."""
        return self.pos - len(self.item.ids) + 1


class RowBook:
    """Rows of one engine: a heap of free rows (new prompts take the lowest, so live rows stay in front) and the
    live ones; finish(item, generated) is called for every prompt that ends."""

    def __init__(self, rows: int, stop_ids, finish: Callable[[PromptItem, Generated], None]):
        self.free = list(range(rows))
        self.live: dict[int, Row] = {}
        self.stops = set(stop_ids)
        self.stop_arr = np.array(sorted(self.stops), dtype=np.int64)
        self._finish = finish

    def place(self, item: PromptItem, limit: int, since: int) -> int:
        row = heapq.heappop(self.free)
        self.live[row] = Row(item, limit, [], len(item.ids), since)
        return row

    def _done(self, row: int, reason: str) -> None:
        r = self.live.pop(row)
        heapq.heappush(self.free, row)
        self._finish(r.item, Generated(token_ids=r.tokens, finish_reason=reason))

    def first_token(self, row: int, token: int) -> None:
        """The prefill's token: it may already end the answer."""
        r = self.live[row]
        r.tokens.append(token)
        if token in self.stops:
            self._done(row, "stop")
        elif len(r.tokens) >= r.limit:
            self._done(row, "length")

    def launched(self, steps: int, cap: int) -> None:
        for r in self.live.values():
            r.pos = min(r.pos + steps, cap)

    def absorb(self, chunk: np.ndarray, chunk_id: int) -> None:
        """Tokens (steps, B) of a processed chunk: append them up to a stop token or the limit; finish rows."""
        steps, width = chunk.shape
        stopped = np.isin(chunk, self.stop_arr)
        for row in list(self.live):
            r = self.live[row]
            if r.since > chunk_id or row >= width:
                continue
            n = min(steps, r.limit - len(r.tokens))
            hit = np.flatnonzero(stopped[:n, row])
            if hit.size:
                r.tokens.extend(chunk[:hit[0] + 1, row].tolist())
                self._done(row, "stop")
            else:
                r.tokens.extend(chunk[:n, row].tolist())
                if len(r.tokens) >= r.limit:
                    self._done(row, "length")

    # ---- what the next chunk needs ----------------------------------------------------------------------
    def width(self) -> int:
        """Rows the next chunk must cover: up to the highest live row."""
        return max(self.live) + 1

    def steps_left(self) -> int:
        """Most tokens any live row can still use beyond the launched chunks (0: launching more is useless)."""
        return max(r.limit - r.launched_tokens for r in self.live.values())

    def top_position(self) -> int:
        return max(r.pos for r in self.live.values())

    def live_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.live.values())

    def pack(self) -> tuple[list[int], list[int]]:
        """Renumber live rows to 0..n-1 (no chunk may be in flight); returns (from rows, to rows) to copy."""
        n = len(self.live)
        movers = sorted(r for r in self.live if r >= n)
        holes = sorted(r for r in range(n) if r not in self.live)
        for a, b in zip(movers, holes):
            self.live[b] = self.live.pop(a)
        total = len(self.free) + n
        self.free = [r for r in range(total) if r not in self.live]
        heapq.heapify(self.free)
        return movers, holes
