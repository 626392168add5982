"""Chat data -> token ids + assistant-only loss masks -> fixed-shape batches with per-step anchors.

Conversations are rendered with the TARGET tokenizer's chat template (the one that will be served). The loss mask
is 1 exactly on tokens produced by the assistant: spans are found by rendering the conversation and locating each
assistant message's content in the rendered text (character offsets -> token offsets), so it stays exact for
multi-turn chats. Samples with fewer than 2 * block_size supervised tokens are dropped and counted.

Batches are a pure function of (seed, step): the epoch order is a seeded permutation, and anchors are drawn from a
generator seeded with (seed, step). Resuming at step k therefore reproduces the exact batches of an uninterrupted run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .blocks import build_block_batch, raw_weight_total, sample_anchors


class DataError(ValueError):
    pass


def resolve_data_path(data: str) -> Path:
    if data == "tiny":
        from .tiny import tiny_data_path

        return tiny_data_path()
    p = Path(data).expanduser()
    if not p.is_file():
        raise DataError(f"data file {p} does not exist. Expected a JSONL file with one conversation per line, "
                        'e.g. {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}.')
    return p


def read_conversations(path: Path) -> list[list[dict]]:
    """OpenAI `messages` JSONL. A malformed line raises naming the file and line number."""
    convs = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}). Fix or remove that line.") from e
            msgs = obj.get("messages") if isinstance(obj, dict) else None
            if not isinstance(msgs, list) or not msgs:
                raise DataError(f"{path}:{lineno}: expected an object with a non-empty 'messages' list.")
            convs.append(msgs)
    if not convs:
        raise DataError(f"{path} holds no conversations. Expected one JSON object per line.")
    return convs


def tokenize_conversation(tokenizer, messages: list[dict], *, enable_thinking: bool | None = None) -> tuple[list[int], list[int]]:
    """Render with the chat template; return (input_ids, loss_mask) with 1 on assistant content tokens and on the
    assistant's end-of-turn token (the drafter must learn to predict where a turn ends)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')} has no chat template. Fix: use a "
                        "chat/instruct model or set tokenizer.chat_template.")
    kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kw)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    spans = []
    cursor = 0
    for m in messages:
        content = m.get("content") or ""
        if not content:
            continue
        at = text.find(content, cursor)
        if at < 0:  # template rewrote this message (e.g. dropped earlier reasoning): find its final answer part
            tail = content.split("</think>")[-1].strip()
            at = text.find(tail, cursor) if tail else -1
            content = tail
        if at < 0:
            continue
        if m.get("role") == "assistant":
            end = at + len(content)
            eot = getattr(tokenizer, "eos_token", None)
            for marker in ("<|im_end|>", eot):
                if marker and text.startswith(marker, end):
                    end += len(marker)
                    break
            spans.append((at, end))
        cursor = at + len(content)
    mask = [0] * len(ids)
    for i, (s, e) in enumerate(offsets):
        if e > s and any(s >= a and e <= b for a, b in spans):
            mask[i] = 1
    return ids, mask


@dataclass
class TokenizedData:
    input_ids: torch.Tensor  # (n, S) long, right-padded with pad_id
    loss_mask: torch.Tensor  # (n, S) bool
    lengths: torch.Tensor  # (n,) long
    report: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def tokenize_dataset(tokenizer, conversations: list[list[dict]], *, seq_len: int, block_size: int,
                     enable_thinking: bool | None = None) -> TokenizedData:
    """Tokenize, truncate to seq_len, right-pad, drop samples with < 2 * block_size supervised tokens (counted)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows, masks, lengths = [], [], []
    dropped_short, truncated = 0, 0
    for msgs in conversations:
        ids, mask = tokenize_conversation(tokenizer, msgs, enable_thinking=enable_thinking)
        if len(ids) > seq_len:
            truncated += 1
            ids, mask = ids[:seq_len], mask[:seq_len]
        if sum(mask) < 2 * block_size:
            dropped_short += 1
            continue
        n = len(ids)
        rows.append(ids + [pad_id] * (seq_len - n))
        masks.append(mask + [0] * (seq_len - n))
        lengths.append(n)
    report = {"conversations": len(conversations), "kept": len(rows), "dropped_short": dropped_short,
              "truncated": truncated, "min_supervised_tokens": 2 * block_size}
    if not rows:
        raise DataError(f"no sample has >= {2 * block_size} supervised tokens after truncation to seq_len={seq_len} "
                        f"({report}). Fix: raise seq_len or use data with longer assistant answers.")
    return TokenizedData(torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.bool),
                         torch.tensor(lengths, dtype=torch.long), report)


class BatchSampler:
    """Fixed-shape global batches as a pure function of the step: epoch permutation + per-step anchors."""

    def __init__(self, data: TokenizedData, *, batch_size: int, num_anchors: int, block_size: int,
                 mask_token_id: int, gamma: float, seed: int):
        self.data = data
        self.batch_size, self.num_anchors, self.block_size = batch_size, num_anchors, block_size
        self.mask_token_id, self.gamma, self.seed = mask_token_id, gamma, seed
        self.steps_per_epoch = max(1, len(data) // batch_size)
        self._perm_epoch, self._perm = -1, None

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch index within the epoch) of a global step."""
        return divmod(step, self.steps_per_epoch)

    def indices(self, step: int) -> torch.Tensor:
        epoch, i = self.position(step)
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self.data), generator=g), epoch
        return self._perm[i * self.batch_size:(i + 1) * self.batch_size]

    def batch(self, step: int):
        """The BlockBatch of a global step (CPU tensors). Loss weights are normalised over this whole batch."""
        idx = self.indices(step)
        ids, mask = self.data.input_ids[idx], self.data.loss_mask[idx]
        g = torch.Generator().manual_seed(self.seed * 7_919 + step * 104_729 + 1)
        anchors, valid = sample_anchors(mask, self.num_anchors, g)
        total = raw_weight_total(mask, anchors, valid, block_size=self.block_size, gamma=self.gamma)
        return build_block_batch(ids, mask, anchors, valid, block_size=self.block_size,
                                 mask_token_id=self.mask_token_id, gamma=self.gamma, weight_total=total)
