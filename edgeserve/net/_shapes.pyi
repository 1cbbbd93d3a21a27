def refuse(
    block: bytes | bytearray | memoryview,
    length: int,
    shapes: tuple[tuple[bytes, bytes, int, int, int, bytes, bytes], ...],
    /,
) -> tuple[int, bytes]: ...
