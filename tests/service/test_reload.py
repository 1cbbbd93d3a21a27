"""Reload (SIGHUP): new SLOs, scheduler settings and profiles apply while queued requests are
served; a bad file or a change that needs a restart leaves the old config serving."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository
from service_support import NotifyListener, serve_process, write_serve_config
from tiny_onnx import TinyModel

from edgeserve.config.reload import ReloadRefused, changed_keys
from edgeserve.config.server import ServerConfig
from edgeserve.runtime.server import Server
from edgeserve.service.process import NetServer
from edgeserve.service.reloader import ConfigReloader
from edgeserve.wire.client import BlockingClient


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("reload") / "engines"
    return root, profiled_tiny_repository(root)


def _scale_profile(path: Path, factor: float) -> None:
    """Rewrite a profile with every latency multiplied (as a re-profile on a slower clock would)."""
    data = json.loads(path.read_text())
    for cell in data["cells"]:  # the table recomputes its statistics from the samples
        cell["samples_ms"] = [s * factor for s in cell["samples_ms"]]
    path.write_text(json.dumps(data))


def test_reload_applies_slo_scheduler_and_profile_while_queued_requests_are_served(
    served: tuple[Path, dict[str, TinyModel]], tmp_path: Path
) -> None:
    source, models = served
    root = tmp_path / "engines"
    shutil.copytree(source, root)
    factory = HookedFactory(delay_s=0.02)
    old = ServerConfig.from_dict(config_dict(root))
    xs = models["tiny_a"].random_input(40, seed=1)

    async def main() -> tuple[list[Any], list[str], float, float, Any]:
        async with Server(old, backend_factory=factory) as server:
            before = server.latency_model.models[0].latency(0, 1)
            callers = [asyncio.ensure_future(server.infer("tiny_a", x)) for x in xs]
            await asyncio.sleep(0)
            while factory.backend is None or not factory.backend.entered.is_set():
                await asyncio.sleep(0.001)
            assert server.snapshot()["queue_depth"]["tiny_a"] > 10  # a queue to keep across the swap
            profile = next((root / "tiny_a" / "profiles").glob("*.json"))
            _scale_profile(profile, 3.0)
            new_models = {**old.models, "tiny_a": replace(old.models["tiny_a"], slo_ms=4000.0, max_queue=128)}
            new = replace(old, models=new_models, scheduler=replace(old.scheduler, urgency_clip=5.0))
            changed = await server.reload(new)
            after = server.latency_model.models[0].latency(0, 1)
            late = await server.infer("tiny_a", xs[0])
            results = await asyncio.gather(*callers)
            return results, changed, before, after, late

    results, changed, before, after, late = asyncio.run(main())
    assert [r.status.value for r in results] == ["ok"] * 40
    assert all(r.deadline - r.queued == pytest.approx(1.0) for r in results)  # arrived under the old SLO
    assert late.ok and late.deadline - late.queued == pytest.approx(4.0)
    assert sorted(changed) == ["models.tiny_a.max_queue", "models.tiny_a.slo_ms", "scheduler.urgency_clip"]
    assert after == pytest.approx(3.0 * before, rel=0.02)  # the re-read profile is in use


def test_reload_refuses_a_model_set_change_and_keeps_serving(
    served: tuple[Path, dict[str, TinyModel]],
) -> None:
    root, models = served
    old = ServerConfig.from_dict(config_dict(root))
    only_a = replace(old, models={"tiny_a": old.models["tiny_a"]})
    threads = replace(old, backend=replace(old.backend, threads=2))

    async def main() -> tuple[str, str, Any, ServerConfig]:
        async with Server(old) as server:
            with pytest.raises(ReloadRefused) as models_error:
                await server.reload(only_a)
            with pytest.raises(ReloadRefused) as backend_error:
                await server.reload(threads)
            result = await server.infer("tiny_b", models["tiny_b"].random_input(1)[0])
            return str(models_error.value), str(backend_error.value), result, server.config

    models_message, backend_message, result, kept = asyncio.run(main())
    assert models_message.startswith("models: the served set changed")
    assert "systemctl restart edgeserve" in models_message
    assert backend_message.startswith("backend.threads: cannot change while serving")
    assert "systemctl restart edgeserve" in backend_message
    assert result.ok and kept is not only_a and tuple(kept.models) == ("tiny_a", "tiny_b")


def test_changed_keys_names_nested_paths(served: tuple[Path, dict[str, TinyModel]]) -> None:
    root, _ = served
    old = ServerConfig.from_dict(config_dict(root))
    new = replace(old, listen=replace(old.listen, tcp=("127.0.0.1", 7070)), shutdown_timeout_s=1.0)
    assert changed_keys(old, new) == ["shutdown_timeout_s", "listen.tcp"]
    assert changed_keys(old, old) == []


def test_bad_toml_on_reload_keeps_the_old_config_and_logs_the_error(
    served: tuple[Path, dict[str, TinyModel]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, models = served
    path = tmp_path / "serve.toml"
    write_serve_config(path, root, tmp_path / "s.sock")

    async def main() -> tuple[bool, Any, float, int]:
        async with NetServer(path) as net:
            path.write_text("repository = [unclosed\n")
            reloader = ConfigReloader(path, net, manage_logging=False)
            applied = await reloader.reload_once()
            result = await net.server.infer("tiny_a", models["tiny_a"].random_input(1)[0])
            return applied, result, net.server.config.models["tiny_a"].slo_ms, reloader.failures

    with caplog.at_level("ERROR", logger="edgeserve.reload"):
        applied, result, slo_ms, failures = asyncio.run(main())
    assert not applied and failures == 1 and result.ok and slo_ms == 2000
    record = next(
        r for r in caplog.records if r.getMessage() == "reload failed; still serving the previous config"
    )
    assert "not valid TOML" in record.error  # type: ignore[attr-defined]


def test_sighup_reloads_the_running_service_and_survives_a_bad_file(
    served: tuple[Path, dict[str, TinyModel]], tmp_path: Path
) -> None:
    root, models = served
    config = tmp_path / "serve.toml"
    write_serve_config(config, root, tmp_path / "serve.sock", slo_ms=2000)
    listener = NotifyListener(tmp_path / "notify.sock")
    x = models["tiny_a"].random_input(1)[0]
    try:
        with serve_process(config, {"NOTIFY_SOCKET": str(listener.path)}) as server:
            urls = server.wait_ready()
            listener.wait_for("READY", "1")
            with BlockingClient(urls[1]) as client:
                futures = [client.submit("tiny_a", x) for _ in range(50)]  # in flight across the reload
                write_serve_config(
                    config, root, tmp_path / "serve.sock", slo_ms=3000, extra='[logging]\nlevel = "debug"\n'
                )
                server.process.send_signal(signal.SIGHUP)
                listener.wait_for("RELOADING", "1", timeout=30)
                listener.wait_for("READY", "1", timeout=30)
                assert all(f.result(30).ok for f in futures)
            with BlockingClient(urls[1]) as client:
                assert client.models["tiny_a"]["slo_ms"] == 3000
            config.write_text("this is = = not toml")
            server.process.send_signal(signal.SIGHUP)
            listener.wait_for("READY", "1", timeout=30)
            time.sleep(0.2)
            with BlockingClient(urls[1]) as client:
                assert client.infer("tiny_a", x, timeout=30).ok
                assert client.models["tiny_a"]["slo_ms"] == 3000
            server.process.send_signal(signal.SIGTERM)
            code, err = server.finish()
    finally:
        listener.close()
    assert code == 0, err
    assert "event=reloaded" in err and 'changed="models.tiny_a.slo_ms,logging.level"' in err, err
    assert "level=error logger=edgeserve.reload" in err and "not valid TOML" in err
