"""`edgeserve install-service`: install edgeserve as a systemd service on this box.

The plan is a list of steps (write a file, run a command, or a note), printed by --dry-run and
carried out otherwise, so what the dry run shows is exactly what would happen. --root DIR writes
the files under DIR (tests, image builds) and skips the steps that change the running system.

Before it writes anything, every prerequisite is checked (systemd as PID 1, the binary's path, the
repository's path, the service user and the tools that make it); the first that fails stops it with
one sentence and its fix, and --dry-run prints the same checks. A step that fails after a write
rolls back what was written and created (files, directories, the user), in reverse order.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from edgeserve.errors import EdgeServeError

SERVICE = "edgeserve"
USER = "edgeserve"
UNIT_PATH = Path("/etc/systemd/system/edgeserve.service")
CONFIG_PATH = Path("/etc/edgeserve/config.toml")
GPU_GROUPS = ("video", "render")
HIDDEN_BY_PROTECT_HOME = (Path("/home"), Path("/root"), Path("/run/user"))

EPILOG = """\
steps (each printed as it runs):
  1. write /etc/systemd/system/edgeserve.service (ExecStart = this environment's edgeserve)
  2. write /etc/edgeserve/config.toml from the example, unless a config is already there
  3. create the system user edgeserve (no home, no shell) in the video/render groups
  4. create the repository directory named in the config and give it to that user
  5. systemctl daemon-reload; systemctl enable --now edgeserve
First every prerequisite is checked (systemd as PID 1, the binary, the repository path, the user);
nothing is written unless all pass. A failed step rolls back what the earlier ones wrote and created.

examples:
  edgeserve install-service --dry-run          # print every step and file, change nothing
  sudo edgeserve install-service               # install, enable and start
  sudo edgeserve install-service --no-start    # install and enable; start it later
  edgeserve install-service --root image/      # write the files under image/ (no useradd/systemctl)

Then: edgeserve doctor; journalctl -u edgeserve -f. Details: systemd/README.md in the source repository.
"""


class InstallError(EdgeServeError):
    """The service cannot be installed as asked; the message says what to do."""


@dataclass(frozen=True)
class Step:
    """One thing install-service does: write `content` to `path`, run `command`, or just say `note`."""

    what: str
    path: Path | None = None
    content: str | None = None
    mode: int = 0o644
    command: tuple[str, ...] = ()
    note: str | None = None
    undo: tuple[str, ...] = ()  # the command that reverses `command` on a rollback
    creates: Path | None = None  # the directory `command` creates (removed on a rollback if empty)

    def describe(self, show_content: bool = True) -> str:
        if self.path is not None and self.content is not None:
            head = f"write {self.path} (mode {self.mode:04o}): {self.what}"
            if not show_content:
                return head
            body = "".join(f"    | {line}\n" for line in self.content.splitlines())
            return f"{head}\n{body.rstrip()}"
        if self.command:
            return f"run   {shlex.join(self.command)}    # {self.what}"
        return f"note  {self.what}" + (f": {self.note}" if self.note else "")


def template_dir() -> Path:
    """The unit template and the example config, shipped as the package edgeserve.systemd."""
    from importlib.resources import files

    here = Path(str(files("edgeserve.systemd")))
    if not (here / "edgeserve.service").is_file():
        raise InstallError(
            f"{here}: the unit template is not there; reinstall edgeserve (pip install --force-reinstall "
            "edgeserve) or copy systemd/ from the source repository"
        )
    return here


def edgeserve_executable() -> Path:
    """The `edgeserve` script of the running interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).parent / "edgeserve"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside.absolute()
    found = shutil.which("edgeserve")
    if found is None:
        raise InstallError(
            "no `edgeserve` executable next to this Python or on PATH; install the package first: "
            "python3 -m venv /opt/edgeserve && /opt/edgeserve/bin/pip install <edgeserve checkout>"
        )
    return Path(found).absolute()


def render_unit(template: str, executable: Path, config: Path = CONFIG_PATH) -> str:
    """The unit with ExecStart pointing at `executable`."""
    exec_start = f"ExecStart={shlex.quote(str(executable))} serve --config {shlex.quote(str(config))}"
    rendered, n = re.subn(r"^ExecStart=.*$", exec_start, template, count=1, flags=re.MULTILINE)
    if n != 1:
        raise InstallError("the unit template has no ExecStart= line; restore systemd/edgeserve.service")
    return rendered


def repository_of(config_text: str, config_path: Path) -> Path:
    """The repository the config serves from (relative paths are relative to the config file)."""
    from edgeserve.config.server import tomllib

    try:
        value = tomllib.loads(config_text).get("repository", "engines")
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"{config_path}: not valid TOML ({exc}); fix it, then run again") from None
    path = Path(str(value))
    return path if path.is_absolute() else config_path.parent / path


def _in_tmp(path: Path) -> bool:
    return path.absolute().is_relative_to("/tmp") or path.absolute().is_relative_to("/var/tmp")


def _has_models(repository: Path) -> bool:
    return repository.is_dir() and any(repository.glob("*/manifest.json"))


def _under(root: Path, path: Path) -> Path:
    return root / path.relative_to("/") if path.is_absolute() else root / path


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def existing_groups(names: tuple[str, ...]) -> list[str]:
    out = []
    for name in names:
        try:
            grp.getgrnam(name)
        except KeyError:
            continue
        out.append(name)
    return out


def plan(
    *,
    root: Path | None,
    executable: Path,
    templates: Path,
    start: bool = True,
) -> list[Step]:
    """Every step, in order. `root` set: files under it, system-changing steps become notes."""
    base = root if root is not None else Path("/")
    steps: list[Step] = []
    for hidden in HIDDEN_BY_PROTECT_HOME:
        if executable.is_relative_to(hidden):
            steps.append(
                Step(
                    "warning",
                    note=f"{executable} is under {hidden}, which ProtectHome=yes hides from the service; "
                    "install edgeserve elsewhere (python3 -m venv /opt/edgeserve && "
                    "/opt/edgeserve/bin/pip install <checkout>) and run its install-service",
                )
            )
    template = (templates / "edgeserve.service").read_text()
    private_tmp = re.search(r"^PrivateTmp=(yes|true|1)\s*$", template, re.MULTILINE) is not None
    if private_tmp and _in_tmp(executable):
        steps.append(
            Step(
                "warning",
                note=f"{executable} is under /tmp, which PrivateTmp=yes replaces with an empty directory "
                "for the service: it could not start; install edgeserve elsewhere (python3 -m venv "
                "/opt/edgeserve && /opt/edgeserve/bin/pip install <checkout>) and run its install-service",
            )
        )
    unit = render_unit(template, executable)
    steps.append(Step("the systemd unit", path=_under(base, UNIT_PATH), content=unit))
    config_file = _under(base, CONFIG_PATH)
    if config_file.exists():
        config_text = config_file.read_text()
        steps.append(Step(f"keep the existing {config_file}", note="never overwritten; edit it by hand"))
    else:
        config_text = (templates / "config.toml").read_text()
        steps.append(Step("the example config", path=config_file, content=config_text, mode=0o640))
    repository = repository_of(config_text, CONFIG_PATH)
    if private_tmp and _in_tmp(repository):
        steps.append(
            Step(
                "warning",
                note=f"the repository {repository} is under /tmp, which PrivateTmp=yes hides from the "
                f"service; set repository in {CONFIG_PATH} to a path such as /var/lib/edgeserve/engines",
            )
        )
    empty = not _has_models(_under(base, repository))
    if empty and start:
        start = False
        steps.append(
            Step(
                "not starting the service",
                note=f"the repository {repository} has no exported models, so it would fail at start; "
                f"export and profile them as the service user (`edgeserve export --demo --repository "
                f"{repository}` then `edgeserve-profile --repository {repository} --threads N`), "
                f"list them in {CONFIG_PATH}, then `sudo systemctl start {SERVICE}`",
            )
        )
    groups = existing_groups(GPU_GROUPS)
    useradd = (
        "useradd",
        "--system",
        "--no-create-home",
        "--home-dir",
        "/var/lib/edgeserve",
        "--shell",
        "/usr/sbin/nologin",
        "--user-group",
        *(("--groups", ",".join(groups)) if groups else ()),
        USER,
    )
    system_steps: list[Step] = []
    if user_exists(USER):
        steps.append(Step(f"user {USER} exists", note="not created again"))
        if groups:
            system_steps.append(
                Step("GPU device groups for the user", command=("usermod", "-aG", ",".join(groups), USER))
            )
    else:
        system_steps.append(
            Step(
                "the service user, in the GPU groups that exist here", command=useradd, undo=("userdel", USER)
            )
        )
    system_steps += [
        Step("the model repository", command=("mkdir", "-p", str(repository)), creates=repository),
        Step(
            "the service user owns the repository", command=("chown", "-R", f"{USER}:{USER}", str(repository))
        ),
        Step("config readable by the service user", command=("chgrp", USER, str(CONFIG_PATH))),
        Step(
            "systemd reads the new unit",
            command=("systemctl", "daemon-reload"),
            undo=("systemctl", "daemon-reload"),
        ),
        Step(
            "enable at boot" + (" and start now" if start else " (not started now; see above or --no-start)"),
            command=("systemctl", "enable", *(("--now",) if start else ()), SERVICE),
        ),
    ]
    if root is None:
        return steps + system_steps
    skipped = "; ".join(shlex.join(s.command) for s in system_steps)
    steps.append(
        Step("skipped under --root (run on the target system)", note=skipped),
    )
    return steps


@dataclass(frozen=True)
class Check:
    """One prerequisite: what was checked, whether it holds, and (when not) the sentence with its fix."""

    what: str
    ok: bool
    problem: str = ""

    def describe(self) -> str:
        return f"check {'ok    ' if self.ok else 'FAILED'} {self.what}" + (
            "" if self.ok else f": {self.problem}"
        )


def systemd_is_pid1() -> bool:
    """What sd_booted(3) tests: systemd made /run/systemd/system (it runs as PID 1)."""
    return Path("/run/systemd/system").is_dir()


def _pid1_name() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def prerequisites(*, root: Path | None, executable: Path, templates: Path) -> list[Check]:
    """Everything install-service needs before it writes anything; under --root only the files'."""
    base = root if root is not None else Path("/")
    checks: list[Check] = []
    # the binary ExecStart runs
    runnable = executable.is_file() and os.access(executable, os.X_OK)
    checks.append(
        Check(
            f"the binary {executable} exists and is executable",
            runnable,
            f"{executable} is not an executable file; give the edgeserve script of the environment the "
            "service should run with --executable PATH (e.g. /opt/edgeserve/bin/edgeserve)",
        )
    )
    hidden = next((h for h in HIDDEN_BY_PROTECT_HOME if executable.is_relative_to(h)), None)
    if root is None and hidden is not None:
        checks.append(
            Check(
                f"the binary is outside {hidden}",
                False,
                f"{executable} is under {hidden}, which the unit's ProtectHome=yes hides from the service; "
                "install edgeserve elsewhere (python3 -m venv /opt/edgeserve && /opt/edgeserve/bin/pip "
                "install <checkout>) and run /opt/edgeserve/bin/edgeserve install-service",
            )
        )
    if root is None and _in_tmp(executable):
        checks.append(
            Check(
                "the binary is outside /tmp",
                False,
                f"{executable} is under /tmp, which the unit's PrivateTmp=yes replaces with an empty "
                "directory for the service; install edgeserve elsewhere (python3 -m venv /opt/edgeserve "
                "&& /opt/edgeserve/bin/pip install <checkout>) and run its install-service",
            )
        )
    # where the files go
    for target in (UNIT_PATH, CONFIG_PATH):
        where = _nearest_existing(_under(base, target).parent)
        fine = where.is_dir() and os.access(where, os.W_OK)
        checks.append(
            Check(
                f"{_under(base, target)} can be written",
                fine,
                f"cannot write {_under(base, target)}: {where} is not a writable directory; run as root or "
                "choose another --root",
            )
        )
    # the repository named in the config (the existing one, else the example's)
    config_file = _under(base, CONFIG_PATH)
    try:
        config_text = (
            config_file.read_text() if config_file.exists() else (templates / "config.toml").read_text()
        )
        repository = repository_of(config_text, CONFIG_PATH)
        problem = ""
        existing = _nearest_existing(_under(base, repository))
        if _under(base, repository).exists() and not _under(base, repository).is_dir():
            problem = (
                f"the repository {repository} is a file, not a directory; set repository in {CONFIG_PATH}"
            )
        elif not existing.is_dir():
            problem = f"the repository {repository} cannot be created: {existing} is not a directory"
        checks.append(
            Check(f"the repository {repository} is a directory or can be made one", not problem, problem)
        )
    except (InstallError, OSError, UnicodeDecodeError) as exc:
        checks.append(Check("the config can be read", False, str(exc)))
    if root is not None:
        return checks
    # the running system: systemd, the tools, the user
    checks.append(
        Check(
            "systemd runs as PID 1",
            systemd_is_pid1(),
            f"systemd is not running here (PID 1 is {_pid1_name()!r}, /run/systemd/system is missing), so "
            "there is no service manager to install into; run `edgeserve serve --config FILE` under this "
            "box's own supervisor instead, or write the files for a systemd image with --root DIR",
        )
    )
    needed = ["systemctl", "chown", "chgrp", "mkdir"]
    if not user_exists(USER):
        needed += ["useradd", "userdel"]
    missing = [tool for tool in needed if shutil.which(tool) is None]
    checks.append(
        Check(
            f"the tools are on PATH ({', '.join(needed)})",
            not missing,
            f"{', '.join(missing)} not found on PATH; install them (apt-get install systemd passwd "
            "coreutils) or run from a root shell whose PATH has /usr/sbin",
        )
    )
    if user_exists(USER):
        checks.append(Check(f"the user {USER} exists (kept)", True))
    else:
        checks.append(Check(f"the user {USER} can be created (useradd)", "useradd" not in missing, ""))
    return checks


def failed_checks(checks: list[Check]) -> str | None:
    """One sentence for the first failed check (and how many more failed), else None."""
    bad = [c for c in checks if not c.ok]
    if not bad:
        return None
    more = f" ({len(bad) - 1} more check(s) failed: see --dry-run)" if len(bad) > 1 else ""
    return f"nothing was changed: {bad[0].problem}{more}"


def execute(steps: list[Step], out: TextIO | None = None) -> None:
    """Carry the steps out, printing each; a failing step rolls back what the earlier ones did
    (files restored or removed, created directories removed if empty, undo commands run) and
    stops with its output and what was rolled back."""
    stream = sys.stdout if out is None else out
    undo: list[tuple[str, Callable[[], object]]] = []
    for step in steps:
        print(step.describe(show_content=False), file=stream, flush=True)
        try:
            if step.path is not None and step.content is not None:
                _write(step, undo)
            elif step.command:
                made = _missing_dirs(step.creates) if step.creates is not None else []
                done = subprocess.run(step.command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise InstallError(
                        f"`{shlex.join(step.command)}` failed ({done.returncode}): "
                        f"{(done.stderr or done.stdout).strip()}"
                    )
                for directory in made:
                    undo.append((f"removed {directory}", lambda d=directory: d.rmdir()))
                if step.undo:
                    undo.append(
                        (shlex.join(step.undo), lambda c=step.undo: subprocess.run(c, capture_output=True))
                    )
        except (InstallError, OSError) as exc:
            message = str(exc) if isinstance(exc, InstallError) else f"{step.what}: {exc}"
            raise InstallError(f"{message}; {_roll_back(undo, stream)}") from None


def _missing_dirs(path: Path) -> list[Path]:
    """The directories `mkdir -p path` would create, deepest first (removed in that order)."""
    out = []
    path = path.absolute()
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def _write(step: Step, undo: list[tuple[str, Callable[[], object]]]) -> None:
    assert step.path is not None and step.content is not None
    for directory in reversed(_missing_dirs(step.path.parent)):
        directory.mkdir()
        undo.append((f"removed {directory}", lambda d=directory: d.rmdir()))
    if step.path.exists():
        old, mode = step.path.read_bytes(), step.path.stat().st_mode & 0o7777

        def restore(path: Path = step.path, old: bytes = old, mode: int = mode) -> None:
            path.write_bytes(old)
            path.chmod(mode)

        undo_step = (f"restored {step.path}", restore)
    else:
        undo_step = (f"removed {step.path}", step.path.unlink)
    tmp = step.path.with_name(step.path.name + ".tmp")
    tmp.write_text(step.content)
    tmp.chmod(step.mode)
    tmp.replace(step.path)
    undo.append(undo_step)


def _roll_back(undo: list[tuple[str, Callable[[], object]]], stream: TextIO) -> str:
    """Undo in reverse order; the sentence saying what was rolled back (and what could not be)."""
    if not undo:
        return "nothing had been changed"
    done, failed = [], []
    for what, action in reversed(undo):
        try:
            action()
        except OSError as exc:
            failed.append(f"{what} ({exc.strerror or exc})")
            continue
        done.append(what)
        print(f"undo  {what}", file=stream, flush=True)
    text = "rolled back: " + ", ".join(done)
    if failed:
        text += "; could not roll back: " + ", ".join(failed) + " (remove by hand)"
    return text


def run(args: argparse.Namespace) -> int:
    if args.root is None and not args.dry_run and os.geteuid() != 0:
        raise InstallError(
            "install-service changes /etc, users and systemd: run it as root (sudo edgeserve "
            "install-service), or see what it would do with --dry-run, or write under a directory with --root"
        )
    executable = args.executable or edgeserve_executable()
    templates = template_dir()
    checks = prerequisites(root=args.root, executable=executable, templates=templates)
    steps = plan(root=args.root, executable=executable, templates=templates, start=not args.no_start)
    if args.dry_run:
        print("dry run: nothing is changed; the checks made first:")
        for check in checks:
            print(check.describe())
        if (problem := failed_checks(checks)) is not None:
            reason = problem.removeprefix("nothing was changed: ")
            print(f"a real run would stop here, before writing anything: {reason}")
        print("the steps:")
        for step in steps:
            print(step.describe())
        return 0
    if (problem := failed_checks(checks)) is not None:
        raise InstallError(problem)
    execute(steps)
    if args.root is None:
        print(f"installed; check it with `edgeserve doctor` and `systemctl status {SERVICE}`")
    else:
        print(f"files written under {args.root}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "install-service",
        help="install edgeserve as a systemd service (unit, config, user)",
        description="Write the systemd unit and the example config, create the service user, "
        "give it the model repository and enable the service. Needs root unless --dry-run or --root.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dry-run", action="store_true", help="print each step and file; change nothing")
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="write the files under this directory and skip useradd/chown/systemctl (for image builds)",
    )
    parser.add_argument("--no-start", action="store_true", help="enable the service but do not start it")
    parser.add_argument(
        "--executable",
        type=Path,
        default=None,
        help="the edgeserve binary ExecStart runs (default: the one of this Python environment)",
    )
    parser.set_defaults(func=run)
