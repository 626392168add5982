"""runs_dir resolves against the project root (or an absolute path / $DFLASH_LAB_RUNS), never the working directory:
a run started from a kernel in notebooks/ is listed by `python -m dflash_lab.runs list` from anywhere."""

from pathlib import Path

from dflash_lab.runs import rundir, listing as runs

ROOT = Path(__file__).resolve().parent.parent


def test_resolution_rules(tmp_path, monkeypatch):
    monkeypatch.delenv(rundir.RUNS_ENV, raising=False)
    monkeypatch.chdir(ROOT / "notebooks")  # where a JupyterLab kernel runs
    assert rundir.resolve_runs_dir("runs") == ROOT / "runs"
    assert rundir.resolve_runs_dir("out/runs") == ROOT / "out" / "runs"
    assert rundir.resolve_runs_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv(rundir.RUNS_ENV, str(tmp_path / "elsewhere"))
    assert rundir.resolve_runs_dir("runs") == tmp_path / "elsewhere"
    assert rundir.resolve_runs_dir("mine") == ROOT / "mine"  # an explicit relative runs_dir is not redirected


def test_a_run_made_from_notebooks_is_listed_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(rundir.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT / "notebooks")
    made = rundir.new_run_dir("runs", "from-kernel")
    rundir.write_json(made / rundir.CONFIG_FILE, {"run_name": "from-kernel"})
    assert made.parent == tmp_path / "runs"  # not notebooks/runs
    monkeypatch.chdir(tmp_path)
    assert runs.list_runs("runs") == [made]


# --- a damaged line or file costs only itself, and is said --------------------------------------------------------
def _run(root, name, *, steps=6, metrics: str, summary: str | None = '{"status": "finished"}', events: str = "",
         config: str | None = None):
    import json

    d = root / f"20260101T00000{len(list(root.iterdir())) if root.exists() else 0}Z-{name}-abc123"
    d.mkdir(parents=True)
    (d / rundir.CONFIG_FILE).write_text(config if config is not None else json.dumps({"steps": steps, "lr": 1e-3}))
    (d / rundir.METRICS_FILE).write_text(metrics)
    (d / rundir.EVENTS_FILE).write_text(events)
    if summary is not None:
        (d / "summary.json").write_text(summary)
    return d


def _rows(*steps, loss=1.0):
    import json

    return "".join(json.dumps({"step": s, "loss": loss / s, "acc": 0.5}) + "\n" for s in steps)


def test_garbage_lines_and_cut_off_files_cost_only_themselves_and_are_said(tmp_path, capsys):
    root = tmp_path / "runs"
    good = _run(root, "good", metrics=_rows(1, 2, 4, 6))
    garbage = ('123\nnull\n"x"\n[1]\n{"step": "abc", "loss": 1.0}\n{"step": 3, "loss": "x"}\n'
               '{"step": 3, "loss": NaN}\n')
    # a resume went back to step 4 (the stray 6 is recomputed), then a row past steps=6, then a torn last line
    bad = _run(root, "bad", metrics=_rows(1, 2) + garbage + _rows(4, 6, 5, 6) + '{"step": 8, "loss": NaN}\n{"st',
               summary='{"status": "fin', events='null\n{"event": "resumed", "time": 1}\n')
    no_config = _run(root, "noconfig", metrics=_rows(1), config='{"steps": ')
    said = []
    table = runs.runs_table([good, bad, no_config], log=said.append)
    assert table.loc[good.name, "status"] == "finished" and table.loc[good.name, "step"] == 6
    assert table.loc[bad.name, "status"] == "summary.json unreadable"
    assert table.loc[bad.name, "step"] == 6 and table.loc[bad.name, "loss"] == 1.0 / 6  # not "8/6 loss nan"
    assert table.loc[no_config.name, "status"] == "config.json unreadable"
    note = next(s for s in said if f"{bad.name}/metrics.jsonl" in s)
    assert f"{bad / 'metrics.jsonl'}: kept 5 rows, skipped" in note and "1 torn last line" in note and "4 line(s) that are JSON but not an object (line 3, 4, 5, 6)" in note
    assert "1 row(s) whose step is not an integer" in note and "1 row(s) whose loss is not a number" in note
    assert "1 row(s) with a NaN/inf loss before the last row" in note and "1 row(s) past the run's configured" in note
    assert "1 row(s) recomputed later (a resume went back to an earlier step; the later rows are kept) (line 11)" in note
    assert any(f"{bad.name}/events.jsonl: kept 1 rows, skipped 1 line(s) that are JSON but not an object" in s
               for s in said)
    assert any(f"{no_config.name}/config.json cannot be read" in s for s in said)
    frame = runs.load_metrics([good, bad], log=None)
    assert frame[frame.run == bad.name].step.tolist() == [1, 2, 4, 5, 6]  # step order, the later rows kept
    assert len(frame.attrs["skipped"]) == 1
    assert runs.main(["list", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr()
    assert good.name in out.out and bad.name in out.out and f"NOTE: {bad / 'metrics.jsonl'}: kept" in out.err


# --- a run whose process is gone is never listed as running -------------------------------------------------------
def _ckpt(run, step):
    (run / "checkpoints" / f"step-{step:07d}").mkdir(parents=True)
    (run / "checkpoints" / f"step-{step:07d}" / "state.json").write_text("{}")


def test_the_lock_decides_running_and_the_last_event_how_a_dead_run_ended(tmp_path):
    import json
    import os
    import socket

    from dflash_lab.runs import lock as run_lock
    from dflash_lab.runs.run_state import run_status

    root = tmp_path / "runs"
    ev = lambda *names: "".join(json.dumps({"event": n, "step": 55, "time": 1}) + "\n" for n in names)  # noqa: E731
    # written a second ago (fresh files), but Ctrl-C ended it: events end with `interrupted`, the lock is free
    interrupted = _run(root, "ctrlc", steps=400, metrics=_rows(1, 55), summary=None, events=ev("start", "interrupted"))
    _ckpt(interrupted, 55)
    run_lock.acquire(interrupted)
    run_lock.release(interrupted)  # released at exit: run.lock is gone, not left as a stale record
    assert not (interrupted / run_lock.LOCK_FILE).exists()
    assert run_status(interrupted) == "interrupted (ckpt @55)"
    # killed with SIGKILL: its lock record names a pid of this host that holds no lock, no end event after `resumed`
    killed = _run(root, "killed", steps=300, metrics=_rows(1, 10), summary=None, events=ev("resumed", "checkpoint"))
    (killed / run_lock.LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname()}))
    assert run_status(killed) == "killed (no ckpt)"
    _ckpt(killed, 8)
    assert run_status(killed) == "killed (ckpt @8)"
    # alive: the lock is held (here by this process), however old its last write
    live = _run(root, "live", steps=300, metrics=_rows(1, 10), summary=None, events=ev("start"))
    os.utime(live / rundir.METRICS_FILE, (1, 1))
    os.utime(live / rundir.EVENTS_FILE, (1, 1))
    run_lock.acquire(live)
    try:
        assert run_status(live) == "running"
    finally:
        run_lock.release(live)
    assert run_status(live) == "killed (no ckpt)"
    stopped = _run(root, "budget", steps=300, metrics=_rows(1, 10), summary=None,
                   events=ev("start") + json.dumps({"event": "stopped", "resumable": True}) + "\n")
    (stopped / run_lock.LOCK_FILE).write_text("")
    assert run_status(stopped) == "stopped (resumable)"
    table = runs.compact_table(runs.runs_table([interrupted, killed], log=None))
    assert list(table["status"]) == ["interrupted (ckpt @55)", "killed (ckpt @8)"]
    assert list(table["step"]) == ["55/400", "10/300"]


def test_an_eval_tau_of_an_earlier_step_says_which_step(tmp_path):
    import json

    root = tmp_path / "runs"
    rows = _rows(10, 20) + json.dumps({"step": 30, "loss": 0.5, "real_tau": 2.5}) + "\n" + _rows(40, 60)
    run = _run(root, "stale", steps=60, metrics=rows)
    now = _run(root, "fresh", steps=30, metrics=_rows(10, 20) + json.dumps({"step": 30, "loss": 0.5,
                                                                            "real_tau": 2.25}) + "\n")
    table = runs.compact_table(runs.runs_table([run, now], log=None))
    assert list(table["eval tau"]) == ["2.50 @step 30", "2.25"]


def test_compare_by_default_takes_ended_runs_and_keeps_the_demo(tmp_path):
    root = tmp_path / "runs"
    demo = _run(root, "demo", metrics=_rows(1, 6))  # oldest, finished
    done = [_run(root, f"done{k}", metrics=_rows(1, 6)) for k in range(4)]
    aborted = [_run(root, f"try{k}", metrics=_rows(1), summary=None) for k in range(3)]  # newest, never ended
    picked = runs.resolve_runs([], runs_dir=root, newest=4)
    assert picked == [done[3], done[2], done[1], demo]  # newest first; the demo replaces the 4th newest
    assert runs.resolve_runs([], runs_dir=root, newest=8) == [*aborted[::-1], *done[::-1], demo]


def test_compare_prefers_finished_runs_to_runs_stopped_early_and_says_so(tmp_path):
    import json

    from dflash_lab.runs import lock as run_lock
    from dflash_lab.runs.run_state import run_status

    root = tmp_path / "runs"
    done = [_run(root, f"done{k}", metrics=_rows(1, 6)) for k in range(3)]
    stopped = [_run(root, f"tried{k}", steps=300, metrics=_rows(1, 14 + 3 * k), summary=None,
                    events=json.dumps({"event": "start"}) + "\n" + json.dumps({"event": "stopped", "resumable": True})
                    + "\n") for k in range(2)]  # newest: a Stop click after 14 and 17 steps
    for s in stopped:
        (s / run_lock.LOCK_FILE).write_text("")
    assert [run_status(s) for s in stopped] == ["stopped (resumable)"] * 2
    picked = runs.resolve_runs([], runs_dir=root, newest=4)
    assert picked == [stopped[1], done[2], done[1], done[0]]  # the 3 finished, then the newest stopped one
    note = runs.selection_note(runs.list_runs(root), 4)
    assert note.startswith("compared 4 run(s) of 5: 1 stopped, 3 finished")
    assert "left out 0" not in note and "finished runs first" in note
    note3 = runs.selection_note(runs.list_runs(root), 3)
    assert "3 finished" in note3 and "left out 2 newer" in note3 and "step 17" in note3 and "step 14" in note3


def test_run_folders_old_and_new_names_list_in_stamp_order(tmp_path):
    """New folders put the name first (`mydrafter-<stamp>-<id>`: the file browser shows the name); folders made
    before (`<stamp>-<name>-<id>`) still list, in the order of their stamps, and keep their labels."""
    root = tmp_path / "runs"
    old = root / "20260101T000000Z-demo-abc123"
    mid = root / "mydrafter-20260102T000000Z-def456"
    new = rundir.new_run_dir(root, "mydrafter")
    for d in (old, mid, new):
        d.mkdir(parents=True, exist_ok=True)
        (d / rundir.CONFIG_FILE).write_text("{}")
    assert new.name.startswith("mydrafter-2") and rundir.run_folder_parts(new)["name"] == "mydrafter"
    assert runs.list_runs(root) == [new, mid, old]  # newest first, by stamp whatever the layout
    assert rundir.run_folder_parts(old) == {"stamp": "20260101T000000Z", "name": "demo", "id": "abc123"}
    assert runs.run_label(old) == "demo-abc123 (0101-0000)" and runs.run_label(mid) == "mydrafter-def456 (0102-0000)"
