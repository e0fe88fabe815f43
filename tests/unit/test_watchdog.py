"""The clean-up watchdog (``pytriton/_platform/watchdog.py``) run as ``Triton.run`` runs it, against fakes.

The "server" is a sleeping process in a session of its own (its own process group), the
"segments" are files in ``/dev/shm`` with a unique prefix, and the test holds the pipe's write end
as the user's process does. Closing it without ``done`` is what the kernel does when the user's
process is killed. (Which group a ``pgid`` line selects is tested in test_self_healing.py.)
"""

from __future__ import annotations

import os
import pathlib
import secrets
import signal
import subprocess
import sys
import tempfile

import pytest

from pytriton._platform import watchdog as _watchdog
from tests.conftest import wait_for

WATCHDOG = pathlib.Path(_watchdog.__file__)


def _running(pid):
    """True while ``pid`` runs (a zombie, which nobody may reap in a container, does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


class Scene:
    def __init__(self, tmp_path):
        self.prefix = f"pytriton-{os.getpid()}-wdtest{secrets.token_hex(3)}"
        self.segment = pathlib.Path("/dev/shm") / f"{self.prefix}-m0-s0-1"
        self.segment.write_bytes(b"x")
        self.other_segment = pathlib.Path("/dev/shm") / f"pytriton-{os.getpid()}-wdother{secrets.token_hex(3)}"
        self.other_segment.write_bytes(b"x")
        self.socket_dir = tmp_path / "sockets"
        self.socket_dir.mkdir()
        (self.socket_dir / "slot-0.sock").write_text("")
        self.workspace = tmp_path / "workspace"
        (self.workspace / "model_repository").mkdir(parents=True)
        self.scratch = pathlib.Path(tempfile.mkdtemp(prefix="python_env_", dir="/tmp"))
        self.busy_scratch = pathlib.Path(tempfile.mkdtemp(prefix="python_env_", dir="/tmp"))
        (self.busy_scratch / "keep").write_text("not empty")
        self.servers = []
        self.watchdog = None
        self.write_fd = None

    def stub(self, region):
        """A process whose command line looks like a Python-backend stub's (argv[0] and the region name)."""
        stub = subprocess.Popen(
            ["/backends/python/triton_python_backend_stub", "-c", "import time; time.sleep(60)", region],
            executable=sys.executable,
        )
        self.servers.append(stub)
        return stub

    def server(self):
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        self.servers.append(server)
        return server

    def start(self, pgid):
        read_fd, self.write_fd = os.pipe()
        self.watchdog = subprocess.Popen(
            [
                sys.executable,
                "-S",
                str(WATCHDOG),
                str(read_fd),
                str(pgid),
                self.prefix,
                str(self.socket_dir),
                str(self.workspace),
            ],
            pass_fds=(read_fd,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        os.close(read_fd)

    def tell(self, line):
        os.write(self.write_fd, line.encode() + b"\n")

    def user_dies(self):
        os.close(self.write_fd)
        self.write_fd = None
        return self.watchdog.wait(timeout=30)

    def close(self):
        if self.write_fd is not None:
            os.close(self.write_fd)
        if self.watchdog is not None and self.watchdog.poll() is None:
            self.watchdog.kill()
            self.watchdog.wait()
        for server in self.servers:
            server.kill()
            server.wait()
        for path in (self.segment, self.other_segment, self.busy_scratch / "keep"):
            path.unlink(missing_ok=True)
        for path in (self.scratch, self.busy_scratch):
            if path.exists():
                path.rmdir()


@pytest.fixture()
def scene(tmp_path):
    scene = Scene(tmp_path)
    yield scene
    scene.close()


def test_a_killed_user_process_leaves_nothing_behind(scene):
    server = scene.server()
    scene.start(server.pid)
    scene.tell(f"scratch {scene.scratch}")
    scene.tell(f"scratch {scene.busy_scratch}")
    assert scene.user_dies() == 0
    assert server.wait(timeout=10) == -signal.SIGKILL
    assert not scene.segment.exists() and scene.other_segment.exists()  # only this instance's prefix
    assert not scene.socket_dir.exists() and not scene.workspace.exists()
    assert not scene.scratch.exists()
    assert (scene.busy_scratch / "keep").exists(), "a scratch directory that is not empty is never removed"


def test_done_means_nothing_left_to_do(scene):
    server = scene.server()
    scene.start(server.pid)
    scene.tell(f"scratch {scene.scratch}")
    scene.tell("done")
    assert scene.user_dies() == 0
    assert server.poll() is None
    assert scene.segment.exists() and scene.socket_dir.exists() and scene.workspace.exists()
    assert scene.scratch.exists()


def test_a_ctrl_c_reaching_the_watchdog_does_not_stop_it(scene):
    server = scene.server()
    scene.start(server.pid)
    scene.tell("pgid not-a-number")  # ignored
    # The handler is installed right at start; the watchdog then blocks in read. Give it that long.
    assert wait_for(lambda: _sigint_ignored(scene.watchdog.pid), 10)
    scene.watchdog.send_signal(signal.SIGINT)
    assert scene.watchdog.poll() is None
    assert scene.user_dies() == 0
    assert server.wait(timeout=10) == -signal.SIGKILL
    assert not scene.segment.exists()


def _cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read()


def _sigint_ignored(pid):
    """True once ``pid`` ignores SIGINT (the SigIgn mask in /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def test_main_in_process_with_done(tmp_path):
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"scratch /tmp/python_env_none\ndone\n")
    os.close(write_fd)
    previous = signal.getsignal(signal.SIGINT)
    try:
        # A group number no process has: even a broken "done" check could kill nothing here.
        assert _watchdog.main([str(read_fd), "999999999", "pytriton-none", str(tmp_path)]) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
        os.close(read_fd)
    assert tmp_path.exists()


def test_an_embedded_triton_has_no_server_group_to_kill_but_its_stubs_are_killed(scene):
    # Triton(embedded=True) passes 0: its stubs are children of the user's process, in no group of
    # their own (os.killpg(0) would be the watchdog's own group). The watchdog finds them by their
    # command line and kills them; another instance's stub and other processes are left alone.
    bystander = scene.server()
    ours = [scene.stub(f"{scene.prefix}-pb{index}") for index in range(2)]
    theirs = scene.stub(f"{scene.prefix}x-pb0")  # a longer prefix that merely starts with ours
    assert wait_for(lambda: all(scene.prefix.encode() in _cmdline(stub.pid) for stub in [*ours, theirs]), 10)
    scene.start(0)
    scene.tell(f"scratch {scene.scratch}")
    assert scene.user_dies() == 0
    assert [stub.wait(timeout=10) for stub in ours] == [-signal.SIGKILL] * 2
    assert _running(bystander.pid) and _running(theirs.pid)
    assert not scene.segment.exists() and not scene.socket_dir.exists() and not scene.workspace.exists()
    assert not scene.scratch.exists()
