"""Run directories: `runs/<name>-<UTC stamp>-<short id>/` holding config, env, metrics, checkpoints and notebooks.

    config.json          resolved TrainConfig            drafter_config.json   the drafter's shape
    env.json             git commit + dirty flag, package versions, driver, GPUs (names, UUIDs), CUDA_VISIBLE_DEVICES
    metrics.jsonl        one line per logged step         system.jsonl          GPU samples (gpu_monitor.py, GPU runs)
    events.jsonl         checkpoints, resumes, stops, interrupts, divergence, failed writes (one JSON line each)
    checkpoints/         step-XXXXXXX/ full checkpoints (checkpoint.py) + drafter.safetensors
    plots/               training.png                     summary.json          written by Trainer.finish()
    train.ipynb          the executed notebook (save_executed_notebook)

A resumed run continues in the SAME directory: metrics.jsonl is cut back to the checkpoint's step (the lines after
it are recomputed identically) and appended to; events.jsonl records the resume and any changed settings. A FRESH
run given a run_dir that already holds a run (metrics, events, checkpoints, a summary) is refused, naming
resume_from as the way to continue it: appending would mix the two runs' metrics, and evaluate / export would take
the old run's weights. `overwrite_run_dir=True` (Trainer) starts such a folder over: everything in it is deleted.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import lock as run_lock
from .folder_names import OLD_RUN_FOLDER, RUN_FOLDER, new_folder_name, run_folder_parts  # noqa: F401 (public)
from .run_files import clean_metrics, parse_jsonl, read_jsonl  # noqa: F401 (read_jsonl re-exported)

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SYSTEM_FILE = "system.jsonl"
EVENTS_FILE = "events.jsonl"
ENV_FILE = "env.json"
NOTEBOOK_ENV = "DFLASH_NOTEBOOK_OUTPUT"  # set by an in-process papermill.execute_notebook caller (see README)
RUNS_ENV = "DFLASH_LAB_RUNS"  # where runs go when runs_dir is left at its default "runs"
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding dflash_lab/ and notebooks/


def resolve_runs_dir(runs_dir: str | Path = "runs") -> Path:
    """Where `runs_dir` points, independent of the process's working directory (a notebook kernel runs in
    notebooks/): an absolute path as is; the default "runs" -> $DFLASH_LAB_RUNS if set, else <project>/runs; any
    other relative path -> under the project root. So `python -m dflash_lab.runs list` sees every run."""
    path = Path(runs_dir).expanduser()
    if path.is_absolute():
        return path
    if str(runs_dir) == "runs" and os.environ.get(RUNS_ENV):
        return Path(os.environ[RUNS_ENV]).expanduser().resolve()
    return PROJECT_ROOT / path
PACKAGES = ("dflash-lab", "torch", "transformers", "safetensors", "numpy", "nvidia-ml-py", "papermill", "nbclient",
            "ipykernel", "ipywidgets", "jupyterlab", "plotly", "matplotlib", "pandas")


def shown_path(path: str | Path) -> str:
    """A path as printed into a notebook that may be shared: relative to the project (`runs/x-.../STOP`, what a shell
    at the project's root types) when under it, else as it is. Files keep absolute paths; only what is shown changes."""
    p = Path(path)
    try:
        return str(p.relative_to(PROJECT_ROOT)) if p.is_absolute() else str(p)
    except ValueError:
        return str(p)


def new_run_dir(runs_dir: str | Path, name: str) -> Path:
    path = resolve_runs_dir(runs_dir) / new_folder_name(name, _dt.datetime.now(_dt.timezone.utc))
    (path / "checkpoints").mkdir(parents=True)
    (path / "plots").mkdir()
    return path


class RunDirUsed(RuntimeError):
    """A fresh run was pointed at a folder that already holds a run; the message names resume_from and the fix."""


def used_by_a_run(path: str | Path) -> list[str]:
    """What shows that a folder already holds a run: metric or event lines, checkpoints, a summary, evaluations.
    A config.json alone (written by a sweep or a torchrun launch before the run starts) does not count."""
    path = Path(path)
    found = [f for f in (METRICS_FILE, EVENTS_FILE) if (path / f).is_file() and (path / f).stat().st_size > 0]
    found += [f"{d}/" for d in ("checkpoints", "evals") if (path / d).is_dir() and any((path / d).iterdir())]
    return found + [f for f in ("summary.json",) if (path / f).is_file()]


def refuse_used_run_dir(path: str | Path, *, resume_from: str | Path | None = None, overwrite: bool = False) -> None:
    """For a run that does not continue `path` (a fresh run, or a resume of another folder): refuse a folder that
    already holds a run, or with `overwrite` delete everything in it (the caller holds its lock) and start clean."""
    path = Path(path)
    if resume_from is not None and Path(resume_from).resolve() == path.resolve():
        return  # a resume continues its own folder
    used = used_by_a_run(path)
    if not used:
        return
    if not overwrite:
        raise RunDirUsed(f"run_dir {str(path)!r} already holds a run ({', '.join(used)}): a fresh run there would "
                         "append to its metrics and keep its checkpoints, and evaluate / export would take the old "
                         f"weights. Fix: continue that run with resume_from={str(path)!r}; or leave run_dir unset "
                         "(a new folder is made) or pass another; or overwrite_run_dir=True to delete its contents "
                         "first.")
    for p in path.iterdir():
        if p.name != run_lock.LOCK_FILE:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def open_run_dir(run_dir: str | Path | None, *, runs_dir: str | Path, name: str, resume_from: Path | None = None,
                 resume_step: int = 0, overwrite: bool = False) -> tuple[Path, list[dict]]:
    """The run directory of a Trainer and the metric rows it continues from.

    `run_dir` given: that folder (created if needed); one that already holds another run is refused unless
    `overwrite` (refuse_used_run_dir). Resuming without one: the checkpoint's own run directory, its metrics.jsonl
    cut back to `resume_step`. Otherwise a new `runs_dir/<name>-<stamp>-<id>/`. This process takes the folder's lock
    (run_lock.py) first: another live process using it makes this raise RunDirLocked.
    """
    if run_dir:
        path = Path(run_dir)
    elif resume_from is not None:
        path = Path(resume_from)  # resuming continues the same run directory
    else:
        path = new_run_dir(runs_dir, name)
    run_lock.acquire(path)  # one process per run dir: a second run or resume is refused, naming the holder
    refuse_used_run_dir(path, resume_from=resume_from, overwrite=overwrite)
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    (path / "plots").mkdir(exist_ok=True)
    rows = resume_metrics(path, resume_step, source=resume_from) if resume_from is not None else []
    return path, rows


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict:
    from importlib import metadata

    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _nvml_gpus() -> tuple[str | None, list[dict]]:
    """(driver version, physical GPUs with names and UUIDs) from NVML; (None, []) without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVIDIA driver on this machine
        return None, []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({"nvml_index": i, "name": pynvml.nvmlDeviceGetName(h), "uuid": pynvml.nvmlDeviceGetUUID(h)})
        return pynvml.nvmlSystemGetDriverVersion(), gpus
    finally:
        pynvml.nvmlShutdown()


def environment_info() -> dict:
    """git commit + dirty flag, package versions, driver, GPUs (names, UUIDs), CUDA_VISIBLE_DEVICES."""
    import torch

    status = _git("status", "--porcelain", "--untracked-files=no")
    packages = package_versions()
    info = {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "git_dirty_files": status.splitlines()[:50] if status else [],
        "python": sys.version.split()[0], "platform": platform.platform(), "hostname": platform.node(),
        "packages": packages, "torch": torch.__version__, "transformers": packages.get("transformers"),
        "cuda": torch.version.cuda,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "cpu_count": os.cpu_count(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"cuda_index": i, "name": p.name, "uuid": str(getattr(p, "uuid", "")),
                                 "total_memory_gb": round(p.total_memory / 2**30, 1)})
    info["driver"], info["nvml_gpus"] = _nvml_gpus()
    return info


def write_json(path: Path, obj: dict) -> None:
    """Atomic JSON write (temp file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def log_event(run_dir: str | Path, event: str, **fields) -> None:
    """Append one event (checkpoint, resumed, stop_requested, interrupted, diverged, ...) to events.jsonl."""
    now = time.time()
    record = {"time": now, "utc": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(timespec="seconds"),
              "event": event, **fields}
    with open(Path(run_dir) / EVENTS_FILE, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def resume_metrics(run_dir: str | Path, step: int, source: str | Path | None = None, *, log=print) -> list[dict]:
    """Metric rows up to `step` of the run being resumed; in the same run dir, metrics.jsonl is cut back to them.

    Lines after the checkpoint were written by the killed process; the resumed run recomputes exactly those steps,
    so they are dropped (atomically) rather than duplicated. Torn or garbage lines, and rows out of step order, are
    dropped too and said through `log` (run_files.clean_metrics).
    """
    run_dir = Path(run_dir)
    if source is None:
        return []
    src = Path(source) / METRICS_FILE
    if not src.is_file():
        return []
    rows, lines = parse_jsonl(src)
    text = {r["_line"]: line for r, line in zip(rows, lines)}
    kept = clean_metrics(rows, max_step=step)
    past = kept.skipped.pop("past_steps", [])  # recomputed by the resumed run: expected, not damage
    if kept.note():
        log(f"NOTE: {kept.note()}")
    kept_lines = [text[r.pop("_line")] for r in kept]
    if Path(source).resolve() == run_dir.resolve() and (past or kept.skipped):
        tmp = src.with_name(src.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept_lines))
        os.replace(tmp, src)
    return list(kept)


# ---------------------------------------------------------------------------------------------------------------
# The executed notebook
# ---------------------------------------------------------------------------------------------------------------
_PM_OPTS_2 = {"-p", "--parameters", "-r", "--parameters_raw"}
_PM_OPTS_1 = {"-f", "--parameters_file", "-y", "--parameters_yaml", "-b", "--parameters_base64", "--engine",
              "--autosave-cell-every", "-k", "--kernel", "-l", "--language", "--cwd", "--stdout-file",
              "--stderr-file", "--log-level", "--start-timeout", "--start_timeout", "--execution-timeout"}


def papermill_output_from_argv(args: list[str], cwd: Path | None = None) -> Path | None:
    """The OUTPUT_PATH of a `papermill [OPTIONS] NOTEBOOK_PATH [OUTPUT_PATH]` command line (python -m too)."""
    try:
        start = next(i for i, a in enumerate(args[:3]) if Path(a).name in ("papermill", "papermill.exe")) + 1
    except StopIteration:
        return None
    positional, i = [], start
    while i < len(args):
        a = args[i]
        if a in _PM_OPTS_2:
            i += 3
        elif a in _PM_OPTS_1:
            i += 2
        elif a.startswith("-") and a != "-":
            i += 1
        else:
            positional.append(a)
            i += 1
    if len(positional) < 2 or positional[1] == "-" or "://" in positional[1]:
        return None
    out = Path(positional[1]).expanduser()
    return out if out.is_absolute() or cwd is None else cwd / out


def find_papermill_output() -> Path | None:
    """The notebook papermill is writing for this kernel: $DFLASH_NOTEBOOK_OUTPUT, else the parent's command line.

    Under the papermill CLI the kernel's parent process is papermill itself: its argv names the output (relative
    paths are resolved against papermill's working directory, not the kernel's `--cwd`). An in-process
    `papermill.execute_notebook(...)` has no such command line: the caller sets DFLASH_NOTEBOOK_OUTPUT before the
    call (the kernel inherits the environment).
    """
    explicit = os.environ.get(NOTEBOOK_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    ppid = os.getppid()
    try:
        argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
        cwd = Path(os.readlink(f"/proc/{ppid}/cwd"))
    except OSError:
        return None
    return papermill_output_from_argv([a.decode(errors="replace") for a in argv if a], cwd)


LAB_SESSION_ENV = "JPY_SESSION_NAME"  # jupyter_server gives each kernel it starts the path of its notebook


def find_lab_notebook() -> Path | None:
    """The notebook file a JupyterLab (jupyter_server) kernel was started for, or None: this process must be a kernel
    (a sweep's variant inherits the variable but is no notebook) and the file must exist."""
    name = os.environ.get(LAB_SESSION_ENV)
    if not name or "ipykernel" not in sys.modules:
        return None
    path = Path(name).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    return path if path.suffix == ".ipynb" and path.is_file() else None


def share_bases(notebook: Path, extra=()) -> dict[Path, str]:
    """Folders whose absolute paths an executed notebook should not carry, and what they become: the folder that
    holds the runs folder of the run the notebook lies in (so `runs/<run>/...` remains), the project root, the home
    directory (`~`), and `extra` (each -> "")."""
    bases = {Path(b).resolve(): "" for b in extra}
    for d in Path(notebook).resolve().parents:
        if (d / CONFIG_FILE).is_file():  # the run folder
            bases.setdefault(d.parent.parent, "")
            break
    bases.setdefault(PROJECT_ROOT, "")
    home = Path.home()
    if home != Path("/"):
        bases.setdefault(home, "~")
    return bases


def relative_paths(node, bases: dict[Path, str]):
    """Every string of a notebook (cells, outputs, metadata) with absolute paths under `bases` made relative, so an
    executed notebook names `runs/<run>/checkpoints/...` instead of one machine's folders. Image data is left as is.
    Longest base first: a run folder inside the project is relative to the runs folder's parent, not to the root."""
    order = sorted(((str(b).rstrip("/"), r) for b, r in bases.items() if str(b) not in ("", "/")),
                   key=lambda br: -len(br[0]))

    def fix(text: str) -> str:
        for base, repl in order:
            if base in text:
                text = text.replace(base + "/", repl + "/" if repl else "")
                text = re.sub(re.escape(base) + r"(?![\w.-])", repl or ".", text)
        return text

    def walk(x):
        if isinstance(x, str):
            return fix(x)
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            return {k: v if k.startswith("image/") else walk(v) for k, v in x.items()}
        return x

    return walk(node)


def shareable_copy(src: Path, dst: Path) -> None:
    """Copy a notebook, dropping widget state and widget views (GitHub refuses to render some of them), with paths
    relative (relative_paths)."""
    nb = relative_paths(json.loads(src.read_text()), share_bases(dst))
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        outs = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data and "application/vnd.jupyter.widget-view+json" in data:
                data.pop("application/vnd.jupyter.widget-view+json")
                if not data:
                    continue
            outs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outs
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, dst)


def save_executed_notebook(run_dir: str | Path, name: str = "train.ipynb", *, wait_for_final: bool = True,
                           source: str | Path | None = None) -> Path | None:
    """Copy the notebook papermill is writing into the run dir (or, in a JupyterLab kernel, the notebook as last
    saved); returns the copy, or None when this process runs no notebook.

    Called from inside the notebook, the copy holds every cell up to the one calling this (papermill saves after
    each cell). With `wait_for_final`, a small detached process waits for this kernel to exit and for papermill's
    final write (metadata.papermill.end_time set), then copies again, so the run dir ends up with the complete
    executed notebook. Widget state is stripped so the copy renders on GitHub. If papermill writes its output
    straight into the run dir, there is nothing to copy.
    """
    src = Path(source) if source else find_papermill_output()
    if src is None and source is None:
        src, wait_for_final = find_lab_notebook(), False  # the saved file: what the user last saved of it
    if src is None or not src.is_file():
        return None
    dst = Path(run_dir) / name
    if src.resolve() == dst.resolve():
        return dst
    shareable_copy(src, dst)
    if wait_for_final:
        subprocess.Popen([sys.executable, "-m", "dflash_lab.runs.rundir", "--copy-final", str(src), str(dst),
                          str(os.getpid())], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    return dst


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:  # a zombie (exited, not yet reaped) counts as gone
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def copy_when_final(src: Path, dst: Path, kernel_pid: int, *, timeout_s: float = 120.0, poll_s: float = 0.5) -> bool:
    """Wait for `kernel_pid` to exit, then for papermill's final write of `src`; copy it to `dst`."""
    while _pid_alive(kernel_pid):
        time.sleep(poll_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            meta = json.loads(src.read_text()).get("metadata", {}).get("papermill", {})
        except (OSError, json.JSONDecodeError):
            meta = {}
        if meta.get("end_time"):
            shareable_copy(src, dst)
            return True
        time.sleep(poll_s)
    return False


if __name__ == "__main__":  # the detached copier started by save_executed_notebook
    if len(sys.argv) == 5 and sys.argv[1] == "--copy-final":
        copy_when_final(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
