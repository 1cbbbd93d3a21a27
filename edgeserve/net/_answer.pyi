from typing import Any

Piece = dict[Any, bytes]
Tables = tuple[type, Any, type, Piece, dict[Any, tuple[bytes, bytes]], Piece, Piece]

def frame(request_id: int, result: Any, priority: int | None, tables: Tables, /) -> bytes | None: ...
