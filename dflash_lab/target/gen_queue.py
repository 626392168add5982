"""The work queue generation engines pull prompts from: thread-safe, follow-up prompts re-enter it, progress with ETA.

One queue feeds one Generator or several (one per GPU, one thread each): an engine takes as many prompts as it has
free rows, and when a prompt finishes, `on_finish(key, generated)` may return the next prompt of the same
conversation (every-turn regeneration: the answered history asks the next question), which goes back into the queue
and is taken by whichever engine has a free row first. Progress (prompts done, new tokens/s, rows live, ETA) goes to
a `progress` callback and, every `log_every_s`, to a printed line.
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


class PromptQueue:
    """Prompts waiting for a free row, the answers of finished ones, and the follow-ups they produce."""

    def __init__(self, items: list[PromptItem], *, total: int | None = None,
                 on_finish: Callable[[int, Generated], PromptItem | None] | None = None,
                 progress: Callable[[GenProgress], None] | None = None, log: Callable[[str], None] | None = None,
                 log_every_s: float = 10.0):
        self._pending = deque(items)
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
        """Record an answer; a follow-up prompt from on_finish enters the queue before this one stops counting."""
        follow = self._on_finish(key, generated) if self._on_finish else None
        with self._cond:
            self.results[key] = generated
            self._tokens_done += len(generated.token_ids)
            if follow is not None:
                self._pending.append(follow)
            self._in_flight -= 1
            self._cond.notify_all()

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
