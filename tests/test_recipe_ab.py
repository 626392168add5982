"""bench/recipe_ab.py: arms on one recipe data preparation; an arm stopped by its time budget continues exactly in
the next job, and both arms are evaluated in one evaluation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dflash_lab.train import stopping
from dflash_lab.workflows import ab_report

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[1]
DATA = dict(model="tiny", draft_vocab_size=None, n_train=8, heldout=4, regen_batch_size=16, regen_max_new_tokens=16,
            n_self=24, self_heldout=3, self_heldout_fraction=0.3, seq_len=96, batch_size=2, num_anchors=2,
            block_size=8, num_draft_layers=1, real_tau_every=0, steps=8, threads=1)


def _ab():
    spec = importlib.util.spec_from_file_location("recipe_ab", ROOT / "bench" / "recipe_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sets(d: dict) -> list[str]:
    return [a for k, v in d.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def test_an_arm_stopped_by_its_budget_continues_exactly_and_arms_are_evaluated_together(tmp_path, monkeypatch):
    ab, work = _ab(), tmp_path / "ab"
    ab.main(["data", "--work", str(work), "--device", "cpu", *_sets(DATA)])
    state = json.loads((work / "ab.json").read_text())
    assert Path(state["train_data"]).is_file() and set(state["sets"]) == {"chitchat-heldout", "self-heldout",
                                                                          "general"}
    # tokenized once before the arms, for each block size asked: an arm then reads its entry (no entry of its own)
    tokenized = tmp_path / "tokenized"
    monkeypatch.setenv("DFLASH_LAB_TOKENIZED", str(tokenized))
    ab.main(["tokenize", "--work", str(work), "--tokenize-block-size", "8", "--tokenize-block-size", "4"])
    assert len(list(tokenized.glob("*.pt"))) == 2
    ab.main(["train", "--work", str(work), "--arm", "straight", *_sets({"steps": 8})])
    assert len(list(tokenized.glob("*.pt"))) == 2
    clock = {"t": 0.0}

    def tick():  # 10 s a read: a 45 s budget runs out after a few steps, the same ones every time
        clock["t"] += 10.0
        return clock["t"]

    monkeypatch.setattr(stopping, "now", tick)
    ab.main(["train", "--work", str(work), "--arm", "split", *_sets({"steps": 8, "time_budget_s": 45})])
    first = json.loads((work / "ab.json").read_text())["arms"]["split"]
    assert first["status"] == "stopped (resumable)" and 0 < first["steps"] < 8
    monkeypatch.setattr(stopping, "now", lambda: 0.0)
    ab.main(["train", "--work", str(work), "--arm", "split", *_sets({"steps": 8, "time_budget_s": 1e6})])
    arms = json.loads((work / "ab.json").read_text())["arms"]
    assert arms["split"]["status"] == "finished" and arms["split"]["steps"] == 8
    assert arms["split"]["run_dir"] == first["run_dir"]  # the same run, continued
    loss = {a: [r["loss"] for r in arms[a]["curve"] if "loss" in r] for a in ("straight", "split")}
    assert len(loss["straight"]) == 8 and loss["split"] == loss["straight"]
    with pytest.raises(SystemExit, match="already finished"):
        ab.main(["train", "--work", str(work), "--arm", "split", *_sets({"steps": 8})])

    out = tmp_path / "results.json"
    ab.main(["eval", "--work", str(work), "--device", "cpu", "--prompts", "2", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["arm"], r["prompt_set"]) for r in rows if r["decoder"] != "target only"} == \
        {(a, s) for a in ("straight", "split") for s in ("chitchat-heldout", "self-heldout", "general")}
    foreign = tmp_path / "recipe-results.json"  # e.g. the recipe's own results.json in its work dir
    foreign.write_text(json.dumps({"phases": {}}))
    with pytest.raises(SystemExit, match="holds no evaluation rows.*Fix: name another file"):
        ab.main(["eval", "--work", str(work), "--device", "cpu", "--prompts", "2", "--out", str(foreign)])
    tau = {(r["arm"], r["prompt_set"]): r["tau"] for r in rows}
    assert all(tau[("split", s)] == tau[("straight", s)] for s in ("chitchat-heldout", "general"))  # equal drafters
    _a_later_arm_joins_the_file(ab, work, out, tmp_path)
    rows = json.loads(out.read_text())["rows"]

    sampled = ["eval", "--work", str(work), "--device", "cpu", "--prompts", "2", "--out", str(out), "--arms",
               "straight", "--temperature", "1", "--draft-sampling", "argmax", "--draft-sampling", "coupled"]
    ab.main(sampled)
    rows = json.loads(out.read_text())["rows"]
    hot = {(r["draft_sampling"], r["decoder"], r["prompt_set"]) for r in rows if r["temperature"] == 1.0}
    assert hot == {(m, d, "chitchat-heldout") for m in ("argmax", "coupled") for d in ("trained", "target only")}
    ab.main(sampled)  # a rerun (the next job) skips what the file holds
    assert len(json.loads(out.read_text())["rows"]) == len(rows)
    split_t1 = tmp_path / "t1-split.json"  # a second process's file: one arm, T=1, no baseline
    ab.main(["eval", "--work", str(work), "--device", "cpu", "--prompts", "2", "--out", str(split_t1), "--arms",
             "split", "--temperature", "1", "--draft-sampling", "coupled", "--no-baseline"])
    assert {r["decoder"] for r in json.loads(split_t1.read_text())["rows"]} == {"trained"}
    merged = tmp_path / "merged.json"
    ab.main(["merge", str(out), str(split_t1), "--out", str(merged)])
    m = json.loads(merged.read_text())
    assert len(m["rows"]) == len(rows) + 1 and m["merged_from"] == [out.name, split_t1.name]
    # each drafter row carries the target-alone speed of its own file's evaluation (split_t1 decoded none)
    alone = {(r["prompt_set"], r["temperature"], r["draft_sampling"]): r["tokens_per_s"] for r in rows
             if r["decoder"] == "target only"}
    for r in m["rows"]:
        if r["decoder"] != "target only":
            want = None if r["arm"] == "split" and r["temperature"] == 1.0 else \
                alone[(r["prompt_set"], r["temperature"], r["draft_sampling"])]
            assert r["target_tokens_per_s"] == want
    assert set(m["arms"]) == {"straight", "split"}
    with pytest.raises(SystemExit, match="both hold.*Fix: leave one of them out"):
        ab.main(["merge", str(out), str(out), "--out", str(merged)])
    report = {"results": {"rows": rows}}
    labels = {r["arm"] for r in ab_report.final_rows(report) if r["temperature"] == 1.0}
    assert labels == {"straight", "straight (coupled drafts)"}
    _collect_sessions(ab, work, out, split_t1, tmp_path)


def _a_later_arm_joins_the_file(ab, work: Path, out: Path, tmp_path: Path) -> None:
    """An arm trained after the evaluation is evaluated alone into the same file: the arms measured are not decoded
    again, the target alone neither, and its speedup is its tokens/s over that earlier pass's on the same prompts.
    The arm is then taken out again, so the rest of the test sees the two arms it trained."""
    before = json.loads(out.read_text())["rows"]
    saved = (work / "ab.json").read_text()
    ab.main(["train", "--work", str(work), "--arm", "late", *_sets({"steps": 8})])
    ab.main(["eval", "--work", str(work), "--device", "cpu", "--prompts", "2", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rows[:len(before)] == before  # nothing measured again
    late = rows[len(before):]
    assert {(r["arm"], r["prompt_set"]) for r in late} == \
        {("late", s) for s in ("chitchat-heldout", "self-heldout", "general")}
    base = {r["prompt_set"]: r["tokens_per_s"] for r in before if r["decoder"] == "target only"}
    for r in late:
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / base[r["prompt_set"]], rel=1e-12)
        assert r["speedup_against"] == "an earlier evaluation's target alone"
    ab.main(["eval", "--work", str(work), "--device", "cpu", "--prompts", "2", "--out", str(out)])
    assert len(json.loads(out.read_text())["rows"]) == len(rows)  # a rerun skips what the file holds
    (work / "ab.json").write_text(saved)
    out.write_text(json.dumps({**json.loads(out.read_text()), "rows": before}))


def _collect_sessions(ab, work: Path, t0: Path, t1: Path, tmp_path: Path) -> None:
    """Two GPU sessions' results.tgz on one data pack, one arm each, joined into the folder ab_report reads; other
    data or an arm in both is refused."""
    import tarfile

    state = json.loads((work / "ab.json").read_text())
    assert set(state["data_sha256"]) == {"train_data", "heldout_data", "chitchat-heldout", "self-heldout"}

    def session(name: str, arm: str, results: list[Path], **change) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "ab.json").write_text(json.dumps({**state, "arms": {arm: state["arms"][arm]}, **change}))
        for i, f in enumerate(results):  # the rows of this session's arm
            res = json.loads(f.read_text())
            res["rows"] = [r for r in res["rows"] if r["arm"] == arm]
            (d / f"ab-results-{i}.json").write_text(json.dumps(res))
        with tarfile.open(d / "results.tgz", "w:gz") as tgz:
            for f in sorted(d.glob("*.json")):
                tgz.add(f, arcname=f.name)
            run = Path(state["arms"][arm]["run_dir"])
            for f in ("metrics.jsonl", "summary.json", "config.json"):
                tgz.add(run / f, arcname=f"runs/{run.name}/{f}")
        return d / "results.tgz"

    first = session("s1", "straight", [t0])
    second = session("s2", "split", [t1])
    ab.main(["collect", str(first), str(second), "--out", str(tmp_path / "joined" / "eval")])
    joined = ab_report.load_ab(tmp_path / "joined")
    assert set(joined["ab"]["arms"]) == {"straight", "split"} and set(joined["metrics"]) == {"straight", "split"}
    assert joined["ab"]["collected_from"] == ["results.tgz", "results.tgz"]
    assert {r["arm"] for r in ab_report.final_rows(joined)} == {"straight", "straight (coupled drafts)",
                                                               "split (coupled drafts)"}
    other = session("s3", "split", [t1], data_sha256={**state["data_sha256"], "train_data": "0" * 64})
    with pytest.raises(SystemExit, match="trained on other data.*Fix: collect sessions of one data pack"):
        ab.main(["collect", str(first), str(other), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="arm 'straight' is in.*Fix: leave one of them out"):
        ab.main(["collect", str(first), str(first), "--out", str(tmp_path / "y")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()  # refused: nothing written


def test_arms_finishing_side_by_side_each_keep_their_entry(tmp_path):
    """Two arms trained side by side on one GPU finish in any order: every update re-reads what the other wrote."""
    import threading
    import time

    ab, work = _ab(), tmp_path / "ab"
    work.mkdir()
    with ab._updating(work) as state:
        state["arms"] = {}

    def finish(name):
        with ab._updating(work) as state:
            time.sleep(0.02)  # without the lock, every thread would read the empty state and one entry would win
            state["arms"][name] = {"status": "finished"}

    threads = [threading.Thread(target=finish, args=(f"arm{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads((work / "ab.json").read_text())["arms"]) == [f"arm{i}" for i in range(6)]


def test_a_preset_arm_trains_with_the_presets_settings_only_on_the_data_the_preset_makes():
    """--preset long: the arm's TrainConfig takes the long preset's training settings (5 layers, batch 64, 7,500
    steps, compiled) over the A/B's recipe; data made with other data settings than the preset's is refused, naming
    the setting, so no arm trains on another pool than its comparison's."""
    from dflash_lab.workflows.recipe_config import PRESETS, RecipeConfig

    ab = _ab()
    state = {"recipe": RecipeConfig(n_self=PRESETS["long"]["n_self"]).to_dict()}
    cfg = ab._arm_recipe(state, "long")
    tc = cfg.train_config(Path("/d/train.jsonl"), Path("/d/heldout.jsonl"))
    assert (tc.num_draft_layers, tc.batch_size, tc.steps, tc.compile_drafter, tc.lr) == (5, 64, 7500, True, 8.5e-4)
    assert ab._arm_recipe(state, None).num_draft_layers == RecipeConfig().num_draft_layers == 3
    state["recipe"]["n_self"] = 30_000
    with pytest.raises(SystemExit, match="n_self.*30000.*60000"):
        ab._arm_recipe(state, "long")
    with pytest.raises(SystemExit, match="unknown; Fix: use one of"):
        ab._arm_recipe(state, "longest")


def _recipe_call(folder: Path, *, train: dict | None, rows: list[dict] | None = None, metrics: bool = False) -> Path:
    """One call folder of a recipe run, as bench/recipe_smollm2.sh brings it back."""
    folder.mkdir(parents=True)
    phases = {"train": train} if train else {}
    if rows:
        phases["evaluate"] = {"rows": rows}
    (folder / "results.json").write_text(json.dumps({"phases": phases}))
    if metrics:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
            {"step": 1, "time": 100.0, "step_time_s": 2.0, "loss": 9.0},
            {"step": 2, "time": 160.0, "step_time_s": 1.0, "loss": 8.0, "val_chain_tau": 2.5})))
        (folder / "config.json").write_text(json.dumps({"block_size": 16, "num_draft_layers": 5}))
    return folder


def test_a_recipe_run_is_adopted_as_an_arm_with_its_training_wall_and_its_own_rows(tmp_path):
    """adopt: the recipe's train seconds summed over its calls (a reused phase not counted twice), its drafter rows
    under the arm's name with the speedups its own evaluation measured, its curve files in the folder's tarball;
    a run on other held-out prompts (sha256) or an arm name already taken is refused and changes nothing."""
    import tarfile

    ab, out = _ab(), tmp_path / "eval"
    out.mkdir()
    (out / "ab.json").write_text(json.dumps({"arms": {"dspark-long": {"run_dir": "/w/runs/dspark-long-1"}}}))
    theirs = {"arm": "dspark-long", "decoder": "trained", "prompt_set": "general", "temperature": 0.0, "tau": 2.6,
              "prompts": 64, "tokens_per_s": 600.0, "speedup": 2.0, "steps": 6600, "prompt_set_sha256": "aa"}
    (out / "results.json").write_text(json.dumps({"rows": [theirs]}))
    with tarfile.open(out / "arm-metrics.tgz", "w:gz"):
        pass
    run = "/tmp/recipe-run/runs/20261206T085924Z-recipe-0200f5"
    rows = [{"decoder": "trained", "prompt_set": "general", "temperature": 0.0, "tau": 2.43, "tau_low": 2.29,
             "tau_high": 2.58, "prompts": 64, "tokens_per_s": 530.4, "speedup": 1.75, "prompt_set_sha256": "aa"},
            {"decoder": "target only", "prompt_set": "general", "temperature": 0.0, "tau": 1.0, "prompts": 64,
             "tokens_per_s": 302.9, "speedup": 1.0, "prompt_set_sha256": "aa"}]
    stopped = {"run_dir": run, "status": "stopped"}
    calls = [_recipe_call(tmp_path / "c1", train={**stopped, "seconds": 98.2, "steps": 475}),
             _recipe_call(tmp_path / "c2", train={**stopped, "seconds": 490.1, "steps": 6908}),
             _recipe_call(tmp_path / "c3", train={"seconds": 99.4, "run_dir": run, "status": "finished", "steps": 7500,
                                                  "loss_last": 1.5}, rows=rows, metrics=True)]
    ab.main(["adopt", *map(str, calls), "--arm", "dflash-long", "--out", str(out)])
    state = json.loads((out / "ab.json").read_text())["arms"]["dflash-long"]
    assert (state["wall_s"], state["steps"], state["status"]) == (687.7, 7500, "finished")
    got = [r for r in json.loads((out / "results.json").read_text())["rows"] if r["arm"] == "dflash-long"]
    # its own speedup and target-alone speed, and no second target-alone row
    assert [(r["tau"], r["speedup"], r["steps"], r["target_tokens_per_s"]) for r in got] == [(2.43, 1.75, 7500,
                                                                                              302.9)]
    with tarfile.open(out / "arm-metrics.tgz") as t:
        assert sorted(t.getnames()) == [f"runs/{Path(run).name}/config.json", f"runs/{Path(run).name}/metrics.jsonl"]
    before = [(out / f).read_bytes() for f in ("ab.json", "results.json", "arm-metrics.tgz")]
    with pytest.raises(SystemExit, match="already in"):
        ab.main(["adopt", *map(str, calls), "--arm", "dflash-long", "--out", str(out)])
    rows[0]["prompt_set_sha256"] = "bb"
    other = _recipe_call(tmp_path / "c4", train={"seconds": 5.0, "run_dir": run, "status": "finished", "steps": 9},
                         rows=rows, metrics=True)
    with pytest.raises(SystemExit, match=r"prompt sets \['general'\] are not the A/B's"):
        ab.main(["adopt", str(other), "--arm", "other", "--out", str(out)])
    assert [(out / f).read_bytes() for f in ("ab.json", "results.json", "arm-metrics.tgz")] == before
