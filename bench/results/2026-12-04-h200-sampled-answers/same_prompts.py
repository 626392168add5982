"""Check that two recipe_ab pools differ only in the target's answers, and (--merge DIR) write one state holding both
pools' arms, so that one evaluation decodes both drafters on the same prompts beside one target-alone baseline.

    python same_prompts.py /tmp/sa-greedy /tmp/sa-t1 [--merge /tmp/sa-both]

The pools must hold the same prompts in every held-out set file, and the second pool's training file no first user
turn the first one lacks: the evaluation's held-out filter reads the first arm's training data, which then covers
the other arm's too.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def first_turns(path: str) -> collections.Counter:
    turns = collections.Counter()
    with open(path) as f:
        for line in f:
            if line.strip():
                msgs = json.loads(line).get("messages", [])
                user = next((m["content"] for m in msgs if m.get("role") == "user"), None)
                if user is not None:
                    turns[user] += 1
    return turns


def compare(a: dict, b: dict) -> list[str]:
    problems = []
    pairs = [("training data", a["train_data"], b["train_data"]), ("held-out data", a["heldout_data"], b["heldout_data"])]
    pairs += [(f"set {k}", v, b["sets"].get(k)) for k, v in a["sets"].items() if Path(v).is_file()]
    for what, pa, pb in pairs:
        if pb is None:
            problems.append(f"{what}: only in the first pool")
            continue
        ta, tb = first_turns(pa), first_turns(pb)
        same = sum((ta & tb).values())
        print(f"{what}: {sum(ta.values())} / {sum(tb.values())} first user turns, {same} in both")
        if what == "training data" and not tb - ta:
            continue  # answers the mix found unusable drop a conversation: the filter on the first pool's then covers
        if ta != tb:
            problems.append(f"{what}: the first user turns differ ({sum((ta - tb).values())} only in {pa}, "
                            f"{sum((tb - ta).values())} only in {pb})")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("first", type=Path)
    p.add_argument("second", type=Path)
    p.add_argument("--merge", type=Path, help="write DIR/ab.json: the first pool's state with both pools' arms")
    args = p.parse_args(argv)
    a, b = (json.loads((w / "ab.json").read_text()) for w in (args.first, args.second))
    problems = compare(a, b)
    for line in problems:
        print("DIFFERENT:", line)
    if problems:
        return 1
    if args.merge:
        args.merge.mkdir(parents=True, exist_ok=True)
        arms = {**a.get("arms", {}), **b.get("arms", {})}
        unfinished = {k: v["status"] for k, v in arms.items() if v["status"] != "finished"}
        if unfinished:
            print(f"arms not finished: {unfinished}")
            return 2
        (args.merge / "ab.json").write_text(json.dumps({**a, "arms": arms}, indent=1))
        print(f"merged {list(arms)} into {args.merge / 'ab.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
