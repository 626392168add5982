"""Optional metric sinks where researchers already look: TensorBoard event files and W&B (offline mode).

Switched on by `TrainConfig.metric_sinks`, e.g. `("tensorboard",)`; the config checks the names and that the
package is installed (the error names the pip command). Each sink has two methods, `log(record)` and `close()`, and
gets the same records as metrics.jsonl (every `log_every` steps, plus the first, last and evaluation steps):

    <run_dir>/tensorboard/   events.out.tfevents.*    `tensorboard --logdir runs/` shows every run
    <run_dir>/wandb/         offline run              `wandb sync <run_dir>/wandb/offline-run-*` uploads it later

Every finite number in a record becomes a scalar tagged by its key (`loss`, `sim_tau`, `mem_gb/cuda:0`, ...) at the
record's step and wall time; lists and strings stay in metrics.jsonl only. A sink that fails while training warns
once and is switched off: a full disk or a W&B problem never stops a run (metrics.jsonl keeps everything).
"""

from __future__ import annotations

import math
from pathlib import Path

from dflash_lab.config.feature_checks import sink_problem

SKIP_KEYS = ("step", "time")


def scalars(record: dict) -> dict[str, float]:
    """The finite numbers of a record, by key (bools, lists, strings and the step/time keys left out)."""
    out = {}
    for k, v in record.items():
        if k in SKIP_KEYS or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


class TensorBoardSink:
    """Scalars into TensorBoard event files (torch's SummaryWriter; needs the `tensorboard` package)."""

    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10)

    def log(self, record: dict) -> None:
        step, walltime = int(record["step"]), record.get("time")
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=step, walltime=walltime)

    def close(self) -> None:
        self.writer.close()  # flushes


class WandbSink:
    """Scalars into an offline W&B run under <run_dir>/wandb (nothing leaves the machine; `wandb sync` later)."""

    def __init__(self, run_dir: str | Path, *, name: str, config: dict | None = None):
        import wandb

        self.run = wandb.init(mode="offline", dir=str(run_dir), name=name, config=config or {}, reinit="create_new")

    def log(self, record: dict) -> None:
        self.run.log(scalars(record), step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


class FanOut:
    """The run's JSONL sink plus the optional ones, behind the same two methods."""

    def __init__(self, first, extra: list, log=print):
        self.first, self.extra, self._log = first, list(extra), log

    def log(self, record: dict) -> None:
        if self.first is not None:
            self.first.log(record)
        for sink in list(self.extra):
            try:
                sink.log(record)
            except Exception as e:  # noqa: BLE001 - a metric sink must never stop training
                self.extra.remove(sink)
                self._log(f"WARNING: metric sink {type(sink).__name__} failed ({type(e).__name__}: {e}); switched "
                          "off for this run (metrics.jsonl still has every record)")

    def close(self) -> None:
        if self.first is not None:
            self.first.close()
        for sink in self.extra:
            sink.close()


def with_sinks(jsonl_sink, names: tuple[str, ...], run_dir: str | Path | None, *, config: dict | None = None,
               log=print):
    """`jsonl_sink` alone when no sinks are asked for (or there is no run dir to write into), else a FanOut."""
    if not names or run_dir is None:
        return jsonl_sink
    run_dir = Path(run_dir)
    extra = []
    for name in names:
        problem = sink_problem(name)
        if problem is not None:  # the config checked it; a package removed since then still gets a clear error
            raise RuntimeError(f"TrainConfig.metric_sinks={names!r}: {problem}")
        if name == "tensorboard":
            extra.append(TensorBoardSink(run_dir / "tensorboard"))
        else:
            extra.append(WandbSink(run_dir, name=run_dir.name, config=config))
    return FanOut(jsonl_sink, extra, log=log)
