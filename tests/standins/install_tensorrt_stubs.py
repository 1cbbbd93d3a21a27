"""Install tensorrt-stubs for mypy into .venv/typestubs, and fix what keeps mypy from reading them.

Not `pip install tensorrt-stubs` into the venv: the wheel requires `tensorrt` itself (not installable
without NVIDIA's index), and its `tensorrt/__init__.pyi` folder would make `import tensorrt` succeed in
the venv as an empty namespace package, so `--backend auto` would think TensorRT is installed. So it
goes, without dependencies, into a folder only mypy reads (setup.cfg [mypy] mypy_path).

The generated stubs (pybind11-stubgen) need four fixes to be usable, each what TensorRT documents:
parameters named `in` (a syntax error), a required parameter after defaults, a module-level
`bool: DataType` that shadows the builtin (every `-> bool` would become invalid, so Any), and `Dims`:
"the TensorRT API can implicitly convert Python iterables to Dims objects" and Dims "behave like
Python tuples", so a `Dims` parameter also takes a tuple or list and a Dims is iterable.

Run by the Makefile (`make lint`, `make test`); `python tests/standins/install_tensorrt_stubs.py TARGET`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

VERSION = "10.13.0.35.1"


def patch(text: str) -> str:
    """The stub text of tensorrt_bindings/tensorrt.pyi with the fixes above."""
    text = re.sub(r"([(,] )in: ", r"\1in_: ", text)
    text = text.replace("channel_axis: int)", "channel_axis: int = ...)")
    text = re.sub(r"^bool: DataType.*\n", "", text, flags=re.MULTILINE)
    lines = []
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("def "):
            line = re.sub(r"(\w+): Dims([,)])", r"\1: Dims | tuple[int, ...] | list[int]\2", line)
        lines.append(line)
        if line.startswith("class Dims:"):
            lines.append("    def __iter__(self) -> typing.Iterator[int]: ...\n")
    return "".join(lines)


def main(target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            f"tensorrt-stubs=={VERSION}",
        ],
        check=True,
    )
    stub = target / "tensorrt_bindings" / "tensorrt.pyi"
    stub.write_text(patch(stub.read_text()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
