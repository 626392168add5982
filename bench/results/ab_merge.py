"""What a results folder's merge_eval.py shares: one arm-metrics.tgz from this folder's last call and the baseline
arm's run folders out of another folder's eval/arm-metrics.tgz (an arm trained the same day on the same data pool)."""
import io
import tarfile
from pathlib import Path


def merge_arm_metrics(out: Path, this_run: Path, base: Path, base_arm: str) -> None:
    """Writes `out` (a .tgz) with every file of `this_run` and those of `base` under runs/<stamp>-<base_arm>-<id>/."""
    with tarfile.open(out, "w:gz") as dst:
        for src, keep in ((this_run, lambda name: True), (base, lambda name: f"-{base_arm}-" in name)):
            with tarfile.open(src) as tgz:
                for m in tgz.getmembers():
                    if m.isfile() and keep(m.name):
                        dst.addfile(m, io.BytesIO(tgz.extractfile(m).read()))
