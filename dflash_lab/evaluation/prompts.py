"""Prompt files for evaluation: JSONL chat prompts read, checked and rendered with the target's chat template.

{"messages": [...]} (trailing assistant turns are dropped and the chat template's generation prompt is added) or
{"prompt": "text"} (one user turn) per line. Which file a set name means: prompt_sets.py.

Which prompts of a file a set evaluates does not depend on how the file is ordered: duplicates (the same messages
after normalisation: case, Unicode form, whitespace) count once, and n of them are taken evenly spaced over the
file, never its first n. A prefix is not a sample: a regenerated set
is written as answers finish (its first 64 of 200 held-out chitchat turns were 37 distinct greetings, "Hello?"
eleven times, answers of 15 tokens where the set's mean is 79), and a hand-written one is grouped by kind (the
first 64 of the 78 general prompts left out every summary and multi-step one).

Given the run's training prompts (data/heldout_overlap.py), `select_prompts` also counts the file's prompts that
were trained on and, for a held-out set, leaves them out before the n are spread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dflash_lab.data.chat_formats import RecordIssue, normalize_record
from dflash_lab.data.heldout_overlap import TrainingPrompts, prompt_key, split_overlap


class EvalError(ValueError):
    """Bad evaluation input (prompts file, run, target); the message says what to pass instead."""


def spread(items: list, n: int | None) -> list:
    """n of `items` evenly spaced over the list, its first one included (all of them when n is None or >= len)."""
    if n is None or n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def distinct(prompts: list[list[dict]]) -> list[list[dict]]:
    """The prompts with duplicates (the same roles and normalised texts) dropped, first occurrences kept in order."""
    seen, out = set(), []
    for m in prompts:
        key = prompt_key(m)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


@dataclass(frozen=True)
class PromptSelection:
    """The prompts a set evaluates, and what was counted on the way: the file's distinct prompts, how many of them
    also occur in the training data (None: no training data to check against) and whether those were left out."""

    messages: list
    file_prompts: int
    in_training: int | None = None
    removed: bool = False
    train_source: str = ""


def select_prompts(path: str | Path, n_prompts: int | None = None, *, train: TrainingPrompts | None = None,
                   remove: bool = True) -> PromptSelection:
    """n_prompts of the file's distinct prompts, spread over it; with `train`, those that were trained on are counted
    and (remove=True: a held-out set) left out before the spread, or only counted (remove=False: a file evaluated
    as given, or a training set)."""
    every = _read_distinct(path)
    clean, found = split_overlap(every, train)
    chosen = clean if remove else every
    if not chosen:
        raise EvalError(f"every one of the {len(every)} prompts of {path} also occurs in the training data "
                        f"({train.source}): nothing held out is left to evaluate. Fix: evaluate on prompts the "
                        "drafter was not trained on (e.g. --prompts general), or pass this file as a training set.")
    return PromptSelection(spread(chosen, n_prompts), len(every), None if train is None else len(found),
                           bool(remove and found), train.source if train is not None else "")


def read_prompt_messages(path: str | Path, n_prompts: int | None = None, *, train: TrainingPrompts | None = None
                         ) -> list[list[dict]]:
    """The distinct prompts of a JSONL file as chat message lists, trailing assistant turns dropped; n_prompts of
    them evenly spaced over the file (module docstring), those in `train`'s training prompts left out. An empty
    file, a line without a usable prompt, or a prompt with no turn left raises EvalError naming the line."""
    return select_prompts(path, n_prompts, train=train).messages


def _read_distinct(path: str | Path) -> list[list[dict]]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise EvalError(f"prompts file {p} does not exist. Expected JSONL with one {{\"messages\": [...]}} or "
                        "{\"prompt\": \"...\"} object per line.")
    out: list[list[dict]] = []
    for lineno, raw in enumerate(p.read_bytes().split(b"\n"), 1):  # bytes: a bad byte is named by its line
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EvalError(f"{p}:{lineno}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}). "
                            "Fix: save the file as UTF-8, or remove that line.") from None
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
        try:  # the training data's checks (roles, content, text parts only), in the form the chat template takes
            messages, _ = normalize_record({"messages": messages}, f"{p}:{lineno}", data_format="openai",
                                           require_assistant=False)
        except RecordIssue as issue:
            raise EvalError(f"{p}:{lineno}: {issue.detail} [{issue.reason}]. Fix or remove that line.") from None
        out.append(messages)
    if not out:
        raise EvalError(f"prompts file {p} is empty: it holds no prompts. Fix: add one JSON object per line, e.g. "
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}.")
    return distinct(out)


def render(tokenizer, messages: list[dict], enable_thinking: bool | None = None) -> list[int]:
    """Token ids of a prompt: the chat template with its generation prompt (plain text joined by lines without one)."""
    if getattr(tokenizer, "chat_template", None):
        kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    else:
        text = "\n".join(m.get("content") or "" for m in messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def load_prompts(path: str | Path, tokenizer, *, n_prompts: int | None = None, enable_thinking: bool | None = None,
                 messages: list[list[dict]] | None = None) -> list[list[int]]:
    """Token ids of the prompts in a JSONL file ({"messages": [...]} or {"prompt": "..."} per line); n_prompts of
    them as read_prompt_messages picks them, or the given `messages` (a selection already made). An empty file, a
    line without a usable prompt, or a prompt that renders empty raises EvalError."""
    out = []
    chosen = messages if messages is not None else read_prompt_messages(path, n_prompts)
    for i, messages in enumerate(chosen, 1):
        ids = render(tokenizer, messages, enable_thinking)
        if not ids:
            raise EvalError(f"{path}: prompt {i} renders to no tokens. Fix: give it some text.")
        out.append(ids)
    return out
