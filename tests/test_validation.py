"""Validation on held-out data and real tau during training: anchor enumeration, the replay of
speculative decoding on a sequence (== real SpeculativeDecoder tau on the target's own output), the Trainer hook's
keys in metrics.jsonl / history, validation leaving training untouched, the tau_gap warning, config checks."""

import json

import pytest
import torch

from dflash_lab import TrainConfig, Trainer
from dflash_lab.config import ConfigError
from dflash_lab.evaluation.speculative import SpeculativeDecoder
from dflash_lab.target.features import FeatureExtractor, embedding_of, lm_head_weight
from dflash_lab.tiny import tiny_heldout_path
from dflash_lab.train.validation import (acceptance_lengths, all_anchors, chain_tau, due, heldout_source,
                                   real_tau_interval, tau_gap, tau_gap_event, teacher_forced, val_interval,
                                   validate_when_due)

TINY = dict(target="tiny", data="tiny", block_size=8, num_anchors=24, seq_len=192, batch_size=8,
            num_draft_layers=2, lr=3e-3, seed=0, log_every=5)
QUIET = dict(log=lambda *a: None)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


def test_all_anchors_are_every_training_anchor_position_in_order():
    m = torch.zeros(2, 10, dtype=torch.bool)
    m[0, 2:6] = True  # candidates 2, 3, 4 (p and p+1 supervised)
    m[1, 0:2] = True
    m[1, 7:10] = True  # candidates 0, 7, 8
    (anchors, valid), = all_anchors(m)
    assert anchors.shape[1] == 64
    assert anchors[0, valid[0]].tolist() == [2, 3, 4]
    assert anchors[1, valid[1]].tolist() == [0, 7, 8]
    long = torch.ones(1, 150, dtype=torch.bool)
    passes = all_anchors(long)
    got = torch.cat([a[v] for a, v in passes]).tolist()
    assert len(passes) == 3 and got == list(range(149))


def test_chain_replays_decoding_by_jumping_the_acceptance_length():
    # one answer at positions 10..19 (anchors 10..18); L: 10 -> 3 -> 13 -> 1 -> 14 -> 4 -> 18 -> 2 (leaves the run)
    anchors = torch.arange(10, 19)[None]
    L = torch.tensor([[3, 9, 9, 1, 4, 9, 9, 9, 2]])
    tau, tokens, iters = chain_tau(L, anchors, torch.ones_like(anchors, dtype=torch.bool))
    assert (tokens, iters) == (3 + 1 + 4 + 2, 4) and tau == pytest.approx(2.5)
    # the per-anchor mean (the training metric's estimator) says 6.1: positions inside long runs count as often as
    # the positions where serving actually starts its blocks
    assert L.float().mean() == pytest.approx(55 / 9)
    c = torch.tensor([[[True, True, False], [False, True, True]]])
    assert acceptance_lengths(c, torch.ones_like(c)).tolist() == [[3, 1]]


def test_simulated_tau_multiplies_per_slot_accuracies():
    """1 + sum_k prod_{j<=k} acc_j (the per-block mean of run lengths overstated real tau 1.57x)."""
    from dflash_lab.drafter.step import block_stats

    c = torch.tensor([[[True, True, True], [True, True, False], [True, False, True], [False, True, True]]])
    h = torch.ones_like(c)
    h[0, 3, 2] = False  # slot 3 of the last block has no label: it leaves slot 3's denominator
    st = block_stats(c, h)
    assert st["slot_acc"].tolist() == pytest.approx([0.75, 0.75, 2 / 3])
    assert float(st["sim_tau"]) == pytest.approx(1 + 0.75 + 0.75 ** 2 + 0.75 ** 2 * 2 / 3)
    assert float(st["acc"]) == pytest.approx(8 / 11)
    assert float(block_stats(c & False, h)["sim_tau"]) == 1.0


@pytest.fixture(scope="module")
def trained():
    """A tiny-target trainer after 40 steps (enough for tau > 1), with validation and real tau off."""
    tr = Trainer(TrainConfig(**TINY, steps=40, val_every=0, real_tau_every=0), write_run_dir=False, **QUIET)
    tr.step(40)
    yield tr
    tr.close()


def test_replay_on_the_targets_own_output_matches_real_speculative_tau(trained):
    """The teacher-forced computation (full-sequence features, ground-truth anchor) and serving agree: replaying
    acceptance on the target's own greedy continuation gives the SpeculativeDecoder's tau."""
    tok, target, drafter = trained.tokenizer, trained.target, trained.drafter
    dcfg = trained.drafter_config
    dec = SpeculativeDecoder(target, drafter, eos_token_id=tok.eos_token_id)
    ext = FeatureExtractor(target, dcfg.target_layer_ids, fused_norms=False)
    from dflash_lab.evaluation.evaluate import load_prompts

    real_acc, tokens, iters = [], 0, 0
    for prompt in load_prompts(tiny_heldout_path(), tok, n_prompts=4):
        g = dec.generate(prompt, max_new_tokens=48, temperature=0.0)
        real_acc += g.accepted
        seq = torch.tensor([prompt + g.output_ids])
        m = torch.zeros_like(seq, dtype=torch.bool)
        m[0, len(prompt):] = True
        tf = teacher_forced(drafter, ext, embedding_of(target), lm_head_weight(target), seq, m,
                            block_size=dcfg.block_size, mask_token_id=dcfg.mask_token_id, gamma=4.0)
        _, t, k = chain_tau(acceptance_lengths(tf["correct"], tf["has_loss"]), tf["anchors"], tf["valid"])
        tokens, iters = tokens + t, iters + k
    real = sum(real_acc) / len(real_acc) + 1
    assert real > 1.05  # the drafter accepts something (40 steps: ~1.1), so the comparison means something
    # the last block of each prompt is cut by max_new_tokens in serving and by the sequence end in the replay
    assert tokens / iters == pytest.approx(real, abs=0.03)


def test_trainer_logs_validation_and_real_tau_without_disturbing_training(tmp_path):
    common = dict(TINY, steps=4, log_every=1, runs_dir=str(tmp_path), devices=("cpu", "cpu"))
    on = Trainer(TrainConfig(**common, val_every=2, real_tau_every=4, val_sequences=3, real_tau_prompts=2,
                             real_tau_new_tokens=12), **QUIET)
    off = Trainer(TrainConfig(**common, val_every=0, real_tau_every=0), write_run_dir=False, **QUIET)
    try:
        on.train()
        off.step(4)
        # same seed, same batches: the losses are identical step by step, so validation left the replicas alone
        assert [r["loss"] for r in on.history] == [r["loss"] for r in off.history]
        rows = [json.loads(line) for line in open(on.run_dir / "metrics.jsonl")]
    finally:
        on.close()
        off.close()
    by_step = {r["step"]: r for r in rows}
    assert sorted(s for s, r in by_step.items() if "val_acc" in r) == [2, 4]
    assert sorted(s for s, r in by_step.items() if "real_tau" in r) == [4]
    r = by_step[4]
    assert 0.0 <= r["val_acc"] <= 1.0 and len(r["val_slot_acc"]) == 7
    assert 1.0 <= r["val_sim_tau"] <= 8.0 and 1.0 <= r["val_chain_tau"] <= 8.0
    assert 1.0 <= r["real_tau"] <= 8.0 and r["real_tau_prompts"] == 2
    assert on.history[-1]["real_tau"] == r["real_tau"]  # the dashboard's ring buffer has them too


def test_real_tau_carries_its_interval_and_the_best_step_is_kept_by_name(tmp_path):
    """real_tau comes with its 95% bootstrap interval, prompt count and the prompts' sha256; the best step's
    weights survive checkpoint rotation in checkpoints/best/ (best.json says which step), and evaluate / export
    take them with --checkpoint best while a run dir alone still means its newest weights."""
    from safetensors import safe_open

    from dflash_lab.data.heldout_overlap import TrainingPrompts
    from dflash_lab.evaluation import export
    from dflash_lab.evaluation.prompt_sets import prompts_sha256
    from dflash_lab.evaluation.prompts import read_prompt_messages

    cfg = TrainConfig(**TINY, steps=6, real_tau_every=2, val_every=0, real_tau_prompts=5, real_tau_new_tokens=12,
                      checkpoint_every=2, keep_checkpoints=1, runs_dir=str(tmp_path))
    t = Trainer(cfg, **QUIET)
    try:
        t.train()
        t.save_drafter()
    finally:
        t.close()
    rows = [r for r in map(json.loads, open(t.run_dir / "metrics.jsonl")) if "real_tau" in r]
    assert [r["step"] for r in rows] == [2, 4, 6]
    for r in rows:
        assert r["real_tau_low"] <= r["real_tau"] <= r["real_tau_high"] and r["real_tau_prompts"] == 5
        # the held-out prompts the run does not train on (15 of the tiny target's 100 occur in its training data)
        trained = TrainingPrompts.read("tiny")
        assert r["real_tau_sha256"] == prompts_sha256(read_prompt_messages(tiny_heldout_path(), 5, train=trained))
    best = max(rows, key=lambda r: (r["real_tau"], -r["step"]))  # the earliest of equal taus
    marker = json.loads((t.run_dir / "best.json").read_text())
    assert marker["step"] == best["step"] and marker["real_tau"] == best["real_tau"]
    assert (marker["real_tau_low"], marker["real_tau_high"]) == (best["real_tau_low"], best["real_tau_high"])
    weights = t.run_dir / "checkpoints" / "best" / "drafter.safetensors"
    with safe_open(str(weights), "pt") as f:
        assert int(f.metadata()["step"]) == best["step"]
    assert [p.name for p in (t.run_dir / "checkpoints").glob("step-*")] == ["step-0000006"]  # rotated; best stays
    assert export.resolve_drafter(t.run_dir, "best").step == best["step"]
    assert export.resolve_drafter(t.run_dir).step == 6 and export.resolve_drafter(t.run_dir, "6").step == 6
    with pytest.raises(export.DrafterNotFoundError, match=r"no checkpoint of step 3; it has steps \[6\]"):
        export.resolve_drafter(t.run_dir, "step-3")
    out = export.export_drafter(t.run_dir, tmp_path / "served", checkpoint="best", log=lambda *a: None)
    said = json.loads((out / "config.json").read_text())["dflash_lab"]
    assert said["step"] == best["step"] and said["best"]["real_tau"] == best["real_tau"]


def test_tau_gap_rule_and_event():
    assert tau_gap(13.2, 2.7) and tau_gap(5.6, 3.6)
    assert not tau_gap(1.4, 1.0)  # ratio 1.4 < 1.5
    assert not tau_gap(2.4, 1.5)  # ratio 1.6 but only 0.9 apart
    hist = [{"step": s, "sim_tau": 12.0 + (s % 2)} for s in range(1, 10)]
    ev = tau_gap_event({"step": 10, "sim_tau": 14.0, "real_tau": 2.0, "real_tau_prompts": 8, "val_sim_tau": 3.0},
                       hist)
    assert ev["step"] == 10 and ev["real_tau"] == 2.0 and ev["val_sim_tau"] == 3.0
    assert ev["sim_tau"] == pytest.approx((4 * 12 + 5 * 13 + 14) / 10)  # mean of the last 10 steps
    assert tau_gap_event({"step": 10, "sim_tau": 3.0, "real_tau": 2.9}, [{"step": 9, "sim_tau": 3.2}]) is None
    assert tau_gap_event({"step": 10, "sim_tau": 9.0}, hist) is None  # no real tau at this step


def test_tau_gap_warning_reaches_events_and_progress(tmp_path):
    """The Trainer's hook with a REAL measurement (a drafter one step in: real tau ~1) against a training sim_tau
    set high by hand, as a memorising drafter shows it: the event and the WARNING line appear."""
    lines = []
    tr = Trainer(TrainConfig(**TINY, steps=2, runs_dir=str(tmp_path), val_every=0, real_tau_every=2,
                             real_tau_prompts=1, real_tau_new_tokens=8), log=lines.append)
    try:
        tr.step(1)
        record = {**tr.last_metrics, "step": 2, "sim_tau": 7.5}  # what a memorising drafter shows in training
        tr.step_count = 2
        validate_when_due(tr, record)
    finally:
        tr.close()
    assert record["real_tau"] < 2.0  # one step of training: real acceptance is ~1
    events = [json.loads(line) for line in open(tr.run_dir / "events.jsonl")]
    gap = [e for e in events if e["event"] == "tau_gap"]
    assert len(gap) == 1 and gap[0]["real_tau"] == pytest.approx(record["real_tau"], abs=1e-4)
    assert any(line.startswith("WARNING: tau gap at step 2") for line in lines)


def test_heldout_source_and_intervals(tmp_path):
    assert heldout_source("tiny", None) == (tiny_heldout_path(), None)
    assert heldout_source("tiny", "") is None
    train = tmp_path / "train.jsonl"
    train.write_text("")
    assert heldout_source(str(train), None) is None
    (tmp_path / "heldout.jsonl").write_text("")
    assert heldout_source(str(train), None) == (tmp_path / "heldout.jsonl", None)
    dd = tmp_path / "dd"
    dd.mkdir()
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert heldout_source(str(dd), None) == (dd, "test")
    with pytest.raises(FileNotFoundError, match="heldout_data"):
        heldout_source("tiny", str(tmp_path / "missing.jsonl"))
    assert val_interval(TrainConfig(steps=2000)) == 200 and val_interval(TrainConfig(steps=20)) == 50
    assert real_tau_interval(TrainConfig(steps=2000)) == 0  # tiny: off by default
    assert [s for s in range(1, 131) if due(s, 50, 130)] == [50, 100, 130]
    assert not any(due(s, 50, 20) for s in range(1, 21))  # a short run measures nothing
    assert real_tau_interval(TrainConfig(target="some/model", steps=2000)) == 200
    assert real_tau_interval(TrainConfig(target="some/model", steps=300)) == 100


@pytest.mark.parametrize("field,value", [("val_every", -1), ("real_tau_every", 1.5), ("val_sequences", 0),
                                         ("real_tau_prompts", 0), ("real_tau_new_tokens", True)])
def test_config_rejects_bad_validation_settings(field, value):
    with pytest.raises(ConfigError, match=f"TrainConfig.{field}="):
        TrainConfig(**{field: value})


@pytest.mark.gpu
def test_validation_on_gpu_leaves_the_captured_training_step_alone(tmp_path):
    """On a GPU the step is a replayed CUDA graph: measuring between steps (copy of worker 0's drafter, own feature
    extractor, no_grad) must not change what the next steps compute."""
    common = dict(TINY, steps=6, log_every=1, devices=("cuda:0",), cuda_graphs=True)
    on = Trainer(TrainConfig(**common, val_every=2, real_tau_every=3, val_sequences=4, real_tau_prompts=2,
                             real_tau_new_tokens=16, runs_dir=str(tmp_path)), **QUIET)
    off = Trainer(TrainConfig(**common, val_every=0, real_tau_every=0), write_run_dir=False, **QUIET)
    try:
        on.train()
        off.step(6)
        for a, b in zip(on.history, off.history):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a["step"], a["loss"], b["loss"])
        measured = {r["step"]: r for r in on.history if "val_acc" in r or "real_tau" in r}
        assert sorted(measured) == [2, 3, 4, 6] and measured[6]["real_tau"] >= 1.0
    finally:
        on.close()
        off.close()


def test_validation_set_skips_heldout_conversations_too_short_to_score(tmp_path):
    """Held-out first turns are often greetings with a few words of answer: the validation set is the first
    val_sequences conversations that hold two blocks of answer, not the first val_sequences as they come."""
    from dflash_lab.target.load import load_tokenizer
    from dflash_lab.train.validation import load_validation_set

    rows = [json.loads(line) for line in tiny_heldout_path().read_text().splitlines() if line.strip()]
    short = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 20
    held = tmp_path / "heldout.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in short + rows[:30]))
    cfg = TrainConfig(**{**TINY, "heldout_data": str(held), "val_sequences": 6})
    vs = load_validation_set(load_tokenizer("tiny"), cfg, block_size=cfg.block_size)
    assert vs.input_ids.shape == (6, cfg.seq_len)
    assert int(vs.loss_mask.sum(1).min()) >= 2 * cfg.block_size  # every kept sequence can be scored


def test_validation_takes_distinct_held_out_conversations_spread_after_tokenizing(tmp_path):
    """A regenerated held-out file lists the shortest answers first and repeats itself: the sequences taken are
    distinct, none is a training conversation, they are spread over the usable ones, and each is named."""
    from dflash_lab.data.heldout_overlap import TrainingPrompts
    from dflash_lab.target.load import load_tokenizer
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.validation import load_validation_set

    held = [json.loads(line) for line in tiny_heldout_path().read_text().splitlines() if line.strip()]
    trained = [json.loads(line) for line in tiny_data_path().read_text().splitlines()[:4]]
    train = TrainingPrompts.of([r["messages"] for r in trained], "tiny")  # the run trains on these 4
    hello = held[0]["messages"]
    again = [{"messages": [dict(m, content=m["content"].upper()) if m["role"] == "user" else m for m in hello]}]
    rows = [{"messages": hello}] * 9 + again + trained + held[40:70]  # 9 + 1 case-only copies, 4 trained, 30 others
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainConfig(**{**TINY, "heldout_data": str(path), "val_sequences": 8, "real_tau_prompts": 40})
    vs = load_validation_set(load_tokenizer("tiny"), cfg, block_size=cfg.block_size, train=train)
    assert vs.input_ids.shape == (8, cfg.seq_len)
    assert len({tuple(r.tolist()) for r in vs.input_ids}) == 8  # no sequence twice (before: the first 8 were one)
    assert vs.counts == {"conversations": 44, "duplicates": 9, "in_training": 4, "train_source": "tiny",
                         "usable": 31, "prompts_in_training": 4}
    # spread over the 31 (the first kept "Hello" copy, lines 15-44): usable index i * 31 // 8
    assert vs.taken == [f"heldout.jsonl:{k}" for k in (1, 17, 21, 25, 29, 33, 37, 41)]
    assert "9 duplicates and 4 also in the training data (tiny), left out" in vs.choice_text()
    assert "31 long enough to score, 8 spread over them: heldout.jsonl:1, heldout.jsonl:17" in vs.choice_text()
    assert vs.choice_text().endswith("heldout.jsonl:21, ... (5 more)")  # three named: the line stays short
    assert len(vs.prompts) == 31  # the real-tau prompts: distinct, the trained ones left out


def test_a_run_shorter_than_one_validation_interval_says_validation_is_off():
    logged = []
    Trainer(TrainConfig(**TINY, steps=20), write_run_dir=False, log=logged.append).step(1)  # auto interval: 50
    (line,) = [m for m in logged if m.startswith("validation: ")]
    assert "off for this run: its 20 steps are fewer than one validation interval (50 steps)" in line
    assert len(line) < 400  # the held-out conversations are named by their first three
