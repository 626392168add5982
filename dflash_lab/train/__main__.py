"""`python -m dflash_lab.train` (alone, or one rank under torchrun): `--config <run dir>/config.json`, or
`--data FILE` for a new run dir."""

from .cli import run

if __name__ == "__main__":
    raise SystemExit(run())
