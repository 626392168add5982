"""Prompt files for evaluation: JSONL chat prompts read, checked and rendered with the target's chat template.

{"messages": [...]} (trailing assistant turns are dropped and the chat template's generation prompt is added) or
{"prompt": "text"} (one user turn) per line. Which file a set name means: prompt_sets.py.

Which prompts of a file a set evaluates does not depend on how the file is ordered: exact duplicates count once,
and n of them are taken evenly spaced over the file, never its first n. A prefix is not a sample: a regenerated set
is written as answers finish (its first 64 of 200 held-out chitchat turns were 37 distinct greetings, "Hello?"
eleven times, answers of 15 tokens where the set's mean is 79), and a hand-written one is grouped by kind (the
first 64 of the 78 general prompts left out every summary and multi-step one).
"""

from __future__ import annotations

import json
from pathlib import Path


class EvalError(ValueError):
    """Bad evaluation input (prompts file, run, target); the message says what to pass instead."""


def spread(items: list, n: int | None) -> list:
    """n of `items` evenly spaced over the list, its first one included (all of them when n is None or >= len)."""
    if n is None or n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def distinct(prompts: list[list[dict]]) -> list[list[dict]]:
    """The prompts with exact duplicates (the same messages) dropped, first occurrences kept in order."""
    seen, out = set(), []
    for m in prompts:
        key = json.dumps(m, sort_keys=True, ensure_ascii=False)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def read_prompt_messages(path: str | Path, n_prompts: int | None = None) -> list[list[dict]]:
    """The distinct prompts of a JSONL file as chat message lists, trailing assistant turns dropped; n_prompts of
    them evenly spaced over the file (module docstring). An empty file, a line without a usable prompt, or a prompt
    with no turn left raises EvalError naming the line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise EvalError(f"prompts file {p} does not exist. Expected JSONL with one {{\"messages\": [...]}} or "
                        "{\"prompt\": \"...\"} object per line.")
    out: list[list[dict]] = []
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"{p}:{lineno}: not valid JSON ({e.msg}). Fix or remove that line.") from e
            if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
                messages = list(obj["messages"])
            elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                messages = [{"role": "user", "content": obj["prompt"]}]
            else:
                raise EvalError(f"{p}:{lineno}: expected {{\"messages\": [...]}} or {{\"prompt\": \"...\"}}.")
            while messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
                messages = messages[:-1]
            if not messages:
                raise EvalError(f"{p}:{lineno}: the prompt is empty after dropping assistant turns. Fix: give at "
                                "least one user message.")
            out.append(messages)
    if not out:
        raise EvalError(f"prompts file {p} is empty: it holds no prompts. Fix: add one JSON object per line, e.g. "
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}.")
    return spread(distinct(out), n_prompts)


def render(tokenizer, messages: list[dict], enable_thinking: bool | None = None) -> list[int]:
    """Token ids of a prompt: the chat template with its generation prompt (plain text joined by lines without one)."""
    if getattr(tokenizer, "chat_template", None):
        kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    else:
        text = "\n".join(m.get("content") or "" for m in messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def load_prompts(path: str | Path, tokenizer, *, n_prompts: int | None = None,
                 enable_thinking: bool | None = None) -> list[list[int]]:
    """Token ids of the prompts in a JSONL file ({"messages": [...]} or {"prompt": "..."} per line); n_prompts of
    them as read_prompt_messages picks them. An empty file, a line without a usable prompt, or a prompt that renders
    empty raises EvalError."""
    out = []
    for i, messages in enumerate(read_prompt_messages(path, n_prompts), 1):
        ids = render(tokenizer, messages, enable_thinking)
        if not ids:
            raise EvalError(f"{path}: prompt {i} renders to no tokens. Fix: give it some text.")
        out.append(ids)
    return out
