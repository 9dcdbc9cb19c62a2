"""nbddp command line: turn the stage notebooks into one DDP-safe script and run it.

    python pipeline.py export [--notebooks notebooks] [--out generated] [--check] [--force]

Each subcommand parses its flags and calls the library; bad input exits 2 with the error's message.
"""
import argparse
import sys

from nbddp.errors import NbddpError
from nbddp.export import export


def add_export_command(subcommands) -> None:
    command = subcommands.add_parser(
        "export",
        help="write generated/train.py (and its source map) from the stage notebooks",
        description="Export notebooks/NN_*.ipynb, in name order, to one DDP-safe script for torchrun.",
    )
    command.add_argument("--notebooks", default="notebooks", help="folder of the stage notebooks (default: notebooks)")
    command.add_argument("--out", default="generated", help="folder to write train.py into (default: generated)")
    command.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the generated files are not what export writes"
    )
    command.add_argument("--force", action="store_true", help="overwrite a train.py that was edited by hand")
    command.set_defaults(run=run_export)


def run_export(args) -> int:
    result = export(args.notebooks, args.out, check=args.check, force=args.force)
    if not args.check:
        print(result.report.text(result.script_path.as_posix()))
        return 0
    if result.stale:
        stale = "\n".join(f"  {line}" for line in result.stale)
        print(f"generated files are stale; run `python pipeline.py export`:\n{stale}", file=sys.stderr)
        return 1
    print(f"{args.out} is up to date with {args.notebooks}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline.py", description=__doc__.splitlines()[0])
    subcommands = parser.add_subparsers(dest="command", required=True)
    add_export_command(subcommands)
    return parser


def main(argv=None) -> int:
    """Run one subcommand; returns the exit status (argparse itself exits 2 on a bad flag)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except NbddpError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_status


if __name__ == "__main__":
    sys.exit(main())
