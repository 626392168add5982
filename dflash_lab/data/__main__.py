"""`python -m dflash_lab.data FILE --target T`: validate a data file against a target's chat template."""

from .tokenize import main

if __name__ == "__main__":
    raise SystemExit(main())
