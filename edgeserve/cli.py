"""`edgeserve`: the command group. Each subcommand lives next to the code it drives.

A subcommand module exposes `add_parser(subparsers)`, which registers its parser and sets
`func(args) -> int`. Modules are imported only to build the parser, and heavy imports (torch)
happen inside `func`, so `edgeserve --help` stays fast on a box that has no torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from edgeserve import __version__
from edgeserve.errors import EdgeServeError

# Later issues append serve, send, bench, build-engines, install-service, doctor.
SUBCOMMAND_MODULES = (
    "edgeserve.export.cli",
    "edgeserve.profiler.cli",
    "edgeserve.scheduler.cli",
    "edgeserve.tools.build_engines",
    "edgeserve.service.serve_cli",
    "edgeserve.tools.bench_cli",
    "edgeserve.tools.send_cli",
    "edgeserve.service.install",
    "edgeserve.service.doctor",
    "edgeserve.camera.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgeserve",
        description=(
            "Serve several early-exit DNNs on one edge box under per-request deadlines. "
            "Typical flow: `edgeserve export` a model into the repository, measure it with "
            "`edgeserve-profile`, then serve it."
        ),
    )
    parser.add_argument("--version", action="version", version=f"edgeserve {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EdgeServeError as exc:
        print(f"edgeserve: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgeserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
