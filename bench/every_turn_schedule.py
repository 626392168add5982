"""How full the engine's rows stay in every-turn regeneration, by queue policy: a scheduling simulation on the CPU.

    python bench/every_turn_schedule.py --conversations /tmp/chitchat/train-all.jsonl \
        --answers /tmp/scaling-data/chitchat-regen.jsonl --rows 512 --n 1000 6962

Drives the real PromptQueue (target/gen_queue.py) with the Generator's row rules and no model: rows refill in waves
(when 1/8 of them is free, or none is live), finished rows are read every 8 steps (one chunk), and an answer of L
tokens holds its row for L decode steps. The turn structure is real (each conversation's assistant turns, from
--conversations); answer lengths are drawn, seeded, from real answers of the target (--answers: a regenerated file,
its new_tokens), so the figures are SIMULATED row occupancy, not GPU rates. Two policies: "before" (follow-ups
behind the waiting prompts, shortest prompts first) and "now" (follow-ups first, longest chains first). A decode
step of a 135M target costs about the same at 256 or 512 live rows, so row occupancy is what separates the rates.
One JSON line per (n, policy): decode steps, occupancy (answer tokens / (steps x rows)), refill waves.
"""

from __future__ import annotations

import argparse
import json
import random

import inspect

from dflash_lab.data.regen_engine import TURN_KEYS
from dflash_lab.target.gen_queue import Generated, PromptItem, PromptQueue, by_length, longest_chain_first
from dflash_lab.target.generate import Generator

# the engine's own refill rule (its default), not a copy of the number; a chunk is its 8 steps per sync on CUDA
REFILL_FRACTION = inspect.signature(Generator.__init__).parameters["refill_fraction"].default


def simulate(chains: list[list[int]], rows: int, *, now: bool, chunk: int = 8,
             refill_fraction: float = REFILL_FRACTION) -> dict:
    """chains[c] = answer lengths of conversation c's turns, in order. Returns steps, occupancy, waves."""
    def item(c: int, turn: int) -> PromptItem:
        return PromptItem(c * TURN_KEYS + turn, [0] * (1 + turn))  # prompt length grows with the turn

    def on_finish(key: int, _gen: Generated):
        c, turn = divmod(key, TURN_KEYS)
        return item(c, turn + 1) if turn + 1 < len(chains[c]) else None

    first = [item(c, 0) for c in range(len(chains))]
    order = longest_chain_first(first, {it.key: len(chains[it.key // TURN_KEYS]) for it in first}) if now \
        else by_length(first)
    queue = PromptQueue(order, on_finish=on_finish, follow_ups_first=now)
    live: dict[int, list] = {}  # row -> [key, tokens left]
    steps = tokens = waves = 0
    refill_at = max(1, int(refill_fraction * rows))
    try:
        while True:
            free = rows - len(live)
            if free and (not live or free >= refill_at) and queue.has_waiting():
                taken = queue.take(free)
                spare = [r for r in range(rows) if r not in live]
                for r, it in zip(spare, taken):
                    c, turn = divmod(it.key, TURN_KEYS)
                    live[r] = [it.key, chains[c][turn]]
                waves += 1
            if not live:
                if queue.wait_for_work():
                    continue
                break
            for _ in range(chunk):  # one chunk: every live row decodes, finished ones only at its end
                steps += 1
                for r in live.values():
                    if r[1] > 0:
                        r[1] -= 1
                        tokens += 1
            for r in [r for r, (_, left) in live.items() if left == 0]:
                key, _ = live.pop(r)
                queue.finish(key, Generated(token_ids=[], finish_reason="stop"))
            queue.settle()
    finally:
        queue.close()
    return {"steps": steps, "answer_tokens": tokens, "occupancy": round(tokens / (steps * rows), 4), "waves": waves}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", required=True, help="JSONL chat conversations (their assistant turns)")
    ap.add_argument("--answers", required=True, help="a regenerated JSONL file: its generation.new_tokens")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--n", type=int, nargs="+", default=[1000])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    turns = []
    for line in open(args.conversations):
        if line.strip():
            msgs = json.loads(line)["messages"]
            turns.append(max(1, sum(m["role"] == "assistant" for m in msgs)))
    lengths = [n for line in open(args.answers) if line.strip() for n in json.loads(line)["generation"]["new_tokens"]]
    rng = random.Random(args.seed)
    for n in args.n:
        chains = [[rng.choice(lengths) for _ in range(t)] for t in turns[:n]]
        for now in (False, True):
            out = simulate(chains, args.rows, now=now)
            print(json.dumps({"conversations": len(chains), "answers": sum(map(len, chains)), "rows": args.rows,
                              "policy": "now" if now else "before", **out, "simulated": True}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
