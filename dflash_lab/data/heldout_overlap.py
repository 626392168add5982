"""Held-out prompts that also occur in training: found by normalised text, in one place for every held-out set.

A split by conversation id keeps no conversation on both sides, but it does keep identical TEXTS on both sides:
chitchat's training first turns hold "Hello!" 168 times, "hello?" 265 and "Hello?" 302 times, and 71 of its 200
held-out first turns are training first turns too. On those the drafter replays an answer it was trained on, and held-out tau reads
what memory gives, not what the drafter has learnt. So validation, evaluation and the data reports check every
held-out prompt against the training prompts here, and say how many they found.

What is compared: a prompt is a list of chat messages up to the turn the model answers; its key is the role and the
normalised text (prompt_filters.normalize: NFKC, case folded, whitespace collapsed) of each of its messages. The
training side is every context the drafter was trained to continue: each prefix of each training conversation that
ends just before an assistant turn (and a prompt-only record as a whole: its answer is written later). An evaluation
prompt overlaps when its whole prompt is one of them; a held-out conversation (validation) overlaps when any of its
own such prefixes is one (then its answers were trained on). Keys are 8-byte blake2b digests held as ints: about 100
bytes per training prompt in memory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from .chat_formats import read_chat_data
from .prompt_filters import normalize

_KEY_SALT = b"dflash-prompt:"


def _update(h, message: dict) -> None:
    h.update(str(message.get("role", "")).encode() + b"\x1f")
    h.update(normalize(str(message.get("content") or "")).encode("utf-8") + b"\x1e")


def _digest(h) -> int:
    return int.from_bytes(h.digest(), "big")


def prompt_key(messages: list[dict]) -> int:
    """The key of one prompt (its messages as given): equal for prompts equal after normalisation."""
    h = hashlib.blake2b(_KEY_SALT, digest_size=8)
    for m in messages:
        _update(h, m)
    return _digest(h)


def context_keys(messages: list[dict], *, open_end: bool = False) -> list[int]:
    """Keys of every prefix of a conversation that ends just before an assistant turn (what it trains on); with
    `open_end`, also the whole when it ends on another turn (a prompt file whose answers are still to be written)."""
    h, keys = hashlib.blake2b(_KEY_SALT, digest_size=8), []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and i > 0:
            keys.append(_digest(h.copy()))
        _update(h, m)
    if open_end and messages and messages[-1].get("role") != "assistant":
        keys.append(_digest(h))
    return keys


@dataclass
class TrainingPrompts:
    """The training side of the check: the keys of every trained context, and where they were read."""

    source: str
    conversations: int = 0
    keys: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, conversations, source: str = "conversations") -> "TrainingPrompts":
        """From message lists (or anything iterating message lists, e.g. a ChatData)."""
        out = cls(source)
        for messages in conversations:
            out.conversations += 1
            out.keys.update(context_keys(messages, open_end=True))
        return out

    @classmethod
    def read(cls, data: str | Path, *, data_format: str = "auto") -> "TrainingPrompts":
        """From a training data path as TrainConfig.data names it ("tiny", a file or a folder); DataError when it
        cannot be read."""
        if str(data) == "tiny":
            from dflash_lab.tiny import tiny_data_path

            path = Path(tiny_data_path())
        else:
            path = Path(data).expanduser()
        chat = read_chat_data(path, data_format=data_format, on_error="skip", require_assistant=False)
        return cls.of(chat, str(data))

    def has_prompt(self, messages: list[dict]) -> bool:
        """An evaluation prompt (trailing assistant turns already dropped) is one of the trained contexts."""
        return prompt_key(messages) in self.keys

    def has_conversation(self, messages: list[dict]) -> bool:
        """Some context of a held-out conversation (the prompt of one of its answers) was trained on."""
        return any(k in self.keys for k in context_keys(messages))


@dataclass(frozen=True)
class Overlap:
    """What the check found in one held-out set: `found` of `checked` items also occur in training, and whether
    they were removed (a built-in or the run's own held-out set) or only counted (a file given as is)."""

    checked: int
    found: int
    removed: bool
    train_source: str

    def text(self) -> str:
        what = "removed" if self.removed else "kept: the file is evaluated as given"
        return (f"{self.found} of {self.checked} also in the training data ({self.train_source}; {what})"
                if self.found else f"none of {self.checked} in the training data ({self.train_source})")

    def to_dict(self) -> dict:
        return {"checked": self.checked, "found": self.found, "removed": self.removed,
                "train_source": self.train_source}


def conversations_in_training(heldout: list[list[dict]], train: list[list[dict]]) -> int:
    """How many held-out conversations share a trained context with the training conversations (a data tool's
    report: written beside each other, checked before either is used)."""
    return len(split_overlap(heldout, TrainingPrompts.of(train), conversations=True)[1])


def split_overlap(items: list, train: TrainingPrompts | None, *, conversations: bool = False
                  ) -> tuple[list, list]:
    """(items not in training, items in training), each in input order. items are message lists: evaluation
    prompts, or whole held-out conversations with `conversations=True`. No training side: nothing is found."""
    if train is None:
        return list(items), []
    test = train.has_conversation if conversations else train.has_prompt
    clean, found = [], []
    for m in items:
        (found if test(m) else clean).append(m)
    return clean, found
