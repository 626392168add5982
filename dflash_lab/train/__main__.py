"""`torchrun ... -m dflash_lab.train --run-dir DIR`: one rank of a distributed run."""

from .cli import run

if __name__ == "__main__":
    raise SystemExit(run())
