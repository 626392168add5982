"""torchrun on CPU with gloo: 2 ranks == 1 process == the threaded engine; a dying rank ends the job; resume; stop.

Every run here is a real `python -m torch.distributed.run --standalone` (or `python -m dflash_lab.train`) subprocess
on the tiny target with a tiny shape (seq 64, 2 draft layers, block 8, 4 anchors, global batch 2, 4 steps).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dflash_lab.config import TrainConfig
from dflash_lab.train.distributed import DistConfig, rank_layout, resolve_device
from dflash_lab.train.launch import cluster_command, launch, prepare_run, torchrun_args

CFG = TrainConfig(target="tiny", data="tiny", seq_len=64, batch_size=2, block_size=8, num_anchors=4,
                  num_draft_layers=2, steps=4, log_every=1, checkpoint_every=2, keep_checkpoints=5, seed=0,
                  run_name="dist-test")  # devices ("cpu",) and dtype "auto" -> fp32: what the notebook builds too
DATA_LINES = 64  # a slice of the tiny chat set: every rank tokenizes it at start-up, so keep it short
RUN_TIMEOUT_S = 600  # a hung job fails the test instead of hanging it (a bound on a hang, not on speed)
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "launch.ipynb"
TOL = 1e-5


def _env(**extra) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(run_dir: Path, nproc: int, *, extra_args=(), **env) -> tuple[subprocess.CompletedProcess, float]:
    """nproc 0 = plain `python -m dflash_lab.train`; otherwise torchrun with nproc ranks."""
    cmd = ([sys.executable, "-m", "dflash_lab.train", "--config", str(run_dir / "config.json"), *extra_args]
           if nproc == 0 else torchrun_args(run_dir, nproc_per_node=nproc, train_args=tuple(extra_args)))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=_env(**env))
    return proc, time.monotonic() - t0


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _grads(dump: Path, rank: int, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(dump / f"grads.rank{rank}.step{step}.safetensors"))


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from dflash_lab.runs.checkpoint import load_checkpoint

    return load_checkpoint(run_dir).drafter


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, no process group: the numbers every distributed layout must reproduce."""
    from dflash_lab.tiny import tiny_data_path

    base = tmp_path_factory.mktemp("dist")
    data = base / "train-slice.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:DATA_LINES]))
    cfg = CFG.replace(data=str(data))
    run_dir = prepare_run(cfg, DistConfig(), run_dir=base / "ref")
    proc, _ = _run(run_dir, 0, DFLASH_DUMP_GRADS=base / "ref-grads")
    _ok(proc)
    return {"base": base, "cfg": cfg, "run_dir": run_dir, "grads": base / "ref-grads", "losses": _losses(run_dir)}


@pytest.fixture(scope="module")
def ddp_run(reference):
    """2 gloo ranks, DDP, launched from notebooks/launch.ipynb run by papermill: config into a new run dir,
    torchrun in the background, cluster command printed, dashboard attached, log followed until the job ends."""
    import nbformat

    cfg, base = reference["cfg"], reference["base"]
    params = dict(target=cfg.target, data=cfg.data, steps=cfg.steps, block_size=cfg.block_size,
                  num_anchors=cfg.num_anchors, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                  num_draft_layers=cfg.num_draft_layers, lr=cfg.lr, seed=cfg.seed, run_name="nb-ddp",
                  runs_dir=str(base / "nb"),
                  log_every=1, checkpoint_every=cfg.checkpoint_every, keep_checkpoints=cfg.keep_checkpoints,
                  nproc_per_node=2, gpus=[], parallel="ddp", timeout_s=30.0, follow_s=float(RUN_TIMEOUT_S))
    out = base / "launch-out.ipynb"
    proc = subprocess.run([sys.executable, "-m", "papermill", str(NOTEBOOK), str(out), "-y", json.dumps(params)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 60,
                          env=_env(DFLASH_DUMP_GRADS=base / "ddp-grads"))
    _ok(proc)
    [run_dir] = list((base / "nb").iterdir())
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for c in nbformat.read(out, as_version=4).cells for o in c.get("outputs", []))
    assert "torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint node0:29500" in text  # the cluster command
    assert "finished at step 4/4" in text and "'state': 'finished'" in text  # followed log + job.status()
    follow = next(c for c in nbformat.read(out, as_version=4).cells if "job.follow(" in c.source)
    assert not [o for o in follow.outputs if o.output_type == "execute_result"]  # no stray exit code `0`
    assert (run_dir / "launch.ipynb").is_file() and (run_dir / "plots" / "training.png").is_file()
    assert TrainConfig.from_json(run_dir / "config.json") == TrainConfig.from_json(  # the same values chosen
        reference["run_dir"] / "config.json").replace(run_name="nb-ddp", runs_dir=str(base / "nb"))
    return {"cfg": cfg, "run_dir": run_dir, "grads": base / "ddp-grads", "losses": _losses(run_dir)}


def _assert_matches_reference(reference, losses, grads_dir, ranks=(0, 1)):
    ref = reference["losses"]
    assert sorted(losses) == sorted(ref) == [1, 2, 3, 4]
    for step in ref:
        assert math.isfinite(ref[step])
        assert abs(losses[step] - ref[step]) <= TOL * max(1.0, abs(ref[step])), (step, losses[step], ref[step])
    assert ref[4] < ref[1]  # it trains
    for step in (1, 2, 3, 4):
        want = _grads(reference["grads"], 0, step)
        for rank in ranks:
            got = _grads(grads_dir, rank, step)
            assert _max_diff(got, want) < TOL, (step, rank, _max_diff(got, want))
            assert max(float(g.abs().max()) for g in want.values()) > 1e-4  # gradients are not trivially zero


def test_two_gloo_ranks_ddp_match_one_process(reference, ddp_run):
    _assert_matches_reference(reference, ddp_run["losses"], ddp_run["grads"])
    # summed (not averaged) over ranks: both ranks hold the identical full gradient
    g0, g1 = _grads(ddp_run["grads"], 0, 2), _grads(ddp_run["grads"], 1, 2)
    assert _max_diff(g0, g1) == 0.0
    assert _max_diff(_final_weights(ddp_run["run_dir"]), _final_weights(reference["run_dir"])) < TOL
    assert not list(ddp_run["run_dir"].glob("error.rank*.json"))
    for rank in (0, 1):  # every rank samples its host (GPUs via NVML when present, CPU/RAM always)
        first = json.loads((ddp_run["run_dir"] / f"system.rank{rank}.jsonl").read_text().splitlines()[0])
        assert first["host"]["ram_used_gb"] > 0
    assert (ddp_run["run_dir"] / "system.jsonl").resolve().name == "system.rank0.jsonl"  # what the dashboard follows


def test_threaded_engine_matches_ddp(ddp_run):
    """The in-process threaded engine with two CPU workers gives the same losses as two DDP ranks."""
    from dflash_lab.train.trainer import Trainer

    cfg = ddp_run["cfg"]
    trainer = Trainer(cfg.replace(devices=("cpu", "cpu"), checkpoint_every=0), write_run_dir=False, log=lambda *a: None)
    try:
        losses = [trainer.step(1)["loss"] for _ in range(cfg.steps)]
    finally:
        trainer.close()
    for step, loss in enumerate(losses, 1):
        assert abs(loss - ddp_run["losses"][step]) <= TOL * max(1.0, abs(loss)), (step, loss, ddp_run["losses"][step])


def test_torchrun_checkpoint_resumes_in_notebook_trainer(ddp_run):
    """Same checkpoint format both ways: the 2-rank run's step-2 checkpoint continues in a Trainer identically."""
    from dflash_lab.train.trainer import Trainer

    ckpt = ddp_run["run_dir"] / "checkpoints" / "step-0000002"
    trainer = Trainer(ddp_run["cfg"].replace(resume_from=str(ckpt), checkpoint_every=0), write_run_dir=False,
                      log=lambda *a: None)
    try:
        assert trainer.step_count == 2
        losses = {3: trainer.step(1)["loss"]}
        losses[4] = trainer.step(1)["loss"]
    finally:
        trainer.close()
    for step in (3, 4):
        want = ddp_run["losses"][step]
        assert abs(losses[step] - want) <= TOL * max(1.0, abs(want)), (step, losses[step], want)


def test_two_gloo_ranks_fsdp2_match_one_process(reference):
    base = reference["base"]
    run_dir = prepare_run(reference["cfg"], DistConfig(parallel="fsdp2", timeout_s=30), run_dir=base / "fsdp2")
    proc, _ = _run(run_dir, 2, DFLASH_DUMP_GRADS=base / "fsdp2-grads")
    _ok(proc)
    _assert_matches_reference(reference, _losses(run_dir), base / "fsdp2-grads")
    assert _max_diff(_final_weights(run_dir), _final_weights(reference["run_dir"])) < TOL


def test_separate_target_rank_feeds_drafter_rank(reference):
    """targets_per_node=1 on 2 ranks: rank 1 runs only the target and sends features (and the frozen embedding)
    to rank 0, which trains; same numbers as one process."""
    base = reference["base"]
    run_dir = prepare_run(reference["cfg"], DistConfig(targets_per_node=1, timeout_s=30), run_dir=base / "split")
    proc, _ = _run(run_dir, 2, DFLASH_DUMP_GRADS=base / "split-grads")
    _ok(proc)
    _assert_matches_reference(reference, _losses(run_dir), base / "split-grads", ranks=(0,))
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["drafter_ranks"] == 1 and row["world_size"] == 2 and 0.0 <= row["feature_wait_frac"] <= 1.0


def test_dying_rank_ends_job_with_clear_error_then_resume_matches(reference, ddp_run):
    base = reference["base"]
    # a process-group timeout far past the run's own (RUN_TIMEOUT_S): a peer hung on the dead rank would wait it
    # out and fail _run; a job that ends does so because the dead rank ended it, however slow the machine
    run_dir = prepare_run(reference["cfg"], DistConfig(timeout_s=3600), run_dir=base / "fault")
    proc, _ = _run(run_dir, 2, DFLASH_FAULT="1:2")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    err = json.loads((run_dir / "error.rank1.json").read_text())
    assert err["rank"] == 1 and err["step"] == 2
    assert "injected fault on rank 1 at step 2" in out
    assert "[rank 1] FAILED at step 2" in out
    root_cause = out.split("Root Cause")[-1]  # torchrun's summary names the rank that died first, with its error
    assert "rank      : 1" in root_cause and "injected fault on rank 1 at step 2" in root_cause
    status = json.loads((run_dir / "status.json").read_text())
    assert status["phase"] == "failed" and status["error"].startswith("rank 1 at step 2: RuntimeError: injected")
    assert err["rank"] == 1 and err["step"] == 2 and "injected fault" in err["error"]
    from dflash_lab.runs.checkpoint import latest_checkpoint

    assert latest_checkpoint(run_dir).name == "step-0000002"  # written before the fault, complete

    # resume the same run directory on 2 ranks: steps 3-4 are those of the uninterrupted run
    proc, _ = _run(run_dir, 2, extra_args=("--resume", str(run_dir)))
    _ok(proc)
    losses, want = _losses(run_dir), ddp_run["losses"]
    assert sorted(losses) == [1, 2, 3, 4]
    for step in (3, 4):
        assert abs(losses[step] - want[step]) <= TOL * max(1.0, abs(want[step])), (step, losses[step], want[step])
    assert _max_diff(_final_weights(run_dir), _final_weights(ddp_run["run_dir"])) < TOL


def test_job_stop_stops_every_rank_at_one_step_with_a_checkpoint(reference):
    """launch -> Job.stop(): STOP file -> all ranks leave at the same step, rank 0 checkpoints, exit code 0."""
    from dflash_lab.runs.checkpoint import latest_checkpoint

    run_dir = prepare_run(reference["cfg"].replace(steps=400, checkpoint_every=0), DistConfig(targets_per_node=1, timeout_s=30),
                          run_dir=reference["base"] / "stop")
    job = launch(run_dir, nproc_per_node=2, env={"OMP_NUM_THREADS": "1"})
    try:
        t_end = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < t_end and job.running:
            if (run_dir / "metrics.jsonl").is_file() and len(_losses(run_dir)) >= 2:
                break
            time.sleep(0.3)
        assert job.running, job.tail(60)
        rc = job.stop(grace_s=60)
    finally:
        if job.running:
            job.kill()
    assert rc == 0, job.tail(60)
    status = json.loads((run_dir / "status.json").read_text())
    last = max(_losses(run_dir))
    assert status["phase"] == "stopped" and 2 <= status["step"] < 400 and status["step"] == last
    assert latest_checkpoint(run_dir).name == f"step-{last:07d}"
    assert "stopped at step" in job.tail(40)


# ---------------------------------------------------------------------------------------------------------------
# Pure pieces (no processes)
# ---------------------------------------------------------------------------------------------------------------
def test_rank_layout_colocated_and_split():
    lay = rank_layout(4, 4, 0)
    assert lay.colocated and lay.drafter_ranks == (0, 1, 2, 3) and lay.feeder == {0: 0, 1: 1, 2: 2, 3: 3}
    lay = rank_layout(16, 8, 3)  # 2 nodes: local ranks 5-7 run targets, features stay inside the node
    assert lay.drafter_ranks == (0, 1, 2, 3, 4, 8, 9, 10, 11, 12)
    assert lay.target_ranks == (5, 6, 7, 13, 14, 15)
    assert lay.feeder[0] == 5 and lay.feeder[3] == 5 and lay.feeder[4] == 6 and lay.feeder[12] == 14
    assert lay.served_by(5) == [0, 3]
    with pytest.raises(Exception, match="targets_per_node=2 leaves no drafter"):
        rank_layout(2, 2, 2)
    with pytest.raises(Exception, match="not a multiple"):
        rank_layout(6, 4, 0)


def test_dist_config_validates_and_round_trips():
    d = DistConfig(parallel="fsdp2", targets_per_node=2, timeout_s=60)
    assert DistConfig.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    with pytest.raises(Exception, match="parallel='zero3'"):
        DistConfig(parallel="zero3")
    with pytest.raises(Exception, match="backend='nccl' cannot run on device='cpu'"):
        DistConfig(backend="nccl", device="cpu")
    assert resolve_device(DistConfig(), 1, ("cpu",)) == torch.device("cpu")  # "auto" follows the TrainConfig


def test_cluster_commands(tmp_path):
    run_dir = tmp_path / "r"
    c10d = cluster_command(run_dir, nnodes=2, nproc_per_node=8, rdzv_endpoint="node0:29500")
    assert ("torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint node0:29500 --rdzv-id r --nproc-per-node 8 "
            f"--max-restarts 0 -m dflash_lab.train --config {run_dir}/config.json") in c10d
    static = cluster_command(run_dir, nnodes=2, nproc_per_node=8, rdzv_endpoint="node0:29500", rdzv_backend="static")
    assert "--node-rank 0" in static and "--node-rank 1" in static and static.count("torchrun") == 2
    with pytest.raises(ValueError, match="rendezvous endpoint"):
        torchrun_args(run_dir, nproc_per_node=2, nnodes=2)


def test_notebook_trainer_matches_command_line(reference):
    """One step, one speed: the notebook's Trainer on one device and `python -m dflash_lab.train` (one process) run
    the same engine step, so the same seed gives the same loss curve; the command line's rows carry the engine's
    own fields (phase times, graph mode)."""
    from dflash_lab.train.trainer import Trainer

    cfg = reference["cfg"]
    trainer = Trainer(cfg.replace(checkpoint_every=0), write_run_dir=False, log=lambda *a: None)
    try:
        losses = [trainer.step(1)["loss"] for _ in range(cfg.steps)]
    finally:
        trainer.close()
    for step, loss in enumerate(losses, 1):
        want = reference["losses"][step]
        assert abs(loss - want) <= TOL * max(1.0, abs(want)), (step, loss, want)
    row = json.loads((reference["run_dir"] / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["drafter_ms"] > 0 and row["graph/drafter[0]@cpu"].startswith("eager")
