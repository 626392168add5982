"""The held-out set a run validates on: where its conversations are, and which of them and of its prompts are taken.

The choice does not depend on how the held-out file is ordered or how often it repeats itself: duplicates count
once, conversations and prompts the run trains on (data/heldout_overlap.py) are left out, and the sequences are
spread over the conversations long enough to score AFTER tokenizing, as the real-tau prompts are spread over the
file's distinct prompts (evaluation/prompts.py). The log names each conversation taken (`ValidationSet.choice_text`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_lab.data.chat_formats import ChatData
from dflash_lab.data.heldout_overlap import TrainingPrompts, prompt_key, split_overlap
from dflash_lab.data.tokenize import DataError, read_conversations, tokenize_dataset
from dflash_lab.evaluation.prompt_sets import prompts_sha256
from dflash_lab.evaluation.prompts import render, select_prompts, spread

HELDOUT_SPLITS = ("heldout", "test", "validation")  # datasets DatasetDict split names taken as held-out, in order


def heldout_source(data: str, heldout_data: str | None) -> tuple[Path, str | None] | None:
    """(path, split) of the held-out conversations, or None when there are none (validation and real tau off)."""
    if heldout_data == "":
        return None
    if heldout_data is not None:
        p = Path(heldout_data).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"TrainConfig.heldout_data={heldout_data!r} does not exist. Fix: pass a JSONL "
                                    'file of held-out conversations, or heldout_data="" to turn validation off.')
        return p, None
    if data == "tiny":
        from dflash_lab.tiny import tiny_heldout_path

        return tiny_heldout_path(), None
    p = Path(data).expanduser()
    if p.is_file():
        sibling = p.with_name("heldout.jsonl")
        return (sibling, None) if sibling.is_file() and sibling != p else None
    if (p / "dataset_dict.json").is_file():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        pick = next((s for s in HELDOUT_SPLITS if s in splits), None)
        return (p, pick) if pick else None
    return None


VAL_CANDIDATES = 512  # held-out conversations tokenized to find the validation sequences (well under a second)


@dataclass
class ValidationSet:
    """Fixed held-out sequences (right-padded) and real-tau prompts, tokenized once, and how they were chosen."""

    input_ids: torch.Tensor  # (n, S) long
    loss_mask: torch.Tensor  # (n, S) bool
    prompts: list[list[int]]  # real-tau prompts: each conversation without its last assistant turn
    source: str
    prompts_sha256: str = ""  # of the real-tau prompts' messages (prompt_sets.prompts_sha256: comparable across runs)
    taken: list[str] = field(default_factory=list)  # the id ("file.jsonl:17" or its "id") of each sequence
    counts: dict = field(default_factory=dict)  # conversations, duplicates, in_training, usable; prompts_in_training

    def choice_text(self) -> str:
        """Which held-out conversations were taken and what was left out on the way (the log says it)."""
        c = self.counts
        trained = ("not checked: the training data could not be read" if c.get("in_training") is None else
                   f"{c['in_training']} also in the training data ({c.get('train_source')}), left out")
        return (f"{c.get('conversations')} conversations: {c.get('duplicates')} duplicates and {trained}; "
                f"{c.get('usable')} long enough to score, {len(self.taken)} spread over them: "
                + ", ".join(self.taken[:SHOWN]) + (f", ... ({len(self.taken) - SHOWN} more)"
                                                   if len(self.taken) > SHOWN else ""))


SHOWN = 3  # conversations named in the log line (all of them made a ~700-character line on every run)


def training_prompts(cfg) -> TrainingPrompts | None:
    """The run's training prompts for the held-out check; None when the data cannot be read here (then nothing is
    left out and the log says it was not checked)."""
    try:
        return TrainingPrompts.read(cfg.data, data_format=cfg.data_format)
    except (DataError, OSError):
        return None


def distinct_conversations(conversations: list) -> list:
    """Conversations with duplicates (the same roles and normalised texts in every turn) dropped, first kept."""
    seen, out = set(), []
    for c in conversations:
        key = prompt_key(c.messages)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def load_validation_set(tokenizer, cfg, *, block_size: int, max_positions: int = 1 << 30,
                        train: TrainingPrompts | None | str = "read") -> ValidationSet | None:
    """Tokenize the held-out conversations the way training does (chat template, masks, truncation to seq_len).

    Which val_sequences are taken does not depend on the file's order or repeats: duplicates count once, those the
    run trains on (data/heldout_overlap.py) are left out, and the sequences are spread over the conversations that
    hold two blocks of answer AFTER tokenizing, as the real-tau prompts are spread over the file's distinct prompts.
    A regenerated file is written as answers finish (shortest first) and is not deduplicated: taking the first 16
    usable ones of the SmolLM2 recipe's 200 took the same "Hello!" conversation 9 times, and the replayed tau read
    6.18 where real tau read 3.12. `train`: the training prompts ("read" = from cfg.data; None = no check)."""
    src = heldout_source(cfg.data, cfg.heldout_data)
    if src is None:
        return None
    path, split = src
    if train == "read":
        train = training_prompts(cfg)
    chat = read_conversations(path, data_format=cfg.data_format, on_error="skip", split=split)
    unique = distinct_conversations(chat.conversations)
    clean, trained = split_overlap([c.messages for c in unique], train, conversations=True)
    keep = {id(m) for m in clean}
    unique = [c for c in unique if id(c.messages) in keep]
    if not unique:
        raise DataError(f"every held-out conversation of {path} also occurs in the training data ({cfg.data}). "
                        "Fix: hold out conversations the run does not train on (heldout_data=...).")
    # tokenizing every candidate is cheap (well under a second for 512); a larger file is spread over first
    cands = spread(unique, max(VAL_CANDIDATES, 4 * cfg.val_sequences))
    data = tokenize_dataset(tokenizer, ChatData(cands, chat.report), seq_len=cfg.seq_len, block_size=block_size,
                            enable_thinking=cfg.enable_thinking, on_error="skip")
    pick = spread(list(range(len(data))), cfg.val_sequences)
    prompts, messages, prompts_trained = [], [], None
    if path.suffix == ".jsonl" and split is None:  # render prompts exactly as `evaluate` does
        chosen = select_prompts(path, cfg.real_tau_prompts, train=train)
        prompts_trained = chosen.in_training
        for m in chosen.messages:
            ids = render(tokenizer, m, cfg.enable_thinking)
            # a prompt that cannot fit with its generation budget would stop the decoder: leave it out
            if ids and len(ids) + cfg.real_tau_new_tokens + block_size <= max_positions:
                prompts.append(ids)
                messages.append(m)
    counts = {"conversations": len(chat), "duplicates": len(chat) - len(unique) - len(trained),
              "in_training": None if train is None else len(trained),
              "train_source": train.source if train is not None else cfg.data,
              "usable": len(data), "prompts_in_training": prompts_trained}
    return ValidationSet(data.input_ids[pick].long(), data.loss_mask[pick].bool(), prompts,
                         f"{path}" + (f" (split {split})" if split else ""), prompts_sha256(messages),
                         taken=[data.sample_ids[i] for i in pick], counts=counts)
