"""Prompt sets for evaluation: JSONL files of chat prompts rendered with the target's chat template.

{"messages": [...]} (trailing assistant turns are dropped and the chat template's generation prompt is added) or
{"prompt": "text"} (one user turn) per line; default: the tiny target's held-out and train prompts.
"""

from __future__ import annotations

import json
from pathlib import Path


class EvalError(ValueError):
    """Bad evaluation input (prompts file, run, target); the message says what to pass instead."""


def _render(tokenizer, messages: list[dict], enable_thinking: bool | None) -> list[int]:
    while messages and messages[-1].get("role") == "assistant":
        messages = messages[:-1]
    if not messages:
        return []
    if getattr(tokenizer, "chat_template", None):
        kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    else:
        text = "\n".join(m.get("content") or "" for m in messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def load_prompts(path: str | Path, tokenizer, *, n_prompts: int | None = None,
                 enable_thinking: bool | None = None) -> list[list[int]]:
    """Token ids of the prompts in a JSONL file ({"messages": [...]} or {"prompt": "..."} per line); the first
    n_prompts. An empty file, a line without a usable prompt, or a prompt that renders empty raises EvalError."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise EvalError(f"prompts file {p} does not exist. Expected JSONL with one {{\"messages\": [...]}} or "
                        "{\"prompt\": \"...\"} object per line.")
    out: list[list[int]] = []
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if n_prompts is not None and len(out) >= n_prompts:
                break
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"{p}:{lineno}: not valid JSON ({e.msg}). Fix or remove that line.") from e
            if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
                ids = _render(tokenizer, obj["messages"], enable_thinking)
            elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                ids = _render(tokenizer, [{"role": "user", "content": obj["prompt"]}], enable_thinking)
            else:
                raise EvalError(f"{p}:{lineno}: expected {{\"messages\": [...]}} or {{\"prompt\": \"...\"}}.")
            if not ids:
                raise EvalError(f"{p}:{lineno}: the prompt is empty after dropping assistant turns. Fix: give at "
                                "least one user message.")
            out.append(ids)
    if not out:
        raise EvalError(f"prompts file {p} is empty: it holds no prompts. Fix: add one JSON object per line, e.g. "
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}.")
    return out


def default_prompt_files(target: str, data: str = "tiny") -> dict[str, Path]:
    """Prompt sets used when none are given: for the tiny target its held-out set and its training prompts."""
    if target == "tiny":
        from dflash_lab.tiny import tiny_data_path, tiny_heldout_path

        return {"heldout": Path(tiny_heldout_path()), "train": Path(tiny_data_path())}
    if data and data != "tiny" and Path(data).is_file():
        return {"train": Path(data)}
    raise EvalError(f"no default prompts for target {target!r}. Fix: pass prompts=<JSONL file> (--prompts FILE).")


def prompt_files_of(prompts, target: str, data: str) -> dict[str, Path]:
    if prompts is None or prompts == "" or prompts == []:
        return default_prompt_files(target, data)
    if isinstance(prompts, dict):
        return {str(k): Path(v) for k, v in prompts.items()}
    if isinstance(prompts, (str, Path)):
        prompts = [prompts]
    sets = {}
    for p in prompts:
        name = Path(p).stem
        while name in sets:
            name += "'"
        sets[name] = Path(p)
    return sets
