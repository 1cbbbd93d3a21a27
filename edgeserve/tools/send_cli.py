"""`edgeserve send`: send an image, a .npy file or synthetic inputs to a running server; print answers."""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  edgeserve send --target unix:///run/edgeserve.sock --model digits-m --synthetic 5
  edgeserve send --target tcp://127.0.0.1:7070 --model digits-m --npy samples.npy --deadline-ms 20
  edgeserve send --target unix:///run/edgeserve.sock --model digits-m --image frame.jpg --capture-now
  edgeserve send --target unix:///run/edgeserve.sock --model digits-m --npy samples.npy --out answers.npz
  edgeserve send --target unix:///run/edgeserve.sock --model digits-m --synthetic 2 --full

--npz takes one array per input, named as the model's inputs (the hello reply lists them; numpy.savez
names them with keywords), each one sample or a stack of N; an input without a batch dimension is given
whole and repeated for every sample.
--npy takes one sample shaped like the model input, or a stack of them (N, ...); another float dtype
(float64 from numpy) is converted to the model's with a note; uint8 arrays shaped (H, W, C) are sent
as camera frames. --image decodes a picture (needs Pillow) to uint8 in the channels the server's
[models.<name>.preprocess] table names (rgb, bgr or gray) and sends it as a camera frame.
At most the server's window (hello max_in_flight_total, else max_in_flight) is in flight at once, and
--synthetic makes each input only when a slot frees: any N runs in constant memory, never `rejected`
for the window.
One line per answer: id, status, exit, top-1 class and its logit (for a model whose output is one vector
of class scores; else each output's name and shape), client latency. --full prints every output's
values under its line; --out FILE saves them: FILE.npz (arrays named r<k> for the k-th input, or
r<k>.<output> for a model with several outputs; numpy.load reads it) or FILE.jsonl (one JSON object per
answer: id, status, exit, late, ms, error and outputs as nested lists).
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "send",
        help="send inputs to a running server and print the answers",
        description="Send one or more inputs to `edgeserve serve` (pipelined) and print each answer.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", required=True, help="unix:///path/to.sock or tcp://host:port")
    parser.add_argument("--token", help="the server's listen.token, if it has one")
    parser.add_argument("--model", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", type=Path, help="an image file (PNG, JPEG, ...), sent as a camera frame")
    source.add_argument("--npy", type=Path, help="a .npy file: one sample or a stack of samples")
    source.add_argument(
        "--npz", type=Path, help="a .npz file with one array per input name (a model with several inputs)"
    )
    source.add_argument("--synthetic", type=int, metavar="N", help="N random inputs of the model's shape")
    parser.add_argument("--deadline-ms", type=float, help="budget per request (default: the model's SLO)")
    parser.add_argument(
        "--capture-now", action="store_true", help="send capture_ts = now instead of a budget"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answers")
    parser.add_argument("--full", action="store_true", help="print every output's values under its line")
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="save the answers' outputs: FILE.npz or FILE.jsonl"
    )
    parser.set_defaults(func=run)


def _note(text: str) -> None:
    print(f"send: {text}", file=sys.stderr, flush=True)


def _image(path: Path, camera: dict[str, Any] | None, model: str) -> list[Any]:
    """The picture as a uint8 HWC frame in the channel order the server's preprocess expects."""
    import numpy as np
    from PIL import Image

    from edgeserve.errors import InputError

    if camera is None:
        raise InputError(
            f"--image: the server takes no camera frames for {model!r}; add a [models.{model}.preprocess] "
            "table to its config (the example config of `edgeserve install-service --dry-run` shows one), "
            "or send a tensor with --npy"
        )
    channels = str(camera.get("channels", "rgb"))
    try:
        with Image.open(path) as image:
            frame = np.asarray(image.convert("L" if channels == "gray" else "RGB"), dtype=np.uint8)
    except OSError as exc:
        raise InputError(f"--image {path}: cannot read the image ({exc}); give a PNG or JPEG file") from None
    if channels == "gray":
        return [frame[:, :, None]]
    return [np.ascontiguousarray(frame[:, :, ::-1]) if channels == "bgr" else frame]


def _inputs(args: argparse.Namespace, spec: dict[str, Any]) -> Iterable[Any]:
    import numpy as np

    from edgeserve.errors import InputError
    from edgeserve.tools.bench import synthetic_inputs

    if args.synthetic is not None:  # one at a time, as slots free: constant memory whatever N
        rng = np.random.default_rng(0)
        return (synthetic_inputs(spec, 1, rng)[0] for _ in range(args.synthetic))
    if args.npz is not None:
        return _npz(args.npz, spec)
    if spec.get("input") is None:
        names = ", ".join(spec.get("inputs") or {})
        raise InputError(
            f"{args.model!r} takes several inputs ({names}): send them with --npz FILE (one array per "
            "input name) or --synthetic N"
        )
    shape = tuple(spec["input"]["shape"])
    dtype = np.dtype(spec["input"]["dtype"])
    if args.image is not None:
        return _image(args.image, spec.get("camera_input"), args.model)
    try:
        array = np.load(args.npy, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"--npy {args.npy}: not a readable .npy file ({exc}); write one with numpy.save"
        ) from None
    is_frame = array.dtype == np.uint8 and array.ndim == 3 and array.shape[-1] in (1, 3)
    if not is_frame and array.dtype != dtype and not (array.dtype == np.uint8 and array.ndim == 4):
        if array.dtype.kind not in "fiu":
            raise InputError(f"--npy {args.npy}: dtype {array.dtype} cannot become the model's {dtype}")
        _note(f"{args.npy}: converting {array.dtype} to the model's {dtype}")
        array = array.astype(dtype)
    if tuple(array.shape) == shape or is_frame:
        return [array]
    if tuple(array.shape[1:]) == shape or (array.dtype == np.uint8 and array.ndim == 4):
        return list(array)
    raise InputError(
        f"--npy {args.npy}: shape {array.shape} is neither {shape} nor (N, {', '.join(map(str, shape))})"
    )


def _npz(path: Path, spec: dict[str, Any]) -> list[Any]:
    """Samples from one array per input: each one sample, or a stack of the same N."""
    import numpy as np

    from edgeserve.errors import InputError

    tensors = spec.get("inputs") or {"x": spec["input"]}
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(
            f"--npz {path}: not a readable .npz file ({exc}); write one with numpy.savez"
        ) from None
    if sorted(arrays) != sorted(tensors):
        raise InputError(
            f"--npz {path}: holds {sorted(arrays)}, the model takes {sorted(tensors)}; name the arrays as "
            f"its inputs, e.g. numpy.savez(path, {', '.join(f'{n}=...' for n in tensors)})"
        )
    whole: dict[str, Any] = {}  # one sample (or an unbatched input): repeated for every sample
    stacked: dict[str, Any] = {}
    for name, entry in tensors.items():
        shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
        array = arrays[name]
        if array.dtype != dtype:
            raise InputError(f"--npz {path}: {name!r} is {array.dtype}, the model takes {dtype}")
        if tuple(array.shape) == shape:
            whole[name] = array
        elif array.ndim == len(shape) + 1 and tuple(array.shape[1:]) == shape:
            stacked[name] = array
        else:
            raise InputError(
                f"--npz {path}: {name!r} is shaped {array.shape}, the model takes {shape} or (N, *{shape})"
            )
    counts = {len(a) for a in stacked.values()}
    if len(counts) > 1:
        raise InputError(f"--npz {path}: the stacked inputs have different N {sorted(counts)}")
    count = counts.pop() if counts else 1
    samples = [{**whole, **{n: a[i] for n, a in stacked.items()}} for i in range(count)]
    return [next(iter(s.values())) for s in samples] if len(tensors) == 1 else samples


def _describe(reply: Any) -> str:
    """The top class of a vector of class scores; else every output's name, shape and dtype."""
    outputs = reply.outputs or {"output": reply.output}
    if len(outputs) == 1 and reply.output.ndim == 1 and reply.output.dtype.kind == "f":
        top = int(reply.output.argmax())
        return f"class {top} ({float(reply.output[top]):.3f})"
    return " ".join(f"{name}{list(v.shape)} {v.dtype}" for name, v in outputs.items())


def check_args(args: argparse.Namespace) -> None:
    """What can be checked before connecting: the options, the files and the optional modules."""
    from edgeserve.errors import InputError, require_module

    if args.synthetic is not None and args.synthetic < 1:
        raise InputError(f"--synthetic {args.synthetic}: give at least 1 input")
    for option, path in (("--image", args.image), ("--npy", args.npy), ("--npz", args.npz)):
        if path is not None and not path.is_file():
            raise InputError(f"{option} {path}: no such file; check the path")
    if args.image is not None:
        require_module("PIL", "--image")
    if args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout:g}: must be positive")
    if args.out is not None:
        if args.out.suffix not in (".npz", ".jsonl"):
            raise InputError(
                f"--out {args.out}: give a file ending in .npz (numpy arrays) or .jsonl (JSON lines)"
            )
        if not args.out.parent.is_dir():
            raise InputError(f"--out {args.out}: no directory {args.out.parent}; create it first")


class _Saver:
    """--out: each answer's outputs written as it comes (a .npz written entry by entry, or JSON
    lines), so that memory stays constant whatever the count."""

    def __init__(self, path: Path) -> None:
        import zipfile

        self.path = path
        self._zip = zipfile.ZipFile(path, "w") if path.suffix == ".npz" else None
        self._lines = None if self._zip is not None else path.open("w", encoding="utf-8")

    def add(self, k: int, reply: Any, ms: float) -> None:
        import json

        import numpy as np

        outputs = reply.outputs or ({} if reply.output is None else {"output": reply.output})
        if self._zip is not None:
            for name, value in outputs.items():
                key = f"r{k}" if len(outputs) == 1 else f"r{k}.{name}"
                with self._zip.open(f"{key}.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, np.asarray(value), allow_pickle=False)
            return
        assert self._lines is not None
        record = {
            "input": k,
            "id": reply.id,
            "status": reply.status,
            "exit": reply.exit_name,
            "late": reply.late,
            "ms": round(ms, 3),
            "error": reply.error,
            "outputs": {name: np.asarray(v).tolist() for name, v in outputs.items()},
        }
        self._lines.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
        if self._lines is not None:
            self._lines.close()


def _full(reply: Any) -> str:
    """Every output's values, one indented block per output."""
    import numpy as np

    outputs = reply.outputs or ({} if reply.output is None else {"output": reply.output})
    with np.printoptions(threshold=sys.maxsize, linewidth=100, precision=6, suppress=True):
        return "\n".join(
            f"  {name} = {np.array2string(np.asarray(v), prefix='  ' + name + ' = ')}"
            for name, v in outputs.items()
        )


def run(args: argparse.Namespace) -> int:
    from edgeserve.errors import InputError
    from edgeserve.wire.client import BlockingClient, unknown_served_model

    check_args(args)
    with BlockingClient(args.target, token=args.token) as client:
        if args.model not in client.models:
            raise InputError(unknown_served_model(args.model, list(client.models), args.target))
        xs = _inputs(args, client.models[args.model])
        saver = _Saver(args.out) if args.out is not None else None
        # Within the server's window: a new input is made and sent only when an answer frees a slot,
        # so that any --synthetic N runs in constant memory (answers printed in order as they come).
        window = max(1, client.window_total or 8)
        waiting: deque[tuple[int, float, concurrent.futures.Future[Any], list[float]]] = deque()
        failed = 0

        def answer() -> None:
            nonlocal failed
            k, t0, future, finished = waiting.popleft()
            try:
                reply = future.result(args.timeout)
            except concurrent.futures.TimeoutError:
                raise InputError(
                    f"no answer within --timeout {args.timeout:g} s; is the server overloaded? "
                    "try a larger --timeout"
                ) from None
            ms = ((finished[0] if finished else time.perf_counter()) - t0) * 1000.0
            if reply.ok and reply.output is not None:
                detail = f"exit {reply.exit_name} {_describe(reply)}"
                detail += " LATE" if reply.late else ""
            else:
                failed += 1
                detail = reply.error or ""
            print(f"#{reply.id} {reply.status:<8} {detail}  {ms:.2f} ms", flush=True)
            if args.full and reply.ok:
                print(_full(reply), flush=True)
            if saver is not None:
                saver.add(k, reply, ms)

        try:
            for k, x in enumerate(xs):
                if len(waiting) >= window:
                    answer()
                options: dict[str, Any] = {"deadline_ms": args.deadline_ms}
                if args.capture_now:
                    options = {"capture_ts": time.time()}
                finished: list[float] = []
                t0 = time.perf_counter()
                future = client.submit(args.model, x, **options)
                future.add_done_callback(lambda f, finished=finished: finished.append(time.perf_counter()))
                waiting.append((k, t0, future, finished))
            while waiting:
                answer()
        finally:
            if saver is not None:
                saver.close()
        if saver is not None:
            _note(f"wrote the outputs of {k + 1} answers to {args.out}")
    return 0 if failed == 0 else 1
