"""`torchrun ... -m dflash_lab.train --run-dir DIR`: one rank of a distributed run."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
