"""PYTRITON_HARDENING with a real server: off serves without the tricks; strict refuses a start it cannot protect.

A refused ``ptrace`` is simulated as in tests/unit/test_launch.py: the launch's libc is replaced by one whose
``ptrace`` fails with ``EPERM`` in the forked child (``prctl``, hence the seccomp filter, stays real), and
Yama's setting reads 3, so the cause named is the one a machine with ``kernel.yama.ptrace_scope=3`` gives.
"""

from __future__ import annotations

import ctypes
import logging
import pathlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton._platform import hardening, proc
from pytriton._platform import launch as _launch
from pytriton.exceptions import PyTritonServerError
from pytriton.model_config import Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import owned_resources, process_group_alive, shm_entries, wait_for
from tests.e2e.kind_models import identity


class _PtraceRefusingLibc:
    def __init__(self, real: ctypes.CDLL):
        self._real = real

    def prctl(self, *args: object) -> int:
        return int(self._real.prctl(*args))

    def ptrace(self, *args: object) -> int:
        ctypes.set_errno(1)
        return -1


@pytest.fixture(autouse=True)
def _fresh_warnings():
    hardening.forget_warnings()
    yield
    hardening.forget_warnings()


@pytest.fixture()
def refused_ptrace(monkeypatch):
    assert _launch._LIBC is not None
    monkeypatch.setattr(_launch, "_LIBC", _PtraceRefusingLibc(_launch._LIBC))
    monkeypatch.setattr(_launch.proc, "kernel_int", lambda name, root="/proc": 3 if "yama" in name else None)


def _bind(triton: Triton) -> None:
    spec = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    triton.bind("Echo", identity, spec, spec)


def _infer_both(ports) -> None:
    x = np.arange(4, dtype=np.float32)[None]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("Echo", [tensor]).as_numpy("x"), x)
    http.close()
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc.infer("Echo", [tensor]).as_numpy("x"), x)
    grpc.close()


def _assert_clean(server_pid, shm_prefix, socket_dir, workspace, scratch=None) -> None:
    assert wait_for(lambda: not process_group_alive(server_pid), 10), "server or stub processes left behind"
    assert wait_for(lambda: not shm_entries(shm_prefix), 10), f"/dev/shm leftovers: {shm_entries(shm_prefix)}"
    assert not pathlib.Path(socket_dir).exists() and not pathlib.Path(workspace).exists()


def test_off_serves_http_and_grpc_without_any_protection_and_leaves_nothing(ports, monkeypatch, caplog):
    monkeypatch.setenv("PYTRITON_HARDENING", "off")
    triton = Triton(config=TritonConfig(**ports))
    try:
        _bind(triton)
        with caplog.at_level(logging.DEBUG, logger="pytriton"):
            triton.run()
        _infer_both(ports)
        server = triton._backend.server
        assert proc.status_int(server.pid, "Seccomp") == 0  # no filter: the product works without it
        assert server.protections is not None and not any(record.active for record in server.protections.records())
        [summary] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Protections of this server")]
        assert "hardening=off" in summary and "shm-guard: inactive" in summary
        info = owned_resources(triton)
    finally:
        triton.stop()
    _assert_clean(*info)


def test_strict_fails_the_start_when_ptrace_is_refused_naming_the_cause(ports, refused_ptrace, tmp_path):
    triton = Triton(config=TritonConfig(hardening="strict", **ports), workspace=tmp_path / "workspace")
    try:
        _bind(triton)
        with pytest.raises(PyTritonServerError) as raised:
            triton.run()
    finally:
        triton.stop()
    message = str(raised.value)
    assert "strict" in message and "hidden-token" in message
    assert "PTRACE_TRACEME" in message and "ptrace_scope is 3" in message  # the cause
    assert not shm_entries(triton._shm_prefix)
    assert not (tmp_path / "workspace").exists() or not any((tmp_path / "workspace").iterdir())


def test_auto_starts_when_ptrace_is_refused_and_warns_once_with_the_cause(ports, refused_ptrace, caplog):
    triton = Triton(config=TritonConfig(**ports))
    try:
        _bind(triton)
        with caplog.at_level(logging.DEBUG, logger="pytriton"):
            triton.run()
        _infer_both(ports)
        server = triton._backend.server
        assert server.protections.active(hardening.HIDDEN_TOKEN) is False
        assert server.protections.active(hardening.CHMOD_FILTER) is True
        assert proc.status_int(server.pid, "Seccomp") == 2  # the other protections stay
        info = owned_resources(triton)
    finally:
        triton.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    hidden = [message for message in warnings if "access token hidden" in message]
    assert len(hidden) == 1 and "ptrace_scope is 3" in hidden[0], warnings
    _assert_clean(*info)


# -- the in-process server (Triton(embedded=True)) ------------------------------------------------------------


def test_off_serves_in_process_without_confining_threads_or_guarding_regions(monkeypatch):
    from pytriton.server import _shm_guard

    monkeypatch.setenv("PYTRITON_HARDENING", "off")
    monkeypatch.setattr(_launch, "call_confined", lambda *a: pytest.fail("off confines no thread"))
    monkeypatch.setattr(_shm_guard.ShmGuard, "start", lambda self: pytest.fail("off starts no guard"))
    triton = Triton(embedded=True)
    try:
        spec = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
        triton.bind("Echo", identity, spec, spec)
        triton.run()
        assert triton.client("Echo").infer_sample(np.arange(3, dtype=np.float32))["x"].tolist() == [0.0, 1.0, 2.0]
        prefix = triton._shm_prefix
    finally:
        triton.stop()
    assert wait_for(lambda: not shm_entries(prefix), 10), f"/dev/shm leftovers: {shm_entries(prefix)}"


def test_strict_refuses_an_in_process_start_whose_backend_cannot_be_protected(monkeypatch):
    monkeypatch.setenv("PYTRITON_HARDENING", "strict")
    monkeypatch.setattr(_launch, "confine_thread", lambda: "no seccomp filter on this test's machine")
    triton = Triton(embedded=True)
    try:
        spec = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
        triton.bind("Echo", identity, spec, spec)
        with pytest.raises(PyTritonServerError) as raised:
            triton.run()
    finally:
        triton.stop()
    assert "inprocess-modes" in str(raised.value) and "no seccomp filter on this test's machine" in str(raised.value)
