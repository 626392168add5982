"""`python -m dflash_lab.data FILE --target T`: validate a data file against a target's chat template."""

import sys

from .tokenize import DataError, load_dataset


def main(argv: list[str] | None = None) -> int:
    """Validate a data file and print its report (exit 2 with the problem when it cannot be read)."""
    import argparse

    from dflash_lab.target.load import TargetLoadError, load_tokenizer

    p = argparse.ArgumentParser(description="Validate chat data against a target's chat template; print the report.")
    p.add_argument("data", help='data file/dir, or "tiny"')
    p.add_argument("--target", default="tiny", help='target whose tokenizer/template is used (default "tiny")')
    p.add_argument("--seq-len", type=int, default=3072)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--format", default="auto", choices=["auto", "openai", "sharegpt"])
    p.add_argument("--thinking", choices=["on", "off", "template"], default="template",
                   help="enable_thinking passed to the template (template = do not pass it)")
    a = p.parse_args(argv)
    thinking = {"on": True, "off": False, "template": None}[a.thinking]
    try:  # what this check exists to find is the answer, not a crash: the problem (and the report), exit 2
        data = load_dataset(load_tokenizer(a.target), a.data, seq_len=a.seq_len, block_size=a.block_size,
                            enable_thinking=thinking, data_format=a.format, log=print)
    except (DataError, TargetLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(data.report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
