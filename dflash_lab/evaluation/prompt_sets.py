"""Named prompt sets: what `--prompts NAME` means, where its file is, and the size and checksum every report quotes.

    python -m dflash_lab.evaluation.prompt_sets list [--target T]      names, files, sizes, checksums
    python -m dflash_lab.evaluation.prompt_sets build chitchat-heldout   build the chitchat set (installs its wheel)

- `general`: 78 prompts written for dflash-lab (questions, instructions, arithmetic, code, advice, chit-chat,
  summaries, multi-step), shipped as package data in `prompt_sets/general.jsonl`;
- `chitchat-heldout`: the first user turn of the 200 chitchat conversations that data/real_data.py's fixed split
  holds out (smallest sha256 of the id), built once into `$DFLASH_LAB_CACHE/prompt_sets/` from its wheel;
- `self-heldout`: prompts the target wrote itself, held out by data/self_prompts.py (`<its --out stem>.heldout.jsonl`):
  the run's training file's own, else the one in its training folder, else the one in `runs/data/`;
- `tiny-heldout`, `tiny-train`: the tiny target's 100 held-out and 3,200 training conversations;
- anything else: a JSONL file, `{"messages": [...]}` or `{"prompt": "..."}` per line.

Two tau figures are comparable only on the same prompts, so a report names each set with its size (prompts
evaluated, and distinct ones in the file; prompts.py says which are evaluated) and the sha256 of exactly the
evaluated prompts (their chat messages as canonical JSON, trailing assistant turns dropped; independent of the
tokenizer, so one checksum identifies a set across targets).

Held-out means not trained on: when the run's training data is known (its config.json names it), every set is
checked against its prompts (data/heldout_overlap.py) and the report says how many of the set's prompts were found
there. From a held-out set (chitchat-heldout, self-heldout, tiny-heldout, the run's own held-out file, a file
named heldout.jsonl, *.heldout.jsonl or *-heldout.jsonl) they are left out before the n are spread; any other file
is evaluated as given, with the count beside it. chitchat-heldout is also built without the prompts of chitchat's
training split: 71 of its 200 first turns (30 of its 159 distinct prompts: "Hello?", "hello?", "Hello!", "Hi",
...) occur there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_lab.data.files import HELDOUT_SUFFIX, DataError, heldout_files

from dflash_lab.data.heldout_overlap import TrainingPrompts, split_overlap
from .prompts import EvalError, PromptSelection, select_prompts

PACKAGED = Path(__file__).resolve().parent / "prompt_sets"
GENERAL = PACKAGED / "general.jsonl"
CHITCHAT_HELDOUT = 200  # the held-out size of data/real_data.py's split (and the recipe's default)
SELF_PROMPTS_COMMAND = "python -m dflash_lab.data.self_prompts --target {target} --n 2000 --out runs/data/self.jsonl"
NAMES = ("general", "chitchat-heldout", "self-heldout", "tiny-heldout", "tiny-train")


@dataclass(frozen=True)
class PromptSetInfo:
    """What a report says about one prompt set: its name, file, how many prompts were evaluated (of how many in the
    file) and the sha256 of the evaluated prompts."""

    name: str
    path: str
    prompts: int
    file_prompts: int
    sha256: str
    in_training: int | None = None  # of the file's distinct prompts, also in the run's training data (None: unchecked)
    overlap_removed: bool = False  # those were left out (a held-out set) rather than evaluated (a file as given)
    train_data: str = ""  # the training data checked against

    @property
    def short(self) -> str:
        return self.sha256[:12]

    def text(self) -> str:
        return (f"{self.name}: {self.prompts} of {self.file_prompts} prompts, sha256 {self.short} ({self.path}); "
                + overlap_text(self.to_dict()))

    def to_dict(self) -> dict:
        return asdict(self)


def prompts_sha256(messages: list[list[dict]]) -> str:
    """sha256 of prompts given as chat message lists (canonical JSON, one prompt per line)."""
    h = hashlib.sha256()
    for m in messages:
        h.update(json.dumps(m, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def overlap_text(info: dict) -> str:
    """What the held-out check found in a set (a PromptSetInfo's dict, as eval.json keeps it)."""
    found = info.get("in_training")
    if found is None:
        return "not checked against training data (the run's data is not known or not readable here)"
    if not found:
        return f"none of its prompts in the training data ({info.get('train_data')})"
    how = "left out" if info.get("overlap_removed") else "evaluated as given"
    return f"{found} of its distinct prompts also in the training data ({info.get('train_data')}), {how}"


def info_of(name: str, path: str | Path, chosen: PromptSelection) -> PromptSetInfo:
    return PromptSetInfo(name, str(path), len(chosen.messages), chosen.file_prompts, prompts_sha256(chosen.messages),
                         chosen.in_training, chosen.removed, chosen.train_source)


def set_info(name: str, path: str | Path, n_prompts: int | None = None, *, train: TrainingPrompts | None = None,
             remove: bool = True) -> PromptSetInfo:
    """Size and checksum of the n_prompts prompts a file's set evaluates (all when None; prompts.select_prompts
    picks them, `train`'s prompts counted and, with `remove`, left out); file_prompts counts its distinct prompts."""
    return info_of(name, path, select_prompts(path, n_prompts, train=train, remove=remove))


def read_training_prompts(data: str, data_format: str = "auto") -> TrainingPrompts | None:
    """A run's training prompts for the held-out check; None when its data cannot be read here (the report then
    says the sets were not checked)."""
    if not data:
        return None
    try:
        return TrainingPrompts.read(data, data_format=data_format)
    except (DataError, OSError):
        return None


def is_heldout_file(path: str | Path, data: str = "", heldout_data: str | None = None) -> bool:
    """A file of held-out prompts, from which those a run trains on are left out: the run's own held-out file, or
    one whose name says so (heldout.jsonl, *.heldout.jsonl, *-heldout.jsonl: the built-in chitchat-heldout and
    tiny-heldout, self_prompts' held-out files). Any other file is evaluated as given."""
    p = Path(path).expanduser()
    own = run_heldout_file(data, heldout_data) if data else None
    if own is not None and own.resolve() == p.resolve():
        return True
    return p.name == "heldout.jsonl" or p.name.endswith((HELDOUT_SUFFIX, "-heldout.jsonl"))


def prompt_sets_dir() -> Path:
    """`$DFLASH_LAB_CACHE/prompt_sets` (default `~/.cache/dflash-lab/prompt_sets`): sets built from wheels."""
    from dflash_lab.target.models import cache_root

    return cache_root().parent / "prompt_sets"


def chitchat_heldout_path() -> Path:
    return prompt_sets_dir() / "chitchat-heldout.jsonl"


def build_chitchat_heldout(*, install: bool = True, log=print) -> Path:
    """Write the chitchat-heldout set (from the chitchat-dataset wheel, installed with --no-deps when `install`)."""
    from dflash_lab.data import real_data

    out = chitchat_heldout_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".chitchat-") as tmp:
        try:
            summary = real_data.build_chitchat(tmp, heldout=CHITCHAT_HELDOUT, install=install, log=log)
        except real_data.RealDataError as e:
            raise EvalError(f"prompt set 'chitchat-heldout' cannot be built: {e}") from None
        # a split by conversation id leaves the same greetings on both sides: keep the held-out lines whose prompt
        # no training conversation starts with
        held = Path(tmp) / "heldout-first.jsonl"
        lines = [ln + "\n" for ln in held.read_text(encoding="utf-8").split("\n") if ln.strip()]  # JSON lines
        train = TrainingPrompts.read(Path(tmp) / "train-all.jsonl")
        records = [json.loads(ln) for ln in lines]
        clean, _ = split_overlap([r["messages"] for r in records], train)
        clean_ids = {id(m) for m in clean}
        kept = [ln for ln, r in zip(lines, records) if id(r["messages"]) in clean_ids]
        held.write_text("".join(kept), encoding="utf-8")
        meta = {"source": summary["source"], "source_sha256": summary["source_sha256"],
                "heldout": CHITCHAT_HELDOUT, "split_rule": summary["split_rule"], "variant": "first user turn",
                "train_overlap_removed": len(lines) - len(kept), "lines": len(kept)}
        (Path(tmp) / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        shutil.move(str(Path(tmp) / "meta.json"), str(out.with_suffix(".meta.json")))
        shutil.move(str(Path(tmp) / "heldout-first.jsonl"), str(out))  # same folder: an atomic rename
    log(f"built prompt set {set_info('chitchat-heldout', out).text()}")
    return out


def _overlap_checked(path: Path) -> bool:
    """The built set's meta says training prompts were left out of it (a build from before did not)."""
    try:
        return "train_overlap_removed" in json.loads(path.with_suffix(".meta.json").read_text())
    except (OSError, ValueError):
        return False


def self_heldout_file(data: str = "", runs_dir: str | Path = "runs", target: str = "") -> Path:
    """The held-out file of `self-heldout`: the one that belongs to the run's training data (its file's own, or the
    one in its folder), else the one in `runs/data/`; EvalError when none exists or a folder holds several."""
    from dflash_lab.runs.rundir import resolve_runs_dir

    mine = Path(data).expanduser() if data and data != "tiny" else None
    places = ([mine] + ([mine.parent] if mine.suffix else []) if mine else []) + [resolve_runs_dir(runs_dir) / "data"]
    for place in places:
        found = heldout_files(place)
        if len(found) > 1:
            raise EvalError(f"prompt set 'self-heldout' is ambiguous: {place} holds {len(found)} held-out files "
                            f"({', '.join(f.name for f in found)}). Fix: pass the one that belongs to the run's "
                            f"training data: --prompts {found[0]}.")
        if found:
            return found[0]
    raise EvalError(f"prompt set 'self-heldout' (prompts written by the target) is missing: no *{HELDOUT_SUFFIX} "
                    f"for {' or in '.join(str(p) for p in places)}. Fix: run "
                    f"`{SELF_PROMPTS_COMMAND.format(target=target or '<target>')}` (it writes "
                    f"runs/data/self{HELDOUT_SUFFIX}), or pass its held-out file: --prompts <stem>{HELDOUT_SUFFIX}.")


def named_set_path(name: str, *, target: str = "", data: str = "", build: bool = True, log=print) -> Path:
    """The file of a named prompt set; raises EvalError naming the command that makes a missing one."""
    if name == "general":
        return GENERAL
    if name in ("tiny-heldout", "tiny-train"):
        from dflash_lab.tiny import tiny_data_path, tiny_heldout_path

        return Path(tiny_heldout_path() if name == "tiny-heldout" else tiny_data_path())
    if name == "chitchat-heldout":
        p = chitchat_heldout_path()
        if p.is_file() and (not build or _overlap_checked(p)):
            return p
        import importlib.util

        if build and importlib.util.find_spec("chitchat_dataset") is not None:  # the wheel is there: no install
            log(f"building prompt set chitchat-heldout into {p} ("
                + ("again: built before training prompts were left out of it)" if p.is_file() else "once)"))
            return build_chitchat_heldout(install=False, log=log)
        if p.is_file():
            return p
        raise EvalError(f"prompt set 'chitchat-heldout' is not built yet ({p}). Fix: run `python -m "
                        "dflash_lab.evaluation.prompt_sets build chitchat-heldout` (installs chitchat-dataset==0.9.0 "
                        "with pip --no-deps, then writes the set).")
    if name == "self-heldout":
        return self_heldout_file(data, target=target)
    raise EvalError(f"unknown prompt set {name!r}. Fix: use one of {', '.join(NAMES)}, or a JSONL file path.")


def run_heldout_file(data: str, heldout_data: str | None) -> Path | None:
    """The run's held-out JSONL when it has one (explicit heldout_data, or heldout.jsonl next to a data file)."""
    if heldout_data == "":
        return None
    if heldout_data:
        p = Path(heldout_data).expanduser()
        return p if p.is_file() and p.suffix == ".jsonl" else None
    if data == "tiny":
        return named_set_path("tiny-heldout")
    p = Path(data).expanduser() if data else None
    if p is not None and p.is_file() and (p.with_name("heldout.jsonl")).is_file() and p.name != "heldout.jsonl":
        return p.with_name("heldout.jsonl")
    return None


def default_sets(target: str, data: str = "tiny", heldout_data: str | None = None) -> dict[str, Path]:
    """Prompt sets when none are given: the tiny target's held-out and training prompts; for a real target the
    run's held-out prompts (when it has a held-out JSONL) and the general set."""
    if target == "tiny":
        return {"heldout": named_set_path("tiny-heldout"), "train": named_set_path("tiny-train")}
    sets = {}
    held = run_heldout_file(data, heldout_data)
    if held is not None:
        sets["heldout"] = held
    sets["general"] = GENERAL
    return sets


def resolve_sets(prompts, target: str, data: str = "", heldout_data: str | None = None, *, log=print
                 ) -> dict[str, Path]:
    """`prompts` (None, a name or file, a list of them, or {set name: name or file}) -> {set name: file}."""
    if prompts is None or prompts == "" or prompts == []:
        return default_sets(target, data, heldout_data)
    if isinstance(prompts, (str, Path)):
        prompts = [prompts]
    items = prompts.items() if isinstance(prompts, dict) else [(None, p) for p in prompts]
    sets = {}
    for key, p in items:
        s = str(p)
        if s in NAMES:
            path, name = named_set_path(s, target=target, data=data, log=log), s
        else:
            path = Path(s).expanduser()
            if not path.is_file():
                raise EvalError(f"prompts file {s} does not exist, and it is not a prompt set name either "
                                f"({', '.join(NAMES)}). Fix: pass a JSONL file with one {{\"messages\": [...]}} or "
                                "{\"prompt\": \"...\"} object per line, or one of the names.")
            name = path.stem
        name = str(key) if key is not None else name
        while name in sets:
            name += "'"
        sets[name] = path
    return sets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.prompt_sets", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="the named sets: file, size, sha256")
    ls.add_argument("--target", default="", help="target (for self-heldout's command)")
    ls.add_argument("--data", default="", help="a run's training data (self-heldout is looked for next to it)")
    b = sub.add_parser("build", help="build a set that comes from a wheel (chitchat-heldout)")
    b.add_argument("name", choices=["chitchat-heldout"])
    b.add_argument("--no-install", action="store_true", help="do not pip install the data wheel when missing")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        try:
            build_chitchat_heldout(install=not args.no_install)
        except EvalError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    for name in NAMES:
        try:
            print(set_info(name, named_set_path(name, target=args.target, data=args.data, build=False)).text())
        except EvalError as e:
            print(f"{name}: missing. {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
