"""Read chat data files (JSONL, JSON, Parquet, Hugging Face `datasets` saved to disk) in OpenAI or ShareGPT format.

Every record becomes a `Conversation`: an id, normalised OpenAI-style messages (roles system/user/assistant/tool,
string content, optional `reasoning_content`) and its source ("file.jsonl:17" or "file.parquet:row 16"). A record
that cannot be used is never dropped silently: with `on_error="skip"` it is counted in a `DataReport` under a reason
code with its source and what is wrong; with `on_error="raise"` the first one raises a `DataError` naming the file,
the line (or row) and the problem.

Formats (detected per record with format="auto"):
    OpenAI    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
    ShareGPT  {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}],
               "system": "..." (optional)}
An optional top-level "id" names the sample (regeneration uses it to resume); otherwise "<file>:<line>", the file's
path relative to a data folder (`a/x.jsonl:3` and `b/x.jsonl:3` stay apart). A repeated id gets "@<file>:<line>"
of its second occurrence, so every id of one read is distinct and fixed by the data itself.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .files import DataError, FileIssue, RecordIssue, find_data_files, iter_records

__all__ = ["DataError", "RecordIssue", "DataReport", "Conversation", "ChatData", "normalize_record", "read_chat_data",
           "from_messages"]

FORMATS = ("auto", "openai", "sharegpt")
ON_ERROR = ("skip", "raise")
ROLES = ("system", "user", "assistant", "tool")
OPENAI_ROLE_ALIASES = {"developer": "system", "function": "tool"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "model": "assistant", "system": "system", "tool": "tool",
                  "observation": "tool", "function_response": "tool"}
# Reason codes of skipped records / samples, with the sentence the report shows.
REASONS = {
    "unreadable": "file line is not valid UTF-8, or text holds a lone surrogate (\\ud800) that cannot be encoded",
    "unreadable_file": "a file (or its rest, from the row named) cannot be read: corrupt or empty Parquet, a broken "
                       "compressed stream, invalid JSON array",
    "malformed_json": "not valid JSON",
    "not_an_object": "record is not a JSON object",
    "no_messages": "no 'messages' (OpenAI) or 'conversations' (ShareGPT) list",
    "bad_message": "a message is not an object with a role and string content",
    "unknown_role": "a message has a role the chat template does not know",
    "unsupported_content": "a message has non-text content parts (images, audio)",
    "empty_assistant": "an assistant turn is empty",
    "no_assistant": "no assistant turn to learn from",
    "no_prompt": "the first assistant turn has no user or system turn before it (nothing to answer)",
    "tool_turns": "tool turns cannot be regenerated (the new answer would not match the old tool results)",
    "special_token_in_content": "message text contains a special token of the tokenizer (would break the template)",
    "template_mismatch": "the chat template did not render an assistant turn where expected",
    "template_error": "the chat template raised an error while rendering the conversation",
    "too_short": "fewer than 2 * block_size supervised tokens after truncation",
}


class DataReport(dict):
    """What happened to every record, as a plain dict (JSON-serialisable) with an HTML and a text view.

    Keys: sources, formats {openai, sharegpt}, records, conversations, skipped {reason: count},
    examples {reason: ["file:line: detail", ...]} (first 5 per reason), and after tokenisation: kept, dropped_short,
    truncated, seq_len, block_size, min_supervised_tokens, tokens, supervised_tokens, padded_tokens, max_length,
    mean_length, enable_thinking, mask_method, warnings.
    """

    MAX_EXAMPLES = 5

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.setdefault("sources", [])
        self.setdefault("formats", {})
        self.setdefault("records", 0)
        self.setdefault("conversations", 0)
        self.setdefault("skipped", {})
        self.setdefault("examples", {})
        self.setdefault("files", {"read": {}, "skipped": {}})  # read: {path: records}; skipped: {path: reason}

    def skip(self, reason: str, where: str, detail: str) -> None:
        self["skipped"][reason] = self["skipped"].get(reason, 0) + 1
        ex = self["examples"].setdefault(reason, [])
        if len(ex) < self.MAX_EXAMPLES:
            ex.append(f"{where}: {detail}")

    @property
    def total_skipped(self) -> int:
        return sum(self["skipped"].values())

    def lines(self) -> list[str]:
        out = [f"data: {', '.join(map(str, self['sources'])) or '(in memory)'}",
               f"records read: {self['records']}  usable conversations: {self['conversations']}  "
               f"formats: {self['formats']}"]
        files = self["files"]
        if len(files["read"]) > 1 or files["skipped"]:
            out.append(f"files: {len(files['read'])} read, {len(files['skipped'])} skipped")
            out += [f"    skipped file {f}: {why}" for f, why in list(files["skipped"].items())[:20]]
            if len(files["skipped"]) > 20:
                out.append(f"    ... and {len(files['skipped']) - 20} more (data_report.json lists all)")
        if "kept" in self:
            out.append(f"kept {self['kept']} samples; dropped {self['dropped_short']} with < "
                       f"{self['min_supervised_tokens']} supervised tokens; truncated {self['truncated']} to seq_len="
                       f"{self['seq_len']}")
            out.append(f"tokens {self['tokens']:,} (supervised {self['supervised_tokens']:,}, padded to "
                       f"{self['padded_tokens']:,}); mean length {self['mean_length']:.1f}, max {self['max_length']}"
                       f"; thinking {self.get('enable_thinking')}; mask {self.get('mask_method')}")
        for reason, n in sorted(self["skipped"].items(), key=lambda kv: -kv[1]):
            out.append(f"skipped {n}: {REASONS.get(reason, reason)} [{reason}]")
            out += [f"    e.g. {e}" for e in self["examples"].get(reason, [])[:3]]
        out += [f"warning: {w}" for w in self.get("warnings", [])]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        e = html.escape
        rows = [("records read", self["records"]), ("usable conversations", self["conversations"])]
        if "kept" in self:
            rows += [("kept samples", self["kept"]),
                     (f"dropped (< {self['min_supervised_tokens']} supervised tokens)", self["dropped_short"]),
                     (f"truncated to seq_len={self['seq_len']}", self["truncated"]),
                     ("tokens / supervised / padded",
                      f"{self['tokens']:,} / {self['supervised_tokens']:,} / {self['padded_tokens']:,}"),
                     ("mean / max length", f"{self['mean_length']:.1f} / {self['max_length']}"),
                     ("thinking / mask", f"{self.get('enable_thinking')} / {self.get('mask_method')}")]
        body = "".join(f"<tr><td style='text-align:left'>{e(str(k))}</td><td style='text-align:right'>{e(str(v))}"
                       "</td></tr>" for k, v in rows)
        for reason, n in sorted(self["skipped"].items(), key=lambda kv: -kv[1]):
            ex = "<br>".join(e(x) for x in self["examples"].get(reason, []))
            body += (f"<tr style='color:#b45309'><td style='text-align:left'>skipped: {e(REASONS.get(reason, reason))}"
                     f" <code>{e(reason)}</code><br><small>{ex}</small></td><td style='text-align:right'>{n}</td></tr>")
        for w in self.get("warnings", []):
            body += f"<tr style='color:#b91c1c'><td colspan=2 style='text-align:left'>warning: {e(w)}</td></tr>"
        src = e(", ".join(map(str, self["sources"])) or "(in memory)")
        return f"<div><b>Data report</b> <small>{src}</small><table>{body}</table></div>"


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: list[dict]  # normalised: role in ROLES, content str, optional reasoning_content / tool fields
    source: str  # "file.jsonl:17" or "file.parquet:row 16"
    format: str  # "openai" | "sharegpt"
    answer_ids: tuple[tuple[int, ...], ...] | None = None
    """Each assistant turn's token ids as the target generated them (a regenerated record's generation.token_ids,
    kept with --keep-token-ids; the stop token included when the answer stopped), or None: tokenize.py trains on
    these ids instead of re-tokenizing the answer's text, where they decode to it."""


def stored_answer_ids(rec: dict, messages: list[dict]) -> tuple[tuple[int, ...], ...] | None:
    """A record's generation.token_ids when it holds one list of integers per assistant turn, else None."""
    gen = rec.get("generation")
    ids = gen.get("token_ids") if isinstance(gen, dict) else None
    if not isinstance(ids, list) or len(ids) != sum(m["role"] == "assistant" for m in messages):
        return None
    if not all(isinstance(t, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in t)
               for t in ids):
        return None
    return tuple(tuple(t) for t in ids)


@dataclass
class ChatData:
    """Conversations read from a file, in file order, plus the report of what was skipped. Indexing gives the
    messages list (what `tokenize_dataset` and regeneration consume)."""

    conversations: list[Conversation] = field(default_factory=list)
    report: DataReport = field(default_factory=DataReport)

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, i: int) -> list[dict]:
        return self.conversations[i].messages

    def __iter__(self) -> Iterator[list[dict]]:
        return (c.messages for c in self.conversations)

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.conversations]

    @property
    def sources(self) -> list[str]:
        return [c.source for c in self.conversations]


# ---------------------------------------------------------------------------------------------------------------
# Normalisation of one record
# ---------------------------------------------------------------------------------------------------------------

def _text_of(content, where: str) -> str:
    """OpenAI content: a string, None, or a list of parts [{"type": "text", "text": ...}] (text parts only)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RecordIssue("unsupported_content", f"{where} has a content part of type {kind!r}; only text "
                                                         "parts are supported")
        return "".join(texts)
    raise RecordIssue("bad_message", f"{where} content is {type(content).__name__}, expected a string")


def _openai_messages(msgs: list, where: str) -> list[dict]:
    out = []
    for k, m in enumerate(msgs):
        at = f"message {k}"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RecordIssue("bad_message", f"{at} is not an object with a string 'role'")
        role = OPENAI_ROLE_ALIASES.get(m["role"], m["role"])
        if role not in ROLES:
            raise RecordIssue("unknown_role", f"{at} has role {m['role']!r}; known roles: "
                                              f"{list(ROLES) + list(OPENAI_ROLE_ALIASES)}")
        if "content" not in m and not m.get("tool_calls"):
            raise RecordIssue("bad_message", f"{at} ({role}) has no 'content'")
        msg = {"role": role, "content": _text_of(m.get("content"), at)}
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if isinstance(reasoning, str) and reasoning.strip():
            msg["reasoning_content"] = reasoning
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise RecordIssue("bad_message", f"{at} has {key}={m[key]!r}; expected a string")
                msg[key] = m[key]
        if m.get("tool_calls") is not None:
            calls = m["tool_calls"]
            if not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
                raise RecordIssue("bad_message", f"{at} has tool_calls of type {type(calls).__name__}; expected a "
                                                 "list of objects")
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _sharegpt_messages(record: dict, where: str) -> list[dict]:
    turns = record.get("conversations", record.get("conversation"))
    out = []
    system = record.get("system")
    if isinstance(system, str) and system.strip():
        out.append({"role": "system", "content": system})
    for k, t in enumerate(turns):
        at = f"turn {k}"
        if not isinstance(t, dict):
            raise RecordIssue("bad_message", f"{at} is not an object")
        who = t.get("from", t.get("role"))
        text = t.get("value", t.get("content"))
        if not isinstance(who, str) or text is None:
            raise RecordIssue("bad_message", f"{at} needs 'from' and 'value' (ShareGPT) or 'role' and 'content'")
        role = SHAREGPT_ROLES.get(str(who).lower())
        if role is None:
            raise RecordIssue("unknown_role", f"{at} has from={who!r}; known: {sorted(SHAREGPT_ROLES)}")
        out.append({"role": role, "content": _text_of(text, at)})
    return out


def normalize_record(record, where: str, *, data_format: str = "auto",
                     require_assistant: bool = True) -> tuple[list[dict], str]:
    """One raw record -> (normalised messages, "openai"|"sharegpt"); raises RecordIssue when it is unusable.
    require_assistant=False (regeneration input): no assistant turn needed, and empty ones are placeholders."""
    if not isinstance(record, dict):
        raise RecordIssue("not_an_object", f"record is a {type(record).__name__}, expected a JSON object")
    has_openai = isinstance(record.get("messages"), list)
    sharegpt_key = "conversations" if "conversations" in record else "conversation"
    has_sharegpt = isinstance(record.get(sharegpt_key), list)
    if data_format == "openai" or (data_format == "auto" and has_openai):
        if not has_openai:
            hint = " (it looks like ShareGPT: use data_format='sharegpt' or 'auto')" if has_sharegpt else ""
            raise RecordIssue("no_messages", f"no 'messages' list{hint}; keys: {sorted(record)[:8]}")
        fmt, msgs = "openai", _openai_messages(record["messages"], where)
    elif data_format == "sharegpt" or (data_format == "auto" and has_sharegpt):
        if not has_sharegpt:
            hint = " (it looks like OpenAI messages: use data_format='openai' or 'auto')" if has_openai else ""
            raise RecordIssue("no_messages", f"no 'conversations' list{hint}; keys: {sorted(record)[:8]}")
        fmt, msgs = "sharegpt", _sharegpt_messages(record, where)
    else:
        raise RecordIssue("no_messages", f"expected 'messages' (OpenAI) or 'conversations' (ShareGPT); keys: "
                                         f"{sorted(record)[:8]}")
    if not msgs:
        raise RecordIssue("no_messages", "the message list is empty")
    for k, m in enumerate(msgs if require_assistant else ()):  # without it, assistant turns are placeholders
        if m["role"] == "assistant" and not (m["content"].strip() or m.get("reasoning_content") or m.get("tool_calls")):
            raise RecordIssue("empty_assistant", f"assistant message {k} is empty")
    if require_assistant and not any(m["role"] == "assistant" for m in msgs):
        raise RecordIssue("no_assistant", "the conversation has no assistant message")
    if require_assistant and msgs[0]["role"] == "assistant":
        raise RecordIssue("no_prompt", "the conversation starts with an assistant message")
    try:  # JSON allows lone surrogates ("\ud800"); tokenizers cannot encode them
        json.dumps(msgs, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordIssue("unreadable", f"text holds a lone surrogate {e.object[e.start:e.end]!r}") from None
    except (TypeError, ValueError, RecursionError) as e:  # e.g. tool_calls holding non-JSON values
        raise RecordIssue("bad_message", f"a message holds a value that is not JSON ({e})") from None
    return msgs, fmt


# ---------------------------------------------------------------------------------------------------------------
# The public reader
# ---------------------------------------------------------------------------------------------------------------

def read_chat_data(path: str | Path, *, data_format: str = "auto", on_error: str = "skip", split: str | None = None,
                   require_assistant: bool = True, limit: int | None = None) -> ChatData:
    """Read every record of `path`; usable ones become Conversations, the rest are counted in `.report`
    (on_error="skip") or raise a DataError naming file, line and problem (on_error="raise")."""
    if data_format not in FORMATS:
        raise DataError(f"data_format={data_format!r} is unknown. Fix: use one of {FORMATS}.")
    if on_error not in ON_ERROR:
        raise DataError(f"on_error={on_error!r} is unknown. Fix: use one of {ON_ERROR}.")
    files, skipped_files = find_data_files(path)
    report = DataReport(sources=[str(f) for f in files])
    report["files"]["skipped"] = skipped_files
    convs: list[Conversation] = []
    seen_ids: set[str] = set()
    root = Path(path).expanduser()
    for f in files:
        name = f.relative_to(root).as_posix() if root.is_dir() and root in f.parents else f.name
        report["files"]["read"][str(f)] = 0
        for where, rec in iter_records(f, split=split):
            if limit is not None and len(convs) >= limit:
                break
            if isinstance(rec, FileIssue):  # a file-level failure is not a record: count it, keep what was read
                if on_error == "raise":
                    raise DataError(f"{where}: {rec.detail} [{rec.reason}]. Fix or remove that file, or pass "
                                    "on_error='skip' to skip it and count it in the report.")
                report.skip(rec.reason, where, rec.detail)
                continue
            report["records"] += 1
            report["files"]["read"][str(f)] += 1
            try:
                if isinstance(rec, RecordIssue):
                    raise rec
                msgs, fmt = normalize_record(rec, where, data_format=data_format, require_assistant=require_assistant)
            except RecordIssue as issue:
                if on_error == "raise":
                    raise DataError(f"{where}: {issue.detail} [{issue.reason}]. Fix or remove that record, or pass "
                                    "on_error='skip' to skip such records and count them in the report.") from None
                report.skip(issue.reason, where, issue.detail)
                continue
            sid = rec.get("id") if isinstance(rec.get("id"), (str, int)) else None
            place = name + where[len(str(f)):]  # "a/x.jsonl:3": where the record is, relative to the data path
            sid = str(sid) if sid is not None else place
            if sid in seen_ids:
                sid = f"{sid}@{place}"
            while sid in seen_ids:  # an explicit id that spells another record's place
                sid += "+"
            seen_ids.add(sid)
            convs.append(Conversation(sid, msgs, where, fmt, stored_answer_ids(rec, msgs)))
            report["formats"][fmt] = report["formats"].get(fmt, 0) + 1
    report["conversations"] = len(convs)
    if not convs:
        raise DataError(f"{path} holds no usable conversation ({report['records']} records read).\n{report}\n"
                        "Fix: check the format: one JSON object per line with 'messages' (OpenAI) or "
                        "'conversations' (ShareGPT).")
    return ChatData(convs, report)


def from_messages(conversations: list[list[dict]], *, on_error: str = "skip", require_assistant: bool = True,
                  name: str = "conversations") -> ChatData:
    """In-memory lists of OpenAI messages -> ChatData with the same validation as files ("name[i]" as source)."""
    report = DataReport(sources=[])
    out = []
    for i, msgs in enumerate(conversations):
        where = f"{name}[{i}]"
        report["records"] += 1
        try:
            norm, fmt = normalize_record({"messages": msgs} if isinstance(msgs, list) else msgs, where,
                                         require_assistant=require_assistant)
        except RecordIssue as issue:
            if on_error == "raise":
                raise DataError(f"{where}: {issue.detail} [{issue.reason}].") from None
            report.skip(issue.reason, where, issue.detail)
            continue
        out.append(Conversation(str(i), norm, where, fmt))
        report["formats"][fmt] = report["formats"].get(fmt, 0) + 1
    report["conversations"] = len(out)
    return ChatData(out, report)
