"""Where the tests find files of the checkout, whichever tests/ subfolder a test file lives in."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
