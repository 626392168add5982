"""Synthetic chat tasks for the tiny target: answers are deterministic functions of the prompt.

The answers are structured (counting, lists, tables, spelled words, templated sentences), so a drafter that reads
the prompt can guess many tokens ahead, but one that ignores it cannot: where a count starts and stops, which word
is spelled, which attributes an item number has all come from the prompt. Every answer is 40-150 tokens with the
tiny tokenizer. About 15% of conversations have two turns (the second often says "now do the same for ..." and so
only makes sense after reading the first), and a few (~4%) carry a short `<think>` reasoning, always triggered by the
prompt suffix " Think first." so the thinking behaviour is itself a function of the prompt.

Numbers stay in 0..199 so that every number is one or two BPE tokens and its successor / attributes are learnable
by a 1M-parameter model in a few CPU minutes.

Public API: `make_datasets(seed, n_train, n_heldout)`, `generate_conversations(n, seed)`, `split_thinking(text)`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

MAX_NUMBER = 199
THINK_SUFFIX = " Think first."

COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple", "brown", "gray"]
SHAPES = ["cube", "ball", "cone", "ring", "disk", "star", "box"]
MATERIALS = ["wood", "glass", "steel", "paper"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = [
    "apple", "river", "candle", "garden", "window", "silver", "rocket", "planet", "forest", "bottle", "orange",
    "pencil", "market", "castle", "dragon", "mirror", "summer", "winter", "spring", "autumn", "basket", "button",
    "carpet", "doctor", "engine", "finger", "guitar", "hammer", "island", "jacket", "kitten", "ladder", "monkey",
    "needle", "ocean", "pepper", "rabbit", "saddle", "tunnel", "violin", "wallet", "yellow", "zipper", "bridge",
    "cloud", "desert", "feather", "glove", "honey", "lemon", "music", "paint", "queen", "shadow", "tiger", "velvet",
    "whale", "anchor", "butter", "cherry", "danger", "eagle", "fabric", "goose", "harbor", "insect", "jungle",
    "lizard", "meadow", "nickel", "pirate", "robot", "stone", "table", "umbrella", "valley", "wizard", "bread",
    "circle", "dinner",
]


def item_attributes(n: int) -> tuple[str, str, str]:
    """Colour, shape, material of item n: fixed functions of n (last digit, n mod 7, n mod 4)."""
    return COLORS[n % 10], SHAPES[n % 7], MATERIALS[n % 4]


def split_thinking(text: str) -> tuple[str, str]:
    """Split an assistant message into (reasoning, answer); reasoning is '' when there is no `<think>` block."""
    if "</think>" not in text:
        return "", text
    head, answer = text.split("</think>", 1)
    return head.split("<think>", 1)[-1].strip("\n"), answer.lstrip("\n")


@dataclass(frozen=True)
class Turn:
    """One user request and its exact answer; `kind` + `params` let a follow-up turn re-run the same task."""
    kind: str
    params: tuple
    prompt: str
    answer: str
    reasoning: str


# ---- the tasks: each is (params) -> (prompt, answer, reasoning); a sampler draws params --------------------------
# Formats are chosen so that what an answer must match against the prompt is the SAME token there and here: numbers
# always follow a space (" 41" in "to 41." and in "... 40 41"), list words follow a space, line counters are " n".
# A tiny model then learns "stop when the current token is the prompt's end value" as an exact token match.

def _count_up(a: int, b: int):
    return (f"Count from {a} to {b}.", "Counting up: " + " ".join(str(i) for i in range(a, b + 1)),
            f"I count up from {a} to {b} in steps of one.")


def _count_down(a: int, b: int):
    return (f"Count down from {a} to {b}.", "Counting down: " + " ".join(str(i) for i in range(a, b - 1, -1)),
            f"I count down from {a} to {b} in steps of one.")


def _multiples(k: int, a: int, b: int):
    return (f"List the multiples of {k} from {a} to {b}.",
            f"Multiples of {k}: " + ", ".join(str(i) for i in range(a, b + 1, k)) + ".",
            f"I start at {a} and add {k} each time until {b}.")


def _letters(a: str, b: str, upper: bool):
    i, j = LETTERS.index(a), LETTERS.index(b)
    case, a, b = ("capital letters", a.upper(), b.upper()) if upper else ("letters", a, b)
    lines = [f"{k + 1}. {LETTERS[k].upper() if upper else LETTERS[k]}" for k in range(i, j + 1)]
    return (f"Write the {case} from {a} to {b} with their positions.", "\n".join(lines),
            f"The letter {a} is number {i + 1} and the letter {b} is number {j + 1}.")


def _repeat(word: str, n: int):
    return (f"Repeat the word {word} {n} times, numbered.", "\n".join(f"Line {k}: {word}" for k in range(1, n + 1)),
            f"I write {word} on {n} numbered lines.")


def _spell(*words: str):
    return ("Spell these words: " + " ".join(words) + ".",
            "\n".join(f"- {w}: " + " ".join(w) for w in words),
            f"There are {len(words)} words, so I spell each one letter by letter.")


def _items(a: int, b: int):
    lines = []
    for n in range(a, b + 1):
        color, shape, material = item_attributes(n)
        article = "an" if color[0] in "aeiou" else "a"
        lines.append(f"Item {n} is {article} {color} {shape} made of {material}.")
    return (f"Describe items {a} to {b}.", "\n".join(lines), f"I describe the items from {a} to {b}, one per line.")


def _item_table(a: int, b: int):
    rows = ["| item | color | shape | material |", "| --- | --- | --- | --- |"]
    for n in range(a, b + 1):
        rows.append("| {} | {} | {} | {} |".format(n, *item_attributes(n)))
    return (f"Make a table of items {a} to {b}.", "\n".join(rows), f"One table row for each item from {a} to {b}.")


def _calendar(unit: str, start: str, n: int):
    names, label = (DAYS, "Day") if unit == "days" else (MONTHS, "Month")
    i = names.index(start)
    lines = [f"{label} {k + 1}: {names[(i + k) % len(names)]}" for k in range(n)]
    return (f"List {n} {unit} starting from {start}.", "\n".join(lines),
            f"I start with {start} and keep going for {n} {unit}.")


def _copy(*numbers: int):
    listed = " ".join(str(n) for n in numbers)
    return (f"Copy these numbers: {listed}.", f"Copied: {listed}", f"I copy the {len(numbers)} numbers in order.")


TASKS: dict[str, Callable[..., tuple[str, str, str]]] = {
    "count_up": _count_up, "count_down": _count_down, "multiples": _multiples, "letters": _letters,
    "repeat": _repeat, "spell": _spell, "items": _items, "item_table": _item_table, "calendar": _calendar,
    "copy": _copy,
}
# Sampling weights of the task kinds (sum need not be 1).
WEIGHTS = {"count_up": 12, "count_down": 10, "multiples": 10, "letters": 10, "repeat": 10, "spell": 10, "items": 12,
           "item_table": 8, "calendar": 10, "copy": 8}


def _sample_params(kind: str, rng: random.Random) -> tuple:
    if kind == "count_up":
        n = rng.randint(41, 64)
        a = rng.randint(0, MAX_NUMBER + 1 - n)
        return (a, a + n - 1)
    if kind == "count_down":
        n = rng.randint(41, 64)
        b = rng.randint(0, MAX_NUMBER + 1 - n)
        return (b + n - 1, b)
    if kind == "multiples":
        k = rng.choice([2, 2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 9])
        top = MAX_NUMBER // k                   # largest usable multiplier
        n = rng.randint(20, min(30, top))       # number of terms (2 tokens each)
        i = rng.randint(1, top - n + 1)
        return (k, k * i, k * (i + n - 1))
    if kind == "letters":
        span = rng.randint(11, 20)
        i = rng.randint(0, 26 - span)
        return (LETTERS[i], LETTERS[i + span - 1], rng.random() < 0.3)
    if kind == "repeat":
        return (rng.choice(WORDS), rng.randint(8, 16))
    if kind == "spell":
        words, letters = [], 0
        while letters < 40 or len(words) < 4:  # ~ (len + 3) tokens per word: keep answers >= 40 tokens
            w = rng.choice(WORDS)
            if w not in words:
                words.append(w)
                letters += len(w) + 3
        return tuple(words)
    if kind == "items":
        n = rng.randint(4, 6)
        a = rng.randint(0, MAX_NUMBER + 1 - n)
        return (a, a + n - 1)
    if kind == "item_table":
        n = rng.randint(3, 5)
        a = rng.randint(0, MAX_NUMBER + 1 - n)
        return (a, a + n - 1)
    if kind == "calendar":
        unit = rng.choice(["days", "months"])
        return (unit, rng.choice(DAYS if unit == "days" else MONTHS), rng.randint(8, 16))
    if kind == "copy":
        return tuple(rng.sample(range(MAX_NUMBER + 1), rng.randint(40, 48)))
    raise ValueError(f"unknown task kind {kind!r}; known: {sorted(TASKS)}")


def make_turn(kind: str, params: tuple) -> Turn:
    prompt, answer, reasoning = TASKS[kind](*params)
    return Turn(kind, params, prompt, answer, reasoning)


def sample_turn(rng: random.Random) -> Turn:
    kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    return make_turn(kind, _sample_params(kind, rng))


# Follow-ups that re-run the previous task with new range ends: the answer depends on the FIRST turn's task.
_FOLLOWUP = {"count_up", "count_down", "letters", "items", "item_table"}


def sample_followup(prev: Turn, rng: random.Random) -> Turn:
    """Second user turn: 60% "Now do the same ..." (when the task allows it), else an unrelated task."""
    if prev.kind not in _FOLLOWUP or rng.random() < 0.4:
        return sample_turn(rng)
    params = _sample_params(prev.kind, rng)
    if prev.kind == "letters":
        params = (params[0], params[1], prev.params[2])  # same case as before
    t = make_turn(prev.kind, params)
    a, b = params[0], params[1]
    if prev.kind == "letters" and prev.params[2]:
        a, b = a.upper(), b.upper()
    prompt = f"Now do the same for items {a} to {b}." if prev.kind in ("items", "item_table") else \
        f"Now do the same from {a} to {b}."
    return Turn(t.kind, t.params, prompt, t.answer, t.reasoning)


def _assistant(turn: Turn, think: bool) -> str:
    return f"<think>\n{turn.reasoning}\n</think>\n\n{turn.answer}" if think else turn.answer


def sample_conversation(rng: random.Random, two_turn_p: float = 0.15, think_p: float = 0.04) -> dict:
    """One conversation in OpenAI format: {"messages": [{"role", "content"}, ...]}."""
    first = sample_turn(rng)
    turns = [first]
    if rng.random() < two_turn_p:
        turns.append(sample_followup(first, rng))
    think = rng.random() < think_p
    messages = []
    for k, t in enumerate(turns):
        last = k == len(turns) - 1
        prompt = t.prompt + (THINK_SUFFIX if think and last else "")
        messages.append({"role": "user", "content": prompt})
        messages.append({"role": "assistant", "content": _assistant(t, think and last)})
    return {"messages": messages}


def prompt_key(conv: dict) -> tuple[str, ...]:
    """The user side of a conversation: what must not repeat between train and held-out."""
    return tuple(m["content"] for m in conv["messages"] if m["role"] == "user")


def generate_conversations(n: int, seed: int, exclude: set | None = None, **kw) -> list[dict]:
    """`n` conversations with distinct user sides, none in `exclude`; same seed -> identical list."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out = []
    while len(out) < n:
        conv = sample_conversation(rng, **kw)
        key = prompt_key(conv)
        if key in seen:
            continue
        seen.add(key)
        out.append(conv)
    return out


def make_datasets(seed: int = 0, n_train: int = 4000, n_heldout: int = 100) -> tuple[list[dict], list[dict]]:
    """(train, heldout). Held-out is drawn first, has no thinking, and its user turns never occur as a train
    prompt; train then excludes every held-out user side."""
    heldout = generate_conversations(n_heldout, seed + 1, think_p=0.0)
    banned = {prompt_key(c) for c in heldout}
    # Also ban single-turn prompts equal to any held-out user message, so a held-out question is never seen.
    banned |= {(m["content"],) for c in heldout for m in c["messages"] if m["role"] == "user"}
    train = generate_conversations(n_train, seed, exclude=banned)
    return train, heldout
