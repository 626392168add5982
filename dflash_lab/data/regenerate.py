"""Regenerate the assistant turns of a chat data set with the target itself (HF generation or an OpenAI server).

A drafter learns to predict the TARGET's tokens, so its training responses should be the target's own outputs in the
chat template and thinking mode that will be served. For every conversation the user/system turns are kept and each
assistant turn is replaced by the target's answer given the history so far (earlier turns already regenerated); a
conversation ending in a user turn gets one new answer, so a prompts-only file works too.

Two back ends:
- Hugging Face: the target is loaded on each chosen device (one replica per device, one thread each); conversations
  are grouped into left-padded batches of similar prompt length and generated turn by turn.
- Server: POST {url}/v1/chat/completions (vLLM, SGLang or any OpenAI-compatible server running the target), with
  `concurrency` requests in flight and `chat_template_kwargs.enable_thinking` when a thinking mode is chosen.

Output: JSONL, one line per conversation {"id", "source", "messages", "generation": {sampling settings, model,
finish_reasons, new_tokens}}, readable as OpenAI-format training data, plus `<out>.meta.json` (settings, counts,
throughput). It is append-only and resumable: a rerun skips ids already in the file (an interrupted half-written last
line is cut off first) and refuses to mix sampling settings. Greedy (temperature 0) output is reproducible; sampled
output is seeded per batch (seed + batch number), so it is reproducible for the same batch composition.

    python -m dflash_lab.data.regenerate --data prompts.jsonl --out regen.jsonl --target Qwen/Qwen3-8B \
        --devices cuda:0 cuda:1 --batch-size 64 --max-new-tokens 2048 --temperature 0 --thinking off
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .chat_formats import ChatData, DataError, read_chat_data
from .regen_local import HFGenerator, greedy_match_check, load_generators
from .regen_server import FailureLog, ServerGenerator, check_record_settings, check_server_url, server_job


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How the target answers; recorded in every output record and in `<out>.meta.json`."""

    temperature: float = 0.0
    """0 = greedy (reproducible); > 0 samples."""
    top_p: float = 1.0
    """Nucleus sampling mass (only when temperature > 0)."""
    top_k: int = 0
    """Top-k sampling (0 = off; only when temperature > 0)."""
    max_new_tokens: int = 2048
    """Longest answer per turn; answers cut here are recorded with finish_reason "length"."""
    enable_thinking: bool | None = None
    """Passed to the chat template (Qwen3-style thinking switch); None = the template's default."""
    seed: int = 0
    """Base seed of the sampling RNG (seed + batch number)."""

    def __post_init__(self) -> None:
        def bad(name, why, fix):
            raise DataError(f"SamplingConfig.{name}={getattr(self, name)!r} is invalid: {why}. Fix: {fix}.")

        if not self.temperature >= 0:
            bad("temperature", "must be >= 0", "use 0 for greedy or e.g. 0.6")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]", "use 1.0 (off) or e.g. 0.95")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", "must be an integer >= 0", "use 0 (off) or e.g. 20")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            bad("max_new_tokens", "must be an integer >= 1", "use e.g. 2048")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class RegenStats:
    """Counts and throughput of one regenerate() call (this call only; resumed samples are `already_done`)."""

    total: int = 0
    already_done: int = 0
    samples: int = 0
    turns: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    finish_reasons: Counter = dataclasses.field(default_factory=Counter)
    skipped: dict = dataclasses.field(default_factory=dict)
    out: str = ""
    backend: str = ""
    greedy_match: dict | None = None
    """Batched vs single-sequence greedy on the first prompts (`greedy_match_check`), local back end at T=0."""
    failed: dict = dataclasses.field(default_factory=dict)  # server: reason -> ids not written (regen_server.py)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(finish_reasons=dict(self.finish_reasons), samples_per_s=round(self.samples_per_s, 3),
                 tokens_per_s=round(self.tokens_per_s, 1))
        return d

    def __str__(self) -> str:
        return (f"regenerated {self.samples} conversations ({self.turns} turns, {self.new_tokens:,} new tokens) in "
                f"{self.seconds:.1f}s: {self.samples_per_s:.2f} samples/s, {self.tokens_per_s:,.0f} new tokens/s "
                f"[{self.backend}]; {self.already_done} already done; finish {dict(self.finish_reasons)}; "
                f"skipped {self.skipped or 0}"
                + (f"; NOT written {({k: len(v) for k, v in self.failed.items()})} (rerun to retry)" if self.failed
                   else "") + f" -> {self.out}" + (f"; greedy match {self.greedy_match['summary']}"
                                                   if self.greedy_match else ""))

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


# ---------------------------------------------------------------------------------------------------------------
# Resumable output
# ---------------------------------------------------------------------------------------------------------------

def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def load_finished(out: Path, log=print) -> set[str]:
    """Ids already in `out`. A half-written last line (interrupted run) is cut off; a bad line elsewhere raises."""
    if not out.exists():
        return set()
    done, good_end = set(), 0
    with open(out, "rb") as f:
        lines = f.readlines()
    for lineno, raw in enumerate(lines, 1):
        try:
            rec = json.loads(raw)
            done.add(str(rec["id"]))
            good_end += len(raw)
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            if lineno == len(lines) and not raw.endswith(b"\n"):
                with open(out, "r+b") as f:
                    f.truncate(good_end)
                log(f"regenerate: cut off a half-written last line of {out} (line {lineno}, interrupted run)")
                break
            raise DataError(f"{out}:{lineno}: not a complete output record ({e}). The output file is corrupt. Fix: "
                            "remove that line, or start a new output file.") from None
    return done


def _check_meta(out: Path, settings: dict, resuming: bool) -> None:
    mp = meta_path(out)
    if not (resuming and mp.is_file()):
        return
    old = json.loads(mp.read_text()).get("settings", {})
    diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if diff:
        raise DataError(f"{out} was written with other settings {diff} (old, new). Resuming would mix them in one "
                        "file. Fix: rerun with the same settings, use a new output file, or pass overwrite=True.")


def _write_meta(out: Path, settings: dict, stats: RegenStats) -> None:
    mp = meta_path(out)
    tmp = mp.with_name(mp.name + ".tmp")
    tmp.write_text(json.dumps({"settings": settings, "last_run": stats.to_dict(),
                               "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
    os.replace(tmp, mp)


class _Writer:
    """Append-only JSONL writer shared by worker threads; progress lines every `every_s` seconds."""

    def __init__(self, out: Path, stats: RegenStats, settings: dict, log, every_s: float, on_progress):
        self.f = open(out, "a", encoding="utf-8")
        self.out, self.stats, self.settings, self.log, self.every_s = out, stats, settings, log, every_s
        self.on_progress = on_progress
        self.lock = threading.Lock()
        self.t0 = self.last = time.monotonic()

    def add(self, rec: dict) -> None:
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        with self.lock:
            self.f.write(line)
            self.f.flush()
            s = self.stats
            s.samples += 1
            s.turns += len(rec["generation"]["finish_reasons"])
            s.new_tokens += sum(rec["generation"]["new_tokens"])
            s.finish_reasons.update(rec["generation"]["finish_reasons"])
            now = time.monotonic()
            s.seconds = now - self.t0
            if now - self.last >= self.every_s or s.samples + s.already_done == s.total:
                self.last = now
                os.fsync(self.f.fileno())
                _write_meta(self.out, self.settings, s)
                self.log(self.progress_line())
            if self.on_progress is not None:
                self.on_progress(s)

    def progress_line(self) -> str:
        s = self.stats
        done, left = s.samples + s.already_done, s.total - s.samples - s.already_done
        eta = int(left / s.samples_per_s) if s.samples_per_s > 0 else 0
        return (f"regenerate: {done}/{s.total} conversations | {s.samples_per_s:.2f} samples/s | "
                f"{s.tokens_per_s:,.0f} new tok/s | ETA {eta // 3600}h{eta % 3600 // 60:02d}m{eta % 60:02d}s")

    def close(self) -> None:
        with self.lock:
            self.stats.seconds = time.monotonic() - self.t0
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            _write_meta(self.out, self.settings, self.stats)


# ---------------------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------------------

class _Job:
    """One conversation being regenerated turn by turn."""

    def __init__(self, conv):
        self.conv = conv
        self.history: list[dict] = []
        self.rest = list(conv.messages)
        self.finish, self.tokens = [], []

    def next_prompt(self) -> list[dict] | None:
        """Advance through kept turns; the history to answer next, or None when the conversation is done."""
        while self.rest:
            m = self.rest.pop(0)
            if m["role"] == "assistant":
                return self.history
            self.history.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
        if self.history and self.history[-1]["role"] != "assistant":
            return self.history  # a trailing user turn gets an answer too
        return None

    def answer(self, text: str, finish: str, n: int) -> None:
        self.history.append({"role": "assistant", "content": text})
        self.finish.append(finish)
        self.tokens.append(n)

    def record(self, generation: dict) -> dict:
        return {"id": self.conv.id, "source": self.conv.source, "messages": self.history,
                "generation": {**generation, "finish_reasons": self.finish, "new_tokens": self.tokens}}


def _hf_worker(gen: HFGenerator, batches: "queue.Queue", writer: _Writer, generation: dict, stop: threading.Event):
    while not stop.is_set():
        try:
            batch_no, convs = batches.get_nowait()
        except queue.Empty:
            return
        jobs = [_Job(c) for c in convs]
        pending = [(j, j.next_prompt()) for j in jobs]
        rnd = 0
        while pending and not stop.is_set():
            active = [(j, h) for j, h in pending if h is not None]
            if not active:
                break
            outs = gen([h for _, h in active], seed=gen.sampling.seed + batch_no * 1000 + rnd)
            for (j, _), (text, finish, n) in zip(active, outs):
                j.answer(text, finish, n)
            pending = [(j, j.next_prompt()) for j, _ in active]
            rnd += 1
        if stop.is_set():
            return
        for j in jobs:
            writer.add(j.record(generation))


def regenerate(data: str | Path | ChatData, out: str | Path, *, target: str = "tiny", devices=("cpu",),
               batch_size: int = 16, sampling: SamplingConfig | None = None, server_url: str | None = None,
               server_model: str | None = None, concurrency: int = 8, dtype: str = "auto",
               data_format: str = "auto", limit: int | None = None, overwrite: bool = False, log=print,
               progress_every_s: float = 10.0, on_progress=None, models: dict | None = None,
               match_check: int = 0, server_timeout_s: float = 300.0, server_retries: int = 3,
               server_backoff_s: float = 0.5) -> RegenStats:
    """Regenerate every conversation of `data` into `out` (JSONL). Resumes if `out` exists. Returns RegenStats.

    `models` optionally maps device name -> an already loaded model (skips loading; used by notebooks and tests).
    `match_check` > 0 (local back end, temperature 0): first compare batched vs single-sequence greedy on that many
    first prompts (`greedy_match_check`); the result goes to the stats and `<out>.meta.json`.
    Server back end: per-request timeout, bounded retries with backoff, failures counted by id (regen_server.py).
    """
    sampling = sampling or SamplingConfig()
    if server_url is not None:
        check_server_url(server_url)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for p in (out, meta_path(out)):
            p.unlink(missing_ok=True)
    if isinstance(data, ChatData):
        chat = data
    else:
        from .tokenize import resolve_data_path

        chat = read_chat_data(resolve_data_path(str(data)), data_format=data_format, require_assistant=False)
    convs = []
    skipped = {}
    for c in chat.conversations:
        if any(m["role"] == "tool" for m in c.messages):
            skipped["tool_turns"] = skipped.get("tool_turns", 0) + 1
            continue
        convs.append(c)
    if limit is not None:
        convs = convs[:limit]
    backend = f"server {server_url}" if server_url else f"hf {','.join(map(str, devices))}"
    settings = {"target": target, "backend": "server" if server_url else "hf", "sampling": sampling.to_dict()}
    resuming = out.exists()
    _check_meta(out, settings, resuming)
    if resuming:
        check_record_settings(out, sampling.to_dict())  # also without the .meta.json file
    done = load_finished(out, log=log)
    todo = [c for c in convs if c.id not in done]
    stats = RegenStats(total=len(convs), already_done=len(convs) - len(todo), out=str(out), backend=backend,
                       skipped={**chat.report["skipped"], **skipped})
    if chat.report["skipped"] or skipped:
        log(f"regenerate: skipped input records {stats.skipped} (see the data report for examples)")
    log(f"regenerate: {len(todo)} of {len(convs)} conversations to do ({stats.already_done} already in {out}); "
        f"{backend}; sampling {sampling.to_dict()}")
    if not todo:
        return stats
    generation = {"model": target, **sampling.to_dict()}
    if server_url:
        server = ServerGenerator(server_url, sampling, model=server_model, timeout_s=server_timeout_s,
                                 retries=server_retries, backoff_s=server_backoff_s, log=log)
        generation.update(model=server.model, server_url=server_url)
    else:
        gens = load_generators(target, devices, sampling, dtype, models, log)
        if match_check > 0 and sampling.temperature == 0:
            firsts = [_Job(c).next_prompt() for c in todo[:match_check]]
            stats.greedy_match = greedy_match_check(gens[0], firsts, batch_size)
            log(f"regenerate: batched vs single-sequence greedy ({stats.greedy_match['dtype']} on "
                f"{stats.greedy_match['device']}): {stats.greedy_match['summary']} "
                f"({stats.greedy_match['seconds']} s)")
    writer = _Writer(out, stats, settings, log, progress_every_s, on_progress)  # the clock starts here
    stop = threading.Event()
    try:
        if server_url:
            with cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="regen-http") as pool:
                failures = FailureLog(stats.failed, max(5, 2 * concurrency), log)
                futs = [pool.submit(server_job, server, _Job(c), i, writer, generation, stop, failures)
                        for i, c in enumerate(todo)]
                _wait(futs, stop)
        else:
            batches = queue.Queue()
            for b in _length_grouped_batches(todo, batch_size):
                batches.put(b)
            with cf.ThreadPoolExecutor(max_workers=len(gens), thread_name_prefix="regen") as pool:
                futs = [pool.submit(_hf_worker, g, batches, writer, generation, stop) for g in gens]
                _wait(futs, stop)
    finally:
        writer.close()
    log(str(stats))
    return stats


def _wait(futs, stop: threading.Event) -> None:
    try:
        for f in cf.as_completed(futs):
            f.result()
    except BaseException:  # KeyboardInterrupt or a worker error: stop the others, keep what is written
        stop.set()
        raise


def _length_grouped_batches(convs, batch_size: int, window: int = 16):
    """Batches of similar prompt length (less padding), numbered in a fixed order: windows of `window` batches are
    sorted by the length of the first prompt, so the grouping depends only on the input order."""
    numbered = 0
    span = batch_size * window
    for w0 in range(0, len(convs), span):
        chunk = convs[w0:w0 + span]
        chunk = sorted(chunk, key=lambda c: sum(len(m["content"]) for m in c.messages if m["role"] != "assistant"))
        for b0 in range(0, len(chunk), batch_size):
            yield numbered, chunk[b0:b0 + batch_size]
            numbered += 1


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help='input chat data (JSONL/JSON/Parquet/datasets dir) or "tiny"')
    p.add_argument("--out", required=True, help="output JSONL (resumed if it exists)")
    p.add_argument("--target", default="tiny", help='HF id, local dir or "tiny"')
    p.add_argument("--devices", nargs="+", default=["cpu"], help="e.g. cuda:0 cuda:1 (one replica each)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--thinking", choices=["on", "off", "template"], default="template",
                   help="enable_thinking for the chat template (template = do not pass it)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("--format", default="auto", choices=["auto", "openai", "sharegpt"])
    p.add_argument("--server-url", default=None, help="OpenAI-compatible server, e.g. http://localhost:8000")
    p.add_argument("--server-model", default=None, help="model name on the server (default: its first model)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (server back end)")
    p.add_argument("--request-timeout", type=float, default=300.0,
                   help="seconds per server request before it is retried (server back end; raise it for long answers)")
    p.add_argument("--retries", type=int, default=3, help="retries per server request, with backoff (server back end)")
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    p.add_argument("--match-check", type=int, default=0,
                   help="compare batched vs single-sequence greedy on the first N prompts (recorded in .meta.json)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (small models on CPU: 1 is fastest, and far faster on a busy machine)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    sampling = SamplingConfig(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_new_tokens=a.max_new_tokens,
                              enable_thinking={"on": True, "off": False, "template": None}[a.thinking], seed=a.seed)
    regenerate(a.data, a.out, target=a.target, devices=tuple(a.devices), batch_size=a.batch_size, sampling=sampling,
               server_url=a.server_url, server_model=a.server_model, concurrency=a.concurrency, dtype=a.dtype,
               data_format=a.format, limit=a.limit, overwrite=a.overwrite, log=lambda s: print(s, flush=True),
               match_check=a.match_check, server_timeout_s=a.request_timeout, server_retries=a.retries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
