from typing import Any

def parse(
    buffer: bytes | bytearray | memoryview,
    start: int,
    end: int,
    table: tuple[tuple[bytes, str, Any, bytes, tuple[int, ...], int], ...],
    /,
) -> tuple[int, str, Any, int, float | None, int | None] | None: ...
