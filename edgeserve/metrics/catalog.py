"""What the metrics endpoint exports: Server.snapshot(), frontend counters and process metrics as
Prometheus families.

Where Triton Inference Server has a metric that means the same thing, its name, type and labels
are used (`nv_inference_*`, labels `model` and `version`), so Triton dashboards and alerts work;
everything else is `edgeserve_*` in base units (seconds, bytes) with `_total` on counters.
docs/metrics.md documents every name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from edgeserve.metrics.exposition import Family, render
from edgeserve.metrics.process import ProcessSample
from edgeserve.runtime import Status

MODEL_VERSION = "1"  # Triton's `version` label: edgeserve serves one version of each model
STATUSES = tuple(s.value for s in Status)
# Triton's failure reasons; every edgeserve status that is not `ok` maps to one of them.
FAILURE_REASONS = {
    "rejected": "REJECTED",
    "error": "BACKEND",
    "expired": "OTHER",
    "invalid": "OTHER",
    "shutdown": "OTHER",
}
UPSTREAM_STATES = ("closed", "open", "half-open")


class FrontendCounters(Protocol):
    """The counters of a frontend (edgeserve.runtime.FrontendStats has them)."""

    connections: int
    open_connections: int
    requests: int
    discarded: int
    protocol_errors: int
    refused_auth: int
    expired_on_arrival: int
    refused_connections: int
    timed_out_connections: int
    flood_pauses: int
    process_cpu_seconds: float
    read_wait_seconds: float
    by_status: dict[str, int]


class HttpCounters(Protocol):
    """The HTTP listeners' limit counters (edgeserve.oip.connections.HttpGuard has them): by
    listener ("http": the OIP front, "metrics": this endpoint)."""

    @property
    def open_by_listener(self) -> Mapping[str, int]: ...
    @property
    def refused_connections(self) -> Mapping[str, int]: ...
    @property
    def timeouts(self) -> Mapping[tuple[str, str], int]: ...  # by (listener, kind)
    @property
    def bad_requests(self) -> Mapping[str, int]: ...
    @property
    def decode_bytes(self) -> int: ...
    @property
    def decode_refused(self) -> int: ...


def _model_names(snapshot: Mapping[str, Any], models: Sequence[str]) -> list[str]:
    """The served models first (so their series exist at zero from the start), then any other key."""
    names = list(models)
    for key in ("requests", "queue_depth", "violations", "batches"):
        names += [m for m in snapshot.get(key, {}) if m not in names]
    return names


def _triton(snapshot: Mapping[str, Any], names: list[str]) -> list[Family]:
    requests = snapshot.get("requests", {})
    success = Family(
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests (status ok), all batch sizes",
    )
    failure = Family(
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests by Triton reason: REJECTED (queue full), BACKEND "
        "(backend error), CANCELED (caller gave up), OTHER (expired, invalid, shutdown)",
    )
    count = Family(
        "nv_inference_count", "counter", "Number of inferences performed (samples in executed batches)"
    )
    execs = Family("nv_inference_exec_count", "counter", "Number of model executions performed (batches run)")
    request_us = Family(
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative end-to-end time of ok requests (queued to answered) in microseconds",
    )
    queue_us = Family(
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative time ok requests spent queued (to batch start) in microseconds",
    )
    compute_us = Family(
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative time ok requests spent in the backend (batch start to end), microseconds",
    )
    pending = Family(
        "nv_inference_pending_request_count",
        "gauge",
        "Number of requests queued for the model, awaiting execution",
    )
    durations = {key: snapshot.get(key, {}) for key in ("request_duration", "queue_duration")}
    for model in names:
        labels = {"model": model, "version": MODEL_VERSION}
        by_status = requests.get(model, {})
        success.add(by_status.get("ok", 0), **labels)
        reasons = {"REJECTED": 0, "BACKEND": 0, "CANCELED": 0, "OTHER": 0}
        for status, reason in FAILURE_REASONS.items():
            reasons[reason] += by_status.get(status, 0)
        reasons["CANCELED"] += snapshot.get("cancelled", {}).get(model, 0)
        for reason, n in reasons.items():
            failure.add(n, **labels, reason=reason)
        count.add(snapshot.get("inferences", {}).get(model, 0), **labels)
        execs.add(snapshot.get("batches", {}).get(model, 0), **labels)
        request_us.add(durations["request_duration"].get(model, {}).get("sum", 0.0) * 1e6, **labels)
        queue_us.add(durations["queue_duration"].get(model, {}).get("sum", 0.0) * 1e6, **labels)
        compute_us.add(snapshot.get("compute_request_s", {}).get(model, 0.0) * 1e6, **labels)
        pending.add(snapshot.get("queue_depth", {}).get(model, 0), **labels)
    return [success, failure, count, execs, request_us, queue_us, compute_us, pending]


def _histograms(snapshot: Mapping[str, Any], names: list[str]) -> list[Family]:
    families = []
    for key, name, help_text in (
        (
            "request_duration",
            "edgeserve_request_duration_seconds",
            "Time from arrival to answer of ok requests",
        ),
        (
            "queue_duration",
            "edgeserve_queue_duration_seconds",
            "Time from arrival to batch start of ok requests",
        ),
        (
            "compute_duration",
            "edgeserve_compute_duration_seconds",
            "Backend time per executed batch (any outcome)",
        ),
    ):
        family = Family(name, "histogram", help_text)
        for model in names:
            histogram = snapshot.get(key, {}).get(model)
            if histogram is not None:
                family.add_histogram(histogram, model=model)
        families.append(family)
    decision = Family(
        "edgeserve_scheduler_decision_seconds", "histogram", "Time the policy took per decision"
    )
    histogram = snapshot.get("decision", {}).get("histogram")
    if histogram is not None:
        decision.add_histogram(histogram)
    idle_gap = Family(
        "edgeserve_executor_idle_gap_seconds",
        "histogram",
        "Executor idle time between two batches while the second one's first request waited",
    )
    if "idle_gap" in snapshot:
        idle_gap.add_histogram(snapshot["idle_gap"])
    return [*families, decision, idle_gap]


def _edgeserve(snapshot: Mapping[str, Any], names: list[str]) -> list[Family]:
    requests = Family(
        "edgeserve_requests_total",
        "counter",
        "Requests answered by model and status (ok, rejected, expired, error, invalid, shutdown)",
    )
    violations = Family(
        "edgeserve_deadline_violations_total",
        "counter",
        "Deadline violations: late ok answers plus expired requests",
    )
    cancelled = Family(
        "edgeserve_cancelled_total", "counter", "Requests whose caller gave up before the answer"
    )
    batches = Family("edgeserve_batches_total", "counter", "Batches the executor ran")
    depth = Family("edgeserve_queue_depth", "gauge", "Requests queued for the model now")
    exits = Family("edgeserve_exit_total", "counter", "ok answers by the exit that produced them")
    served = Family(
        "edgeserve_served_total", "counter", "Requests served, by where: local or the name of an upstream"
    )
    for model in names:
        by_status = snapshot.get("requests", {}).get(model, {})
        for status in (*STATUSES, *(s for s in by_status if s not in STATUSES)):
            requests.add(by_status.get(status, 0), model=model, status=status)
        violations.add(snapshot.get("violations", {}).get(model, 0), model=model)
        cancelled.add(snapshot.get("cancelled", {}).get(model, 0), model=model)
        batches.add(snapshot.get("batches", {}).get(model, 0), model=model)
        depth.add(snapshot.get("queue_depth", {}).get(model, 0), model=model)
        for exit_name, n in snapshot.get("exit_mix", {}).get(model, {}).items():
            exits.add(n, model=model, exit=exit_name)
        for where, n in snapshot.get("served", {}).get(model, {}).items():
            served.add(n, model=model, where=where)
    window = snapshot.get("utilisation_window_s", 10.0)
    single = (  # one unlabelled sample each: (name, type, help, snapshot key, its type)
        ("edgeserve_executor_busy_seconds_total", "counter", "Time the executor spent running batches",
         "executor_busy_s", float),
        ("edgeserve_executor_busy_cpu_seconds_total", "counter",
         "CPU time of the thread running the batches, within the busy seconds: the rest it did not"
         " run (waiting for the GIL or a core; on a GPU also while the device computes)",
         "executor_busy_cpu_s", float),
        ("edgeserve_executor_utilization", "gauge",
         f"Share of the last {window:g} s the executor spent running batches (0-1)",
         "utilisation_recent", float),
        ("edgeserve_scheduler_failures_total", "counter",
         "Decisions the configured policy raised on (the fallback policy decided instead)",
         "policy_failures", int),
        ("edgeserve_batches_decided_ahead_total", "counter",
         "Batches decided while the batch before them still ran, and started as it ended",
         "batches_ahead", int),
        ("edgeserve_executor_idle_gap_share", "gauge",
         "Executor idle time between batches while work waited, as a share of its busy time"
         " (the host's cost to the accelerator: decisions, hand-offs, the loop)",
         "idle_gap_share", float),
        ("edgeserve_batch_overhead_seconds", "gauge",
         "What a batch cycle costs beyond its profile while work waits (the host's gap, the GIL);"
         " deadline admission adds it to every batch of the work ahead (runtime/budget.py)",
         "batch_overhead_s", float),
        ("edgeserve_exits_kept_shallower_total", "counter",
         "Batches served at a shallower exit than the policy chose, so that the tasks left queued"
         " still meet the deadlines admission took them for (runtime/budget.py)",
         "exits_kept_shallower", int),
        ("edgeserve_idle_poll_seconds_total", "counter",
         "Time the event loop polled instead of sleeping after a batch left the server idle"
         " ([backend] idle_poll_us)", "idle_poll_s", float),
    )  # fmt: skip
    return [
        requests,
        violations,
        cancelled,
        batches,
        depth,
        exits,
        served,
        *(Family(name, kind, text).add(cast(snapshot.get(key, 0))) for name, kind, text, key, cast in single),
        *_latency_cells(snapshot.get("latency_cells", ())),
    ]


def _latency_cells(cells: Sequence[Mapping[str, Any]]) -> list[Family]:
    """Online calibration (docs/scheduler.md): what the scheduler predicts per cell and what ran."""
    predicted = Family(
        "edgeserve_latency_predicted_seconds",
        "gauge",
        "Batch latency the scheduler uses per (model, exit, batch): the profile quantile, calibrated online",
    )
    observed = Family(
        "edgeserve_latency_observed_seconds",
        "gauge",
        "Latency of the last batch run per (model, exit, batch)",
    )
    for c in cells:
        labels = {"model": c["model"], "exit": c["exit"], "batch": str(c["batch"])}
        predicted.add(float(c["predicted_s"]), **labels)
        observed.add(float(c["observed_s"]), **labels)
    return [predicted, observed] if cells else []


def _frontends(frontends: Mapping[str, FrontendCounters]) -> list[Family]:
    simple = (
        ("connections", "edgeserve_frontend_connections_total", "counter", "Connections accepted"),
        ("open_connections", "edgeserve_frontend_open_connections", "gauge", "Connections open now"),
        ("requests", "edgeserve_frontend_requests_total", "counter", "Requests received"),
        (
            "protocol_errors",
            "edgeserve_frontend_protocol_errors_total",
            "counter",
            "Malformed input: socket frames answered invalid or closing their connection, HTTP requests"
            " refused as malformed",
        ),
        (
            "discarded",
            "edgeserve_frontend_discarded_answers_total",
            "counter",
            "Answers dropped because their client had gone",
        ),
        (
            "refused_auth",
            "edgeserve_frontend_refused_auth_total",
            "counter",
            "Socket connections or HTTP requests refused for a missing or wrong token",
        ),
        (
            "expired_on_arrival",
            "edgeserve_frontend_expired_on_arrival_total",
            "counter",
            "Requests whose capture timestamp was already past the SLO on arrival",
        ),
        (
            "refused_connections",
            "edgeserve_frontend_refused_connections_total",
            "counter",
            "Connections refused over listen.max_connections or max_connections_per_listener",
        ),
        (
            "timed_out_connections",
            "edgeserve_frontend_timed_out_connections_total",
            "counter",
            "Connections closed for no hello within hello_timeout_s or idle past idle_timeout_s",
        ),
        (
            "flood_pauses",
            "edgeserve_frontend_flood_pauses_total",
            "counter",
            "Times a client sending far past its window was left unread while another client was not",
        ),
        (
            "process_cpu_seconds",
            "edgeserve_frontend_process_cpu_seconds_total",
            "counter",
            "CPU time of the front's own process (listen.front_process); 0 for a front in the server's",
        ),
        (
            "read_wait_seconds",
            "edgeserve_frontend_read_wait_seconds",
            "gauge",
            "Median wait of a request in its socket before the front reads it (probed with a timer"
            " fd; socket requests are planned with up to 1 ms of it); 0 where not measured (HTTP)",
        ),
    )
    families = [Family(name, kind, help_text) for _, name, kind, help_text in simple]
    answers = Family(
        "edgeserve_frontend_answers_total",
        "counter",
        "Answers written, by status (including those the frontend gave itself)",
    )
    for frontend, stats in frontends.items():
        for (attribute, *_), family in zip(simple, families, strict=True):
            family.add(getattr(stats, attribute), frontend=frontend)
        for status in (*STATUSES, *sorted(s for s in stats.by_status if s not in STATUSES)):
            answers.add(stats.by_status.get(status, 0), frontend=frontend, status=status)
    return [*families, answers] if frontends else []


def _http(http: HttpCounters) -> list[Family]:
    """The HTTP listeners' caps, timeouts and decode budget at work (docs/oip.md, "Limits")."""
    open_now = Family("edgeserve_http_open_connections", "gauge", "HTTP connections open now, by listener")
    refused = Family(
        "edgeserve_http_refused_connections_total",
        "counter",
        "HTTP connections refused (503, closed) over listen.http_max_connections or its per-listener cap",
    )
    timeouts = Family(
        "edgeserve_http_timeouts_total",
        "counter",
        "HTTP connections closed by a timeout: header (request head not in by http_header_timeout_s),"
        " body (body not in by its body timeout), keepalive (idle past http_keepalive_timeout_s)",
    )
    bad = Family(
        "edgeserve_http_bad_requests_total",
        "counter",
        "HTTP requests that could not be parsed (400 JSON, connection closed; logged at debug)",
    )
    for listener, n in sorted(http.open_by_listener.items()):
        open_now.add(n, listener=listener)
    for listener, n in sorted(http.refused_connections.items()):
        refused.add(n, listener=listener)
    for (listener, kind), n in sorted(http.timeouts.items()):
        timeouts.add(n, listener=listener, kind=kind)
    for listener, n in sorted(http.bad_requests.items()):
        bad.add(n, listener=listener)
    in_use = Family(
        "edgeserve_http_decode_bytes",
        "gauge",
        "Large HTTP request bodies being read or decoded now, weighted by their peak decoding cost"
        " (bytes; bounded by listen.http_decode_budget_bytes)",
    )
    over = Family(
        "edgeserve_http_decode_refused_total",
        "counter",
        "HTTP infer requests refused (503) because the decode budget was full",
    )
    return [open_now, refused, timeouts, bad, in_use.add(http.decode_bytes), over.add(http.decode_refused)]


def _upstreams(upstreams: Mapping[str, Mapping[str, Any]]) -> list[Family]:
    rtt = Family("edgeserve_upstream_rtt_seconds", "gauge", "Measured round-trip time to the upstream")
    bandwidth = Family(
        "edgeserve_upstream_bandwidth_bytes_per_second", "gauge", "Measured bandwidth to the upstream"
    )
    state = Family(
        "edgeserve_upstream_state",
        "gauge",
        "Circuit breaker state of the upstream: 1 for the current state, 0 for the others",
    )
    sent = Family("edgeserve_upstream_sent_total", "counter", "Requests offloaded to the upstream")
    failed = Family("edgeserve_upstream_failed_total", "counter", "Offloaded requests that failed")
    fallbacks = Family(
        "edgeserve_upstream_fallbacks_total",
        "counter",
        "Requests meant for the upstream that were served locally instead",
    )
    for name, info in sorted(upstreams.items()):
        rtt.add(float(info.get("rtt_ms", float("nan"))) / 1000.0, upstream=name)
        bandwidth.add(float(info.get("bandwidth_mbps", float("nan"))) * 1e6 / 8.0, upstream=name)
        current = info.get("state")
        for option in (*UPSTREAM_STATES, *([current] if current not in (*UPSTREAM_STATES, None) else [])):
            state.add(int(option == current), upstream=name, state=str(option))
        sent.add(int(info.get("sent", 0)), upstream=name)
        failed.add(int(info.get("failed", 0)), upstream=name)
        fallbacks.add(int(info.get("fallbacks", 0)), upstream=name)
    return [rtt, bandwidth, state, sent, failed, fallbacks]


def _process(sample: ProcessSample) -> list[Family]:
    rows = (
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes", sample.rss_bytes),
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes", sample.virtual_bytes),
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds",
            sample.cpu_seconds,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds",
            sample.start_time_seconds,
        ),
        ("process_open_fds", "gauge", "Number of open file descriptors", sample.open_fds),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors", sample.max_fds),
    )
    return [Family(name, kind, text).add(value) for name, kind, text, value in rows if value is not None]


def _thread_waits(waits: Mapping[str, float]) -> Family:
    family = Family(
        "edgeserve_thread_cpu_wait_seconds_total",
        "counter",
        "Time the server's thread was ready to run but waited for a CPU (Linux schedstat): the"
        " executor's is backend time lost to other threads and processes on its cores",
    )
    for thread, seconds in sorted(waits.items()):
        family.add(seconds, thread=thread)
    return family


def collect(
    snapshot: Mapping[str, Any],
    *,
    models: Sequence[str] = (),
    frontends: Mapping[str, FrontendCounters] | None = None,
    process: ProcessSample | None = None,
    thread_waits: Mapping[str, float] | None = None,
    http: HttpCounters | None = None,
) -> list[Family]:
    """Every family from one Server.snapshot() (plus frontends, process, the threads' CPU waits
    and the HTTP listeners' limits, when given)."""
    names = _model_names(snapshot, models)
    families = [
        *_triton(snapshot, names),
        *_edgeserve(snapshot, names),
        *_histograms(snapshot, names),
        *_frontends(frontends or {}),
    ]
    if snapshot.get("upstreams"):
        families += _upstreams(snapshot["upstreams"])
    if process is not None:
        families += _process(process)
    if thread_waits:
        families.append(_thread_waits(thread_waits))
    if http is not None:
        families += _http(http)
    return families


def render_metrics(
    snapshot: Mapping[str, Any],
    *,
    models: Sequence[str] = (),
    frontends: Mapping[str, FrontendCounters] | None = None,
    process: ProcessSample | None = None,
    thread_waits: Mapping[str, float] | None = None,
    http: HttpCounters | None = None,
    accelerators: Sequence[Family] = (),
    accept: str | None = None,
) -> str:
    """The exposition text for one scrape (format 0.0.4, or OpenMetrics if `accept` asks for it);
    `accelerators`: the families of edgeserve.metrics.accelerators, read apart."""
    families = collect(
        snapshot, models=models, frontends=frontends, process=process, thread_waits=thread_waits, http=http
    )
    return render([*families, *accelerators], accept)
