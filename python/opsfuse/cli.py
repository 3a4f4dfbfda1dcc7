"""The ``python -m opsfuse`` command line: one module per subcommand in ``opsfuse.commands``,
each with ``register(subparsers)`` that adds its parser and sets ``func``."""

from __future__ import annotations

import argparse
import importlib
import sys

# Order shown in --help.
COMMANDS = ("demo", "rewrite", "check", "golden", "bench", "info")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m opsfuse",
        description="Fuse attention subgraphs of ONNX models into one FusedAttention op, and check the result.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"opsfuse.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
