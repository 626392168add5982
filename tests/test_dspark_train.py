"""A DSpark drafter through the whole training seam on the tiny target: engine, metrics rows, checkpoints, exact
resume, distillation's soft targets, Muon's roles, the captured step's function against the plain step, and (GPU)
CUDA-graph replay against eager."""

from __future__ import annotations

import pytest
import torch

from dflash_lab import TrainConfig
from dflash_lab.drafter.dspark import METRICS
from dflash_lab.runs import checkpoint, rundir
from dflash_lab.train.trainer import Trainer

STEPS = 12
SMALL = dict(target="tiny", steps=STEPS, seq_len=64, batch_size=2, block_size=8, num_anchors=4, num_draft_layers=2,
             lr=3e-3, log_every=1, checkpoint_every=4, keep_checkpoints=3, seed=0, drafter_variant="dspark",
             markov_rank=8, val_every=6, real_tau_every=0)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    from dflash_lab.tiny import ensure_tiny_target, tiny_data_path

    ensure_tiny_target()
    path = tmp_path_factory.mktemp("data") / "train200.jsonl"
    path.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:200]))
    return path


def _config(tmp_path, data_file, **kw):
    from dflash_lab.tiny import tiny_heldout_path

    return TrainConfig(**{**SMALL, "data": str(data_file), "runs_dir": str(tmp_path / "runs"),
                          "heldout_data": str(tiny_heldout_path()), **kw})


def _rows(run_dir):
    return {r["step"]: r for r in rundir.read_jsonl(run_dir / rundir.METRICS_FILE) if "loss" in r}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_file):
    t = Trainer(_config(tmp_path_factory.mktemp("straight"), data_file), log=lambda *a: None)
    t.train()
    weights = {k: v.clone() for k, v in t.drafter.state_dict().items()}
    t.close()
    return t.run_dir, _rows(t.run_dir), weights


def test_a_dspark_run_learns_and_logs_its_heads_terms(straight):
    run_dir, rows, _ = straight
    assert sorted(rows) == list(range(1, STEPS + 1))
    first, last = (sum(rows[s]["loss"] for s in steps) / 3 for steps in ((1, 2, 3), (10, 11, 12)))
    assert last < 0.9 * first, (first, last)
    for r in rows.values():
        assert set(METRICS) <= set(r)
        # the loss is DeepSpec's weighted sum of the logged terms
        assert r["loss"] == pytest.approx(0.1 * r["markov_ce"] + 0.9 * r["markov_l1"] + r["confidence_bce"],
                                          rel=1e-5)
        assert 0 <= r["markov_l1"] <= 2 and 0 <= r["confidence_err"] <= 1 and 0 <= r["confidence_acc"] <= 1
    assert rows[STEPS]["confidence_bce"] < rows[1]["confidence_bce"]
    # held-out validation scores the drafter as training does: accuracy of the Markov-corrected logits
    assert all(0 < rows[s]["val_acc"] < 1 and len(rows[s]["val_slot_acc"]) == 7 for s in (6, 12))
    ckpt = checkpoint.load_checkpoint(run_dir)
    assert ckpt.state["drafter_config"]["drafter_variant"] == "dspark"
    assert {"heads.markov_head.markov_w1.weight", "heads.confidence_head.proj.weight"} <= set(ckpt.drafter)
    assert {"master/heads.markov_head.markov_w2.weight", "exp_avg/heads.confidence_head.proj.bias"} <= set(
        ckpt.optimizer)


def test_resume_of_a_dspark_run_equals_the_straight_run(data_file, straight):
    run_dir, rows, weights = straight
    more = Trainer(TrainConfig(resume_from=str(run_dir / "checkpoints" / "step-0000004")), log=lambda *a: None,
                   explicit={"resume_from"})
    assert more.config.drafter_variant == "dspark" and more.step_count == 4
    more.train()
    again = _rows(more.run_dir)
    for s in range(5, STEPS + 1):
        assert {k: again[s][k] for k in ("loss", *METRICS)} == {k: rows[s][k] for k in ("loss", *METRICS)}, s
    for k, v in more.drafter.state_dict().items():
        assert torch.equal(v, weights[k]), k
    more.close()


def test_distilled_dspark_takes_the_targets_top_k_as_q(tmp_path, data_file):
    """distill_weight=1: the L1 and the confidence target read the target's top-k, so the runs part from the one
    whose data token stands in for it, while the CE term (the data's token) starts equal. (At init the tiny
    target's head makes every draft distribution peaked elsewhere: the L1 is 2 either way at step 1.)"""
    runs = {}
    for w in (0.0, 1.0):
        t = Trainer(_config(tmp_path / str(w), data_file, steps=6, checkpoint_every=0, distill_weight=w,
                            distill_top_k=8), write_run_dir=False, log=lambda *a: None)
        t.step(6)
        runs[w] = t.history
        t.close()
    assert runs[0.0][0]["markov_ce"] == runs[1.0][0]["markov_ce"]
    assert abs(runs[0.0][-1]["markov_l1"] - runs[1.0][-1]["markov_l1"]) > 1e-3


def test_muon_leaves_the_heads_on_adamw():
    from dflash_lab.config import DrafterConfig
    from dflash_lab.drafter.model import DFlashDrafter
    from dflash_lab.train.muon import matrix_roles
    from tests.conftest import make_tiny_qwen3

    dc = DrafterConfig.from_target(make_tiny_qwen3().config, num_draft_layers=1, block_size=8, mask_token_id=255,
                                   drafter_variant="dspark", markov_rank=8)
    d = DFlashDrafter(dc)
    roles = dict(zip([n for n, p in d.named_parameters()], matrix_roles(d)))
    assert not any(v for n, v in roles.items() if n.startswith("heads."))
    assert roles["layers.0.self_attn.q_proj.weight"] and sum(roles.values()) == 8


def test_the_captured_step_function_equals_the_plain_step(tmp_path, data_file):
    """The worker's _forward_backward (what a CUDA graph captures: flat static inputs incl. prev_ids) gives the
    plain step.forward_backward's loss, terms and gradients."""
    from dflash_lab.drafter.loss_weights import loss_weighting_of
    from dflash_lab.drafter.step import DraftInputs, build_masks, context_positions, forward_backward

    t = Trainer(_config(tmp_path, data_file, checkpoint_every=0), write_run_dir=False, log=lambda *a: None)
    try:
        w, cfg = t.workers[0], t.config
        batch = t.sampler.batch(0)
        feats = w.target.features(batch.input_ids, batch.doc_ids)
        w.attach_grads()
        out = w.forward_backward(batch, feats, 0)
        graph_grad = w.flat_grad.clone()
        w.flat_grad.zero_()
        masks = build_masks(batch, seq_len=cfg.seq_len, backend="sdpa", layer_types=w.layer_types,
                            sliding_window=w.sliding_window)
        loss, correct, has_loss, terms = forward_backward(
            w.drafter, w.embed, w.head_weight, feats, DraftInputs(batch, masks, context_positions(batch, 64, "cpu")),
            cfg.loss_chunk_size, loss_weighting_of(cfg))
        assert torch.equal(out["loss"], loss) and torch.equal(out["terms"], terms)
        assert torch.equal(out["correct"], correct) and terms.shape == (len(METRICS),)
        assert torch.equal(w.flat_grad, graph_grad) and float(graph_grad.abs().sum()) > 0
    finally:
        t.close()


@pytest.mark.gpu
def test_dspark_graph_replay_equals_eager_on_the_gpu():
    """The captured step holds the heads' parameters and loss: replaying it gives eager's losses and terms."""
    from dflash_lab.drafter.blocks import build_block_batch, raw_weight_total, sample_anchors
    from tests.conftest import bench_tiny_engine

    def batch(step, b=2, seq_len=256, n=16, block=8):
        g = torch.Generator().manual_seed(100 + step)
        ids = torch.randint(0, 1023, (b, seq_len), generator=g)
        mask = torch.rand(b, seq_len, generator=g) > 0.2
        anchors, valid = sample_anchors(mask, n, g)
        total = raw_weight_total(mask, anchors, valid, block_size=block, gamma=4.0)
        return build_block_batch(ids, mask, anchors, valid, block_size=block, mask_token_id=1023, gamma=4.0,
                                 weight_total=total)

    def engine(cuda_graphs):
        spark = dict(drafter_variant="dspark", markov_rank=32)
        return bench_tiny_engine(block_size=8, cuda_graphs=cuda_graphs, drafter=spark, **spark)

    runs = {}
    for graphs in (True, False):
        eng = engine(graphs)
        outs = [eng.step(batch(s), step=s, lr=1e-3, next_batch=None) for s in range(5)]
        runs[graphs] = [(o["loss"].item(), o["terms"].tolist()) for o in outs]
        if graphs:
            w = eng.workers[0].graphed
            assert w.mode == "graph" and w.replays >= 3 and not w.fallbacks, w.status()
        eng.shutdown()
    for (lg, tg), (le, te) in zip(runs[True], runs[False]):
        assert lg == pytest.approx(le, rel=1e-5) and tg == pytest.approx(te, rel=1e-4, abs=1e-6)


def test_the_dashboard_shows_the_heads_terms_of_a_dspark_run(straight):
    from widgets.html import header_html
    from widgets.model import DashboardModel

    _, rows, _ = straight
    m = DashboardModel(total_steps=STEPS)
    m.add_metrics([rows[s] for s in sorted(rows)])
    state = m.state()
    assert state.heads == {k: rows[STEPS][k] for k in METRICS}
    html = header_html(state)
    assert f'markov_ce {rows[STEPS]["markov_ce"]:.3g}' in html and "confidence_acc" in html
    plain = DashboardModel(total_steps=STEPS)
    plain.add_metrics([{k: v for k, v in rows[s].items() if k not in METRICS} for s in sorted(rows)])
    assert plain.state().heads == {} and "markov_ce" not in header_html(plain.state())


def test_the_step_benchmark_times_both_variants_in_one_process(capsys):
    """`python -m dflash_lab.benchmarks.step --drafter-variants dflash,dspark@8` on the CPU: one row per arm, the
    DSpark arm at its own block size with its loss (the GPU job compares their step times the same way)."""
    import json

    from dflash_lab.benchmarks import step as bench

    bench.main(["--shape", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "0",
                "--drafter-variants", "dflash,dspark@8", "--markov-rank", "16"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["drafter_variant"], r["block_size"], r.get("error")) for r in rows] == [("dflash", 16, None),
                                                                                       ("dspark", 8, None)]
    assert rows[1]["markov_rank"] == 16 and "markov_rank" not in rows[0]
    assert all(r["step_ms_median"] > 0 and r["loss_first"] == r["loss_first"] for r in rows)
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--drafter-variants", "dflash,eagle3"])


def test_the_torchrun_rank_loop_trains_dspark_as_the_engine_does(tmp_path, data_file):
    """RankTrainer (one gloo process: the DDP/FSDP2 path's step.train_step, the heads called beside the wrapped
    drafter's forward) gives the engine's losses and heads' terms."""
    from dflash_lab.train.distributed import DistConfig, DistContext
    from dflash_lab.train.rank_trainer import RankTrainer
    from tests import golden

    cfg = _config(tmp_path, data_file, steps=4, checkpoint_every=0)
    t = Trainer(cfg, write_run_dir=False, log=lambda *a: None)
    try:
        t.step(cfg.steps)
        engine = [{k: r[k] for k in ("loss", *METRICS)} for r in t.history]
    finally:
        t.close()
    ctx = DistContext(DistConfig(backend="gloo"), train_devices=cfg.devices, env=None)
    rt = RankTrainer(cfg, ctx, tmp_path / "rank_run", log=lambda *a: None, checkpoints=False)
    try:
        rt.train(progress_every_s=1e9)
        rank = [{k: r[k] for k in ("loss", *METRICS)} for r in rt.metrics.ring.snapshot()]
    finally:
        rt.close()
        ctx.close()
    assert len(rank) == len(engine) == cfg.steps
    for a, b in zip(rank, engine):
        assert a == pytest.approx(b, **golden.TOLERANCE)


def test_a_feature_store_trains_dspark_exactly_as_without(tmp_path):
    """Later epochs read features and the target's top-k from the store: the same losses and heads' terms."""
    from tests.test_feature_store import _tiny_losses

    dspark = dict(drafter_variant="dspark", markov_rank=8, distill_weight=1.0, distill_top_k=4)
    curves, last, windows = _tiny_losses(tmp_path, {"none": dspark, "store": {**dspark, "feature_store_gib": 0.01}})
    assert curves["store"] == pytest.approx(curves["none"], rel=1e-6, abs=1e-6)
    assert last["store"]["feature_store_stored"] == windows and last["store"]["feature_store_hit_rate"] > 0
    for k in METRICS:
        assert last["store"][k] == pytest.approx(last["none"][k], rel=1e-5, abs=1e-6), k


def test_a_compiled_dspark_drafter_trains_as_the_eager_one():
    """compile_drafter: the backbone is traced in the worker threads, the heads' loss runs beside it; the losses
    and terms equal the eager engine's, with no recompile after the first step."""
    from dflash_lab.config import DrafterConfig
    from dflash_lab.train.engine_build import build_engine
    from dflash_lab.train.placement import make_placement
    from tests.conftest import make_tiny_qwen3
    from tests.test_engine import _batch, B, N, S

    target = make_tiny_qwen3()
    runs = {}
    for compiled in (False, True):
        cfg = TrainConfig(seq_len=S, num_anchors=N, block_size=B, batch_size=2, devices=("cpu",), mask_token_id=255,
                          num_draft_layers=2, lr=1e-3, compile_drafter=compiled, drafter_variant="dspark",
                          markov_rank=8)
        dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=B, mask_token_id=255,
                                       drafter_variant="dspark", markov_rank=8)
        engine = build_engine(cfg, make_placement(cfg.devices, None), [target], dc, target_config=target.config,
                              compile_backend="eager")
        outs = [engine.step(_batch(s), step=s, lr=1e-3) for s in range(3)]
        runs[compiled] = [(o["loss"].item(), o["terms"].tolist()) for o in outs]
        m = engine.metrics()
        engine.shutdown()
        if compiled:
            assert m["compiled_graphs"] >= 1 and m["recompiles_after_first_step"] == 0
    for (lc, tc), (le, te) in zip(runs[True], runs[False]):
        assert lc == pytest.approx(le, rel=1e-5) and tc == pytest.approx(te, rel=1e-4, abs=1e-6)


def test_a_trained_dspark_run_loads_with_its_heads(straight):
    """evaluation.export.load_drafter on a dspark run: the backbone and the heads as trained (the decoders and the
    export start from it)."""
    from dflash_lab.evaluation.export import load_drafter

    run_dir, _, weights = straight
    _, drafter = load_drafter(run_dir, log=lambda *a: None)
    assert drafter.heads is not None and drafter.config.drafter_variant == "dspark"
    for k, v in drafter.state_dict().items():
        if not k.startswith("rotary_emb."):
            assert torch.equal(v, weights[k].float()), k


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The dspark run of tests/test_distributed.py's tiny shape in one process (no process group): its losses and
    the gradients it dumps each step."""
    from dflash_lab.tiny import tiny_data_path
    from tests.test_distributed import CFG, DATA_LINES, _losses, _ok, _run
    from dflash_lab.train.distributed import DistConfig
    from dflash_lab.train.launch import prepare_run

    base = tmp_path_factory.mktemp("dist")
    data = base / "train-slice.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:DATA_LINES]))
    cfg = CFG.replace(data=str(data), drafter_variant="dspark", markov_rank=8)
    run_dir = prepare_run(cfg, DistConfig(), run_dir=base / "one")
    proc, _ = _run(run_dir, 0, DFLASH_DUMP_GRADS=base / "one-grads")
    _ok(proc)
    return cfg, base, _losses(run_dir)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_gloo_ranks_train_dspark_as_one_process(one_process, parallel):
    """torchrun, 2 gloo ranks: the heads run beside the DDP / FSDP2-wrapped backbone's forward (their loss is
    outside it) and their gradients are summed with the backbone's: losses and every gradient, heads' included,
    equal one process."""
    from tests.test_distributed import TOL, _grads, _losses, _max_diff, _ok, _run
    from dflash_lab.train.distributed import DistConfig
    from dflash_lab.train.launch import prepare_run

    cfg, base, one = one_process
    run_dir = prepare_run(cfg, DistConfig(parallel=parallel, timeout_s=30), run_dir=base / parallel)
    proc, _ = _run(run_dir, 2, DFLASH_DUMP_GRADS=base / f"{parallel}-grads")
    _ok(proc)
    losses = _losses(run_dir)
    assert sorted(one) == sorted(losses) == [1, 2, 3, 4] and one[4] < one[1]
    for step in (1, 2, 3, 4):
        assert abs(losses[step] - one[step]) <= TOL * max(1.0, abs(one[step])), step
        want = _grads(base / "one-grads", 0, step)
        assert any(k.startswith("heads.markov_head") for k in want) and any("confidence" in k for k in want)
        for rank in (0, 1):
            assert _max_diff(_grads(base / f"{parallel}-grads", rank, step), want) < TOL, (step, rank)


def test_the_command_line_takes_the_variant_with_set(tmp_path):
    """`python -m dflash_lab.train --data ... --set drafter_variant=dspark --set markov_rank=64` writes a dspark run
    dir; a variant not in the table is refused naming the fix."""
    from dflash_lab.config import ConfigError
    from dflash_lab.train.cli import new_run, parse_args

    run_dir = new_run(parse_args(["--data", "tiny", "--runs-dir", str(tmp_path), "--set", "drafter_variant=dspark",
                                  "--set", "markov_rank=64"]))
    cfg = TrainConfig.from_json(run_dir / "config.json")
    assert (cfg.drafter_variant, cfg.markov_rank, cfg.dspark_l1_weight) == ("dspark", 64, 0.9)
    with pytest.raises(ConfigError, match="unknown drafter variant"):
        new_run(parse_args(["--data", "tiny", "--runs-dir", str(tmp_path), "--set", "drafter_variant=dflash2"]))
