"""The private launch (pytriton/_platform/launch.py) on a plain child process: no server needed.

The child is this interpreter running a small script that reports what it sees: its argv as ``main``
received it, its ``/proc/self/cmdline`` as every other user reads it, and whether a chmod that
would open a file to others passes.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys

import pytest

from pytriton._platform import launch as _launch
from pytriton.server.process import TritonServerProcess
from tests.conftest import wait_for

SECRET_FLAG = "--http-restricted-api=model-repository:triton-access-token=s3cret-token"
GRPC_FLAG = "--grpc-restricted-protocol=model-repository:triton-access-token=s3cret-token"
REPORT = """
import json, os, sys, tempfile
directory = tempfile.mkdtemp()
path = os.path.join(directory, "f")
descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
created = os.fstat(descriptor).st_mode & 0o777
try:
    os.fchmod(descriptor, 0o644)
    widened = "allowed"
except OSError as exc:
    widened = exc.strerror
os.fchmod(descriptor, 0o600)
os.close(descriptor)
os.unlink(path)
os.rmdir(directory)
print(json.dumps({"argv": sys.argv[1:], "cmdline": open("/proc/self/cmdline", "rb").read().decode(),
                  "created": created, "widened": widened}))
"""
supported = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="the chmod filter knows x86_64 and aarch64 only"
)


def _run(launch: _launch.PrivateLaunch) -> dict:
    process = subprocess.Popen(launch.argv, env=launch.env, preexec_fn=launch.preexec, stdout=subprocess.PIPE)  # noqa: S603,PLW1509
    launch.after_spawn(process.pid)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    return json.loads(out)


def test_secret_flags_move_to_the_environment():
    argv, env, hidden = _launch.hide_secrets(["bin", "--a=1", SECRET_FLAG, GRPC_FLAG], {"PATH": "/bin"})
    assert argv == [
        "bin",
        "--a=1",
        "--http-restricted-api=" + _launch.PLACEHOLDER,
        "--grpc-restricted-protocol=" + _launch.PLACEHOLDER,
    ]
    assert hidden == {2: "PYTRITON_HIDDEN_ARG_2", 3: "PYTRITON_HIDDEN_ARG_3"}
    assert env == {"PATH": "/bin", "PYTRITON_HIDDEN_ARG_2": SECRET_FLAG, "PYTRITON_HIDDEN_ARG_3": GRPC_FLAG}
    assert "s3cret" not in " ".join(argv)


def test_filter_programs_are_well_formed():
    assert _launch.chmod_filter("sparc") is None
    for machine in ("x86_64", "aarch64"):
        program = _launch.chmod_filter(machine)
        assert program is not None
        for index, (code, jt, jf, _) in enumerate(program):
            if code & 0x07 == 0x05:  # jumps land inside the program
                assert index + 1 + max(jt, jf) < len(program)
        assert program[-1] == (0x06, 0, 0, 0x00050001) and program[-2] == (0x06, 0, 0, 0x7FFF0000)


@supported
def test_the_child_gets_the_secret_and_the_command_line_never_shows_it():
    launch = _launch.PrivateLaunch([sys.executable, "-c", REPORT, "--x", SECRET_FLAG, GRPC_FLAG], dict(os.environ))
    report = _run(launch)
    assert report["argv"] == ["--x", SECRET_FLAG, GRPC_FLAG]  # what main() parsed
    assert "s3cret" not in report["cmdline"] and _launch.PLACEHOLDER in report["cmdline"]
    assert report["created"] == 0o600  # umask 077
    assert report["widened"] == "Operation not permitted"  # the seccomp filter


@supported
def test_without_secrets_nothing_is_traced_but_the_filter_applies():
    launch = _launch.PrivateLaunch([sys.executable, "-c", REPORT], dict(os.environ))
    assert launch.hidden == {}
    report = _run(launch)
    assert report["created"] == 0o600 and report["widened"] == "Operation not permitted"


def test_an_unexpected_stack_kills_the_child_instead_of_running_it():
    launch = _launch.PrivateLaunch([sys.executable, "-c", "import time; time.sleep(30)", SECRET_FLAG], dict(os.environ))
    launch.argv = launch.argv + ["extra"]  # argc no longer matches what redirect_argv expects
    process = subprocess.Popen(launch.argv[:-1], env=launch.env, preexec_fn=launch.preexec)  # noqa: S603,PLW1509
    with pytest.raises(OSError, match="unexpected initial stack"):
        launch.after_spawn(process.pid)
    assert process.wait(timeout=10) < 0


def test_a_refused_trace_falls_back_with_a_warning(monkeypatch, caplog):
    def refuse(self: _launch.PrivateLaunch) -> None:
        if self.hidden:
            raise OSError(1, "PTRACE_TRACEME refused")

    monkeypatch.setattr(_launch.PrivateLaunch, "preexec", refuse)
    server = TritonServerProcess(
        [sys.executable, "-c", "import sys; print(sys.argv[1])", SECRET_FLAG], dict(os.environ)
    )
    with caplog.at_level(logging.WARNING, logger="pytriton.server.process"):
        server.start()
        assert wait_for(lambda: not server.is_alive(), 30)
        server.stop(grace_s=10)
    assert any("readable by every local user" in record.getMessage() for record in caplog.records)
    assert SECRET_FLAG in server.log_lines  # started the old way: the flag is in its argv


@supported
def test_check_reports_the_private_launch(monkeypatch):
    from pytriton._check import FAIL, OK, check_private_launch

    assert [item.status for item in check_private_launch()] == [OK, OK]

    def refuse(self: _launch.PrivateLaunch) -> None:
        if self.hidden:
            raise OSError(1, "PTRACE_TRACEME refused")

    monkeypatch.setattr(_launch.PrivateLaunch, "preexec", refuse)  # the old way: no trace, no filter
    token, regions = check_private_launch()
    assert (token.status, regions.status) == (FAIL, FAIL)
    assert "readable by every local user" in token.detail and "docs/security.md" in token.fix


@pytest.mark.parametrize(
    ("error", "scope", "seccomp", "words"),
    [
        (1, 3, 0, ["(EPERM: Operation not permitted)", "ptrace_scope is 3", "until the machine restarts"]),
        (1, 2, 0, ["ptrace_scope is 2", "CAP_SYS_PTRACE", "sysctl kernel.yama.ptrace_scope=1"]),
        (1, 1, 2, ["seccomp filter that refuses ptrace", "allow ptrace in that profile"]),
        (38, None, 0, ["(ENOSYS:", "seccomp filter"]),
        (1, None, 0, ["neither Yama nor seccomp", "AppArmor, SELinux"]),
        (None, 0, 0, ["the kernel refused PTRACE_TRACEME: neither Yama"]),
    ],
)
def test_a_refused_trace_is_explained_by_its_cause(error, scope, seccomp, words):
    message = _launch.trace_refusal(error, scope, seccomp)
    assert all(word in message for word in words), message


class _RefusingLibc:
    """Stands in for libc in the forked child: every call succeeds except ``ptrace``, refused with ``EPERM``."""

    def prctl(self, *args: object) -> int:
        return 0

    def ptrace(self, *args: object) -> int:
        import ctypes

        ctypes.set_errno(1)  # what ctypes.get_errno() then reads in the child, as after a real refusal
        return -1


def test_the_fallback_warning_names_the_cause_and_the_consequence_not_preexec_fn(monkeypatch, caplog):
    monkeypatch.setattr(_launch, "_LIBC", _RefusingLibc())
    monkeypatch.setattr(_launch.proc, "kernel_int", lambda name, root="/proc": 3 if "yama" in name else None)
    monkeypatch.setattr(_launch.proc, "status_int", lambda pid, key, root="/proc": 0)
    with caplog.at_level(logging.WARNING, logger="pytriton.server.process"):
        process = _launch.spawn(
            [sys.executable, "-c", "import sys; print(sys.argv[1])", SECRET_FLAG],
            dict(os.environ),
            lambda: None,
            stdout=subprocess.PIPE,
        )
        out, _ = process.communicate(timeout=60)
    assert out.decode().strip() == SECRET_FLAG  # started the old way
    [warning] = [r.getMessage() for r in caplog.records if "access token hidden" in r.getMessage()]
    assert "preexec_fn" not in warning
    assert "EPERM" in warning and "ptrace_scope is 3" in warning  # the cause
    assert "readable by every local user in /proc/<pid>/cmdline" in warning  # the consequence


@supported
def test_a_stop_reaped_by_another_waiter_is_named_and_the_child_killed(monkeypatch):
    launch = _launch.PrivateLaunch([sys.executable, "-c", "import time; time.sleep(30)", SECRET_FLAG], dict(os.environ))
    process = subprocess.Popen(launch.argv, env=launch.env, preexec_fn=launch.preexec)  # noqa: S603,PLW1509
    with monkeypatch.context() as patch:
        # A waitpid(-1) reaper elsewhere in the process collected the stop: pytriton's own wait sees nothing.
        patch.setattr(_launch.os, "waitpid", lambda pid, options: (0, 0))
        patch.setattr(_launch, "_STOP_TIMEOUT_S", 0.2)
        with pytest.raises(OSError, match=r"waitpid\(-1\)"):
            launch.after_spawn(process.pid)
    assert process.wait(timeout=10) < 0
