"""The checks `edgeserve doctor` runs: each looks at one thing and says ok, warn, FAIL or skip,
what it found, and the command that fixes it.

Checks read the real state of the box (the backend it creates, the repository's files, /proc,
the device nodes, the Jetson tools); none of them changes anything.
"""

from __future__ import annotations

import grp
import importlib.util
import os
import re
import shutil
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeserve.config.server import ServerConfig
from edgeserve.errors import EdgeServeError
from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import Manifest
from edgeserve.repository import ModelRepository, profile_command
from edgeserve.runtime.backends.select import gpu_visible

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
UNIT_PATH = Path("/etc/systemd/system/edgeserve.service")
MEMORY_MARGIN_BYTES = 512 * 1024 * 1024  # runtime, Python, CUDA context on top of the engines
MEMORY_FACTOR = 2.0  # sessions hold the weights plus activations and copies
TOOL_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `status` is ok / warn / FAIL / skip; `fix` is a command or an action."""

    check: str
    status: str
    finding: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    """What the checks share: the config (once parsed), the backend's fingerprint, the manifests."""

    config_path: Path
    config: ServerConfig | None = None
    fingerprint: Fingerprint | None = None
    manifests: list[Manifest] = field(default_factory=list)
    unit_path: Path = UNIT_PATH
    meminfo_path: Path = Path("/proc/meminfo")


def _run(command: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def check_config(ctx: Context) -> list[Finding]:
    if not ctx.config_path.exists():
        return [
            Finding(
                "config",
                FAIL,
                f"{ctx.config_path}: no such file",
                "sudo edgeserve install-service (writes /etc/edgeserve/config.toml), or pass --config FILE",
            )
        ]
    try:
        ctx.config = ServerConfig.from_toml(ctx.config_path)
    except EdgeServeError as exc:
        return [Finding("config", FAIL, str(exc), f"edit {ctx.config_path} (keys: systemd/config.toml)")]
    models = ", ".join(ctx.config.models)
    return [Finding("config", OK, f"{ctx.config_path} parses; serves {models}")]


def check_backend(ctx: Context) -> list[Finding]:
    """Create the configured backend (no model loaded) and read the fingerprint profiles are keyed by."""
    if ctx.config is None:
        return [Finding("backend", SKIP, "no valid config")]
    from edgeserve.runtime.server import default_backend

    config = ctx.config
    findings = []
    name = config.backend.name
    if name in ("onnxruntime", "auto") and importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime as ort

        providers = ort.get_available_providers()
        gpu_providers = [p for p in providers if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
        findings.append(
            Finding(
                "backend.providers",
                OK if gpu_providers or not gpu_visible() else WARN,
                f"onnxruntime {ort.__version__}: {', '.join(providers)}",
                None
                if gpu_providers or not gpu_visible()
                else "a GPU is present but this onnxruntime is CPU-only: pip uninstall onnxruntime && "
                "pip install onnxruntime-gpu (on a Jetson: the wheel built for your JetPack)",
            )
        )
    if name == "tensorrt" and importlib.util.find_spec("tensorrt") is None:
        findings.append(
            Finding(
                "backend.tensorrt",
                FAIL,
                "backend.name is tensorrt but the tensorrt module is not importable",
                "on a Jetson: sudo apt install nvidia-jetpack; on x86: pip install tensorrt",
            )
        )
        return findings
    try:
        backend = default_backend(ModelRepository(Path(config.repository)), config.backend)
    except EdgeServeError as exc:
        findings.append(
            Finding("backend", FAIL, str(exc), "fix [backend] in the config or install what it names")
        )
        return findings
    try:
        ctx.fingerprint = backend.fingerprint()
    finally:
        backend.close()
    fp = ctx.fingerprint
    findings.append(
        Finding("backend", OK, f"{fp.backend} on {fp.device}, threads {fp.threads}; fingerprint {fp.key()}")
    )
    return findings


def check_device(ctx: Context) -> list[Finding]:
    tegra = Path("/etc/nv_tegra_release")
    if tegra.exists():
        release = tegra.read_text(errors="replace").splitlines()[0].lstrip("# ").strip()
        return [Finding("device", OK, f"Jetson: {release}")]
    if shutil.which("nvidia-smi"):
        code, out = _run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        )
        if code == 0 and out:
            return [Finding("device", OK, f"NVIDIA GPU: {out.splitlines()[0]}")]
        return [
            Finding(
                "device", FAIL, f"nvidia-smi failed: {out[:200]}", "check the driver: dmesg | grep -i nvrm"
            )
        ]
    if Path("/dev/nvidia0").exists():
        return [Finding("device", OK, "/dev/nvidia0 present (no nvidia-smi to query it)")]
    wants_gpu = ctx.config is not None and (
        ctx.config.backend.name == "tensorrt"
        or any(p.lower() in ("cuda", "tensorrt", "trt") or "CUDA" in p for p in ctx.config.backend.providers)
    )
    if wants_gpu:
        return [
            Finding(
                "device",
                FAIL,
                "the config asks for a GPU but none is visible (no /dev/nvidia0, nvidia-smi or Jetson)",
                'install the NVIDIA driver, or set [backend] providers = ["cpu"]',
            )
        ]
    return [Finding("device", OK, "no NVIDIA GPU; the config runs on the CPU")]


def check_models(ctx: Context) -> list[Finding]:
    """Every configured model's manifest verifies and has a profile for this device's fingerprint."""
    if ctx.config is None:
        return [Finding("models", SKIP, "no valid config")]
    repository = ModelRepository(Path(ctx.config.repository))
    findings = []
    for name in ctx.config.models:
        try:
            manifest = repository.load_manifest(name)
        except EdgeServeError as exc:
            fix = f"edgeserve export --model {name} --repository {repository.root}"
            findings.append(Finding(f"model {name}", FAIL, str(exc), fix))
            continue
        ctx.manifests.append(manifest)
        if ctx.fingerprint is None:
            findings.append(
                Finding(f"profile {name}", SKIP, "no backend fingerprint (see the backend check)")
            )
            continue
        fix = profile_command(repository, name, ctx.fingerprint)
        try:
            repository.load_profile(manifest, ctx.fingerprint)
        except EdgeServeError as exc:
            findings.append(Finding(f"profile {name}", FAIL, str(exc), fix))
            continue
        path = repository.profile_path(name, ctx.fingerprint)
        findings.append(Finding(f"profile {name}", OK, f"manifest verified; profile {path.name} matches"))
    return findings


_FREQ = re.compile(r"MinFreq=(\d+)\s+MaxFreq=(\d+)")


def check_jetson_clocks(ctx: Context) -> list[Finding]:
    """Locked clocks make the profile's latencies hold; DVFS makes them wander."""
    if not (shutil.which("nvpmodel") and shutil.which("jetson_clocks")):
        return [Finding("jetson clocks", SKIP, "nvpmodel/jetson_clocks not on PATH (not a Jetson)")]
    findings = []
    code, out = _run(["nvpmodel", "-q"])
    mode = " ".join(out.split()) if code == 0 else f"nvpmodel -q failed: {out[:200]}"
    findings.append(
        Finding(
            "jetson power mode", OK if code == 0 else WARN, mode, None if code == 0 else "sudo nvpmodel -q"
        )
    )
    code, out = _run(["jetson_clocks", "--show"])
    if code != 0:
        findings.append(
            Finding(
                "jetson clocks",
                WARN,
                f"jetson_clocks --show failed: {out[:200]}",
                "sudo jetson_clocks --show",
            )
        )
        return findings
    pairs = _FREQ.findall(out)
    unlocked = [
        line.split(":")[0].split()[0]
        for line in out.splitlines()
        if (m := _FREQ.search(line)) and m[1] != m[2]
    ]
    if pairs and not unlocked:
        findings.append(Finding("jetson clocks", OK, f"locked ({len(pairs)} clock domains at max)"))
    else:
        findings.append(
            Finding(
                "jetson clocks",
                WARN,
                f"not locked ({', '.join(unlocked[:6]) or 'no MinFreq/MaxFreq found'}): "
                "latencies drift from the profile",
                "sudo jetson_clocks (and run it at boot, e.g. a oneshot unit Before=edgeserve.service); "
                "profile with the clocks locked",
            )
        )
    return findings


def check_socket(ctx: Context) -> list[Finding]:
    if ctx.config is None or ctx.config.listen.unix is None:
        return [Finding("socket", SKIP, "no [listen] unix socket configured")]
    listen = ctx.config.listen
    path = Path(listen.unix)
    parent = path.parent
    findings = []
    if not parent.is_dir():
        if parent == Path("/run/edgeserve"):
            findings.append(
                Finding("socket dir", OK, f"{parent} is created by the unit's RuntimeDirectory at start")
            )
        else:
            findings.append(
                Finding(
                    "socket dir",
                    FAIL,
                    f"{parent} does not exist",
                    f"mkdir -p {parent} (or put the socket in /run/edgeserve)",
                )
            )
        return findings
    if not os.access(parent, os.W_OK | os.X_OK):
        findings.append(
            Finding("socket dir", FAIL, f"{parent} is not writable by this user", f"chown edgeserve {parent}")
        )
    else:
        findings.append(Finding("socket dir", OK, f"{parent} exists and is writable"))
    if path.exists() or path.is_symlink():
        st = path.lstat()
        if not stat.S_ISSOCK(st.st_mode):
            findings.append(Finding("socket", FAIL, f"{path} exists and is not a socket", f"rm {path}"))
            return findings
        problems = []
        if stat.S_IMODE(st.st_mode) != listen.unix_mode:
            problems.append(f"mode {stat.S_IMODE(st.st_mode):04o}, config says {listen.unix_mode:04o}")
        if listen.unix_group is not None:
            try:
                want = grp.getgrnam(listen.unix_group).gr_gid
            except KeyError:
                findings.append(
                    Finding(
                        "socket",
                        FAIL,
                        f"listen.unix_group {listen.unix_group!r} does not exist",
                        f"groupadd --system {listen.unix_group}",
                    )
                )
                return findings
            if st.st_gid != want:
                problems.append(f"group gid {st.st_gid}, config says {listen.unix_group}")
        live = _answers(path)
        state = (
            "a server is listening"
            if live
            else "nobody is listening (left behind; the server removes it at start)"
        )
        if problems:
            findings.append(
                Finding(
                    "socket",
                    WARN,
                    f"{path}: {'; '.join(problems)}; {state}",
                    "systemctl restart edgeserve (it applies the config's mode and group)",
                )
            )
        else:
            findings.append(Finding("socket", OK, f"{path}: mode {listen.unix_mode:04o}; {state}"))
    return findings


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def mem_available(meminfo: Path) -> int | None:
    """MemAvailable in bytes from /proc/meminfo, or None where it cannot be read."""
    try:
        match = re.search(r"^MemAvailable:\s+(\d+)\s+kB", meminfo.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def engine_bytes(ctx: Context) -> int:
    """Bytes of the graphs/engines the configured models load (ONNX stages plus built engines)."""
    if ctx.config is None:
        return 0
    total = 0
    repository = ModelRepository(Path(ctx.config.repository))
    for manifest in ctx.manifests:
        total += sum(stage.size_bytes for stage in manifest.stages)
        trt = repository.model_dir(manifest.name) / "trt"
        if ctx.config.backend.name == "tensorrt" and trt.is_dir():
            total += sum(p.stat().st_size for p in trt.rglob("*") if p.is_file())
    return total


def check_memory(ctx: Context) -> list[Finding]:
    if ctx.config is None:
        return [Finding("memory", SKIP, "no valid config")]
    available = mem_available(ctx.meminfo_path)
    if available is None:
        return [Finding("memory", SKIP, f"cannot read MemAvailable from {ctx.meminfo_path}")]
    engines = engine_bytes(ctx)
    needed = int(engines * MEMORY_FACTOR) + MEMORY_MARGIN_BYTES
    text = (
        f"{available / 2**20:.0f} MiB available; models {engines / 2**20:.1f} MiB, "
        f"needs about {needed / 2**20:.0f} MiB"
    )
    if available < needed:
        return [
            Finding(
                "memory",
                FAIL,
                text,
                "serve fewer or smaller models, or stop other services (free -m; top -o %MEM)",
            )
        ]
    if available < 2 * needed:
        return [
            Finding("memory", WARN, text + " (little headroom)", "stop other services or serve fewer models")
        ]
    return [Finding("memory", OK, text)]


def check_unit(ctx: Context) -> list[Finding]:
    if not ctx.unit_path.exists():
        return [
            Finding("systemd unit", WARN, f"{ctx.unit_path} not installed", "sudo edgeserve install-service")
        ]
    match = re.search(r"^ExecStart=(\S+)", ctx.unit_path.read_text(), re.MULTILINE)
    binary = Path(match.group(1)) if match else None
    if binary is None or not os.access(binary, os.X_OK):
        return [
            Finding(
                "systemd unit",
                FAIL,
                f"{ctx.unit_path}: ExecStart runs {binary}, which is not an executable",
                "sudo edgeserve install-service (rewrites the unit for this environment)",
            )
        ]
    return [Finding("systemd unit", OK, f"{ctx.unit_path} runs {binary}")]


UPSTREAM_PROBE_TIMEOUT_S = 3.0


def probe_upstream(url: str, token: str | None, timeout: float = UPSTREAM_PROBE_TIMEOUT_S) -> str | None:
    """None when GET <url>/v2/health/ready answers 200, else why not (refused, timeout, HTTP status)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url.rstrip("/") + "/v2/health/ready")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from /v2/health/ready"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(exc).__name__


def check_upstreams(ctx: Context) -> list[Finding]:
    """Every [[upstreams]] server answers its readiness probe; a dead one is named with its URL."""
    if ctx.config is None or not ctx.config.upstreams:
        return [Finding("upstreams", SKIP, "no [[upstreams]] configured")]
    findings = []
    for upstream in ctx.config.upstreams:
        check = f"upstream {upstream.name}"
        problem = probe_upstream(upstream.url, upstream.token)
        if problem is None:
            findings.append(Finding(check, OK, f"{upstream.url} is ready"))
        else:
            findings.append(
                Finding(
                    check,
                    WARN,
                    f"{upstream.url} is not ready ({problem}); nothing is offloaded to it, "
                    "requests it would take are served locally",
                    f"start the server at {upstream.url}, or fix/remove its [[upstreams]] table "
                    f"(name = {upstream.name!r}) in {ctx.config_path}",
                )
            )
    return findings


# In order: later checks use what earlier ones put in the Context (config, fingerprint, manifests).
CHECKS: tuple[Callable[[Context], list[Finding]], ...] = (
    check_config,
    check_backend,
    check_device,
    check_models,
    check_jetson_clocks,
    check_socket,
    check_upstreams,
    check_memory,
    check_unit,
)


def run_checks(ctx: Context) -> list[Finding]:
    """Every check; one that crashes becomes a FAIL naming the exception (doctor never dies)."""
    findings: list[Finding] = []
    for check in CHECKS:
        try:
            findings.extend(check(ctx))
        except Exception as exc:
            name = check.__name__.removeprefix("check_")
            findings.append(
                Finding(name, FAIL, f"check crashed: {type(exc).__name__}: {exc}", "report this as a bug")
            )
    return findings
