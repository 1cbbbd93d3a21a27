"""Reading and writing the repository's small JSON files safely."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from edgeserve.errors import EdgeServeError


def read_json_object(path: Path, error: type[EdgeServeError], what: str, fix: str) -> dict[str, Any]:
    """The JSON object in `path`, or `error` naming the file, what went wrong and `fix`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{path}: no {what} here; {fix}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{path}: not valid JSON ({exc.msg.removesuffix(' at')} at line {exc.lineno}): "
            f"the file is truncated or corrupt; {fix}"
        ) from None
    if not isinstance(data, dict):
        raise error(f"{path}: a {what} is a JSON object; {fix}")
    return data


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename, so a crash never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
