"""`edgeserve doctor`: check that this box can serve its config, each problem with its fix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgeserve.service.doctor_checks import FAIL, WARN, Context, Finding, run_checks

DEFAULT_CONFIG = Path("/etc/edgeserve/config.toml")

EPILOG = """\
checks: the config parses; the backend imports and starts (execution providers, TensorRT);
the GPU or Jetson is visible; every model's files verify and have a profile for this device's
fingerprint; Jetson power mode and locked clocks (where nvpmodel/jetson_clocks exist); the socket
directory and socket mode/group; every [[upstreams]] server's readiness; free memory against the
models' size; the systemd unit.

examples:
  edgeserve doctor                              # /etc/edgeserve/config.toml
  edgeserve doctor --config serve.toml
  edgeserve doctor --json | jq '.findings[] | select(.status == "FAIL")'

The last line is "all checks passed" only when nothing warned; otherwise "passed with N warnings"
or "N check(s) FAILED". Exit status 0 when nothing FAILs (warnings allowed), 1 otherwise.
"""


def format_text(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{f.status:<4}  {f.check:<18} {f.finding}")
        if f.fix and f.status != "ok":
            lines.append(f"{'':<24} fix: {f.fix}")
    failed = sum(f.status == FAIL for f in findings)
    warned = sum(f.status == WARN for f in findings)
    warnings = f"{warned} warning{'s' if warned != 1 else ''}"
    if failed:
        lines.append(f"{failed} check(s) FAILED" + (f", {warnings}" if warned else ""))
    else:
        lines.append(f"passed with {warnings}" if warned else "all checks passed")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = args.config if args.config is not None else DEFAULT_CONFIG
    ctx = Context(config_path=config)
    if args.unit is not None:
        ctx.unit_path = args.unit
    findings = run_checks(ctx)
    failed = any(f.status == FAIL for f in findings)
    if args.json:
        report = {"config": str(config), "ok": not failed, "findings": [f.to_dict() for f in findings]}
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(format_text(findings))
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check that this box can serve its config, with a fix for each problem",
        description="Check the config, backend, device, model files and profiles, clocks, socket, "
        "memory and the systemd unit; print ok/warn/FAIL per check with the command that fixes it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, default=None, help=f"server TOML file (default: {DEFAULT_CONFIG})"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    parser.add_argument(
        "--unit",
        type=Path,
        default=None,
        help="the unit file to check (default: /etc/systemd/system/edgeserve.service)",
    )
    parser.set_defaults(func=run)
