"""`edgeserve doctor` probes every [[upstreams]] server; "all checks passed" only when nothing warned."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from edgeserve.config.server import ServerConfig
from edgeserve.runtime.offload.breaker import CircuitBreaker
from edgeserve.service.doctor import format_text
from edgeserve.service.doctor_checks import FAIL, OK, WARN, Context, Finding, check_upstreams


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_dead_upstream_is_named_with_its_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    config = ServerConfig.from_dict(
        {
            "models": {"digits-m": {"slo_ms": 50}},
            "upstreams": [{"name": "gpu-box", "url": url, "models": {"digits-m": {"remote": "digits-m"}}}],
        }
    )
    ctx = Context(config_path=tmp_path / "c.toml", config=config)
    [finding] = check_upstreams(ctx)
    assert finding.status == WARN and finding.check == "upstream gpu-box"
    assert url in finding.finding and finding.fix is not None and url in finding.fix


def test_the_summary_counts_warnings() -> None:
    ok = Finding("a", OK, "fine")
    warn = Finding("b", WARN, "hm", "do x")
    assert format_text([ok]).endswith("all checks passed")
    assert format_text([ok, warn]).endswith("passed with 1 warning")
    assert format_text([warn, warn, Finding("c", FAIL, "no", "fix")]).endswith(
        "1 check(s) FAILED, 2 warnings"
    )


def test_the_breaker_logs_when_it_opens_and_closes(caplog: pytest.LogCaptureFixture) -> None:
    breaker = CircuitBreaker(failures_to_open=1, cooldown_s=1.0, name="gpu-box")
    with caplog.at_level(logging.WARNING, logger="edgeserve.runtime.offload.breaker"):
        breaker.failure(0.0)
        breaker.success(2.0)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("circuit breaker of gpu-box opened")
    assert messages[1] == "circuit breaker of gpu-box closed: it answers again"
