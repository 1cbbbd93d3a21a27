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
from edgeserve.errors import DEBUG_ENV, guarded

# Later issues append serve, send, bench, build-engines, install-service, doctor.
SUBCOMMAND_MODULES = (
    "edgeserve.export.cli",
    "edgeserve.importer.cli",
    "edgeserve.profiler.cli",
    "edgeserve.scheduler.cli",
    "edgeserve.tools.build_engines",
    "edgeserve.service.serve_cli",
    "edgeserve.tools.bench_cli",
    "edgeserve.tools.send_cli",
    "edgeserve.service.install",
    "edgeserve.service.doctor",
    "edgeserve.camera.cli",
    "edgeserve.exits.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgeserve",
        description=(
            "Serve several early-exit DNNs on one edge box under per-request deadlines. "
            "Typical flow: `edgeserve export` a model into the repository, measure it with "
            "`edgeserve-profile`, then serve it."
        ),
        epilog=(
            "A mistake prints one line `edgeserve: error: <what>: <fix>` and exits 1; --debug (or "
            "EDGESERVE_DEBUG=1) shows the traceback instead. The docs/*.md named in the help texts are in "
            "the source repository, not in the installed package."
        ),
    )
    parser.add_argument("--version", action="version", version=f"edgeserve {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"show the Python traceback of an error instead of one line (also {DEBUG_ENV}=1)",
    )
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
    # A user mistake or an environment problem is one line `edgeserve: error: <what>: <fix>`
    # (edgeserve.errors.guarded); --debug / EDGESERVE_DEBUG=1 shows the traceback.
    return guarded("edgeserve", lambda: args.func(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
