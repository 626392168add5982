"""--threads of every command that sets torch's CPU threads: one check (config/threads.py), argparse's one-line
error naming the value and the range, before anything loads."""

import pytest

from dflash_lab.config.threads import cpu_cores, threads_arg


def _mains():
    from dflash_lab.data.regenerate import main as regenerate
    from dflash_lab.data.self_prompts import main as self_prompts
    from dflash_lab.evaluation.evaluate import main as evaluate

    return {"regenerate": (regenerate, ["--data", "tiny", "--out", "x.jsonl"]),
            "self_prompts": (self_prompts, ["--target", "tiny", "--n", "4", "--out", "x.jsonl"]),
            "evaluate": (evaluate, ["some-run"])}


@pytest.mark.parametrize("command", ["regenerate", "self_prompts", "evaluate"])
@pytest.mark.parametrize("value", ["100000", "-1", "two"])
def test_a_bad_thread_count_is_one_argparse_error_in_every_command(command, value, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main, args = _mains()[command]
    with pytest.raises(SystemExit) as e:
        main(args + ["--threads", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --threads: --threads {value} is invalid: this machine has {cpu_cores()} CPU core(s)" in err
    assert f"Fix: 1..{cpu_cores()}" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_the_range_is_zero_to_the_cores_this_process_may_use(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert cpu_cores() == 3 and [threads_arg(v) for v in ("0", "1", "3")] == [0, 1, 3]
    with pytest.raises(Exception, match=r"--threads 4 is invalid: this machine has 3 CPU core\(s\)"):
        threads_arg("4")


def test_torch_threads_holds_inside_the_block_and_restores_after_even_on_an_error():
    import torch

    from dflash_lab.config.threads import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    with torch_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
