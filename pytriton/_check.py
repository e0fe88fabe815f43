"""``pytriton check``: the environment a user pastes into a bug report, and a small end-to-end run.

Every item is a :class:`Item` (name, status ``ok``/``fail``/``info``, detail, how to fix). Whatever
reads the system goes through a small function so the unit tests can replace it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

OK, FAIL, INFO = "ok", "fail", "info"
_RELEVANT_ENV = re.compile(r"^(PYTRITON_|TRITON|TRITONSERVER|LD_LIBRARY_PATH$|CUDA_VISIBLE_DEVICES$)")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSWD|KEY|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
REDACTED = "<redacted>"


@dataclasses.dataclass
class Item:
    name: str
    status: str
    detail: str
    fix: str = ""


def relevant_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """pytriton/Triton variables only; values of secret-looking names are replaced by ``<redacted>``."""
    found = {}
    for name in sorted(environ):
        if _RELEVANT_ENV.match(name):
            found[name] = REDACTED if _SECRET_NAME.search(name) else environ[name]
    return found


def _glibc() -> str:
    name, version = platform.libc_ver()
    return f"{name} {version}".strip() or "unknown"


def check_platform() -> List[Item]:
    return [
        Item("platform", INFO, f"{platform.system()} {platform.release()} {platform.machine()}"),
        Item("glibc", INFO, _glibc()),
        Item("python", INFO, f"{platform.python_version()} ({sys.executable})"),
    ]


def check_python() -> List[Item]:
    from pytriton.exceptions import PyTritonError
    from pytriton.server import distribution

    items = []
    try:
        distribution.check_python_supported()
        items.append(Item("python supported", OK, distribution.supported_pythons_text()))
    except PyTritonError as exc:
        items.append(Item("python supported", FAIL, str(exc), "use Python 3.9 to 3.13"))
    try:
        items.append(Item("shared libpython", OK, str(distribution.shared_libpython_dir())))
    except PyTritonError as exc:
        items.append(Item("shared libpython", FAIL, str(exc), "use a Python built with --enable-shared"))
    return items


def _stub_numpy_version(bin_dir: pathlib.Path) -> Optional[str]:
    """numpy's version from the dist-info folder of the stub environment's site-packages."""
    for info in sorted(bin_dir.parent.glob("lib/python*/site-packages/numpy-*.dist-info")):
        return info.name[len("numpy-") : -len(".dist-info")]
    return None


def check_numpy() -> List[Item]:
    from pytriton.exceptions import PyTritonError
    from pytriton.server import distribution

    items = []
    try:
        import numpy

        items.append(Item("numpy (yours)", OK, f"{numpy.__version__}"))
    except ImportError:
        items.append(Item("numpy (yours)", FAIL, "not importable", "pip install numpy"))
    try:
        env = distribution.stub_environment()
        where = "pytriton's private stub environment" if env.own else "your environment"
        version = _stub_numpy_version(env.bin_dir) or ("2 (DLPack path)" if env.numpy2 else "1.x")
        detail = f"numpy {version} in {where} ({env.bin_dir})"
        items.append(Item("numpy (stub)", OK, detail))
    except PyTritonError as exc:
        items.append(Item("numpy (stub)", FAIL, str(exc), f"run `{distribution.INSTALL_COMMAND}`"))
    return items


def check_server() -> List[Item]:
    """The pinned wheel, the located install and its Triton version (read from the install's files)."""
    from pytriton.exceptions import PyTritonError
    from pytriton.server import distribution, versions

    arch = distribution.machine_arch()
    try:
        build = versions.resolve(versions.selected_version())
    except ValueError as exc:
        return [Item("server version", FAIL, str(exc), f"unset {versions.VERSION_ENV} or name a supported build")]
    pin = build.sha256.get(arch, "none for this architecture")
    items = [
        Item("server wheel pin", INFO, f"{distribution.SOURCE_WHEEL_NAME}=={build.wheel_version} sha256 {pin}"),
    ]
    try:
        found = distribution.find_server()
    except PyTritonError as exc:
        items.append(Item("server install", FAIL, str(exc), f"run `{distribution.INSTALL_COMMAND}`"))
        return items
    marker = found.root / distribution._COMPLETE_MARKER
    if marker.exists():
        recorded = marker.read_text().strip()
        state = "complete" if recorded == pin else f"complete, but from a wheel with sha256 {recorded}"
    else:
        state = "no completion marker (not made by install-server)"
    items.append(Item("server install", OK, f"Triton {found.version} at {found.root} ({state})"))
    chosen = f"{versions.VERSION_ENV}" if os.environ.get(versions.VERSION_ENV) else "the default build"
    items.append(
        Item("server version", OK, f"Triton {found.version} ({chosen}; supported: {versions.supported_text()})")
    )
    return items


def _free_bytes(path: str) -> int:
    return shutil.disk_usage(path).free


def check_shm(free_bytes: Callable[[str], int] = _free_bytes) -> List[Item]:
    try:
        free = free_bytes("/dev/shm")
    except OSError as exc:
        return [Item("/dev/shm", FAIL, f"unusable: {exc}", "mount a tmpfs on /dev/shm (docker: --shm-size=1g)")]
    mib = free / 2**20
    if mib < 64:
        return [Item("/dev/shm", FAIL, f"{mib:.0f} MiB free", "give /dev/shm more space (docker: --shm-size=1g)")]
    return [Item("/dev/shm", OK, f"{mib:.0f} MiB free")]


def check_private_launch() -> List[Item]:
    """Whether the server can start with its token hidden and its regions private (docs/security.md)."""
    from pytriton._platform import launch as _launch

    try:
        trace_problem, filter_problem = _launch.probe(sys.executable)
    except (OSError, subprocess.SubprocessError) as exc:
        trace_problem = filter_problem = str(exc)
    fix = "allow ptrace of own children and seccomp filters (docs/security.md)"
    return [
        Item("token hidden from other users", FAIL, trace_problem, fix)
        if trace_problem
        else Item("token hidden from other users", OK, "passed through the environment, not argv"),
        Item("backend regions private", FAIL, filter_problem, fix)
        if filter_problem
        else Item("backend regions private", OK, "0600 from creation (umask 077, chmod filter)"),
    ]


def check_hardening(
    environ: Optional[Mapping[str, str]] = None,
    probe: Optional[Callable[[], Tuple[Optional[str], Optional[str]]]] = None,
) -> List[Item]:
    """The hardening mode (``PYTRITON_HARDENING``) and which protections a server started now would have.

    ``probe`` (default: the private launch tried on this Python) returns ``(trace problem, filter problem)``.
    Under ``strict`` a protection the platform refuses is a failure (the server would not start); under
    ``auto`` it is information (the server starts without it, with a warning); under ``off`` none applies.
    """
    from pytriton._platform import hardening
    from pytriton.exceptions import PyTritonValidationError

    environ = os.environ if environ is None else environ
    try:
        mode = hardening.resolve(None, environ)
    except PyTritonValidationError as exc:
        return [Item("hardening", FAIL, str(exc), "set PYTRITON_HARDENING to off, auto or strict")]
    names = (hardening.HIDDEN_TOKEN, hardening.CHMOD_FILTER, hardening.SHM_GUARD, hardening.INPROCESS_MODES)
    if mode == hardening.OFF:
        return [Item("hardening", INFO, "off: pytriton applies none of its protections (docs/security.md)")] + [
            Item(f"protection {name}", INFO, "inactive (PYTRITON_HARDENING=off)") for name in names
        ]
    if probe is None:
        from pytriton._platform import launch as _launch

        def probe() -> Tuple[Optional[str], Optional[str]]:
            return _launch.probe(sys.executable)

    try:
        trace_problem, filter_problem = probe()
    except (OSError, subprocess.SubprocessError) as exc:
        trace_problem = filter_problem = str(exc)
    problems = {
        hardening.HIDDEN_TOKEN: trace_problem,
        hardening.CHMOD_FILTER: filter_problem,
        hardening.SHM_GUARD: None if _shm_guard_starts() else "inotify is unavailable here",
        hardening.INPROCESS_MODES: _thread_confines(),
    }
    items = [Item("hardening", INFO, f"{mode} (PYTRITON_HARDENING or TritonConfig.hardening; default auto)")]
    for name in names:
        problem = problems[name]
        if problem is None:
            items.append(Item(f"protection {name}", OK, f"active: {hardening.WHAT[name]}"))
        elif mode == hardening.STRICT:
            items.append(
                Item(
                    f"protection {name}",
                    FAIL,
                    f"refused ({problem}): strict refuses to start",
                    "fix the cause, or use auto",
                )
            )
        else:
            items.append(
                Item(f"protection {name}", INFO, f"inactive ({problem}): auto starts without it, with a warning")
            )
    return items


def _thread_confines() -> Optional[str]:
    """Why the in-process server's start thread could not be confined here; None if it can (tried on a thread that then ends)."""
    import threading

    from pytriton._platform import launch as _launch

    found: List[Optional[str]] = ["the probe thread did not finish"]

    def attempt() -> None:
        found[0] = _launch.confine_thread()

    thread = threading.Thread(target=attempt, name="pytriton-check-confine")
    thread.start()
    thread.join(10.0)
    return found[0]


def _shm_guard_starts() -> bool:
    from pytriton.server._shm_guard import ShmGuard

    guard = ShmGuard("pytriton-check-")
    try:
        return guard.start()
    finally:
        guard.stop()


def _port_free(address: str, port: int) -> bool:
    """True when tritonserver could bind ``port`` (a port with connections in TIME_WAIT is free for it)."""
    from pytriton.server.process import port_taken

    return port_taken(address, port) is None


PORT_LABELS = ("http", "grpc", "metrics")


def check_ports(
    environ: Optional[Mapping[str, str]] = None,
    port_free: Callable[[str, int], bool] = _port_free,
    ports: Optional[Mapping[str, Optional[int]]] = None,
) -> List[Item]:
    """Whether the server's ports are free, as a server started with this environment would bind them.

    ``ports``: the ports given on ``pytriton check``'s command line (``{"http": 9000, ...}``; None or
    missing: not given); they win over ``PYTRITON_TRITON_CONFIG_<LABEL>_PORT``, which wins over the
    default. A failure's fix names what a command line can set.
    """
    from pytriton.server.command import effective_options
    from pytriton.triton import TritonConfig

    environ = os.environ if environ is None else environ
    options = effective_options(TritonConfig.from_env(environ))
    items = []
    for label in PORT_LABELS:
        variable = f"PYTRITON_TRITON_CONFIG_{label.upper()}_PORT"
        given = (ports or {}).get(label)
        if given is not None:
            port, source = int(given), f"--{label}-port"
        else:
            port = int(options.get(f"{label}_port", 0))
            source = variable if variable in environ else "default"
        address = options.get(f"{label}_address", "127.0.0.1")
        name = f"{label} port {address}:{port}"
        if port == 0 or port_free(address, port):
            items.append(Item(name, OK, f"free (from {source})"))
        else:
            fix = (
                f"stop what uses {label} port {port}, or serve on another one: {variable}=<port> in the "
                f"server's environment (TritonConfig({label}_port=<port>) in code); "
                f"`pytriton check --{label}-port <port>` checks it first"
            )
            items.append(Item(name, FAIL, f"in use (from {source})", fix))
    return items


def smoke_test() -> List[Item]:
    """Bind an identity model on free loopback ports; one HTTP and one gRPC inference; stop."""
    import socket

    import numpy as np

    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    sockets = [socket.socket() for _ in range(3)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        http, grpc, metrics = (sock.getsockname()[1] for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()

    def identity(requests: List[Mapping[str, object]]) -> List[Dict[str, Any]]:
        return [{"y": request["x"]} for request in requests]

    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    timings: Dict[str, float] = {}
    try:
        started = time.monotonic()
        local = "127.0.0.1"  # a check of this machine: nothing listens beyond it
        config = TritonConfig(
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            http_address=local,
            grpc_address=local,
            metrics_address=local,
        )
        with Triton(config=config) as triton:
            triton.bind(
                "pytriton_check_identity",
                identity,
                inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
                outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=4),
            )
            triton.run()
            timings["start_s"] = time.monotonic() - started
            import tritonclient.grpc as grpcclient
            import tritonclient.http as httpclient

            for label, module, url in (
                ("http", httpclient, f"127.0.0.1:{http}"),
                ("grpc", grpcclient, f"127.0.0.1:{grpc}"),
            ):
                begin = time.monotonic()
                client = module.InferenceServerClient(url)
                try:
                    tensor = module.InferInput("x", list(data.shape), "FP32")
                    tensor.set_data_from_numpy(data)
                    result = client.infer("pytriton_check_identity", [tensor]).as_numpy("y")
                finally:
                    client.close()
                if result is None or not np.array_equal(result, data):
                    raise RuntimeError(f"{label} inference returned {result!r}, expected {data!r}")
                timings[f"{label}_infer_s"] = time.monotonic() - begin
            stopping = time.monotonic()
        timings["stop_s"] = time.monotonic() - stopping
    except Exception as exc:  # noqa: BLE001 - any failure is the report's content
        return [
            Item("smoke test", FAIL, f"{type(exc).__name__}: {exc}", "see the error above; run with the server log")
        ]
    detail = ", ".join(f"{key} {value:.3f}" for key, value in timings.items())
    return [Item("smoke test", OK, f"identity model over HTTP and gRPC: {detail}")]


def run_checks(
    smoke: bool = True, environ: Optional[Mapping[str, str]] = None, ports: Optional[Mapping[str, Optional[int]]] = None
) -> Dict[str, Any]:
    """Every check's items, whether all passed, and the relevant environment (``ports``: see :func:`check_ports`)."""
    from pytriton import __version__

    environ = os.environ if environ is None else environ
    items: List[Item] = [Item("pytriton", INFO, __version__)]
    for section in (check_platform, check_python, check_numpy, check_server, check_shm, check_private_launch):
        items.extend(section())
    items.extend(check_hardening(environ))
    items.extend(check_ports(environ, ports=ports))
    if smoke:
        items.extend(smoke_test())
    failed = [item for item in items if item.status == FAIL]
    return {
        "ok": not failed,
        "items": [dataclasses.asdict(item) for item in items],
        "environment": relevant_environment(environ),
    }


def format_text(report: Mapping[str, Any]) -> str:
    lines = []
    for item in report["items"]:
        lines.append(f"[{item['status']:>4}] {item['name']}: {item['detail']}")
    if report["environment"]:
        lines.append("environment:")
        lines.extend(f"  {name}={value}" for name, value in report["environment"].items())
    for item in report["items"]:
        if item["status"] == FAIL:
            lines.append(f"FAILED: {item['name']}: {item['fix'] or item['detail']}")
    lines.append("all checks passed" if report["ok"] else "some checks failed")
    return "\n".join(lines)


def main(json_output: bool = False, smoke: bool = True, ports: Optional[Mapping[str, Optional[int]]] = None) -> int:
    """``pytriton check``: print the report; the exit code is 0 when every check passed, else 1."""
    report = run_checks(smoke=smoke, ports=ports)
    print(json.dumps(report, indent=2) if json_output else format_text(report))
    return 0 if report["ok"] else 1
