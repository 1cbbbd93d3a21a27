"""Server configuration: a TOML file or the same structure as a dict, checked before anything loads.

Every mistake is a ConfigError naming the key path (`models.digits-m.slo_ms: ...`), and unknown
keys are errors too, so a typo such as `slo_mss` cannot silently fall back to a default.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeserve.config.checks import (
    ConfigError,
    choice,
    no_unknown,
    non_negative_number,
    port_clash,
    positive_int,
    positive_number,
    string,
    table,
)
from edgeserve.config.upstreams import UpstreamConfig, parse_upstreams
from edgeserve.logs import LOG_FORMATS, LOG_LEVELS
from edgeserve.profile import QUANTILES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# Names only: the classes behind them live above config (runtime/backends/) and are imported lazily there.
BACKEND_NAMES = ("onnxruntime", "tensorrt", "torch", "emulated", "auto")
PRECISIONS = ("fp32", "fp16")
LATE_MODES = ("serve", "expire")
ADMISSION_MODES = ("all", "deadline")
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024
# With `max_in_flight` set and no `max_in_flight_total`, the total is this many windows of it: at
# that total each busy connection keeps an even share, a light one its whole window. Unset, both
# come from the deadlines and the profile (ListenConfig.resolved; docs/runtime.md, "Admission").
DEFAULT_TOTAL_WINDOWS = 4
DEFAULT_MAX_CONNECTIONS = 256  # socket-protocol connections, all listeners together
DEFAULT_MAX_CONNECTIONS_PER_LISTENER = 192  # a flood on one listener leaves 64 slots to the others
DEFAULT_MAX_HELLO_BYTES = 4096  # the largest frame accepted before the hello (a hello is tiny)
DEFAULT_HELLO_TIMEOUT_S = 5.0
DEFAULT_IDLE_TIMEOUT_S = 300.0  # 0: never close an idle connection
DEFAULT_REPLY_MARGIN_MS = 0.5  # the answer's way back to a socket or HTTP client
# The HTTP listeners (the OIP front, the metrics endpoint; docs/oip.md, "Limits"). A request's line
# and headers arrive in one or two segments: 10 s covers a retransmit or two on a bad link, not a
# client trickling them (slowloris).
DEFAULT_HTTP_HEADER_TIMEOUT_S = 10.0
# A body's time is this floor (the client's pause before sending it, slow start, a retransmit)
# plus its declared size at DEFAULT_HTTP_BODY_MIN_RATE: 256 KiB/s (2 Mbit/s) is below what any
# LAN or Wi-Fi link sustains, so only a stalling client is cut off (8 MiB: 10 + 32 s).
DEFAULT_HTTP_BODY_TIMEOUT_S = 10.0
DEFAULT_HTTP_BODY_MIN_RATE = 256 * 1024
# An idle kept-alive connection is closed after this long: past aiohttp's client pool expiry
# (15 s), so OipClient never reuses a connection the server is closing; nginx's default too.
DEFAULT_HTTP_KEEPALIVE_TIMEOUT_S = 75.0
# The decode budget's default in frames of max_frame_bytes. A binary body is charged 3 frames (what
# reading and decoding it holds at its peak, measured: oip/decoding.py), a JSON one 3 frames plus
# 88 bytes per value its model's inputs could take: 16 lets five binary bodies of max_frame_bytes
# decode at once (128 MiB with the default frame); a JSON body charged more gets in alone.
DEFAULT_DECODE_BUDGET_FRAMES = 16
CHANNEL_ORDERS = ("rgb", "bgr", "gray")
INTERPOLATIONS = ("bilinear", "nearest")


@dataclass(frozen=True)
class PreprocessConfig:
    """How a camera frame (uint8, height x width x channels) becomes the model's NCHW float32 input.

    `channels` is the order the sender uses; the model is assumed to take RGB (or gray when it has
    one input channel). `resize` defaults to the model's input height and width. Each value is
    `(pixel * scale - mean[c]) / std[c]`; one-element mean/std apply to every channel.
    """

    input: str = "uint8-hwc"
    resize: tuple[int, int] | None = None
    interpolation: str = "bilinear"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    channels: str = "rgb"


@dataclass(frozen=True)
class ModelConfig:
    """One served model: its deadline budget (SLO) and how many requests may wait for it.

    `max_queue` None (the default): the most the accelerator can answer within `slo_ms` at the
    model's shallowest exit, from its profile (runtime/budget.py), so that deadline admission,
    not a count, refuses under overload.
    """

    slo_ms: float
    max_queue: int | None = None
    preprocess: PreprocessConfig | None = None
    # The largest batch this model is served at (None: its profile's); 1 serves it one sample at a
    # time, for a model whose answer depends on its batch mates (runtime/batch_ceiling.py).
    max_batch: int | None = None


@dataclass(frozen=True)
class ListenConfig:
    """Where `edgeserve serve` listens and the per-connection limits (see docs/protocol.md).

    `tcp` is "host:port"; the host is 127.0.0.1 unless told otherwise. `token`, when set, must be
    presented in every connection's hello (and, as `Authorization: Bearer <token>`, on HTTP:
    the OIP front but its health probes, and the metrics endpoint; docs/oip.md).

    The connection caps count the socket protocol's connections (unix and tcp); the HTTP
    listeners have their own (`http_*`, docs/oip.md "Limits"). Before its hello a connection may
    send one frame of at most `max_hello_bytes` and must finish it within `hello_timeout_s`; a
    greeted connection with nothing in flight that sends nothing for `idle_timeout_s` (0: never)
    is closed.
    """

    unix: Path | None = None
    unix_mode: int = 0o660
    unix_group: str | None = None
    tcp: tuple[str, int] | None = None
    http: tuple[str, int] | None = None  # Open Inference Protocol (KServe v2) HTTP frontend
    grpc: tuple[str, int] | None = None  # the same protocol over gRPC (Triton's GRPCInferenceService)
    token: str | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    # A connection's window and the total at which each busy connection keeps an even share.
    # None: derived when the front starts (`resolved`, Server.window_bounds): the largest batch,
    # and the most requests the server could answer in time at once (from the deadlines and the
    # profiles); a max_in_flight set alone makes the total DEFAULT_TOTAL_WINDOWS windows of it.
    max_in_flight: int | None = None
    max_in_flight_total: int | None = None
    # Below that total a connection may go past max_in_flight up to its even share of the total
    # among the clients sending (a client alone: the whole total), so that one or two pipelining
    # clients keep the executor batching; false: max_in_flight binds always.
    share_total: bool = True
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_listener: int = DEFAULT_MAX_CONNECTIONS_PER_LISTENER
    max_hello_bytes: int = DEFAULT_MAX_HELLO_BYTES
    hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    # What an answer needs to reach a socket or HTTP client after the server has it (the kernel,
    # the client's read) and a request's frame waited before the server read it: the scheduler
    # plans each such request to finish this much before its deadline (docs/runtime.md).
    reply_margin_ms: float = DEFAULT_REPLY_MARGIN_MS
    # The socket front (reads, refusals, hellos, limits) in a process of its own, so that under
    # overload it does not hold the GIL the executor thread needs; pays on boxes with cores to
    # spare, costs a hop per request (docs/runtime.md, "The front in a process of its own").
    front_process: bool = False
    # The HTTP listeners (OIP front and metrics endpoint together; docs/oip.md, "Limits"). The caps:
    # None derives them when the front starts from RLIMIT_NOFILE and the socket front's caps
    # (config/http_limits.py, `derived_caps`). Past them a connection gets a 503 and is closed.
    http_max_connections: int | None = None
    http_max_connections_per_listener: int | None = None
    http_header_timeout_s: float = DEFAULT_HTTP_HEADER_TIMEOUT_S  # request line and headers
    http_body_timeout_s: float = DEFAULT_HTTP_BODY_TIMEOUT_S  # plus declared size / min rate
    http_body_min_rate: int = DEFAULT_HTTP_BODY_MIN_RATE  # bytes/s
    http_keepalive_timeout_s: float = DEFAULT_HTTP_KEEPALIVE_TIMEOUT_S
    # Bytes of large request bodies being read and decoded at once, weighted by what decoding
    # them costs (oip/decoding.py); None: DEFAULT_DECODE_BUDGET_FRAMES x max_frame_bytes.
    http_decode_budget_bytes: int | None = None

    @property
    def decode_budget_bytes(self) -> int:
        """http_decode_budget_bytes, or DEFAULT_DECODE_BUDGET_FRAMES frames of max_frame_bytes."""
        if self.http_decode_budget_bytes is not None:
            return self.http_decode_budget_bytes
        return DEFAULT_DECODE_BUDGET_FRAMES * self.max_frame_bytes

    @property
    def in_flight_total(self) -> int:
        """max_in_flight_total, or DEFAULT_TOTAL_WINDOWS windows of max_in_flight: up to that many
        pipelining connections nothing is refused before its own window is full. Unresolved
        (both None): call `resolved` with the server's bound first."""
        if self.max_in_flight_total is not None:
            return self.max_in_flight_total
        if self.max_in_flight is None:
            raise ValueError("listen.max_in_flight is derived from the profile: use ListenConfig.resolved")
        return DEFAULT_TOTAL_WINDOWS * self.max_in_flight

    def resolved(self, window: int, bound: int) -> ListenConfig:
        """These limits with the derived ones filled in: a connection's `window` and the total
        `bound`, the most requests the server could answer in time at once (an explicit key is kept)."""
        if self.max_in_flight is not None:
            return self
        return replace(
            self,
            max_in_flight=min(window, self.max_in_flight_total or bound),
            max_in_flight_total=self.max_in_flight_total or bound,
        )


@dataclass(frozen=True)
class BackendConfig:
    """Which backend runs the models; `threads` must match the profile's (it is in the fingerprint)."""

    name: str = "onnxruntime"
    threads: int | None = None
    providers: tuple[str, ...] = ()
    warmup: int = 3
    precision: str = "fp32"  # which TensorRT engines to run
    device: str | None = None  # torch: "cpu", "cuda" or "cuda:N"; TensorRT: "cuda:N" picks the GPU
    # A batch predicted to take at most this long that empties the queues of an idle loop runs on
    # the loop's thread (backends whose sessions any thread may run: ONNX Runtime); the rest on
    # the executor thread. 0: never.
    inline_max_ms: float = 1.0
    # After a batch leaves the server idle, the event loop polls instead of sleeping for this long
    # (while most idle periods are that short): the next request is read without a wake-up from a
    # halted core (runtime/idle_poll.py). 0: sleep at once.
    idle_poll_us: float = 200.0
    # The event loop's thread asks the kernel for a CPU slice this short (Linux 6.12+, no privilege
    # needed): its wake-ups (a frame to read, a batch to answer) preempt a longer-running thread on
    # its core at once instead of waiting up to ~1.4 ms (runtime/cpu_slice.py). 100-100000, or 0:
    # the kernel's default.
    loop_slice_us: float = 100.0
    # ONNX Runtime: one session per exit, its stages composed into one graph (one call and one GIL
    # hand-off per batch; a copy of the weights per exit), or only per stage (chained); None
    # ("auto"): composed for models whose stage files total at most 64 MiB.
    compose_exits: bool | None = None
    # The emulated backend (runtime/backends/emulated.py): every latency it waits and every one the
    # scheduler plans with is the stored profile's times this; `fingerprint` is the key of the
    # stored profile it emulates (None: the only one the models have).
    slowdown: float = 1.0
    fingerprint: str | None = None


@dataclass(frozen=True)
class SchedulerConfig:
    """The policy and what to do with a task that can no longer meet its deadline.

    late_tasks = "serve": run it anyway, answer `ok` with late=True (the paper's behaviour);
    late_tasks = "expire": answer `expired` at once and spend the accelerator on tasks that can
    still make it (lazy drop, as in Jellyfish). Both count a violation.
    admission = "deadline" (the default): refuse (`rejected`) on arrival a request whose model's
    queue head has already waited so long that the new request, waiting about as long at the
    tail of the FIFO and then served at the shallowest exit, would miss the deadline the
    scheduler plans it to (its own, less the answer's way back): under
    overload the server sheds at once what it would serve late, and as the queue drains it admits
    again; a queue shorter than the largest batch always admits (the task joins the head's batch)
    (not with upstreams: the offloader sends such work upstream instead); "all" queues every
    request that fits in max_queue.
    """

    policy: str = ""  # empty: edgeserve.scheduler.DEFAULT_POLICY
    quantile: str = "p95"
    max_batch: int | None = None  # None: the profile's
    urgency: str = "paper"
    urgency_clip: float = 10.0
    late_tasks: str = "serve"
    admission: str = "deadline"
    # Learn each profile cell's latency from the batches run and schedule with it (docs/scheduler.md).
    calibration: bool = True


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint: `listen` is "host:port" (None: no endpoint), scraped at `path`."""

    listen: tuple[str, int] | None = None
    path: str = "/metrics"


@dataclass(frozen=True)
class LoggingConfig:
    """Log level and line format; "auto" is logfmt without timestamps under journald, with them elsewhere."""

    level: str = "info"
    format: str = "auto"


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs at start. Model order is the scheduler's tie-break order."""

    models: Mapping[str, ModelConfig]
    repository: Path = Path("engines")
    backend: BackendConfig = field(default_factory=BackendConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    shutdown_timeout_s: float = 5.0
    listen: ListenConfig = field(default_factory=ListenConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    upstreams: tuple[UpstreamConfig, ...] = ()  # docs/offload.md

    @classmethod
    def from_toml(cls, path: str | Path) -> ServerConfig:
        """Read and check a TOML file; relative `repository` paths are relative to the file."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"{path}: config file not found; give the right --config path "
                "(systemd/config.toml in the source tree is a commented example)"
            ) from None
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a directory; give the config file itself with --config") from None
        except PermissionError:
            raise ConfigError(f"{path}: this user may not read it; run as its owner or chmod it") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not a text file; --config takes the server's TOML file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"{path}: not valid TOML ({exc}); fix that line (model names with dots need quotes: "
                '[models."resnet50-cifar-w0.25"])'
            ) from None
        config = cls.from_dict(data, origin=str(path))
        if not config.repository.is_absolute():
            config = _replace_repository(config, path.parent / config.repository)
        unix = config.listen.unix
        if unix is not None and not unix.is_absolute():
            from dataclasses import replace

            config = replace(config, listen=replace(config.listen, unix=path.parent / unix))
        return config

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "config") -> ServerConfig:
        """Check a plain dict shaped like the TOML file; ConfigError names the first bad key."""
        try:
            return _server(data)
        except ConfigError as exc:
            raise ConfigError(f"{origin}: {exc}") from None


def _replace_repository(config: ServerConfig, root: Path) -> ServerConfig:
    from dataclasses import replace

    return replace(config, repository=root)


TOP_LEVEL_KEYS = (
    "repository",
    "shutdown_timeout_s",
    "backend",
    "scheduler",
    "models",
    "listen",
    "metrics",
    "logging",
    "upstreams",
)


def _server(data: Mapping[str, Any]) -> ServerConfig:
    data = table(data, "(top level)")
    no_unknown(data, TOP_LEVEL_KEYS, "")
    if "models" not in data:
        raise ConfigError("models: missing; add a [models.<name>] table with slo_ms for each served model")
    models_data = table(data["models"], "models")
    if not models_data:
        raise ConfigError("models: must name at least one model")
    models = {str(name): _model(spec, f"models.{name}") for name, spec in models_data.items()}
    repository = data.get("repository", "engines")
    if not isinstance(repository, (str, Path)) or not str(repository):
        raise ConfigError(f"repository: must be a path, got {repository!r}")
    config = ServerConfig(
        models=models,
        repository=Path(repository),
        backend=_backend(data.get("backend", {})),
        scheduler=_scheduler(data.get("scheduler", {})),
        shutdown_timeout_s=positive_number(data.get("shutdown_timeout_s", 5.0), "shutdown_timeout_s"),
        listen=_listen(data.get("listen", {})),
        metrics=_metrics(data.get("metrics", {})),
        logging=_logging(data.get("logging", {})),
        upstreams=parse_upstreams(data.get("upstreams", []), models),
    )
    listen = config.listen
    ports = {"listen.tcp": listen.tcp, "listen.http": listen.http, "listen.grpc": listen.grpc}
    if (clash := port_clash({**ports, "metrics.listen": config.metrics.listen})) is not None:
        raise ConfigError(clash)
    return config


def _model(data: Any, key: str) -> ModelConfig:
    data = table(data, key)
    allowed = ("slo_ms", "max_queue", "preprocess", "max_batch")
    for sub, value in data.items():
        if sub not in allowed and isinstance(value, Mapping):  # [models.resnet50-cifar-w0.25] unquoted
            dotted = f"{key.removeprefix('models.')}.{sub}"
            raise ConfigError(
                f"{key}.{sub}: TOML reads the dot in the model name {dotted!r} as a sub-table; "
                f'quote the name: [models."{dotted}"] (and [models."{dotted}".preprocess])'
            )
    no_unknown(data, allowed, key)
    if "slo_ms" not in data:
        raise ConfigError(f"{key}.slo_ms: missing; give the model's deadline budget in milliseconds")
    return ModelConfig(
        slo_ms=positive_number(data["slo_ms"], f"{key}.slo_ms"),
        max_queue=None
        if data.get("max_queue") is None
        else positive_int(data["max_queue"], f"{key}.max_queue"),
        preprocess=None if "preprocess" not in data else _preprocess(data["preprocess"], f"{key}.preprocess"),
        max_batch=None
        if data.get("max_batch") is None
        else positive_int(data["max_batch"], f"{key}.max_batch"),
    )


def _numbers(value: Any, key: str, positive: bool = False) -> tuple[float, ...]:
    values = value if isinstance(value, (list, tuple)) else [value]
    ok = bool(values) and all(
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (v > 0 or not positive)
        for v in values
    )
    if not ok:
        kind = "positive numbers" if positive else "numbers"
        raise ConfigError(f"{key}: must be a number or a list of {kind}, got {value!r}")
    return tuple(float(v) for v in values)


def _preprocess(data: Any, key: str) -> PreprocessConfig:
    data = table(data, key)
    allowed = ("input", "resize", "interpolation", "scale", "mean", "std", "channels")
    no_unknown(data, allowed, key)
    resize = data.get("resize")
    if resize is not None:
        if not (isinstance(resize, (list, tuple)) and len(resize) == 2):
            raise ConfigError(f"{key}.resize: must be [height, width], got {resize!r}")
        resize = (positive_int(resize[0], f"{key}.resize[0]"), positive_int(resize[1], f"{key}.resize[1]"))
    mean = _numbers(data.get("mean", 0.0), f"{key}.mean")
    std = _numbers(data.get("std", 1.0), f"{key}.std", positive=True)
    channels = choice(data.get("channels", "rgb"), f"{key}.channels", CHANNEL_ORDERS)
    for name, values in (("mean", mean), ("std", std)):
        if len(values) not in (1, 1 if channels == "gray" else 3):
            raise ConfigError(f"{key}.{name}: must have 1 value or one per channel, got {len(values)}")
    return PreprocessConfig(
        input=choice(data.get("input", "uint8-hwc"), f"{key}.input", ("uint8-hwc",)),
        resize=resize,
        interpolation=choice(data.get("interpolation", "bilinear"), f"{key}.interpolation", INTERPOLATIONS),
        scale=positive_number(data.get("scale", 1.0 / 255.0), f"{key}.scale"),
        mean=mean,
        std=std,
        channels=channels,
    )


def _listen(data: Any) -> ListenConfig:
    data = table(data, "listen")
    allowed = (
        "unix",
        "unix_mode",
        "unix_group",
        "tcp",
        "http",
        "grpc",
        "token",
        "max_frame_bytes",
        "max_in_flight",
        "max_in_flight_total",
        "share_total",
        "max_connections",
        "max_connections_per_listener",
        "max_hello_bytes",
        "hello_timeout_s",
        "idle_timeout_s",
        "reply_margin_ms",
        "front_process",
        *HTTP_LIMIT_KEYS,
    )
    no_unknown(data, allowed, "listen")
    unix = data.get("unix")
    if unix is not None:
        unix = Path(string(unix, "listen.unix"))
    mode_text = data.get("unix_mode", "0660")
    if not isinstance(mode_text, str) or not re.fullmatch(r"0?[0-7]{3}", mode_text):
        raise ConfigError(f'listen.unix_mode: must be an octal string such as "0660", got {mode_text!r}')
    group = data.get("unix_group")
    tcp = data.get("tcp")
    if tcp is not None:
        tcp = _host_port(tcp, "listen.tcp")
    http = data.get("http")
    if http is not None:
        http = _host_port(http, "listen.http")
    grpc = data.get("grpc")
    if grpc is not None:
        grpc = _host_port(grpc, "listen.grpc")
    token = data.get("token")
    front_process, share_total = data.get("front_process", False), data.get("share_total", True)
    for key, flag in (("front_process", front_process), ("share_total", share_total)):
        if not isinstance(flag, bool):
            raise ConfigError(f"listen.{key}: must be true or false, got {flag!r}")
    return ListenConfig(
        unix=unix,
        unix_mode=int(mode_text, 8),
        unix_group=None if group is None else string(group, "listen.unix_group"),
        tcp=tcp,
        http=http,
        grpc=grpc,
        token=None if token is None else string(token, "listen.token"),
        max_frame_bytes=positive_int(
            data.get("max_frame_bytes", DEFAULT_MAX_FRAME_BYTES), "listen.max_frame_bytes", minimum=64
        ),
        max_in_flight=None
        if data.get("max_in_flight") is None
        else positive_int(data["max_in_flight"], "listen.max_in_flight"),
        max_in_flight_total=None
        if data.get("max_in_flight_total") is None
        else positive_int(data["max_in_flight_total"], "listen.max_in_flight_total"),
        share_total=share_total,
        max_connections=positive_int(
            data.get("max_connections", DEFAULT_MAX_CONNECTIONS), "listen.max_connections"
        ),
        max_connections_per_listener=positive_int(
            data.get("max_connections_per_listener", DEFAULT_MAX_CONNECTIONS_PER_LISTENER),
            "listen.max_connections_per_listener",
        ),
        max_hello_bytes=positive_int(
            data.get("max_hello_bytes", DEFAULT_MAX_HELLO_BYTES), "listen.max_hello_bytes", minimum=64
        ),
        hello_timeout_s=positive_number(
            data.get("hello_timeout_s", DEFAULT_HELLO_TIMEOUT_S), "listen.hello_timeout_s"
        ),
        idle_timeout_s=non_negative_number(
            data.get("idle_timeout_s", DEFAULT_IDLE_TIMEOUT_S), "listen.idle_timeout_s"
        ),
        reply_margin_ms=non_negative_number(
            data.get("reply_margin_ms", DEFAULT_REPLY_MARGIN_MS), "listen.reply_margin_ms"
        ),
        front_process=front_process,
        **_http_limits(data),
    )


HTTP_LIMIT_KEYS = (
    "http_max_connections",
    "http_max_connections_per_listener",
    "http_header_timeout_s",
    "http_body_timeout_s",
    "http_body_min_rate",
    "http_keepalive_timeout_s",
    "http_decode_budget_bytes",
)


def _http_limits(data: Mapping[str, Any]) -> dict[str, Any]:
    """The [listen] http_* keys as ListenConfig fields (the absent ones keep their defaults)."""
    found: dict[str, Any] = {}
    for key in ("http_max_connections", "http_max_connections_per_listener", "http_body_min_rate"):
        if data.get(key) is not None:
            found[key] = positive_int(data[key], f"listen.{key}")
    if data.get("http_decode_budget_bytes") is not None:
        found["http_decode_budget_bytes"] = positive_int(
            data["http_decode_budget_bytes"], "listen.http_decode_budget_bytes", minimum=65536
        )
    for key in ("http_header_timeout_s", "http_body_timeout_s", "http_keepalive_timeout_s"):
        if key in data:
            found[key] = positive_number(data[key], f"listen.{key}")
    total, per_listener = found.get("http_max_connections"), found.get("http_max_connections_per_listener")
    if total is not None and per_listener is not None and per_listener > total:
        raise ConfigError(
            f"listen.http_max_connections_per_listener: {per_listener} is more than "
            f"listen.http_max_connections ({total}); one listener cannot have more than all of them"
        )
    return found


def _host_port(value: Any, key: str) -> tuple[str, int]:
    """ "host:port" or ":port" (host 127.0.0.1); port 0 picks a free port."""
    match = re.fullmatch(r"(.*):(\d+)", value) if isinstance(value, str) else None
    if match is None or int(match.group(2)) > 65535:
        raise ConfigError(f'{key}: must be "host:port" such as "127.0.0.1:7070", got {value!r}')
    host = match.group(1).strip("[]") or "127.0.0.1"
    return host, int(match.group(2))


def _backend(data: Any) -> BackendConfig:
    data = table(data, "backend")
    no_unknown(
        data,
        (
            "name",
            "threads",
            "providers",
            "warmup",
            "precision",
            "device",
            "inline_max_ms",
            "idle_poll_us",
            "loop_slice_us",
            "compose_exits",
            "slowdown",
            "fingerprint",
        ),
        "backend",
    )
    compose = data.get("compose_exits", "auto")
    if compose != "auto" and not isinstance(compose, bool):
        raise ConfigError(f'backend.compose_exits: must be "auto", true or false, got {compose!r}')
    threads = data.get("threads")
    providers = data.get("providers", [])
    if not isinstance(providers, (list, tuple)) or not all(isinstance(p, str) and p for p in providers):
        raise ConfigError(f"backend.providers: must be a list of provider names, got {providers!r}")
    return BackendConfig(
        name=choice(data.get("name", "onnxruntime"), "backend.name", BACKEND_NAMES),
        threads=None if threads is None else positive_int(threads, "backend.threads"),
        providers=tuple(providers),
        warmup=positive_int(data.get("warmup", 3), "backend.warmup", minimum=0),
        precision=choice(data.get("precision", "fp32"), "backend.precision", PRECISIONS),
        device=None if data.get("device") is None else _device(data["device"]),
        inline_max_ms=non_negative_number(data.get("inline_max_ms", 1.0), "backend.inline_max_ms"),
        idle_poll_us=non_negative_number(data.get("idle_poll_us", 200.0), "backend.idle_poll_us"),
        loop_slice_us=_loop_slice_us(data.get("loop_slice_us", 100.0)),
        compose_exits=None if compose == "auto" else compose,
        slowdown=_slowdown(data.get("slowdown", 1.0)),
        fingerprint=None if data.get("fingerprint") is None else _fingerprint_key(data["fingerprint"]),
    )


def _slowdown(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(
            f"backend.slowdown: must be a number > 0 (2.0: every batch takes twice the profile's time), "
            f"got {value!r}"
        )
    return float(value)


def _fingerprint_key(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
        raise ConfigError(
            "backend.fingerprint: must be a stored profile's key, the name of a file in <repository>/"
            f"<model>/profiles/ without .json (e.g. torch-nvidia-h200-t1-d5d4d5a507), got {value!r}"
        )
    return value


def _loop_slice_us(value: Any) -> float:
    us = non_negative_number(value, "backend.loop_slice_us")
    if us and not 100 <= us <= 100_000:
        raise ConfigError(
            f"backend.loop_slice_us: the kernel takes 100 to 100000 us (or 0: its default), got {value!r}"
        )
    return us


def _device(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        raise ConfigError(f'backend.device: must be "cpu", "cuda" or "cuda:N", got {value!r}')
    return value


def _scheduler(data: Any) -> SchedulerConfig:
    from edgeserve.scheduler.policies import POLICIES
    from edgeserve.scheduler.urgency import URGENCY_FORMS

    data = table(data, "scheduler")
    allowed = (
        "policy",
        "quantile",
        "max_batch",
        "urgency",
        "urgency_clip",
        "late_tasks",
        "admission",
        "calibration",
    )
    no_unknown(data, allowed, "scheduler")
    policy = data.get("policy", "")
    if policy:
        choice(policy, "scheduler.policy", tuple(POLICIES))
    max_batch = data.get("max_batch")
    clip = data.get("urgency_clip", 10.0)
    if not (isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0):
        raise ConfigError(f"scheduler.urgency_clip: must be a positive number, got {clip!r}")
    calibration = data.get("calibration", True)
    if not isinstance(calibration, bool):
        raise ConfigError(f"scheduler.calibration: must be true or false, got {calibration!r}")
    return SchedulerConfig(
        policy=str(policy),
        quantile=choice(data.get("quantile", "p95"), "scheduler.quantile", QUANTILES),
        max_batch=None if max_batch is None else positive_int(max_batch, "scheduler.max_batch"),
        urgency=choice(data.get("urgency", "paper"), "scheduler.urgency", URGENCY_FORMS),
        urgency_clip=float(clip),
        late_tasks=choice(data.get("late_tasks", "serve"), "scheduler.late_tasks", LATE_MODES),
        admission=choice(data.get("admission", "deadline"), "scheduler.admission", ADMISSION_MODES),
        calibration=calibration,
    )


def _metrics(data: Any) -> MetricsConfig:
    data = table(data, "metrics")
    no_unknown(data, ("listen", "path"), "metrics")
    listen = data.get("listen")
    path = string(data.get("path", "/metrics"), "metrics.path")
    if not path.startswith("/"):
        raise ConfigError(f'metrics.path: must start with "/", got {path!r}')
    return MetricsConfig(listen=None if listen is None else _host_port(listen, "metrics.listen"), path=path)


def _logging(data: Any) -> LoggingConfig:
    data = table(data, "logging")
    no_unknown(data, ("level", "format"), "logging")
    return LoggingConfig(
        level=choice(data.get("level", "info"), "logging.level", LOG_LEVELS),
        format=choice(data.get("format", "auto"), "logging.format", LOG_FORMATS),
    )
