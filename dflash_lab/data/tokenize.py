"""Chat data -> token ids + assistant-only loss masks (fixed-shape batches of them: drafter/batches.py).

Conversations are rendered with the TARGET tokenizer's chat template (the one that will be served), in the thinking
mode that will be served (`enable_thinking`, passed to templates that know it). The loss mask is 1 exactly on the
tokens the assistant produces when served: for each assistant turn k, the supervised span starts where the rendered
conversation stops agreeing with the serving prompt `render(messages[:k], add_generation_prompt=True)` (so a
pre-filled empty `<think></think>` of thinking-off mode is NOT supervised) and ends after the template's end-of-turn
token (e.g. `<|im_end|>`, inferred from the template). Spans are found in the rendering of the WHOLE conversation, so
templates that rewrite earlier turns (Qwen3 drops earlier `<think>` blocks) stay exact. Templates with
`{% generation %}` markers can be used instead through mask_method="generation" (HF's assistant mask).

Answers a record holds as generated ids (regenerate --keep-token-ids: generation.token_ids; chat_formats reads them
into Conversation.answer_ids) are trained on as those ids, not re-tokenized: sampled answers often re-tokenize to
other ids than the target produced, and the drafter should learn the target's own. The rule: an answer's ids are used
when they decode exactly to its message text (a trailing stop token dropped) and the template renders that text
verbatim; the text around answers, the end-of-turn token included, is tokenized as usual. Any other record is
re-tokenized from its text; both counts are in the report (`answer_ids`).

Samples with fewer than 2 * block_size supervised tokens after truncation to seq_len are dropped; every drop and every
skipped record is counted in the `DataReport`. A long conversation is cut to a character budget before tokenizing
(only its first seq_len tokens are kept), so memory and time stay bounded for any record size.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .chat_formats import ChatData, DataError, DataReport, RecordIssue, from_messages, read_chat_data

MASK_METHODS = ("render", "generation")
_PROBE = "dflash probe answer 7291"

__all__ = ["DataError", "DataReport", "TokenizedData", "ChatTemplate", "resolve_data_path",
           "read_conversations", "tokenize_conversation", "tokenize_dataset", "load_dataset"]


def resolve_data_path(data: str) -> Path:
    """"tiny" -> the embedded chat set; else an existing file or directory."""
    if data == "tiny":
        from dflash_lab.tiny import tiny_data_path

        return tiny_data_path()
    p = Path(data).expanduser()
    if not p.exists():
        raise DataError(f"data path {p} does not exist. Expected a JSONL/JSON/Parquet file or a `datasets` directory "
                        'with one conversation per record, e.g. {"messages": [{"role": "user", "content": "..."}, '
                        '{"role": "assistant", "content": "..."}]}.')
    return p


def read_conversations(path: str | Path, *, data_format: str = "auto", on_error: str = "skip",
                       split: str | None = None) -> ChatData:
    """Read a data file (OpenAI messages or ShareGPT; JSONL, JSON, Parquet or `datasets` dir) -> ChatData.
    Iterating it gives message lists; `.report` counts everything skipped (see chat_formats)."""
    return read_chat_data(path, data_format=data_format, on_error=on_error, split=split)


def _template_source(tokenizer) -> str:
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):
        t = t.get("default") or next(iter(t.values()), None)
    return t or ""


class ChatTemplate:
    """The target tokenizer's chat template, checked once: thinking switch, end-of-turn marker, special tokens."""

    def __init__(self, tokenizer, *, enable_thinking: bool | None = None):
        src = _template_source(tokenizer)
        name = getattr(tokenizer, "name_or_path", "?")
        if not src:
            raise DataError(f"tokenizer {name} has no chat template, so conversations cannot be rendered the way the "
                            "target is served. Fix: use the chat/instruct model's tokenizer, or set "
                            "tokenizer.chat_template to the template you serve with.")
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(f"tokenizer {name} is a slow (Python) tokenizer; exact loss masks need token offsets. "
                            "Fix: load it with use_fast=True (a tokenizer.json must exist).")
        self.supports_thinking = "enable_thinking" in src
        if enable_thinking is not None and not self.supports_thinking:
            raise DataError(f"enable_thinking={enable_thinking} but the chat template of {name} has no thinking "
                            "switch (it never reads `enable_thinking`). Fix: leave enable_thinking=None.")
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        self.has_generation_markers = bool(re.search(r"{%-?\s*generation\s*-?%}", src))
        # Added special tokens delimit turns (searched after an answer to find its end-of-turn token); the named
        # special tokens (eos, pad, mask, im_start, ...) plus the end-of-turn token must never occur in message text.
        # Tokens like <think> may be "special" in some tokenizers but are legitimate content, so they are allowed.
        added = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", 0)}
        named = set(getattr(tokenizer, "all_special_tokens", []))
        self._special_re = _alternation(added | named)
        self.end_of_turn = self._infer_end_of_turn()
        self.forbidden_tokens = sorted((named | {self.end_of_turn}) - {None, ""})
        self._forbidden_re = _alternation(set(self.forbidden_tokens))

    def render(self, messages: list[dict], *, add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **self.kwargs)

    def _infer_end_of_turn(self) -> str | None:
        """The special token right after an assistant message's text (e.g. <|im_end|>, <|eot_id|>, </s>)."""
        text = self.render([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": _PROBE}])
        at = text.find(_PROBE)
        if at < 0 or self._special_re is None:
            return None
        m = self._special_re.search(text, at + len(_PROBE))
        if m and not text[at + len(_PROBE):m.start()].strip():
            return m.group(0)
        return None

    def check_content(self, messages: list[dict]) -> None:
        if self._forbidden_re is None:
            return
        for k, m in enumerate(messages):
            for key in ("content", "reasoning_content"):
                hit = self._forbidden_re.search(m.get(key) or "")
                if hit:
                    raise RecordIssue("special_token_in_content",
                                      f"message {k} ({m['role']}) contains the special token {hit.group(0)!r}")

    def assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]], int]:
        """(rendered text, character spans the assistant produces, number of final turns that do not continue the
        serving prompt). Raises RecordIssue("template_mismatch") if an assistant turn cannot be located."""
        self.check_content(messages)
        text = self.render(messages)
        spans, mismatched = [], 0
        last_user = max((k for k, m in enumerate(messages) if m["role"] != "assistant"), default=-1)
        prev_end = 0
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prompt = self.render(messages[:k], add_generation_prompt=True)
            start = _common_prefix_len(prompt, text)
            if start < prev_end:
                raise RecordIssue("template_mismatch", f"assistant message {k}: the serving prompt and the rendered "
                                                       "conversation disagree before the previous assistant turn ends")
            if k > last_user and start < len(prompt):
                mismatched += 1  # e.g. data with reasoning while thinking is off: the prompt pre-fills an empty block
            answer = m["content"].split("</think>")[-1].strip()
            at = text.find(answer, start) if answer else start
            if at < 0:
                raise RecordIssue("template_mismatch", f"assistant message {k}: its text {answer[:40]!r} is not in "
                                                       "the rendered conversation after its prompt")
            end = at + len(answer)
            if self.end_of_turn is not None:  # the turn ends at the next end-of-turn token, with no header between
                j = text.find(self.end_of_turn, end)
                other = self._forbidden_re.search(text, end, j if j >= 0 else len(text))
                if j < 0 or other:
                    found = other.group(0) if other else "end of text"
                    raise RecordIssue("template_mismatch", f"assistant message {k}: expected the end-of-turn token "
                                                           f"{self.end_of_turn!r} after its text, found {found!r}")
                end = j + len(self.end_of_turn)
            spans.append((start, end))
            prev_end = end
        return text, spans, mismatched


def _alternation(tokens: set[str]):
    tokens = sorted(t for t in tokens if t)
    return re.compile("|".join(map(re.escape, sorted(tokens, key=len, reverse=True)))) if tokens else None


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on the first differing character
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _span_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """1 on tokens whose characters overlap a span (a token straddling a span edge counts, as in HF's mask)."""
    s, e = offsets[:, 0], offsets[:, 1]
    mask = np.zeros(len(offsets), dtype=bool)
    for a, b in spans:
        mask |= (s < b) & (e > a) & (e > s)
    return mask


def tokenize_conversation(tokenizer, messages: list[dict], *, enable_thinking: bool | None = None,
                          mask_method: str = "render", template: ChatTemplate | None = None
                          ) -> tuple[list[int], list[int]]:
    """Render one conversation; return (input_ids, loss_mask) with 1 exactly on assistant-produced tokens
    (content + end-of-turn token). Raises DataError (with the reason) if the conversation is unusable."""
    tmpl = template or ChatTemplate(tokenizer, enable_thinking=enable_thinking)
    try:
        msgs = from_messages([messages], on_error="raise").conversations[0].messages
        ids, mask = _encode(tmpl, msgs, mask_method)
    except RecordIssue as issue:
        raise DataError(f"{issue.detail} [{issue.reason}]") from None
    return ids, mask


def _encode(tmpl: ChatTemplate, messages: list[dict], mask_method: str) -> tuple[list[int], list[int]]:
    if mask_method == "generation":
        tmpl.check_content(messages)
        enc = tmpl.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                 return_assistant_tokens_mask=True, **tmpl.kwargs)
        return list(enc["input_ids"]), [int(x) for x in enc["assistant_masks"]]
    text, spans, _ = tmpl.assistant_spans(messages)
    enc = tmpl.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = _span_mask(np.asarray(enc["offset_mapping"]).reshape(-1, 2), spans)
    return list(enc["input_ids"]), mask.astype(int).tolist()


def content_ids(tokenizer, ids: tuple[int, ...], text: str) -> list[int] | None:
    """The generated ids of an answer whose text is `text`: all of them, or all but a trailing stop token; None when
    neither decodes exactly to the text (the record was edited, or the ids belong to another tokenizer)."""
    for cut in (ids, ids[:-1]):
        try:
            if cut and tokenizer.decode(list(cut), skip_special_tokens=False) == text:
                return list(cut)
        except (TypeError, ValueError, OverflowError, IndexError):  # an id outside the vocabulary
            return None
    return None


def _encode_with_answer_ids(tokenizer, text: str, spans: list[tuple[int, int]], messages: list[dict],
                            answer_ids) -> tuple[list[int], np.ndarray] | None:
    """(ids, mask) of a rendered conversation with each answer's generated ids in place of its re-tokenized text,
    or None when an answer's ids do not decode to its text or the template does not render that text verbatim."""
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    ids, mask, pos = [], [], 0

    def text_part(a: int, b: int) -> None:
        if b <= a:
            return
        enc = tokenizer(text[a:b], add_special_tokens=False, return_offsets_mapping=True)
        ids.extend(enc["input_ids"])
        mask.append(_span_mask(np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2) + a, spans))

    for content, stored, (start, end) in zip(answers, answer_ids, spans):
        own = content_ids(tokenizer, stored, content) if content else None
        at = text.find(content, max(start, pos)) if own is not None else -1
        if at < 0 or at + len(content) > end:
            return None
        text_part(pos, at)
        ids.extend(own)
        mask.append(np.ones(len(own), dtype=bool))
        pos = at + len(content)
    text_part(pos, len(text))
    return ids, np.concatenate(mask) if mask else np.zeros(0, dtype=bool)


def _encode_prefixes(tokenizer, texts: list[str], seq_len: int) -> list[tuple[list[int], list]]:
    """(ids, offsets) of each text, exact for the first seq_len tokens (and beyond them whenever the text is short).

    Only the first seq_len tokens are ever kept, so a long text is cut to a character budget before tokenizing: a
    52 MB record otherwise costs minutes and >10 GB of offset tuples. The budget grows 4x until the kept tokens end
    in the first half of the cut text (far from the cut, which can only change the tokens next to it), or the whole
    text fits.
    """
    budget = max(4096, 32 * seq_len)
    cut = [t[:budget] for t in texts]
    enc = tokenizer(cut, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for text, ids, off in zip(texts, enc["input_ids"], enc["offset_mapping"]):
        b = budget
        while len(text) > b and not (len(ids) > seq_len and 2 * off[seq_len - 1][1] <= b):
            b *= 4
            one = tokenizer(text[:b], add_special_tokens=False, return_offsets_mapping=True)
            ids, off = one["input_ids"], one["offset_mapping"]
        out.append((ids, off))
    return out


@dataclass
class TokenizedData:
    input_ids: torch.Tensor  # (n, S) int32, right-padded with pad_id (batches are converted to int64)
    loss_mask: torch.Tensor  # (n, S) bool, True on assistant-produced tokens
    lengths: torch.Tensor  # (n,) long, real tokens per row
    report: DataReport = field(default_factory=DataReport)
    sample_ids: list[str] = field(default_factory=list)  # id of each row ("train.jsonl:17" or the record's "id")
    doc_ids: torch.Tensor | None = None  # (n, S) int32 conversation id per token of packed rows (packing.py)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


# Conversations rendered and encoded together. Rendering their templates is Python on one core; encoding them is one
# batched tokenizer call (encode_batch), which the fast tokenizer spreads over its own threads (TOKENIZERS_PARALLELISM,
# on unless set false)
CHUNK = 512


def encode_chunk(tmpl: "ChatTemplate", convs: list, *, mask_method: str, on_error: str, seq_len: int):
    """One chunk of conversations -> (the conversations encoded, their (ids, mask) in order, the records skipped as
    (reason, source, detail), final turns that do not continue the serving prompt, answer-id counts). Truncation and
    the short-sample rule are the caller's."""
    tokenizer = tmpl.tokenizer
    texts, spans_of, kept, skips, mismatched = [], [], [], [], 0
    answer_ids = {"used": 0, "text_differs": 0}
    for conv in convs:
        try:
            try:
                if mask_method == "generation":
                    ids, m = _encode(tmpl, conv.messages, "generation")
                    texts.append(None)
                    spans_of.append((ids, m))
                else:
                    text, spans, mis = tmpl.assistant_spans(conv.messages)
                    mismatched += mis
                    texts.append(text)
                    spans_of.append(spans)
            except RecordIssue:
                raise
            except Exception as e:  # noqa: BLE001 - jinja raise_exception / TypeError on odd values: one record
                raise RecordIssue("template_error", f"{type(e).__name__}: {str(e)[:200]}") from None
        except RecordIssue as issue:
            if on_error == "raise":
                raise DataError(f"{conv.source}: {issue.detail} [{issue.reason}]. Fix or remove that record, or "
                                "pass on_error='skip'.") from None
            skips.append((issue.reason, conv.source, issue.detail))
            continue
        kept.append(conv)
    if mask_method == "render" and texts:
        encoded = [(ids, _span_mask(np.asarray(off, dtype=np.int64).reshape(-1, 2), spans))
                   for (ids, off), spans in zip(_encode_prefixes(tokenizer, texts, seq_len), spans_of)]
        for k, (conv, text, spans) in enumerate(zip(kept, texts, spans_of)):
            if conv.answer_ids is not None:
                own = _encode_with_answer_ids(tokenizer, text, spans, conv.messages, conv.answer_ids)
                answer_ids["used" if own is not None else "text_differs"] += 1
                encoded[k] = own if own is not None else encoded[k]
    else:
        encoded = [(ids, np.asarray(m, dtype=bool)) for ids, m in spans_of]
    return kept, encoded, skips, mismatched, answer_ids


def tokenize_dataset(tokenizer, conversations, *, seq_len: int, block_size: int, enable_thinking: bool | None = None,
                     mask_method: str = "render", on_error: str = "skip", log=None,
                     progress_every_s: float = 10.0) -> TokenizedData:
    """Tokenize with the chat template, mask, truncate to seq_len, right-pad, drop samples with < 2 * block_size
    supervised tokens. `conversations`: a ChatData (from read_conversations) or a list of OpenAI message lists."""
    if mask_method not in MASK_METHODS:
        raise DataError(f"mask_method={mask_method!r} is unknown. Fix: use one of {MASK_METHODS}.")
    chat = conversations if isinstance(conversations, ChatData) else from_messages(conversations, on_error=on_error)
    tmpl = ChatTemplate(tokenizer, enable_thinking=enable_thinking)
    if mask_method == "generation" and not tmpl.has_generation_markers:
        raise DataError("mask_method='generation' needs {% generation %} markers in the chat template, and this "
                        "template has none. Fix: use mask_method='render' (works with any template).")
    report = DataReport(chat.report)
    report["skipped"], report["examples"] = dict(report["skipped"]), {k: list(v) for k, v in report["examples"].items()}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    min_sup = 2 * block_size
    n_conv = len(chat)
    ids_out = np.full((n_conv, seq_len), pad_id, dtype=np.int32)
    mask_out = np.zeros((n_conv, seq_len), dtype=bool)
    lengths, sample_ids = [], []
    dropped_short = truncated = tokens = supervised = mismatched = 0
    answer_ids = {"used": 0, "text_differs": 0}  # conversations trained on their stored generated ids, or not
    t0 = last = time.monotonic()
    # the fast tokenizer's threads do the encoding; switched off, a many-core host tokenizes ~3x slower
    threads_off = os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in ("false", "0", "off", "no")
    for c0 in range(0, n_conv, CHUNK):
        convs, encoded, skips, mis, used = encode_chunk(tmpl, chat.conversations[c0:c0 + CHUNK],
                                                        mask_method=mask_method, on_error=on_error, seq_len=seq_len)
        for reason, source, detail in skips:
            report.skip(reason, source, detail)
        mismatched += mis
        for k in answer_ids:
            answer_ids[k] += used[k]
        for conv, (ids, m) in zip(convs, encoded):
            if len(ids) > seq_len:
                truncated += 1
                ids, m = ids[:seq_len], m[:seq_len]
            n_sup = int(m.sum())
            if n_sup < min_sup:
                dropped_short += 1
                report.skip("too_short", conv.source, f"{n_sup} supervised tokens < {min_sup} (length {len(ids)})")
                continue
            r = len(lengths)
            ids_out[r, :len(ids)] = ids
            mask_out[r, :len(ids)] = m
            lengths.append(len(ids))
            sample_ids.append(conv.id)
            tokens += len(ids)
            supervised += n_sup
        now = time.monotonic()
        if log is not None and now - last >= progress_every_s:
            last = now
            done = min(c0 + CHUNK, n_conv)
            log(f"tokenizing: {done}/{n_conv} conversations | {done / (now - t0):.0f}/s | "
                f"ETA {(n_conv - done) * (now - t0) / done:.0f}s"
                + (" | tokenizer threads off (TOKENIZERS_PARALLELISM=false)" if threads_off else ""))
    kept = len(lengths)
    report.update(kept=kept, dropped_short=dropped_short, truncated=truncated, seq_len=seq_len, block_size=block_size,
                  min_supervised_tokens=min_sup, tokens=tokens, supervised_tokens=supervised,
                  padded_tokens=kept * seq_len, max_length=max(lengths, default=0),
                  mean_length=tokens / kept if kept else 0.0, enable_thinking=enable_thinking, mask_method=mask_method,
                  end_of_turn=tmpl.end_of_turn, pad_id=pad_id, warnings=list(report.get("warnings", [])),
                  answer_ids=answer_ids)
    if mismatched:
        report["warnings"].append(
            f"{mismatched} final assistant turns do not continue the serving prompt (enable_thinking="
            f"{enable_thinking}); the data was probably generated in another thinking mode. Regenerate it with the "
            "target in the mode you will serve.")
    if tmpl.end_of_turn is None:
        report["warnings"].append("the chat template emits no special end-of-turn token after an assistant message; "
                                  "supervised spans end at the message text.")
    if not kept:
        raise DataError(f"no sample has >= {min_sup} supervised tokens after truncation to seq_len={seq_len}.\n"
                        f"{report}\nFix: raise seq_len, lower block_size, or use data with longer assistant answers.")
    return TokenizedData(torch.from_numpy(ids_out[:kept].copy()), torch.from_numpy(mask_out[:kept].copy()),
                         torch.tensor(lengths, dtype=torch.long), report, sample_ids)


def load_dataset(tokenizer, data: str, *, seq_len: int, block_size: int, enable_thinking: bool | None = None,
                 data_format: str = "auto", on_error: str = "skip", mask_method: str = "render",
                 log=None) -> TokenizedData:
    """read_conversations + tokenize_dataset for a TrainConfig-style `data` string ("tiny" or a path)."""
    chat = read_conversations(resolve_data_path(data), data_format=data_format, on_error=on_error)
    return tokenize_dataset(tokenizer, chat, seq_len=seq_len, block_size=block_size, enable_thinking=enable_thinking,
                            mask_method=mask_method, on_error=on_error, log=log)
