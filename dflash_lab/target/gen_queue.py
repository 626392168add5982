"""The work queue generation engines pull prompts from: thread-safe, follow-up prompts re-enter it, progress with ETA.

One queue feeds one Generator or several (one per GPU, one thread each): an engine takes as many prompts as it has
free rows, and when a prompt finishes, `on_finish(key, generated)` may return the next prompt of the same
conversation (every-turn regeneration: the answered history asks the next question), which goes back into the queue
AHEAD of the prompts still waiting and is taken by whichever engine has a free row first: a conversation's turns
are a chain (each waits for the answer before it), so a follow-up behind hundreds of fresh first turns would leave
the longest chains to finish alone, at a few live rows, after everything else. on_finish runs in one finisher
thread of the queue, in the order answers finish; `close()` ends it and raises what on_finish raised. Progress
(prompts done, new tokens/s, rows live, ETA) goes to a `progress` callback and, every `log_every_s`, to a printed
line.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Generated:
    """One prompt's answer: token ids as generated (the stop token included when one ended it)."""

    token_ids: list[int]
    finish_reason: str  # "stop" (a stop token was generated, and is included) or "length"


@dataclass(frozen=True)
class PromptItem:
    """A prompt waiting in the queue: `key` names it in the results, `ids` are its token ids, `sample_key` keys its
    sampling (default: `key`; pass a key derived from the conversation to make samples independent of input order)."""

    key: int
    ids: list[int]
    sample_key: int | None = None

    @property
    def seed_key(self) -> int:
        return self.key if self.sample_key is None else self.sample_key


@dataclass
class GenProgress:
    """One progress report of a queue: what is done, how fast, and how long the rest should take."""

    prompts_done: int
    prompts_total: int | None  # None when follow-ups make the total unknown and no estimate was given
    new_tokens: int  # tokens generated so far, answers in flight included
    seconds: float
    rows_live: dict = field(default_factory=dict)  # engine name -> rows decoding now

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if not self.prompts_total or not self.prompts_done:
            return None
        return max(0.0, self.seconds * (self.prompts_total - self.prompts_done) / self.prompts_done)

    def line(self) -> str:
        total = f"/{self.prompts_total:,}" if self.prompts_total else ""
        eta = self.eta_s
        eta_s = "?" if eta is None else f"{int(eta) // 60}m{int(eta) % 60:02d}s"
        return (f"generate: {self.prompts_done:,}{total} prompts | {self.new_tokens:,} new tokens | "
                f"{self.tokens_per_s:,.0f} new tok/s | {sum(self.rows_live.values())} rows live | ETA {eta_s}")


def by_length(items: list[PromptItem]) -> list[PromptItem]:
    """Shortest prompts first (stable): rows decoding together then have similar lengths, and a decode step's
    attention reads up to the longest live row of the batch, so one 1,500-token prompt among 200-token rows would
    make every row pay for 1,500 positions while it lives. Results and samples do not depend on the order."""
    return sorted(items, key=lambda it: len(it.ids))


def longest_chain_first(items: list[PromptItem], chain: dict[int, int]) -> list[PromptItem]:
    """Items whose conversation has the most turns to answer first (chain[key]: answers the conversation needs),
    then shortest prompts first: with follow-ups taken first, the run then ends with short chains (scheduling the
    longest jobs first keeps the tail short). Per-row decode attention makes mixed lengths cheap; on the masked sdpa
    path a long row still makes the rows decoding beside it pay for its length."""
    return sorted(items, key=lambda it: (-chain.get(it.key, 1), len(it.ids)))


class PromptQueue:
    """Prompts waiting for a free row, the answers of finished ones, and the follow-ups they produce."""

    def __init__(self, items: list[PromptItem], *, total: int | None = None,
                 on_finish: Callable[[int, Generated], PromptItem | None] | None = None,
                 progress: Callable[[GenProgress], None] | None = None, log: Callable[[str], None] | None = None,
                 log_every_s: float = 10.0, follow_ups_first: bool = True):
        self._pending = deque(items)
        self._follow_ups_first = follow_ups_first  # False: behind the waiting prompts (the order before, to compare)
        self._total = total if total is not None else (None if on_finish else len(items))
        self._on_finish = on_finish
        self._progress, self._log, self._log_every_s = progress, log, log_every_s
        self._cond = threading.Condition()
        self._in_flight = 0
        self.results: dict[int, Generated] = {}
        self._tokens_done = 0  # of finished prompts
        self._tokens_live: dict[str, int] = {}  # engine -> tokens of its unfinished rows
        self._rows_live: dict[str, int] = {}
        self._t0 = time.perf_counter()
        self._last_log = self._t0
        self._error: BaseException | None = None
        self._finish_error: BaseException | None = None
        self._finishing: deque = deque()  # answers waiting for on_finish
        self._handling = False  # the finisher is inside on_finish
        self._closed = False
        self._thread = None
        if on_finish is not None:
            self._thread = threading.Thread(target=self._finisher, name="dflash-gen-finish", daemon=True)
            self._thread.start()

    # ---- engines ---------------------------------------------------------------------------------------------
    def take(self, n: int) -> list[PromptItem]:
        """Up to n waiting prompts (fewer, or none, when fewer wait); they count as in flight until finished."""
        with self._cond:
            if self._error is not None:
                return []
            out = [self._pending.popleft() for _ in range(min(n, len(self._pending)))]
            self._in_flight += len(out)
            return out

    def finish(self, key: int, generated: Generated) -> None:
        """Record an answer. With on_finish, it runs in the queue's finisher thread (the engine goes back to its
        rows at once) and the prompt counts as in flight until its follow-up, if any, is in the queue."""
        with self._cond:
            self.results[key] = generated
            self._tokens_done += len(generated.token_ids)
            if self._on_finish is None:
                self._in_flight -= 1
                self._cond.notify_all()
                return
            self._finishing.append((key, generated))
            self._cond.notify_all()

    def _finisher(self) -> None:
        """on_finish for each answer, in order: decoding, rendering and tokenizing the next turn (host work of a
        millisecond per answer) overlap the engines' waits for their GPUs instead of holding their loops."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._finishing or self._closed)
                if not self._finishing:
                    return
                key, generated = self._finishing.popleft()
                self._handling = True
            follow = None
            if self._error is None:
                try:
                    follow = self._on_finish(key, generated)
                except BaseException as e:  # noqa: BLE001 - the owner gets it back from close()
                    self._finish_error = e
                    self.abort(e)
            with self._cond:
                if follow is not None:
                    if self._follow_ups_first:  # the chain goes on first (module docstring)
                        self._pending.appendleft(follow)
                    else:
                        self._pending.append(follow)
                self._in_flight -= 1
                self._handling = False
                self._cond.notify_all()

    def settle(self) -> None:
        """Block until every answer handed in so far has been through on_finish (its follow-up, if any, queued)."""
        with self._cond:
            self._cond.wait_for(lambda: (not self._finishing and not self._handling) or self._error is not None)

    def close(self) -> None:
        """Stop the finisher thread after it has handled every answer; raise what on_finish raised, if anything."""
        if self._thread is not None:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join()
            self._thread = None
        if self._finish_error is not None:
            raise self._finish_error

    def wait_for_work(self) -> bool:
        """Block until a prompt waits (True) or nothing is waiting or in flight anywhere (False: all done)."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending or self._in_flight == 0 or self._error is not None)
            return bool(self._pending) and self._error is None

    def has_waiting(self) -> bool:
        with self._cond:
            return bool(self._pending)

    def abort(self, error: BaseException) -> None:
        """An engine failed: the others stop taking prompts and leave their loops."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    @property
    def aborted(self) -> bool:
        return self._error is not None

    def report(self, engine: str, live_rows: int, live_tokens: int, *, force: bool = False) -> None:
        """An engine's rows and the tokens of its unfinished answers, after each decode chunk."""
        with self._cond:
            self._rows_live[engine] = live_rows
            self._tokens_live[engine] = live_tokens
            now = time.perf_counter()
            snap = self.snapshot_locked(now) if (self._progress or self._log) else None
            due = force or now - self._last_log >= self._log_every_s
            if due:
                self._last_log = now
        if snap is not None and self._progress is not None:
            self._progress(snap)
        if snap is not None and due and self._log is not None:
            self._log(snap.line())

    def flush(self) -> None:
        """The final report: the callback and the printed line, whatever the time since the last one."""
        snap = self.snapshot()
        if self._progress is not None:
            self._progress(snap)
        if self._log is not None:
            self._log(snap.line())

    def snapshot_locked(self, now: float | None = None) -> GenProgress:
        now = time.perf_counter() if now is None else now
        return GenProgress(prompts_done=len(self.results), prompts_total=self._total,
                           new_tokens=self._tokens_done + sum(self._tokens_live.values()), seconds=now - self._t0,
                           rows_live=dict(self._rows_live))

    def snapshot(self) -> GenProgress:
        with self._cond:
            return self.snapshot_locked()
