"""Regeneration with the generation engine (target/generate.py) instead of Hugging Face `generate`: the same role
as regen_local.HFGenerator (histories -> (text, finish_reason, new_tokens)), and an every-turn driver in which a
conversation re-enters the engine's queue after each answered turn with its regenerated history.

Records are text, so the next turn's prompt is the chat template rendered from the regenerated history and
tokenized again: an answer's ids need not come back as generated (a BPE merge across the boundary with the
template's text, a template that strips whitespace). `RoundTrip` counts, per answer, whether the tokenization of
the whole conversation gives back the answer's generated ids where the answer sits ("same"), other ids
("differs"), or renders the prompt itself differently inside the conversation ("template").

    regenerate_with_engine(hf_generators, conversations, write, generation, stop=stop_event)   # every turn
    EngineGenerator(hf_generator)(histories, seed)                                    # HFGenerator's role

A conversation whose next prompt plus max_new_tokens no longer fits an engine row (max_len positions) is written
with the turns answered so far (counted as "cut_at_max_len"), so every answer had its whole budget, as with HF
`generate`; one whose first prompt does not fit is not written ("too_long").
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time

from dflash_lab.target.gen_devices import run_queue
from dflash_lab.target.gen_queue import Generated, PromptItem, PromptQueue, longest_chain_first
from dflash_lab.target.generate import CacheMemoryError, Generator

from .files import DataError

TURN_KEYS = 1024  # queue keys per conversation: key = conversation * TURN_KEYS + turn


def conversation_key(conv_id: str) -> int:
    """A stable 44-bit key of a conversation id: its samples do not depend on where it sits in the input."""
    return int(hashlib.sha256(str(conv_id).encode()).hexdigest()[:11], 16)


class RoundTrip:
    """Counts of the decode -> re-tokenize round trip of answers (thread-safe); a few differing examples kept."""

    def __init__(self, keep: int = 5):
        self.counts = {"same": 0, "differs": 0, "template": 0}
        self.examples: list[dict] = []
        self.keep = keep
        self._lock = threading.Lock()

    def add(self, outcome: str, example: dict | None = None) -> None:
        with self._lock:
            self.counts[outcome] += 1
            if example is not None and outcome != "same" and len(self.examples) < self.keep:
                self.examples.append(example)

    def to_dict(self) -> dict:
        n = sum(self.counts.values())
        return {**self.counts, "answers": n,
                "mismatch_rate": round((n - self.counts["same"]) / n, 4) if n else 0.0, "examples": self.examples}


class EngineGenerator:
    """HFGenerator's role on the engine: `gen(histories, seed)` -> [(text, finish_reason, new_tokens)].

    Built from an HFGenerator (its model, tokenizer, sampling settings, stop ids and prompt rendering are used as
    they are); engine_kw go to the Generator (max_batch, max_len, cuda_graphs, ...)."""

    def __init__(self, hf, *, round_trip: RoundTrip | None = None, log=None, **engine_kw):
        self.hf, self.tokenizer, self.sampling, self.stop_ids = hf, hf.tokenizer, hf.sampling, hf.stop_ids
        self.engine = Generator(hf.model, stop_ids=hf.stop_ids, log=log, **engine_kw)
        self.round_trip = round_trip or RoundTrip()
        self._lock = threading.Lock()  # one fast tokenizer object is not safe to use from two threads at once

    def encode(self, history: list[dict]) -> list[int]:
        with self._lock:
            return self.tokenizer(self.hf.prompt(history), add_special_tokens=False)["input_ids"]

    def answer(self, history: list[dict], gen: Generated, prompt: list[int] | None = None) -> tuple[str, str, int]:
        """(text, finish_reason, new_tokens) of one answer, as HFGenerator reports it; checks its round trip.
        prompt: the ids the answer was generated after (encode(history); recomputed when not given)."""
        ids = gen.token_ids
        content = ids[:-1] if gen.finish_reason == "stop" else ids
        with self._lock:
            text = self.tokenizer.decode(content, skip_special_tokens=False)
        self.check_round_trip(history, text, content, prompt)
        return text, gen.finish_reason, len(ids)

    def check_round_trip(self, history: list[dict], text: str, content: list[int],
                         prompt: list[int] | None = None) -> str:
        """Tokenize history + answer as a conversation: does the answer come back as `content` where it sits?"""
        kw = self.hf.kwargs
        prompt = self.encode(history) if prompt is None else prompt
        with self._lock:
            full_text = self.tokenizer.apply_chat_template(history + [{"role": "assistant", "content": text}],
                                                           tokenize=False, **kw)
            full = self.tokenizer(full_text, add_special_tokens=False)["input_ids"]
        if full[:len(prompt)] != prompt:
            outcome = "template"
        else:
            outcome = "same" if full[len(prompt):len(prompt) + len(content)] == content else "differs"
        back = full[len(prompt):len(prompt) + len(content) + 2]
        self.round_trip.add(outcome, {"outcome": outcome, "generated": content[:40], "retokenized": back[:40]})
        return outcome

    def __call__(self, histories: list[list[dict]], seed: int) -> list[tuple[str, str, int]]:
        prompts = [self.encode(h) for h in histories]
        outs = self.engine.generate(prompts, dataclasses.replace(self.sampling, seed=seed))
        return [self.answer(h, g) for h, g in zip(histories, outs)]


def engine_generators(hf_generators, *, log=None, **engine_kw) -> list[EngineGenerator]:
    """One EngineGenerator per HFGenerator (per device: regen_local.load_generators), one shared RoundTrip."""
    rt = RoundTrip()
    return [EngineGenerator(g, round_trip=rt, log=log, name=f"{g.device}", **engine_kw) for g in hf_generators]


def answers_to_write(messages: list[dict]) -> int:
    """Assistant turns regeneration writes for a conversation: each assistant turn, plus one for a trailing user
    turn."""
    n = sum(m["role"] == "assistant" for m in messages)
    return n + (1 if messages and messages[-1]["role"] != "assistant" else 0)


class ConversationTurns:
    """One conversation regenerated turn by turn: user / system turns kept, each assistant turn replaced by the
    target's answer to the history so far; a trailing user turn gets an answer too. Writes the same record as
    regenerate.py's HF back end: {"id", "source", "messages", "generation": {..., finish_reasons, new_tokens}}."""

    def __init__(self, conv):
        self.conv = conv
        self.history: list[dict] = []
        self.rest = list(conv.messages)
        self.finish: list[str] = []
        self.tokens: list[int] = []
        self.token_ids: list[list[int]] | None = None  # per answer, the ids as generated (keep_token_ids)

    def next_prompt(self) -> list[dict] | None:
        """The history to answer next (kept turns appended up to it), or None when the conversation is done."""
        while self.rest:
            m = self.rest.pop(0)
            if m["role"] == "assistant":
                return self.history
            self.history.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
        if self.history and self.history[-1]["role"] != "assistant":
            return self.history
        return None

    def answer(self, text: str, finish: str, n: int, ids: list[int] | None = None) -> None:
        self.history.append({"role": "assistant", "content": text})
        self.finish.append(finish)
        self.tokens.append(n)
        if ids is not None:
            self.token_ids = (self.token_ids or []) + [list(ids)]

    def drop_unanswered(self) -> None:
        """End the record at its last answer (the next prompt does not fit an engine row)."""
        while self.history and self.history[-1]["role"] != "assistant":
            self.history.pop()

    def record(self, generation: dict) -> dict:
        gen = {**generation, "finish_reasons": self.finish, "new_tokens": self.tokens}
        if self.token_ids is not None:
            gen["token_ids"] = self.token_ids
        return {"id": self.conv.id, "source": self.conv.source, "messages": self.history, "generation": gen}


class _Stopped(Exception):
    """regenerate.py asked to stop (a worker error or an interrupt elsewhere)."""


def positions_needed(helper: "EngineGenerator", messages: list[dict], first: list[int], max_new: int) -> int:
    """Positions a conversation's longest row takes at most: its last prompt (the kept turns plus every earlier
    answer at its whole budget) and that answer's budget. One answer: the first prompt + max_new exactly; more:
    the conversation rendered with empty answers, plus every answer's budget and ANSWER_SLACK for the template
    tokens that close each answer and for re-tokenization."""
    n = answers_to_write(messages)
    if n <= 1:
        return len(first) + max_new
    last = max(k for k, m in enumerate(messages) if m["role"] == "assistant")
    upto = messages if messages[-1]["role"] != "assistant" else messages[:last]
    empty = [{"role": m["role"], "content": "" if m["role"] == "assistant" else m.get("content", "")} for m in upto]
    return len(helper.encode(empty)) + n * (max_new + ANSWER_SLACK)


ANSWER_SLACK = 8  # positions per earlier answer beyond its budget (end-of-turn tokens; a BPE merge that differs)


def size_engines(gens: list["EngineGenerator"], rows: int, length: int) -> dict:
    """Allocate every engine's cache for `rows` x `length` (the work, not max_batch x max_len); the cache made.
    A cache beyond a device's memory is a DataError naming both sizes and the flags that shrink it."""
    for g in gens:
        try:
            g.engine.allocate(rows, length)
        except CacheMemoryError as e:
            fit = f"--batch-size {e.rows_that_fit}" if e.rows_that_fit >= 1 else "a shorter --max-new-tokens"
            raise DataError(f"regenerate: {e.device} cannot hold the engine's KV cache for {e.rows:,} rows x "
                            f"{e.length:,} positions: it needs {e.need / 2 ** 30:.2f} GiB, {e.free / 2 ** 30:.2f} "
                            f"GiB is free. Fix: {fit} (rows that fit at this length), a shorter --max-new-tokens, "
                            "or --backend hf.") from None
    e = gens[0].engine
    return {"rows": min(g.engine.rows for g in gens), "length": min(g.engine.length for g in gens),
            "gib_per_device": round(e.cache_bytes(e.rows, e.length) / 2 ** 30, 4)}


def regenerate_with_engine(hf_generators, conversations: list, write, generation: dict, *,
                           stop: threading.Event | None = None, log=print, log_every_s: float = 10.0,
                           keep_token_ids: bool = False, **engine_kw) -> dict:
    """Regenerate the assistant turns of `conversations` (chat_formats conversations: id, source, messages) with
    one engine per device (HFGenerators from regen_local.load_generators, or EngineGenerators), every turn through
    one shared queue. write(record) is called once per finished conversation, from the queue's finisher thread.
    Each engine's rows hold up to the target's context (engine_kw max_len caps it further) and its cache is sized
    to the work: min(max_batch, conversations) rows of the longest row any conversation can take.
    keep_token_ids: records also hold each answer's ids as generated (generation.token_ids, one list per turn,
    the stop token included): sampled answers often do not re-tokenize to them (round_trip). Returns counts:
    written, turns, new_tokens, cut_at_max_len, too_long (with too_long_shortest, its shortest first prompt),
    cache (rows, length), round_trip, seconds, engine."""
    jobs = [ConversationTurns(c) for c in conversations]
    gens = hf_generators if hf_generators and isinstance(hf_generators[0], EngineGenerator) else \
        engine_generators(hf_generators, log=log, **engine_kw)
    helper, settings = gens[0], gens[0].sampling
    stats = {"written": 0, "turns": 0, "new_tokens": 0, "cut_at_max_len": 0, "too_long": 0}
    lock = threading.Lock()
    histories: dict[int, tuple[list[dict], list[int]]] = {}  # conversation -> (history asked, its prompt ids)

    def count(**kw) -> None:
        with lock:
            for k, v in kw.items():
                stats[k] += v

    def finish_conversation(job) -> None:
        write(job.record(generation))
        count(written=1)

    room = 0  # positions per row, once the engines are sized

    def item_for(idx: int, turn: int, history: list[dict], ids: list[int] | None = None) -> PromptItem | None:
        if turn >= TURN_KEYS:
            raise ValueError(f"conversation {jobs[idx].conv.id} has more than {TURN_KEYS} assistant turns. Fix: "
                             "split it, or regenerate it with the Hugging Face back end.")
        ids = helper.encode(history) if ids is None else ids
        if len(ids) + settings.max_new_tokens > room:  # the answer would not get its whole budget
            return None
        histories[idx] = (list(history), ids)
        return PromptItem(idx * TURN_KEYS + turn, ids, conversation_key(jobs[idx].conv.id) * TURN_KEYS + turn)

    def on_finish(key: int, gen: Generated) -> PromptItem | None:
        if stop is not None and stop.is_set():
            raise _Stopped()
        idx, turn = divmod(key, TURN_KEYS)
        job = jobs[idx]
        asked, prompt = histories[idx]
        job.answer(*helper.answer(asked, gen, prompt), gen.token_ids if keep_token_ids else None)
        count(turns=1, new_tokens=len(gen.token_ids))
        history = job.next_prompt()
        nxt = item_for(idx, turn + 1, history) if history is not None else None
        if history is not None and nxt is None:
            job.drop_unanswered()
            count(cut_at_max_len=1)
        if nxt is None:
            finish_conversation(job)
        return nxt

    t0 = time.perf_counter()
    context = min(g.engine.max_len for g in gens)  # the target's positions (or a smaller max_len asked for)
    firsts = []  # (conversation, its first prompt, its ids, positions its longest row takes)
    for idx, job in enumerate(jobs):
        history = job.next_prompt()
        if history is None:
            finish_conversation(job)  # nothing to answer: written as it is, as the HF back end does
            continue
        ids = helper.encode(history)
        firsts.append((idx, history, ids, positions_needed(helper, job.conv.messages, ids, settings.max_new_tokens)))
    fitting = [need for _, _, ids, need in firsts if len(ids) + settings.max_new_tokens <= context]
    stats["cache"] = size_engines(gens, min(gens[0].engine.max_batch, max(1, len(fitting))),
                                  min(context, max(fitting, default=1))) if fitting else {"rows": 0, "length": 0}
    room = min(context, min(g.engine.length for g in gens)) if fitting else 0
    items = []
    for idx, history, ids, _ in firsts:
        it = item_for(idx, 0, history, ids)
        if it is None:
            count(too_long=1)
            stats["too_long_shortest"] = min(stats.get("too_long_shortest", len(ids)), len(ids))
        else:
            items.append(it)
    if stats["too_long"] and log:
        log(f"regenerate: {stats['too_long']} conversations not written: their first prompt + max_new_tokens "
            f"({settings.max_new_tokens}) exceeds the target's {context:,} positions. Fix: a shorter "
            "--max-new-tokens, or leave the longest prompts out.")
    if log and fitting:
        c = stats["cache"]
        log(f"regenerate: engine cache {c['rows']} rows x {c['length']:,} positions ({c['gib_per_device']} GiB per "
            f"device) for {len(items)} conversations")
    chain = {it.key: answers_to_write(jobs[it.key // TURN_KEYS].conv.messages) for it in items}
    queue = PromptQueue(longest_chain_first(items, chain), total=sum(chain.values()), on_finish=on_finish, log=log,
                        log_every_s=log_every_s)
    try:
        try:
            if items:
                run_queue([g.engine for g in gens], queue, settings, rows=stats["cache"]["rows"], length=room)
        finally:
            queue.close()  # every answer handed to on_finish is handled; raises what on_finish raised
    except _Stopped:
        pass
    queue.flush()
    stats.update(round_trip=helper.round_trip.to_dict(), seconds=round(time.perf_counter() - t0, 2),
                 engine=[g.engine.graph_status for g in gens], engine_work=[dict(g.engine.work) for g in gens])
    return stats
