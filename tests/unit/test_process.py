"""``TritonServerProcess`` driven with fake "servers": small Python scripts (no tritonserver).

Covers log capture (buffer, file, error lines; crash lines and ``describe_exit``/``kill_stub`` are in
test_self_healing.py), readiness (a probe, a death before it, a
probe that never succeeds), the exit callbacks (only for a server that came up and was not
stopped), and ``stop()`` with a server that ignores SIGINT and leaves a child in its group.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import textwrap

import pytest

from pytriton.exceptions import PyTritonServerError
from pytriton.server import process as process_module
from pytriton.server.process import TritonServerProcess, check_ports_free
from tests.conftest import wait_for


def _server(tmp_path, body, **kwargs):
    script = tmp_path / "fake_server.py"
    script.write_text(textwrap.dedent(body))
    server = TritonServerProcess([sys.executable, str(script)], dict(os.environ), **kwargs)
    return server


@pytest.fixture()
def servers():
    started = []
    yield started
    for server in started:
        server.stop(grace_s=5.0)


def _start(servers, server):
    servers.append(server)
    server.start()
    return server


def test_output_is_kept_in_the_buffer_and_the_log_file(tmp_path, servers):
    log = tmp_path / "logs" / "server.log"
    server = _start(
        servers,
        _server(
            tmp_path,
            """
            print("I1124 starting", flush=True)
            print("E1124 12:00:00 model.cc:1] failed to load 'Bad'", flush=True)
            print("E1124 NVML not available", flush=True)  # harmless on CPU-only machines
            print("error: creating server: Invalid argument", flush=True)
            """,
            log_path=log,
            log_buffer_lines=3,
        ),
    )
    assert wait_for(lambda: not server.is_alive(), 10)
    assert wait_for(lambda: len(server.log_lines) == 3, 10), server.log_lines
    # Bounded: the first line fell out of the buffer but is in the file.
    assert server.log_lines[0].startswith("E1124 12:00:00")
    assert server.error_lines() == ["E1124 12:00:00 model.cc:1] failed to load 'Bad'", server.log_lines[-1]]
    server.stop(grace_s=5.0)
    assert log.read_text().splitlines()[0] == "I1124 starting"


@pytest.mark.parametrize(
    ("instance_line", "started"),
    [
        (
            """'I1127 17:22:29.774916 1314 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: M_0_0 (CPU device 0)"'""",
            True,
        ),
        ('"TRITONBACKEND_ModelInstanceInitialize: printed by something else"', False),
    ],
    ids=["python_be", "another_source"],
)
def test_the_python_backend_counts_as_started_once_it_starts_an_instance(tmp_path, servers, instance_line, started):
    """What lets a failed start still claim the backend's /tmp directory (server/_scratch.py); only
    the Python backend's own line counts."""
    server = _start(
        servers,
        _server(
            tmp_path,
            f"""
            print('I1127 17:22:29.772705 1314 model_lifecycle.cc:472] "loading: M:1"', flush=True)
            print({instance_line}, flush=True)
            print("done", flush=True)
            """,
        ),
    )
    assert wait_for(lambda: "done" in server.log_lines, 10), server.log_lines
    assert server.python_backend_started is started


def test_wait_until_returns_once_the_probe_succeeds(tmp_path, servers):
    ready = tmp_path / "ready"
    server = _start(
        servers,
        _server(tmp_path, f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)\n"),
    )
    server.wait_until(ready.exists, timeout_s=30, what="Starting")
    assert server.is_alive() and server.pid is not None


def test_a_server_dying_before_ready_fails_with_its_own_error_lines(tmp_path, servers):
    server = _start(
        servers,
        _server(
            tmp_path,
            """
            import sys
            print("I1124 starting")
            print("E1124 http_server.cc:1] Socket '127.0.0.1:8000' already in use")
            sys.exit(3)
            """,
        ),
    )
    with pytest.raises(PyTritonServerError, match=r"Starting: tritonserver exited with code 3\.") as info:
        server.wait_until(lambda: False, timeout_s=30, what="Starting")
    message = str(info.value)
    assert "Port 8000 on 127.0.0.1 is already in use; choose another port." in message
    assert "Socket '127.0.0.1:8000' already in use" in message


def test_a_probe_that_never_succeeds_times_out_with_the_last_output(tmp_path, servers):
    server = _start(servers, _server(tmp_path, "import time\nprint('still loading', flush=True)\ntime.sleep(60)\n"))
    assert wait_for(lambda: server.log_lines, 10)
    with pytest.raises(PyTritonServerError, match=r"(?s)Loading: not done after 0 s although .*still loading"):
        server.wait_until(lambda: False, timeout_s=0.2, what="Loading")


def test_exit_callback_fires_for_a_server_that_came_up_and_died(tmp_path, servers):
    go = tmp_path / "go"
    server = _server(
        tmp_path,
        f"""
        import os, sys, time
        for _ in range(1000):
            if os.path.exists({str(go)!r}):
                sys.exit(7)
            time.sleep(0.01)
        """,
    )
    codes = []
    server.register_on_exit(codes.append)
    server.register_on_exit(lambda code: 1 / 0)  # a failing callback does not stop the others
    server.register_on_exit(codes.append)
    _start(servers, server)
    server.wait_until(lambda: True, timeout_s=10, what="Starting")
    go.touch()
    assert wait_for(lambda: codes == [7, 7], 15), codes


def test_exit_callback_does_not_fire_for_a_stopped_or_never_ready_server(tmp_path, servers):
    codes = []
    stopped = _server(tmp_path, "import time\ntime.sleep(60)\n")
    stopped.register_on_exit(codes.append)
    _start(servers, stopped)
    stopped.wait_until(lambda: True, timeout_s=10, what="Starting")
    stopped.stop(grace_s=5.0)

    never_ready = _server(tmp_path, "import sys\nsys.exit(1)\n")
    never_ready.register_on_exit(codes.append)
    _start(servers, never_ready)
    assert wait_for(lambda: not never_ready.is_alive(), 10)
    never_ready._waiter.join(10)
    assert codes == []


def _running(pid):
    """True while ``pid`` runs (a zombie, which nobody may reap in a container, does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


IGNORE_SIGINT = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up', flush=True)\n"


def test_stop_ends_a_server_that_ignores_sigint_and_its_whole_group(tmp_path, servers):
    child_pid_file = tmp_path / "child.pid"
    child = (
        "import os, pathlib, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"pathlib.Path({str(child_pid_file)!r}).write_text(str(os.getpid())); time.sleep(60)"
    )
    server = _start(
        servers,
        _server(
            tmp_path,
            IGNORE_SIGINT
            + f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)\n",
        ),
    )
    # Both ignore SIGINT from here on: only the SIGKILL after the grace period can end them.
    assert wait_for(lambda: "up" in server.log_lines and child_pid_file.exists() and child_pid_file.read_text(), 10)
    child_pid = int(child_pid_file.read_text())
    pgid = server.pid
    server.stop(grace_s=0.3)
    assert not server.is_alive()
    assert server._process.returncode == -signal.SIGKILL
    assert not process_module._group_alive(pgid), "a process of the server's group survived stop()"
    assert not _running(child_pid)
    server.stop()  # idempotent


def test_stop_kills_at_once_when_wait_idle_reports_nothing_left(tmp_path, servers):
    server = _start(servers, _server(tmp_path, IGNORE_SIGINT + "time.sleep(60)\n"))
    server.wait_until(lambda: "up" in server.log_lines, timeout_s=10, what="Starting")
    deadlines = []

    def wait_idle(deadline):
        deadlines.append(deadline)
        return True

    # With grace_s=60 only the SIGKILL after wait_idle can end this server before the test's timeout.
    server.stop(grace_s=60, wait_idle=wait_idle)
    assert len(deadlines) == 1
    assert server._process.returncode == -signal.SIGKILL


def test_a_server_that_exits_on_sigint_is_not_killed(tmp_path, servers):
    server = _start(
        servers,
        _server(
            tmp_path,
            # The handler is installed explicitly: Python leaves SIGINT ignored when it starts with it
            # ignored, as under a shell's background job (`.ci/run &`).
            "import signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "print('up', flush=True)\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    sys.exit(0)\n",
        ),
    )
    # Printed once the interpreter runs the script, so its SIGINT handler is in place.
    server.wait_until(lambda: "up" in server.log_lines, timeout_s=10, what="Starting")
    server.stop(grace_s=30)
    assert server._process.returncode == 0


def test_stop_before_start_does_nothing():
    TritonServerProcess(["tritonserver"], {}).stop()


def test_check_ports_free_names_the_busy_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(PyTritonServerError, match=rf"grpc port {port} on 127.0.0.1 is already in use"):
            check_ports_free({"http": 0, "grpc": port})
    check_ports_free({"http": 0})  # 0: any port, nothing to check


def test_an_unexpected_exit_ends_the_group_so_inherited_connections_close(tmp_path, servers):
    # The hang seen in the soak: Triton forked a stub while pytriton's repository request was open,
    # the stub inherited the connection, the server died, and the request waited for its timeout.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    go = tmp_path / "go"
    child_pid_file = tmp_path / "child.pid"
    server = _server(
        tmp_path,
        f"""
        import os, socket, sys, time
        peer = socket.create_connection(("127.0.0.1", {port}))  # stands for an accepted client connection
        if os.fork() == 0:  # a "stub": inherits the connection and lives on
            open({str(child_pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(60)
            os._exit(0)
        for _ in range(1000):
            if os.path.exists({str(go)!r}):
                os._exit(1)  # the server dies; the child keeps its copy of the connection
            time.sleep(0.01)
        """,
    )
    codes = []
    server.register_on_exit(codes.append)
    with listener:
        _start(servers, server)
        server.wait_until(lambda: True, timeout_s=10, what="Starting")
        client_side, _ = listener.accept()
        with client_side:
            assert wait_for(lambda: child_pid_file.exists() and child_pid_file.read_text(), 10)
            client_side.settimeout(30)
            go.touch()
            # Without the group kill this read would wait for the child's 60 s sleep (and time out).
            assert client_side.recv(1) == b""
    assert wait_for(lambda: codes == [1], 15), codes
    # A killed process closes its files before it turns into a zombie: the connection can read as
    # closed a moment before /proc shows the child gone.
    child = int(child_pid_file.read_text())
    assert wait_for(lambda: not _running(child), 10), child


_CAPPED = textwrap.dedent(
    """
    import os, resource, subprocess, sys, time
    print("up", flush=True)
    if len(sys.argv) > 2:  # what Triton prints once its endpoint accepts connections
        print('I1126 http_server.cc:4713] "Started HTTPService at 127.0.0.1:8000"', flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    print("soft", resource.getrlimit(resource.RLIMIT_DATA)[0], flush=True)
    child = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_DATA)[0])"],
                           capture_output=True, text=True).stdout.strip()
    print("child", child, flush=True)
    try:
        block = bytearray(1 << 30)
        print("allocated", flush=True)
    except MemoryError:
        print("refused", flush=True)
    """
)


def _run_capped(tmp_path, headroom: int, listens: bool = False) -> list:
    """Run the script above as a "server" with ``headroom``; once capped, let it try 1 GiB. Its lines.

    ``listens``: it prints Triton's "Started HTTPService" line, and the test waits for that instead
    of calling ``wait_until`` (the cap must come from the log line alone).
    """
    go = tmp_path / "go"
    argv = [sys.executable, "-c", _CAPPED, str(go)] + (["listens"] if listens else [])
    server = TritonServerProcess(argv, dict(os.environ), data_headroom=headroom)
    server.start()
    try:
        if listens:
            assert wait_for(lambda: server.listening, 30)
        else:
            server.wait_until(lambda: "up" in server.log_lines, 30, "the fake server")  # ready: capped now
        go.touch()
        server._process.wait(30)
        server._reader.join(10)
    finally:
        server.stop(grace_s=1.0)
    return server.log_lines


def test_a_ready_server_is_capped_at_its_private_memory_plus_the_headroom(tmp_path):
    headroom = 256 << 20
    lines = _run_capped(tmp_path, headroom)
    soft = int(next(line.split()[1] for line in lines if line.startswith("soft ")))
    # The cap is what the process used when it became ready plus the headroom (an idle Python: < 512 MiB).
    assert headroom < soft < headroom + (512 << 20), lines
    assert f"child {soft}" in lines  # processes it starts later (the stubs) inherit the cap
    assert "refused" in lines and "allocated" not in lines


def test_the_cap_comes_as_soon_as_the_server_says_it_listens(tmp_path):
    lines = _run_capped(tmp_path, 256 << 20, listens=True)
    assert "refused" in lines and "allocated" not in lines, lines


def test_no_cap_without_a_headroom(tmp_path):
    lines = _run_capped(tmp_path, 0)
    assert f"soft {resource.RLIM_INFINITY}" in lines and "allocated" in lines


def test_a_server_whose_watcher_threads_cannot_start_is_killed(monkeypatch):
    # "can't start new thread" under memory pressure: a server nobody watches must not run on (a
    # restart attempt fails and is retried; pytriton/_serving/supervisor.py).
    import threading

    server = TritonServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    original = threading.Thread.start

    def refuse(thread: threading.Thread) -> None:
        if thread.name == "pytriton-server-wait":
            raise RuntimeError("can't start new thread")
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        server.start()
    monkeypatch.undo()
    assert server.returncode == -signal.SIGKILL and not server.is_alive()
    server.stop(grace_s=1)  # still idempotent afterwards
