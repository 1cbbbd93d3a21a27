"""The socket front's tuning: the numbers behind its turn budget, its refusals and its admission.

Frozen, handed to `Frontend(settings=...)` once (the defaults are what `edgeserve serve` runs):
nothing reads a module global, so a test or a benchmark sets a value for one front without
patching the others. Where a value came from a measurement, its comment says which
(docs/runtime.md, "The path under overload"; docs/overload-journal.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RefusalSettings:
    """Refusing the frames past a connection's window (net/refusals.py)."""

    refusals_per_frame: int = 8  # refusals past the window count as one frame of that budget (~8x cheaper)
    # Refusals of frames that match one of their connection's learned FrameShapes, checked
    # block_min to block_max at a time (below that, without the compiled check, numpy's per-call
    # cost is more than decoding them), count 64 to a frame of the turn's budget.
    block_refusals_per_frame: int = 64
    block_min: int = 16
    block_max: int = 512
    learn_after: int = 16  # frames refused one by one between two learnings of a shape
    # A client that interleaves a few kinds of frames (models, priorities) gets a shape for each
    # within about a hundred frames. Past FrameShapes.MAX_PER_LENGTH learnings with no block of
    # block_min frames since, the frames' structure itself varies (an int that changes, fields in
    # another order): then each further learning doubles the frames refused one by one before the
    # next block and the next learning (backoff, up to 2^max_backoff), so such a client costs
    # about what it did without shapes.
    max_backoff: int = 6


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """A connection's window and the hold of a flood (net/admission.py)."""

    # A connection that sends this many frames past its window in one read floods; while the other
    # clients sending do not (no flooding read for polite_s, data in the last second), the flood's
    # socket is left unread for flood_pause_s (the kernel holds its frames, and the frames of its
    # last read wait in its buffer) so the loop's time goes to the polite clients, and for polite_s
    # after each hold its window is flood_window, so that its requests do not fill the queues the
    # polite clients' wait in (docs/runtime.md). Beside another flood none is held
    # (Admission.polite_others): each keeps being read (its frames stay fresh), with a window of
    # shared_flood_window for polite_s while a polite client is around. Nor is a client held whose
    # refusals number less than flood_ratio times what its full window let through
    # (FloodTally.floods_heavily): a hold would idle the executor it can use.
    flood_frames: int = 16
    # With [listen] share_total, a connection's window below the total is its even share among the
    # clients that sent in the last sending_s, counted every sending_every_s (Admission.sending).
    sending_s: float = 0.25
    sending_every_s: float = 0.01
    flood_pause_s: float = 0.05
    flood_ratio: int = 8
    polite_s: float = 0.25  # also the period of the FloodTally counts ("lately": one to two of them)
    flood_window: int = 1
    shared_flood_window: int = 2
    # A light client: lately light_track or more requests accepted and at most one refused for
    # every light_ratio accepted; its bursts pass its even share of the total (a camera at 0.1x
    # beside floods was refused a quarter of its frames at its share).
    light_track: int = 16
    light_ratio: int = 4


@dataclass(frozen=True, slots=True)
class FrontSettings:
    """All of one socket front's tuning (Frontend)."""

    frames_per_turn: int = 32  # frames handled per loop turn before other callbacks run (~0.3 ms of work)
    # With at most this many connections open, a full window's refusals wait a loop turn
    # (Connection._defer_refusals).
    defer_refusals: int = 4
    write_high_water: int = 1024 * 1024  # bytes buffered for one client before reading pauses
    fail_linger_s: float = 2.0  # after an error message, wait this long for the peer to close
    close_read_bytes: int = 4 * 1024 * 1024  # what a close still reads from the kernel (take_received)
    refusals: RefusalSettings = field(default_factory=RefusalSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
