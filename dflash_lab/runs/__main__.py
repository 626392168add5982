"""`python -m dflash_lab.runs list` or `python -m dflash_lab.runs compare`: list and compare run directories."""

from .listing import main

if __name__ == "__main__":
    raise SystemExit(main())
