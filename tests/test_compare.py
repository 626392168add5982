"""runs.py + plots.py + notebooks/compare.ipynb: list runs, load metrics, static PNG comparison, HTML export."""

import json
import os
import time

import nbformat
import pytest

from dflash_lab import TrainConfig
from dflash_lab.runs import plots, rundir, listing as runs


def _fake_run(root, stamp, name, *, losses, tps, mem_key, mem, status=None):
    """A run directory as the Trainer writes it (config.json, metrics.jsonl, events/summary), with known numbers."""
    d = root / f"{stamp}-{name}-abc123"
    d.mkdir(parents=True)
    TrainConfig(run_name=name, steps=len(losses) * 10).to_json(d / rundir.CONFIG_FILE)
    with open(d / rundir.METRICS_FILE, "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"step": (i + 1) * 10, "loss": loss, "tokens_per_s": tps, "steady_tokens_per_s": tps,
                                "sim_tau": 1 + i * 0.5, "acc": 0.1 * i, mem_key: mem + i,
                                **({"eval_tau": 2.0 + i} if i % 2 == 0 else {})}) + "\n")
    if status == "finished":
        rundir.write_json(d / "summary.json", {"status": "finished"})
    if status == "diverged":
        rundir.log_event(d, "diverged", step=20)
    return d


@pytest.fixture
def two_runs(tmp_path):
    root = tmp_path / "runs"
    a = _fake_run(root, "20260101T100000Z", "base", losses=[5.0, 4.0, 3.0], tps=1000.0, mem_key="mem_gb/cuda:0",
                  mem=10.0, status="finished")
    b = _fake_run(root, "20260102T100000Z", "big", losses=[6.0, 7.0], tps=2500.0, mem_key="rss_gb", mem=1.5,
                  status="diverged")
    (root / "not-a-run").mkdir()
    old = time.time() - 3600
    for f in (b / rundir.METRICS_FILE, b / rundir.EVENTS_FILE, a / rundir.METRICS_FILE):
        os.utime(f, (old, old))
    return root, a, b


def test_list_and_resolve_runs(two_runs):
    root, a, b = two_runs
    assert runs.list_runs(root) == [b, a]  # newest first, folders without config.json ignored
    assert runs.resolve_runs([], runs_dir=root, newest=1) == [a]  # finished before the newer diverged run
    assert runs.resolve_runs([str(a)], runs_dir=root) == [a]
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        runs.resolve_runs([str(root / "not-a-run")], runs_dir=root)
    with pytest.raises(FileNotFoundError, match="Fix: train first"):
        runs.resolve_runs([], runs_dir=root / "empty")


def test_load_metrics_and_table(two_runs):
    root, a, b = two_runs
    frame = runs.load_metrics([a, b])
    assert len(frame) == 5 and set(frame["run"]) == {a.name, b.name}
    assert frame[frame["run"] == a.name]["memory_gb"].tolist() == [10.0, 11.0, 12.0]  # GPU allocation
    assert frame[frame["run"] == b.name]["memory_gb"].tolist() == [1.5, 2.5]  # CPU run: RSS
    assert frame[frame["run"] == a.name]["loss"].tolist() == [5.0, 4.0, 3.0]
    table = runs.runs_table([a, b])
    assert table.loc[a.name, "status"] == "finished" and table.loc[b.name, "status"] == "diverged"
    assert table.loc[a.name, "loss"] == 3.0 and table.loc[b.name, "tokens_per_s"] == 2500.0
    assert table.loc[a.name, "peak_memory_gb"] == 12.0 and table.loc[a.name, "step"] == 30
    assert table.loc[a.name, "eval_tau"] == 4.0 and table.loc[b.name, "eval_tau"] == 2.0  # last real tau


def _fake_eval(run_dir, name, *, step, tau_heldout, tau_train, block_size=8):
    """An evaluation folder as evaluate.py writes it (only the fields runs.py reads)."""
    rows = [{"decoder": "trained", "prompt_set": s, "tau": t, "iterations": 10, "accepted": round((t - 1) * 10),
             "speedup": 1.5} for s, t in (("heldout", tau_heldout), ("train", tau_train))]
    (run_dir / "evals" / name).mkdir(parents=True)
    rundir.write_json(run_dir / "evals" / name / "eval.json",
                      {"summary": rows, "block_size": block_size, "temperature": 0.0, "dtype": "bfloat16",
                       "step": step})


def test_latest_evaluation_of_each_run_in_table_curves_and_list(two_runs, capsys):
    """runs_table / `runs list` / load_metrics (compare's real-tau points) use the NEWEST evaluation folder, quoting
    its heldout row; `runs list` prints every column in full (no "...")."""
    root, a, b = two_runs
    _fake_eval(a, "20260101T120000Z-b8-t0-bf16", step=20, tau_heldout=3.6, tau_train=4.8)
    _fake_eval(a, "20260101T130000Z-b4-t0-bf16", step=20, tau_heldout=2.9, tau_train=3.3, block_size=4)
    table = runs.runs_table([a, b])
    assert table.loc[a.name, "eval_tau"] == pytest.approx(2.9) and table.loc[a.name, "eval_block_size"] == 4
    assert table.loc[a.name, "heldout_tau"] == 4.0 and table.loc[b.name, "eval_tau"] == 2.0  # b: logged fallback
    frame = runs.load_metrics([a, b])
    part = frame[frame["run"] == a.name].set_index("step")
    assert part.loc[20, "eval_tau"] == pytest.approx(2.9)  # the evaluated step had no logged real tau
    assert part.loc[10, "eval_tau"] == 2.0 and part.loc[30, "eval_tau"] == 4.0  # logged values are kept
    assert runs.main(["list", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "..." not in out and "eval tau" in out and "tok/s" in out and "2.90" in out and "2.5k" in out


def test_plot_compare_is_a_png(two_runs, tmp_path):
    root, a, b = two_runs
    img = plots.plot_compare(runs.load_metrics([a, b]), out=tmp_path / "cmp.png")
    assert img._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n" and len(img.data) > 10_000
    assert (tmp_path / "cmp.png").read_bytes() == img.data
    bars = plots.plot_compare_bars(runs.runs_table([a, b]))
    assert bars.data[:4] == b"\x89PNG"


def test_compare_figures_fit_a_1024_px_page_at_full_size(two_runs):
    """Two panels a row, ~1,000 px wide: a 1,024 px page shows them at ~full size (text 12-14 px), not the four-in-a-
    row 1,620 px figure it scaled to 0.55 (5-6 px text)."""
    import struct

    root, a, b = two_runs
    for img in (plots.plot_compare(runs.load_metrics([a, b])), plots.plot_compare_bars(runs.runs_table([a, b]))):
        width, height = struct.unpack(">II", img.data[16:24])  # the PNG's IHDR
        assert 900 <= width <= 1000 and height > 0.4 * width, (width, height)  # 2 columns, 2 rows


def test_compare_notebook_renders_images_and_html(two_runs, tmp_path):
    root, a, b = two_runs
    html = runs.compare([], runs_dir=str(root), out=tmp_path / "out" / "compare.ipynb")
    assert html == tmp_path / "out" / "compare.html"
    nb = nbformat.read(str(tmp_path / "out" / "compare.ipynb"), as_version=4)
    pngs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
    assert len(pngs) == 3  # curves, real tau against GPU-minutes, final bars: static images GitHub renders
    # the executed notebook names runs relative to the folder holding the runs folder, never this machine's paths
    assert nb.metadata.papermill.parameters["run_dirs"] == [f"runs/{b.name}", f"runs/{a.name}"]
    raw = (tmp_path / "out" / "compare.ipynb").read_text()
    assert str(tmp_path) not in raw and str(rundir.PROJECT_ROOT) not in raw
    text = html.read_text()
    assert text.count("src=\"data:image/png;base64") == 3 and a.name in text and b.name in text
    assert 'class="dfl-selection"' in text and "compared 2 run(s) of 2: 1 diverged, 1 finished" in text  # what it took


def test_runs_list_is_narrow_and_says_missing_the_same_way(two_runs, capsys):
    """One line per run within ~110 characters: no NaN / None mix, no 1.128e+04, the held-out taus logged while
    training (real_tau from the validator, val_sim_tau) shown."""
    root, a, b = two_runs
    lines = (a / rundir.METRICS_FILE).read_text().splitlines()  # the validator's held-out figures at the last step
    lines[-1] = json.dumps({"step": 30, "loss": 2.5, "tokens_per_s": 11283.4, "steady_tokens_per_s": 11283.4,
                            "sim_tau": 3.1, "acc": 0.4, "val_sim_tau": 2.71, "real_tau": 2.33})
    (a / rundir.METRICS_FILE).write_text("\n".join(lines) + "\n")
    table = runs.runs_table([a, b])
    assert table.loc[a.name, "heldout_tau"] == 2.33 and table.loc[a.name, "val_sim_tau"] == 2.71
    assert runs.main(["list", "--runs-dir", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row_a = next(line for line in lines if line.startswith(a.name))
    row_b = next(line for line in lines if line.startswith(b.name))
    assert max(len(line) for line in lines) <= 115, lines
    for bad in ("NaN", "nan", "None", "e+0"):
        assert bad not in "\n".join(lines), (bad, lines)
    assert "11.3k" in row_a and "2.71" in row_a and "2.33" in row_a and "30/30" in row_a
    assert row_b.split()[1] == "diverged" and " - " in row_b  # b logged no held-out tau: "-", like every gap


def test_real_taus_with_intervals_are_compared_only_on_the_same_prompts(two_runs, tmp_path):
    """run_taus (compare.ipynb's interval table): runs a and b evaluated on the same prompts (sha) with overlapping
    intervals are not separated; c's interval on those prompts is apart; d measured other prompts: not compared."""
    from dflash_lab.evaluation.run_taus import run_taus, tau_table

    root, a, b = two_runs
    c = _fake_run(root, "20260103T100000Z", "c", losses=[4.0], tps=1.0, mem_key="rss_gb", mem=1.0)
    d = _fake_run(root, "20260104T100000Z", "d", losses=[4.0], tps=1.0, mem_key="rss_gb", mem=1.0)
    for run, (tau, lo, hi), sha in ((a, (2.4, 2.2, 2.6), "s1"), (b, (2.3, 2.1, 2.5), "s1"), (c, (3.1, 2.9, 3.3), "s1"),
                                    (d, (2.35, 2.2, 2.5), "s2")):
        (run / "evals" / "e").mkdir(parents=True)
        rundir.write_json(run / "evals" / "e" / "eval.json", {"step": 30, "max_new_tokens": 128, "summary": [
            {"decoder": "trained", "prompt_set": "general", "prompts": 64, "prompt_set_sha256": sha, "block_size": 16,
             "tau": tau, "tau_low": lo, "tau_high": hi},
            {"decoder": "target only", "prompt_set": "general", "prompts": 64, "block_size": 1, "tau": 1.0}]})
    with open(a / rundir.METRICS_FILE, "a") as f:  # a training-time real tau with its interval
        f.write(json.dumps({"step": 40, "real_tau": 2.0, "real_tau_low": 1.8, "real_tau_high": 2.2,
                            "real_tau_prompts": 32, "real_tau_sha256": "h"}) + "\n")
    rows = {(r["run"], r["measured"].split(" ")[0]): r for r in run_taus([a, b, c, d])}
    assert rows[(a.name, "evaluation")]["not_separated_from"] == [b.name]
    assert rows[(b.name, "evaluation")]["not_separated_from"] == [a.name]
    assert rows[(c.name, "evaluation")]["not_separated_from"] == []
    assert rows[(d.name, "evaluation")]["not_separated_from"] == []  # other prompts: compared with nobody
    t = rows[(a.name, "training")]
    assert (t["tau"], t["tau_low"], t["tau_high"], t["prompts"], t["step"]) == (2.0, 1.8, 2.2, 32, 40)
    frame = tau_table([a, c])
    assert list(frame["not_separated_from"])[:2] == ["separated from all", "separated from all"]
    assert len(frame) == 3 and frame["sha256"].tolist()[0] == "s1"
