"""The in-process server's confined start thread (pytriton/_platform/launch.py: confine_thread, call_confined).

The in-process Python backend creates its regions with ``shm_open(O_CREAT, 0644)`` then ``fchmod(0644)``
on threads Triton starts from the thread that creates the server. These tests play that part with plain
files: what a confined thread (and a thread it starts) creates stays 0600 and cannot be widened, while
the rest of the process (this test's own thread) keeps its umask and may still widen a mode.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pathlib
import platform
import threading
from typing import Dict

import pytest

from pytriton._platform import hardening
from pytriton._platform import launch as _launch
from pytriton.exceptions import PyTritonServerError

supported = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="the chmod filter knows x86_64 and aarch64 only"
)


def _region_like(path: pathlib.Path) -> Dict[str, object]:
    """What the backend does to a region: create it 0644, then fchmod it 0644; the modes seen after each."""
    descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        created = os.fstat(descriptor).st_mode & 0o777
        try:
            os.fchmod(descriptor, 0o644)
            widened = "allowed"
        except OSError as exc:
            widened = exc.strerror or ""
        return {"created": created, "widened": widened, "final": os.fstat(descriptor).st_mode & 0o777}
    finally:
        os.close(descriptor)


@supported
def test_a_confined_thread_and_its_threads_create_private_files_and_the_rest_of_the_process_is_untouched(tmp_path):
    protections = hardening.Protections(hardening.AUTO)
    umask_before = os.umask(0o022)
    os.umask(umask_before)

    def backend() -> Dict[str, Dict[str, object]]:
        seen = {"creator": _region_like(tmp_path / "a")}
        # A thread the confined one starts (as Triton starts its load and instance threads) inherits it.
        child = threading.Thread(target=lambda: seen.__setitem__("child", _region_like(tmp_path / "b")))
        child.start()
        child.join()
        return seen

    seen = _launch.call_confined(backend, protections)
    assert protections.active(hardening.INPROCESS_MODES) is True
    for where in ("creator", "child"):
        assert seen[where] == {"created": 0o600, "widened": os.strerror(1), "final": 0o600}, where
    # Healthy traffic beside it: this thread (the application) keeps its umask and its chmod.
    current = os.umask(0o022)
    os.umask(current)
    assert current == umask_before
    outside = _region_like(tmp_path / "c")
    assert outside["widened"] == "allowed" and outside["final"] == 0o644


def test_an_exception_of_the_call_reaches_the_caller():
    def fails() -> None:
        raise ValueError("the server could not be created")

    with pytest.raises(ValueError, match="could not be created"):
        _launch.call_confined(fails, hardening.Protections(hardening.AUTO))


class _UnshareRefusingLibc:
    """libc whose ``unshare`` fails with EPERM (a container profile that forbids it); nothing else is called."""

    def unshare(self, flags: object) -> int:
        ctypes.set_errno(1)
        return -1


def test_strict_refuses_before_the_call_when_the_thread_cannot_be_confined(monkeypatch):
    monkeypatch.setattr(_launch, "_LIBC", _UnshareRefusingLibc())
    monkeypatch.setattr(_launch, "_program", lambda machine: object())
    called = []
    with pytest.raises(PyTritonServerError) as raised:
        _launch.call_confined(lambda: called.append(1), hardening.Protections(hardening.STRICT))
    assert not called  # no server was created
    assert "inprocess-modes" in str(raised.value) and "unshare(CLONE_FS) refused" in str(raised.value)


def test_auto_warns_once_and_goes_on_when_the_thread_cannot_be_confined(monkeypatch, caplog):
    monkeypatch.setattr(_launch, "_LIBC", _UnshareRefusingLibc())
    monkeypatch.setattr(_launch, "_program", lambda machine: object())
    hardening.forget_warnings()
    with caplog.at_level(logging.WARNING, logger="pytriton.server.process"):
        for _ in range(2):
            protections = hardening.Protections(hardening.AUTO)
            assert _launch.call_confined(lambda: "served", protections) == "served"
            assert protections.active(hardening.INPROCESS_MODES) is False
    warnings = [r.getMessage() for r in caplog.records if "confine" in r.getMessage()]
    assert len(warnings) == 1 and "unshare(CLONE_FS) refused" in warnings[0] and "other local users" in warnings[0]
    hardening.forget_warnings()


def test_no_filter_for_an_unknown_machine_is_a_named_refusal(monkeypatch):
    monkeypatch.setattr(_launch.platform, "machine", lambda: "sparc")
    assert _launch.confine_thread() == "no seccomp filter is defined for sparc"
