"""The OpenAI-server back end of regenerate.py: one request per turn, bounded retries, every failure counted by id.

Policy, per conversation: a request that times out (`timeout_s`, default 300 s), cannot connect, or gets HTTP 429 /
5xx is retried up to `retries` times with exponential backoff (0.5 s, 1 s, 2 s, ... capped at 30 s), each retry
logged. A conversation whose request still fails, whose reply is not the documented JSON shape (malformed), or whose
answer is empty is NOT written (a rerun retries it) and is counted under `request_failed` / `malformed_reply` /
`empty_answer` with its id in `RegenStats.failed`. When `abort_after` conversations in a row fail that way the server
is taken to be down and the run stops (what was written is kept; rerun to resume). HTTP 4xx other than 429 is a
request error (wrong model name, bad settings) and stops the run at once.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from .chat_formats import DataError

class ReplyProblem(Exception):
    """One conversation could not be answered: `reason` (request_failed | malformed_reply | empty_answer)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def check_server_url(url: str) -> str:
    """The URL if it is http(s)://host[:port][/path]; otherwise DataError naming the value and the fix."""
    parts = urllib.parse.urlsplit(url if isinstance(url, str) else "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DataError(f"server_url={url!r} is not an http(s) URL. Fix: pass e.g. http://localhost:8000 (the "
                        "OpenAI-compatible server's base URL; /v1 is added when missing).")
    if parts.query or parts.fragment:
        raise DataError(f"server_url={url!r} has a query or fragment. Fix: pass only scheme://host:port[/path].")
    return url


class ServerGenerator:
    """One request per turn to an OpenAI-compatible /v1/chat/completions endpoint (vLLM, SGLang, ...)."""

    def __init__(self, url: str, sampling, *, model: str | None = None, timeout_s: float = 300.0, retries: int = 3,
                 api_key: str | None = None, backoff_s: float = 0.5, log=print):
        base = check_server_url(url).rstrip("/")
        if not (timeout_s > 0 and isinstance(retries, int) and retries >= 0):
            raise DataError(f"timeout_s={timeout_s!r}, retries={retries!r}: need timeout_s > 0 and an integer "
                            "retries >= 0. Fix: e.g. timeout_s=300, retries=3.")
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.sampling, self.timeout_s, self.retries, self.api_key = sampling, timeout_s, retries, api_key
        self.backoff_s, self.log = backoff_s, log
        try:
            self.model = model or self._first_model()
        except ReplyProblem as e:
            raise DataError(f"server {self.base}: {e.detail}. HINT: is the server up and OpenAI-compatible?") from None

    def _request(self, path: str, payload: dict | None = None, *, what: str = "") -> dict:
        url = self.base + path
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if payload is None else json.dumps(payload).encode()
        last = None
        for attempt in range(self.retries + 1):
            if attempt:
                wait = min(30.0, self.backoff_s * 2 ** (attempt - 1))
                self.log(f"regenerate: {what or url} failed ({last}); retry {attempt}/{self.retries} in {wait:.1f}s")
                time.sleep(wait)
            try:
                req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    body = resp.read()
            except urllib.error.HTTPError as e:
                text = e.read()[:300].decode(errors="replace")
                if e.code < 500 and e.code != 429:
                    raise DataError(f"server {url} answered HTTP {e.code}: {text}. Fix: check the model name and "
                                    "the request settings.") from None
                last = f"HTTP {e.code}: {text}"
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
                continue
            try:
                out = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ReplyProblem("malformed_reply", f"reply is not JSON ({e}): {body[:120]!r}") from None
            if not isinstance(out, dict):
                raise ReplyProblem("malformed_reply", f"reply is a JSON {type(out).__name__}, not an object")
            return out
        raise ReplyProblem("request_failed", f"{self.retries + 1} attempts failed (last: {last})")

    def _first_model(self) -> str:
        models = self._request("/models", what="GET /models").get("data")
        if not (isinstance(models, list) and models and isinstance(models[0], dict) and "id" in models[0]):
            raise DataError(f"server {self.base}/models lists no model. Fix: pass server_model=... explicitly.")
        return str(models[0]["id"])

    def __call__(self, history: list[dict], seed: int, *, what: str = "") -> tuple[str, str, int]:
        s = self.sampling
        payload = {"model": self.model, "messages": history, "max_tokens": s.max_new_tokens,
                   "temperature": s.temperature, "top_p": s.top_p, "seed": seed}
        if s.top_k:
            payload["top_k"] = s.top_k
        if s.enable_thinking is not None:
            payload["chat_template_kwargs"] = {"enable_thinking": s.enable_thinking}
        out = self._request("/chat/completions", payload, what=what)
        try:
            choice = out["choices"][0]
            msg = choice.get("message") or {}
            text = msg.get("content") or ""
            reasoning = msg.get("reasoning_content") or msg.get("reasoning")
            finish = choice.get("finish_reason") or "stop"
            n = int((out.get("usage") or {}).get("completion_tokens", 0) or 0)
            if not (isinstance(text, str) and isinstance(finish, str) and isinstance(reasoning, (str, type(None)))):
                raise TypeError("content / reasoning / finish_reason is not a string")
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise ReplyProblem("malformed_reply", f"reply lacks choices[0].message.content ({type(e).__name__}: "
                                                  f"{e}): {json.dumps(out)[:160]}") from None
        if reasoning:  # a server-side reasoning parser split it off: put it back the way the template reads it
            text = f"<think>\n{reasoning.strip()}\n</think>\n\n{text.lstrip()}"
        if not text.strip():
            raise ReplyProblem("empty_answer", f"the server answered an empty message (finish_reason {finish})")
        return text, finish, n


class FailureLog:
    """Conversations that got no answer, by reason, with ids; stops the run after `abort_after` in a row."""

    def __init__(self, failed: dict, abort_after: int, log):
        self.failed, self.abort_after, self.log = failed, abort_after, log
        self.in_a_row = 0
        self.lock = threading.Lock()

    def success(self) -> None:
        with self.lock:
            self.in_a_row = 0

    def add(self, conv_id: str, problem: ReplyProblem) -> None:
        with self.lock:
            self.failed.setdefault(problem.reason, []).append(conv_id)
            self.in_a_row += 1
            n = sum(len(v) for v in self.failed.values())
            self.log(f"regenerate: conversation {conv_id!r} not written: {problem.reason}: {problem.detail} "
                     f"({n} failed so far; rerun to retry them)")
            if self.in_a_row >= self.abort_after:
                raise DataError(f"{self.in_a_row} conversations in a row got no answer (last: {problem.detail}); the "
                                "server looks down. Finished samples are saved. HINT: check the server, then rerun "
                                "the same command to resume.")


def server_job(gen: ServerGenerator, job, index: int, writer, generation: dict, stop: threading.Event,
               failures: FailureLog) -> None:
    """Answer every turn of one conversation (`job`: regenerate._Job), then write it; a ReplyProblem is counted."""
    history, rnd = job.next_prompt(), 0
    try:
        while history is not None:
            if stop.is_set():
                return
            job.answer(*gen(history, seed=gen.sampling.seed + index * 1000 + rnd,
                            what=f"conversation {job.conv.id!r} turn {rnd}"))
            history, rnd = job.next_prompt(), rnd + 1
    except ReplyProblem as e:
        failures.add(job.conv.id, e)
        return
    failures.success()
    writer.add(job.record(generation))
