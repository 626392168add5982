"""Regenerate the assistant turns of a chat data set with the target itself (HF generation or an OpenAI server).

A drafter learns to predict the TARGET's tokens, so its training responses should be the target's own outputs in the
chat template and thinking mode that will be served. For every conversation the user/system turns are kept and each
assistant turn is replaced by the target's answer given the history so far (earlier turns already regenerated); a
conversation ending in a user turn gets one new answer, so a prompts-only file works too.

Back ends:
- Engine (the default on GPUs, `--backend engine`): target/generate.py on each chosen device, static KV caches, rows
  refilled as they finish, CUDA graphs; every turn of every conversation goes through one queue (regen_engine.py).
  On one H200, SmolLM2-135M answered at ~100k new tokens/s against ~5k for Hugging Face `generate`.
- Hugging Face (`--backend hf`, the default on the CPU): the target is loaded on each chosen device (one replica per
  device, one thread each); conversations are grouped into left-padded batches of similar prompt length and
  generated turn by turn.
- Server: POST {url}/v1/chat/completions (vLLM, SGLang or any OpenAI-compatible server running the target), with
  `concurrency` requests in flight and `chat_template_kwargs.enable_thinking` when a thinking mode is chosen.

Output: JSONL, one line per conversation {"id", "source", "messages", "generation": {back end, target and the
sha256 of its weights, dtype, sampling settings, prompt_sha256, finish_reasons, new_tokens}}, readable as OpenAI-format
training data, plus `<out>.meta.json` (settings, counts, throughput). It is append-only and resumable: a rerun skips
ids already in the file (an interrupted half-written last line is cut off first) and refuses to mix anything that
changes an answer (regen_output.py): other settings, another target, changed prompts, a second writer, an output that
is the input. Greedy (temperature 0) output is reproducible; sampled output is seeded per batch (seed + batch
number), so it is reproducible for the same batch composition. A conversation longer than the target's context is
skipped and counted (`too_long_for_context`), never answered with garbage.

    python -m dflash_lab.data.regenerate --data prompts.jsonl --out regen.jsonl --target Qwen/Qwen3-8B \
        --devices cuda:0 cuda:1 --batch-size 64 --max-new-tokens 2048 --temperature 0 --thinking off
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import queue
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_lab.config.threads import threads_arg
from dflash_lab.target.load import TargetLoadError
from dflash_lab.config.errors import ConfigError
from dflash_lab.target.sampling import GenerationSettings

from .chat_formats import ChatData, DataError, read_chat_data
from .regen_engine import ConversationTurns, regenerate_with_engine
from .regen_local import HFGenerator, PromptFit, generation_dtype, greedy_match_check, load_generators
from .regen_output import (Writer, check_meta, check_output_path, check_records, meta_path, output_lock,
                           prompt_sha256, read_output, target_sha256)
from .regen_server import FailureLog, ServerGenerator, check_server_url, server_job

BACKENDS = ("auto", "engine", "hf")


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
    engine_cache: dict | None = None
    """Engine back end: the KV cache allocated, rows x length positions (sized to the work) and GiB per device."""

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


def load_finished(out: Path, log=print) -> set[str]:
    """Ids already in `out`. A half-written last line (interrupted run) is cut off; a bad line elsewhere raises."""
    return set(read_output(Path(out), log=log))


# ---------------------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------------------

class _Job(ConversationTurns):
    """One conversation regenerated turn by turn (the engine's ConversationTurns); its record also carries the
    prompt's hash, which a resume checks."""

    def record(self, generation: dict) -> dict:
        rec = super().record(generation)
        rec["generation"]["prompt_sha256"] = prompt_sha256(self.conv.messages)
        return rec


def _hf_worker(gen: HFGenerator, batches: "queue.Queue", writer: Writer, generation: dict, stop: threading.Event,
               fit: PromptFit):
    while not stop.is_set():
        try:
            batch_no, convs = batches.get_nowait()
        except queue.Empty:
            return
        jobs = [_Job(c) for c in convs]
        pending = [(j, j.next_prompt()) for j in jobs]
        rnd = 0
        while pending and not stop.is_set():
            active = []
            for j, h in pending:
                why = fit.problem(h) if h is not None else None
                if why is not None:  # past the target's positions the answer would be garbage: skip, never write
                    writer.skip("too_long_for_context", j.conv.id, why)
                    jobs.remove(j)
                elif h is not None:
                    active.append((j, h))
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


def _positive(name: str, value, minimum: int = 1, fix: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{name}={value!r} is invalid: must be an integer >= {minimum}. Fix: {fix}.")


def regenerate(data: str | Path | ChatData, out: str | Path, *, target: str = "tiny", devices=("cpu",),
               batch_size: int = 16, sampling: GenerationSettings | None = None, server_url: str | None = None,
               server_model: str | None = None, concurrency: int = 8, dtype: str = "auto",
               data_format: str = "auto", limit: int | None = None, overwrite: bool = False, log=print,
               progress_every_s: float = 10.0, on_progress=None, models: dict | None = None,
               match_check: int = 0, server_timeout_s: float = 300.0, server_retries: int = 3,
               server_backoff_s: float = 0.5, backend: str = "auto", keep_token_ids: bool = False) -> RegenStats:
    """Regenerate every conversation of `data` into `out` (JSONL). Resumes if `out` exists. Returns RegenStats.

    `models` optionally maps device name -> an already loaded model (skips loading; used by notebooks and tests).
    `match_check` > 0 (local back end, temperature 0): first compare batched vs single-sequence greedy on that many
    first prompts (`greedy_match_check`); the result goes to the stats and `<out>.meta.json`.
    backend (local targets): "engine" (target/generate.py: static caches, rows refilled as they finish, CUDA graphs;
    every turn through one queue), "hf" (Hugging Face generate) or "auto" (engine when every device is a GPU).
    keep_token_ids (engine back end): every record also holds each answer's ids as generated
    (generation.token_ids), which tokenization trains on instead of re-tokenizing the text (tokenize.py).
    Server back end: per-request timeout, bounded retries with backoff, failures counted by id (regen_server.py).
    Refused before anything is touched: an `out` that is the input or lies inside the input folder, another process
    writing `out`, and (on resume) records produced with other settings or for conversations changed since
    (regen_output.py). Local back end: a conversation longer than the target's positions is skipped and counted.
    """
    sampling = sampling or GenerationSettings()
    _positive("batch_size", batch_size, fix="e.g. 16 (--batch-size)")
    _positive("concurrency", concurrency, fix="e.g. 8 (--concurrency)")
    _positive("match_check", match_check, 0, fix="0 (off) or e.g. 8 (--match-check)")
    if limit is not None:
        _positive("limit", limit, 0, fix="the number of first conversations to do, or None (--limit left out) for all")
    if server_url is not None:
        check_server_url(server_url)
    if backend not in BACKENDS:
        raise DataError(f"backend={backend!r} is unknown. Fix: use one of {BACKENDS} (--backend).")
    if backend == "auto":
        backend = "engine" if all(str(d).startswith("cuda") for d in devices) else "hf"
    if keep_token_ids and (server_url is not None or backend != "engine"):
        raise DataError(f"keep_token_ids needs the engine back end (backend={backend!r}"
                        + (", a server" if server_url else "") + " returns text only). Fix: pass --backend engine "
                        "(it also runs on the CPU), or leave --keep-token-ids out.")
    out = Path(out)
    data_path = None
    if not isinstance(data, ChatData):
        from .tokenize import resolve_data_path

        data_path = resolve_data_path(str(data))
        check_output_path(data_path, out)
    dtype_name = None if server_url else generation_dtype(devices, dtype, models)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out, log=log):
        if overwrite:
            for p in (out, meta_path(out)):
                p.unlink(missing_ok=True)
        chat = data if data_path is None else read_chat_data(data_path, data_format=data_format,
                                                             require_assistant=False)
        return _regenerate(chat, out, target=target, devices=devices, batch_size=batch_size, sampling=sampling,
                           server_url=server_url, server_model=server_model, concurrency=concurrency,
                           dtype=dtype, dtype_name=dtype_name, limit=limit, log=log,
                           progress_every_s=progress_every_s, on_progress=on_progress, models=models,
                           match_check=match_check, server_timeout_s=server_timeout_s,
                           server_retries=server_retries, server_backoff_s=server_backoff_s, engine=backend == "engine",
                           keep_token_ids=keep_token_ids)


def _regenerate(chat: ChatData, out: Path, *, target, devices, batch_size, sampling, server_url, server_model,
                concurrency, dtype, dtype_name, limit, log, progress_every_s, on_progress, models, match_check,
                server_timeout_s, server_retries, server_backoff_s, engine, keep_token_ids=False) -> RegenStats:
    """regenerate() once its output is locked and its input read."""
    convs = []
    skipped = {}
    for c in chat.conversations:
        why = unanswerable(c.messages)
        if why is not None:
            skipped[why] = skipped.get(why, 0) + 1
            if skipped[why] <= 5:
                log(f"regenerate: conversation {c.id!r} ({c.source}) skipped: {UNANSWERABLE[why]}")
            continue
        convs.append(c)
    if limit is not None:
        convs = convs[:limit]
    backend = f"server {server_url}" if server_url else f"{'engine' if engine else 'hf'} {','.join(map(str, devices))}"
    server = None
    if server_url:
        server = ServerGenerator(server_url, sampling, model=server_model, timeout_s=server_timeout_s,
                                 retries=server_retries, backoff_s=server_backoff_s, log=log)
        producer = {"backend": "server", "model": server.model, "server_url": server_url}
    else:
        producer = {"backend": "engine" if engine else "hf", "target": target, "target_sha256": target_sha256(target, log=log),
                    "dtype": dtype_name, "model": target}
    settings = {"target": target, "backend": producer["backend"], "sampling": sampling.to_dict(),
                **{k: producer[k] for k in ("target_sha256", "dtype", "model") if k in producer}}
    generation = {**producer, **sampling.to_dict()}
    prompts = {c.id: prompt_sha256(c.messages) for c in convs}
    if out.exists():  # resuming: the meta file and every record must say the same settings (records alone suffice)
        check_meta(out, settings)
    records = read_output(out, log=log)
    check_records(out, records, generation, prompts)
    todo = [c for c in convs if c.id not in records]
    stats = RegenStats(total=len(convs), already_done=len(convs) - len(todo), out=str(out), backend=backend,
                       skipped={**chat.report["skipped"], **skipped})
    if chat.report["skipped"] or skipped:
        log(f"regenerate: skipped input records {stats.skipped} (see the data report for examples)")
    log(f"regenerate: {len(todo)} of {len(convs)} conversations to do ({stats.already_done} already in {out}); "
        f"{backend}; sampling {sampling.to_dict()}")
    if not todo:
        return stats
    if not server_url:
        fit = PromptFit.of(target, sampling, models)
        gens = load_generators(target, devices, sampling, dtype, models, log)
        if match_check > 0 and sampling.temperature == 0:
            firsts = [h for h in (_Job(c).next_prompt() for c in todo[:match_check]) if fit.problem(h) is None]
            stats.greedy_match = greedy_match_check(gens[0], firsts, batch_size)
            log(f"regenerate: batched vs single-sequence greedy ({stats.greedy_match['dtype']} on "
                f"{stats.greedy_match['device']}): {stats.greedy_match['summary']} "
                f"({stats.greedy_match['seconds']} s)")
    writer = Writer(out, stats, settings, log, progress_every_s, on_progress)  # the clock starts here
    stop = threading.Event()
    try:
        if server_url:
            with cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="regen-http") as pool:
                failures = FailureLog(stats.failed, max(5, 2 * concurrency), log)
                futs = [pool.submit(server_job, server, _Job(c), i, writer, generation, stop, failures)
                        for i, c in enumerate(todo)]
                _wait(futs, stop)
        elif engine:  # every turn of every conversation through one queue; rows refilled as they finish
            def write(rec):
                rec["generation"]["prompt_sha256"] = prompts[rec["id"]]
                writer.add(rec)

            counts = regenerate_with_engine(gens, todo, write, generation, stop=stop, log=log, max_batch=batch_size,
                                            keep_token_ids=keep_token_ids)
            stats.skipped.update({k: counts[k] for k in ("too_long", "cut_at_max_len") if counts.get(k)})
            stats.engine_cache = counts["cache"]
            log(f"regenerate: engine {counts.get('engine')}; answers re-tokenized as generated: "
                f"{counts.get('round_trip')}")
        else:
            batches = queue.Queue()
            for b in _length_grouped_batches(todo, batch_size):
                batches.put(b)
            with cf.ThreadPoolExecutor(max_workers=len(gens), thread_name_prefix="regen") as pool:
                futs = [pool.submit(_hf_worker, g, batches, writer, generation, stop, fit) for g in gens]
                _wait(futs, stop)
    finally:
        writer.close()
    log(str(stats))
    if not server_url and stats.samples == 0 and not stop.is_set():
        raise DataError(nothing_written(todo, fit, sampling))
    return stats


UNANSWERABLE = {
    "tool_turns": "it holds tool turns, which regeneration cannot replay",
    "no_user_turn_before_answer": "its first assistant turn comes before any user turn: there is no prompt to "
                                  "answer (drop that turn, or put the user turn it answers before it)",
}


def unanswerable(messages: list[dict]) -> str | None:
    """Why a conversation cannot be regenerated (a key of UNANSWERABLE), or None: checked on input, so one such
    record is reported and skipped instead of stopping the run with nothing written."""
    if any(m["role"] == "tool" for m in messages):
        return "tool_turns"
    for m in messages:
        if m["role"] == "user":
            return None
        if m["role"] == "assistant":
            return "no_user_turn_before_answer"
    return None


def nothing_written(todo: list, fit: PromptFit, sampling: GenerationSettings) -> str:
    """The error of a run that had conversations to answer and wrote none: why, and the flag that fixes it."""
    lens = [fit.prompt_tokens(h) for h in (_Job(c).next_prompt() for c in todo[:1000]) if h is not None]
    ctx = fit.max_positions
    if lens and ctx is not None and min(lens) + sampling.max_new_tokens > ctx:
        room = ctx - min(lens)
        fix = f"--max-new-tokens {room} or less" if room >= 1 else "shorter prompts, or a target with a longer context"
        return (f"none of the {len(todo)} conversations could be answered: every first prompt (the shortest has "
                f"{min(lens):,} tokens) plus --max-new-tokens {sampling.max_new_tokens} exceeds the target's "
                f"{ctx:,} positions. Fix: {fix}.")
    return f"none of the {len(todo)} conversations could be answered. Fix: see the lines above for why."


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
    p.add_argument("--batch-size", type=int, default=16, help="rows generated at once (engine: its static batch)")
    p.add_argument("--backend", default="auto", choices=list(BACKENDS),
                   help="local target: engine (static caches + CUDA graphs), hf (HF generate); auto = engine on GPUs")
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
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations (N >= 0)")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    p.add_argument("--keep-token-ids", action="store_true",
                   help="engine back end: records also keep each answer's ids as generated (generation.token_ids); "
                        "training uses them instead of re-tokenizing the text")
    p.add_argument("--match-check", type=int, default=0,
                   help="compare batched vs single-sequence greedy on the first N prompts (recorded in .meta.json)")
    p.add_argument("--threads", type=threads_arg, default=None,
                   help="torch CPU threads, 1..cores (small models on CPU: 1 is fastest, and far faster on a busy "
                        "machine; 0 = torch's default)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        sampling = GenerationSettings(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                                  max_new_tokens=a.max_new_tokens, seed=a.seed,
                                  enable_thinking={"on": True, "off": False, "template": None}[a.thinking])
        stats = regenerate(a.data, a.out, target=a.target, devices=tuple(a.devices), batch_size=a.batch_size,
                           sampling=sampling, server_url=a.server_url, server_model=a.server_model,
                           concurrency=a.concurrency, dtype=a.dtype, data_format=a.format, limit=a.limit,
                           overwrite=a.overwrite, log=lambda s: print(s, flush=True), match_check=a.match_check,
                           server_timeout_s=a.request_timeout, server_retries=a.retries, backend=a.backend,
                           keep_token_ids=a.keep_token_ids)
    except (DataError, ConfigError, TargetLoadError) as e:  # one line for a CLI user: the value and the fix, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: finished conversations are saved in {a.out}; rerun the same command to resume.",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
