"""Another local user against a default server (issue 25, items 1 and 2): it gets neither the token nor a region.

One unprivileged process (``nobody`` through ``setpriv``, running tests/e2e/local_attacker.py) polls
every ``/proc/*/cmdline`` and ``/proc/*/environ`` it can read and opens every new ``/dev/shm`` entry
of the server the moment inotify or a listing shows it, continuously while the server starts, a
model is bound after ``run()`` (a repository-API load with the token), the backend's grown regions
are recycled, and the server is killed and restarted by the supervisor. Controls prove the watcher
could have won: it finds a marker in a root process's command line and opens a 0644 region.

Without root there is no other user to act as: those tests are skipped and say so. The last test
runs ``pytriton run-server`` (the launcher for a RemoteTriton server) and reads its server's command line.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pathlib
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Set

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.stubside import _arena
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for

SYSTEM_PYTHON = "/usr/bin/python3"
CONTROL_PREFIX = "pytriton-attack-control-"


def _why_not() -> str:
    if os.geteuid() != 0:
        return "acting as another local user needs root (setpriv --reuid=nobody); run as root to try these attacks"
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return "no 'nobody' user to act as the other local user"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is needed to act as another local user"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is needed to run the watcher as another user"
    return ""


another_user = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "runs")


def identity(requests):
    return [{"y": request["x"]} for request in requests]


def _bind(triton: Triton, name: str) -> None:
    triton.bind(
        name,
        identity,
        [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
        [Tensor(name="y", shape=(-1,), dtype=np.uint8)],
        config=ModelConfig(max_batch_size=1),
    )


def _infer(port: int, model: str, x: np.ndarray) -> bool:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        tensor = grpcclient.InferInput("x", list(x.shape), "UINT8")
        tensor.set_data_from_numpy(x)
        return bool(np.array_equal(client.infer(model, [tensor], client_timeout=30).as_numpy("y"), x))
    except Exception:  # refused while the server restarts
        return False
    finally:
        client.close()


def _backend_regions(prefix: str) -> Set[str]:
    return {name for name in os.listdir(_arena.SHM_DIR) if name.startswith(prefix)}


@contextlib.contextmanager
def watching(prefixes: List[str], secrets_: List[str]) -> Iterator[Dict[str, Any]]:
    """Run tests/e2e/local_attacker.py as ``nobody`` for the ``with`` block; the dict gets its JSON report.

    ``secrets_`` go to it on stdin; it opens every new ``/dev/shm`` entry named ``prefixes*`` on sight.
    """
    work = pathlib.Path(tempfile.mkdtemp(prefix="pytriton-attack-"))
    work.chmod(0o755)  # the watcher (nobody) reads its script and the stop file here
    script = work / "local_attacker.py"
    shutil.copy(pathlib.Path(__file__).with_name("local_attacker.py"), script)
    script.chmod(0o644)
    stop = work / "stop"
    nobody = pwd.getpwnam("nobody")
    watcher = subprocess.Popen(  # noqa: S603
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", SYSTEM_PYTHON,
         str(script), str(stop), "50", *prefixes],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
    )  # fmt: skip
    report: Dict[str, Any] = {}
    try:
        assert watcher.stdin is not None and watcher.stdout is not None
        watcher.stdin.write("".join(f"{secret}\n" for secret in secrets_))
        watcher.stdin.close()
        watcher.stdin = None  # communicate() below must not flush it
        assert watcher.stdout.readline().strip() == "ready"
        yield report
    finally:
        stop.touch()
        out, err = watcher.communicate(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    assert watcher.returncode == 0, err
    report.update(json.loads(out.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def attack() -> Iterator[Dict[str, Any]]:
    """Run the whole sequence under the watcher; yields its report plus what the test saw happen."""
    ports = triton_ports()
    triton = Triton(config=TritonConfig(python_backend_shm_recycle_idle_secs=1, **ports))  # default security
    token, control = triton.get_access_token(), "control-" + secrets.token_hex(16)
    assert token
    prefix = f"{triton._shm_prefix}-pb"
    seen: Dict[str, Any] = {}
    decoy = None
    try:
        with watching([triton._shm_prefix, CONTROL_PREFIX], [token, control]) as report:
            # Controls: what a root process shows in its command line, and a region that is 0644 from the start.
            decoy = subprocess.Popen(["/bin/sh", "-c", "sleep 30", control])  # noqa: S603
            region = pathlib.Path(_arena.SHM_DIR) / f"{CONTROL_PREFIX}{os.getpid()}"
            region.write_bytes(b"x")
            region.chmod(0o644)
            _bind(triton, "Identity")
            triton.run()  # start
            seen["start"] = _backend_regions(prefix)
            region.unlink()
            _bind(triton, "Late")  # bind after run(): a repository-API load with the token
            assert _infer(ports["grpc_port"], "Late", np.arange(16, dtype=np.uint8).reshape(1, -1))
            # Recycle: a request larger than the 4 MiB region grows it; once idle the model gets new stubs and regions.
            before = _backend_regions(prefix)
            assert _infer(ports["grpc_port"], "Identity", np.ones((1, 12 << 20), dtype=np.uint8))
            assert wait_for(lambda: len(_backend_regions(prefix) - before) >= 1, 30, 0.1), "no recycle happened"
            seen["recycled"] = _backend_regions(prefix) - before
            # Crash restart: the supervisor starts a new server with new regions.
            assert triton._backend.server is not None and triton._backend.server.pid is not None
            first = triton._backend.server.pid
            os.kill(first, signal.SIGKILL)
            assert wait_for(lambda: triton.server_restarts == 1, 60, 0.1), "the server was not restarted"
            assert wait_for(lambda: _infer(ports["grpc_port"], "Identity", np.ones((1, 8), np.uint8)), 30, 0.2)
            seen["restarted"] = _backend_regions(prefix)
            seen["server_pids"] = {first, triton._backend.server.pid}
    finally:
        if decoy is not None:
            decoy.kill()
            decoy.wait()
        triton.stop()
    report.update(events=seen)
    print(json.dumps({key: value for key, value in report.items() if key != "events"})[:2000], file=sys.stderr)
    yield report


@another_user
def test_the_watcher_could_read_what_another_user_may_read(attack):
    """Controls: a marker in a root process's command line is found, a 0644 region is opened."""
    assert attack["found"].get("1", "").endswith("/cmdline"), attack["found"]
    assert any(name.startswith(CONTROL_PREFIX) for name in attack["opened"]), attack["opened"]
    assert set(attack["events"]["server_pids"]) <= set(attack["servers"]), "the watcher did not see both servers"


@another_user
def test_the_token_is_in_no_command_line_or_environment_another_user_reads(attack):
    assert "0" not in attack["found"], f"the access token was read in {attack['found']['0']}"


@another_user
def test_no_server_region_is_opened_by_another_user(attack):
    events = attack["events"]
    regions = set().union(events["start"], events["recycled"], events["restarted"])
    assert events["recycled"] and events["restarted"] - events["start"], events
    watched = {name for name in attack["seen"] if not name.startswith(CONTROL_PREFIX)}
    assert regions <= watched, sorted(regions - watched)  # the watcher saw every one of them appear
    opened = [name for name in attack["opened"] if not name.startswith(CONTROL_PREFIX)]
    assert not opened, f"another user opened {opened}"


def _server_children(pid: int) -> List[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
                cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2 :].split()[1] == str(pid) and b"tritonserver" in cmdline.split(b"\0")[0]:
                found.append(int(entry))
    return found


def _status(port: int, path: str, headers: Dict[str, str]) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=b"{}", headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


def test_run_server_keeps_the_token_out_of_every_command_line(tmp_path):
    """``pytriton run-server``: the token from the environment protects the endpoints and is in no argv."""
    ports = triton_ports()
    token = secrets.token_urlsafe(32)
    (tmp_path / "models").mkdir()
    command = [sys.executable, "-m", "pytriton", "run-server", "--model-repository", str(tmp_path / "models")]
    command += [f"--{name.replace('_', '-')}={port}" for name, port in ports.items()]
    env = dict(os.environ, PYTRITON_ACCESS_TOKEN=token)
    with open(tmp_path / "server.log", "wb") as log:
        launcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
    try:
        assert wait_for(lambda: _server_children(launcher.pid), 60, 0.05), (tmp_path / "server.log").read_text()
        (server,) = _server_children(launcher.pid)
        cmdline = pathlib.Path(f"/proc/{server}/cmdline").read_bytes()
        assert token.encode() not in cmdline and b"--http-restricted-api=hidden:" in cmdline
        assert token.encode() not in pathlib.Path(f"/proc/{launcher.pid}/cmdline").read_bytes()

        def index(headers: Dict[str, str]) -> int:
            try:
                return _status(ports["http_port"], "/v2/repository/index", headers)
            except OSError:  # not listening yet
                return 0

        assert wait_for(lambda: index({}) == 403, 60, 0.1), (tmp_path / "server.log").read_text()[-3000:]
        assert index({"triton-access-token": token}) == 200
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        assert wait_for(lambda: not pathlib.Path(f"/proc/{server}").exists(), 10)
    finally:
        launcher.kill()
        launcher.wait()


@another_user
def test_no_in_process_region_is_opened_by_another_user(tmp_path):
    """The in-process server (issue 25, item 2): its backend runs in this process, yet every region is 0600 at birth.

    Each load of a model starts a stub with a new region; the watcher opens every one it can the moment
    inotify reports it. The server is created from a confined thread (_platform/launch.py, call_confined):
    the threads Triton starts from it create each region 0600 and cannot widen it. With the shared-memory
    guard alone each region was created 0644 and narrowed a moment later, which the watcher won.
    """
    from tests.e2e.inprocess_models import write_repository

    repository = write_repository(tmp_path / "repo", ("identity", "add_sub"))
    # The server runs in a child (tests/e2e/inprocess_regions_child.py says why); its stubs and regions
    # are this test's all the same.
    child = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "tests.e2e.inprocess_regions_child", str(repository)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=pathlib.Path(__file__).parents[2],
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        prefix = json.loads(child.stdout.readline())["prefix"]
        control = pathlib.Path(_arena.SHM_DIR) / f"{CONTROL_PREFIX}inproc-{os.getpid()}"
        with watching([prefix, CONTROL_PREFIX], []) as report:
            control.write_bytes(b"x")
            control.chmod(0o644)
            try:
                child.stdin.write("go\n")
                child.stdin.flush()
                out, _ = child.communicate(timeout=240)
            finally:
                control.unlink()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, f"the in-process server's process ended with {child.returncode}"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["answer"] == 3
    created: Set[str] = set(result["created"])
    assert any(name.startswith(CONTROL_PREFIX) for name in report["opened"]), report  # the watcher could win
    watched = {name for name in report["seen"] if name.startswith(prefix)}
    assert len(watched) >= 6 and created <= watched, (sorted(watched), sorted(created))
    opened = [name for name in report["opened"] if name.startswith(prefix)]
    assert not opened, f"another user opened {opened} of {len(watched)} in-process regions"
