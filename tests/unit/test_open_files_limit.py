"""``raise_open_files_limit`` (pytriton/server/process.py), called at the start of ``Triton.run()``.

Under systemd the soft ``RLIMIT_NOFILE`` is 1024: a frontend holding about a thousand idle
connections then left no descriptor for a restart of the server (issue 42). The soft limit is
raised to the hard one at start, and that is said at DEBUG. Driven with a fake ``resource`` module.
"""

from __future__ import annotations

import logging
import resource
from typing import List, Tuple

from pytriton.server import process


class FakeLimits:
    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.limits = (soft, hard)
        self.refuse = refuse
        self.set_calls: List[Tuple[int, int]] = []

    def getrlimit(self, which: int) -> Tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: Tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        if self.refuse:
            raise ValueError("not allowed to raise maximum limit")
        self.set_calls.append(limits)
        self.limits = limits


def _patch(monkeypatch, fake: FakeLimits) -> None:
    monkeypatch.setattr(process.resource, "getrlimit", fake.getrlimit)
    monkeypatch.setattr(process.resource, "setrlimit", fake.setrlimit)


def test_the_soft_limit_is_raised_to_the_hard_limit_and_said_at_debug(monkeypatch, caplog):
    fake = FakeLimits(1024, 524288)
    _patch(monkeypatch, fake)
    with caplog.at_level(logging.DEBUG, logger="pytriton.server.process"):
        process.raise_open_files_limit()
    assert fake.limits == (524288, 524288)
    [line] = [r for r in caplog.records if "RLIMIT_NOFILE" in r.getMessage()]
    assert line.levelno == logging.DEBUG and "from 1024 to the hard limit 524288" in line.getMessage()


def test_an_unlimited_hard_limit_is_taken_as_the_kernels_nr_open(monkeypatch):
    fake = FakeLimits(1024, resource.RLIM_INFINITY)
    _patch(monkeypatch, fake)
    process.raise_open_files_limit()
    with open("/proc/sys/fs/nr_open") as nr_open:
        assert fake.limits == (int(nr_open.read()), resource.RLIM_INFINITY)


def test_nothing_is_changed_when_the_soft_limit_is_already_the_hard_one(monkeypatch, caplog):
    fake = FakeLimits(4096, 4096)
    _patch(monkeypatch, fake)
    with caplog.at_level(logging.DEBUG, logger="pytriton.server.process"):
        process.raise_open_files_limit()
    assert fake.set_calls == [] and not [r for r in caplog.records if "RLIMIT_NOFILE" in r.getMessage()]


def test_a_refusal_is_logged_and_ignored(monkeypatch, caplog):
    fake = FakeLimits(1024, 4096, refuse=True)
    _patch(monkeypatch, fake)
    with caplog.at_level(logging.DEBUG, logger="pytriton.server.process"):
        process.raise_open_files_limit()
    assert fake.limits == (1024, 4096)
    assert any("Could not raise the open-files limit" in r.getMessage() for r in caplog.records)


def test_the_real_limit_is_raised_in_a_child(tmp_path):
    # The real call, in a child started with the soft limit of a systemd service.
    import subprocess
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        hard_wanted = hard
    else:
        hard_wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    code = (
        "import resource; from pytriton.server.process import raise_open_files_limit; "
        "raise_open_files_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run(  # noqa: S603 - this interpreter
        [sys.executable, "-c", code],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard_wanted), hard_wanted)),  # noqa: PLW1509
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert [int(value) for value in out] == [hard_wanted, hard_wanted]


def test_the_shm_guard_works_with_descriptors_above_1024(monkeypatch):
    # With the limit raised, the guard's inotify descriptor and wake pipe may be numbered >= 1024,
    # where select.select() raises ValueError (its thread then died and regions stayed as created).
    import os
    import pathlib
    import stat
    import threading

    from pytriton.proxy.stubside import _arena
    from pytriton.server._shm_guard import ShmGuard
    from tests.conftest import wait_for

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        import pytest

        pytest.skip(f"the hard descriptor limit ({hard}) leaves no descriptor above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    prefix = f"pytriton-{os.getpid()}-unittest-highfd-pb"
    ours = pathlib.Path(_arena.SHM_DIR) / f"{prefix}region"
    guard = ShmGuard(prefix)
    try:
        while len(os.listdir("/proc/self/fd")) < 1060:
            fillers.append(os.open("/dev/null", os.O_RDONLY))
        assert guard.start()
        assert guard._inotify is not None and guard._inotify >= 1024
        descriptor = os.open(ours, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(descriptor, 0o644)
        os.close(descriptor)
        assert wait_for(lambda: stat.S_IMODE(ours.stat().st_mode) == 0o600, timeout_s=5.0)
        assert "pytriton-shm-guard" in {thread.name for thread in threading.enumerate()}
    finally:
        guard.stop()
        ours.unlink(missing_ok=True)
        for descriptor in fillers:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
