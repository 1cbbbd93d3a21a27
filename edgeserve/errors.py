"""Errors a user can act on, and the error boundary every entry point runs its command through.

Each error names the file, key or value at fault and says what to run. The boundary (`guarded`):
`edgeserve`, `edgeserve-profile` and `python -m edgeserve.demo` run their command through it.
What a user can act on (edgeserve's own errors, a busy port, a missing file or directory, a refused
connection, bad TOML, an optional module that is not installed) prints one line,
`<prog>: error: <what>: <fix>`, and exits 1. Anything else is a bug in edgeserve: it prints one line
saying so and asking for a report (exit 70) instead of a traceback. `--debug` or EDGESERVE_DEBUG=1
re-raises, so the full traceback is there when it is wanted.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from collections.abc import Callable


class EdgeServeError(Exception):
    """Base class of every error edgeserve raises on purpose."""


class RepositoryError(EdgeServeError):
    """A model repository file is missing, truncated, corrupt or does not match its manifest."""


class ProfileError(EdgeServeError):
    """A profile table is missing, stale (another device or manifest) or malformed."""


class InputError(EdgeServeError):
    """A request's tensor has the wrong dtype or shape for the model."""


class BackendUnavailableError(EdgeServeError):
    """The requested backend or execution provider is not installed on this machine."""


class ListenError(EdgeServeError, OSError):
    """A listener could not be opened; the message names the address, the config key and the fix."""


def listen_failure(key: str, address: str, exc: OSError) -> ListenError:
    """One sentence for a listener that failed to open: which key, which address, what to change."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        fix = (
            f"another program (or another edgeserve) already listens on {address}; "
            f"stop it or set {key} to a free port"
        )
    elif exc.errno in (errno.EACCES, errno.EPERM):
        fix = f"ports below 1024 need root; set {key} to a port above 1024"
    elif exc.errno == errno.EADDRNOTAVAIL:
        fix = f"that address is not on this machine; set {key} to 127.0.0.1:PORT or one of its addresses"
    else:
        fix = f"set {key} to another address"
    return ListenError(exc.errno, f"{key} {address}: cannot listen ({reason}): {fix}")


class MissingDependencyError(EdgeServeError):
    """An optional dependency (matplotlib, Pillow, torch) is needed by an option and is not installed."""


DEBUG_ENV = "EDGESERVE_DEBUG"
EXIT_ERROR = 1
EXIT_BUG = 70  # EX_SOFTWARE
EXIT_INTERRUPTED = 130

# Top-level module -> the extra of setup.cfg that installs it.
EXTRAS = {
    "matplotlib": "plot",
    "PIL": "image",
    "torch": "export",
    "onnx": "export",
    "onnxscript": "export",
    "sklearn": "export",
    "cuda": "tensorrt",
    "tritonclient": "interop",
}

_OS_FIXES = {
    errno.EADDRINUSE: "another program listens there; stop it or choose another port",
    errno.EADDRNOTAVAIL: "that address is not on this machine; use 127.0.0.1 or one of its addresses",
    errno.ENOENT: "check the path (a missing directory can be made with mkdir -p)",
    errno.EACCES: "run as a user who may use it, or change its owner or mode",
    errno.EPERM: "run as a user who may use it, or change its owner or mode",
    errno.ECONNREFUSED: "nothing listens there; start `edgeserve serve --config FILE` or fix the target",
    errno.ENOSPC: "free some disk space",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EISDIR: "give a file, not a directory",
}


def positive_int_arg(text: str) -> int:
    """An argparse `type` for options that take a whole number >= 1, with a message naming the value."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def debug_requested(flag: bool = False) -> bool:
    """True with --debug or EDGESERVE_DEBUG set to anything but empty or 0."""
    return flag or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def install_hint(module: str) -> str:
    top = module.split(".")[0]
    extra = EXTRAS.get(top)
    return f"pip install 'edgeserve[{extra}]'" if extra else f"pip install {top}"


def require_module(module: str, option: str, instead: str | None = None) -> None:
    """MissingDependencyError now, before any work, if `option` needs `module` and it cannot be imported.

    `instead` is the other way out (default: "drop <option>").
    """
    try:
        importlib.import_module(module)
    except ImportError:
        other = instead if instead is not None else f"drop {option}"
        raise MissingDependencyError(
            f"{option} needs {module}, which is not installed here: {install_hint(module)} (or {other})"
        ) from None


def _os_sentence(exc: OSError) -> str:
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or str(exc) or type(exc).__name__
    fix = _OS_FIXES.get(exc.errno or -1)
    text = f"{where}: {what}" if where else what
    return f"{text}: {fix}" if fix else text


def explain(exc: BaseException) -> str | None:
    """The one sentence for an error the user or the environment caused; None for a bug."""
    if isinstance(exc, EdgeServeError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"the module {exc.name!r} is not installed here: {install_hint(exc.name)}"
    if type(exc).__name__ == "TOMLDecodeError":
        return f"not valid TOML ({exc}): fix the file at that line"
    if isinstance(exc, (TimeoutError, ConnectionError)) and not exc.args:
        return f"{type(exc).__name__}: the other side did not answer; check that the server runs"
    if isinstance(exc, OSError):
        return _os_sentence(exc)
    return None


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def guarded(prog: str, call: Callable[[], int | None], debug: bool = False) -> int:
    """Run `call`; turn what `explain` knows into one line on stderr and an exit status."""
    debug = debug_requested(debug)
    try:
        return int(call() or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `... | head`: the reader left, nothing is wrong
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (keeps interpreter shutdown from failing again)
        return 0
    except Exception as exc:
        if debug:
            raise
        sentence = explain(exc)
        if sentence is None:
            print(
                f"{prog}: internal error ({type(exc).__name__}: {_brief(exc)}); this is a bug in edgeserve: "
                f"rerun with --debug (or {DEBUG_ENV}=1) for the traceback and report it",
                file=sys.stderr,
            )
            return EXIT_BUG
        print(f"{prog}: error: {sentence}", file=sys.stderr)
        return EXIT_ERROR
