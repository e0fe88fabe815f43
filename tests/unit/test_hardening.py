"""The hardening switch (pytriton/_platform/hardening.py) and the launch that obeys it (_platform/launch.py).

The launch runs this interpreter as the child (no server): it prints the argv ``main`` received, whether its
``/proc/self/cmdline`` shows the secret, and its seccomp mode. A refused ``ptrace`` is simulated the way
tests/unit/test_launch.py does, with a libc whose ``ptrace`` fails with ``EPERM`` in the forked child.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
import sys

import pytest

from pytriton._platform import hardening
from pytriton._platform import launch as _launch
from pytriton.exceptions import PyTritonServerError, PyTritonValidationError
from pytriton.server.triton_config import TritonConfig

SECRET_FLAG = "--http-restricted-api=model-repository:triton-access-token=s3cret-token"
REPORT = (
    "import json, sys; c = open('/proc/self/cmdline', 'rb').read().decode();"
    "s = [l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')];"
    "print(json.dumps({'argv': sys.argv[1:], 'secret_in_cmdline': ('s3' + 'cret') in c, 'seccomp': s[0] if s else None}))"
)


class _PtraceRefusingLibc:
    """The real libc, except ``ptrace``, which fails with ``EPERM`` (as under Yama ptrace_scope 3)."""

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


def _run(protections: hardening.Protections) -> dict:
    process = _launch.spawn(
        [sys.executable, "-S", "-c", REPORT, SECRET_FLAG],
        dict(os.environ),
        lambda: None,
        protections=protections,
        stdout=subprocess.PIPE,
    )
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    return json.loads(out)


# -- the switch ---------------------------------------------------------------------------------------------


def test_the_mode_comes_from_the_config_field_then_the_variable_then_auto():
    assert hardening.resolve(None, {}) == "auto"
    assert hardening.resolve(None, {"PYTRITON_HARDENING": " STRICT "}) == "strict"
    assert hardening.resolve("off", {"PYTRITON_HARDENING": "strict"}) == "off"  # the field wins
    assert hardening.resolve(None, {"PYTRITON_HARDENING": ""}) == "auto"


def test_an_invalid_mode_is_a_clear_error_naming_the_variable_and_the_choices():
    with pytest.raises(PyTritonValidationError, match=r"PYTRITON_HARDENING='paranoid'.*off, auto, strict"):
        hardening.resolve(None, {"PYTRITON_HARDENING": "paranoid"})
    with pytest.raises(PyTritonValidationError, match=r"TritonConfig.hardening='yes'"):
        TritonConfig(hardening="yes")
    assert TritonConfig(hardening="Strict").hardening == "strict"
    assert TritonConfig.from_env({"PYTRITON_TRITON_CONFIG_HARDENING": "off"}).hardening == "off"


def test_strict_raises_naming_the_protection_and_the_cause():
    protections = hardening.Protections("strict")
    protections.applied(hardening.CHMOD_FILTER)
    with pytest.raises(PyTritonServerError, match=r"strict.*'hidden-token'.*Yama says no.*PYTRITON_HARDENING=auto"):
        protections.refused(hardening.HIDDEN_TOKEN, "Yama says no")
    assert protections.active(hardening.CHMOD_FILTER) is True
    assert protections.active(hardening.HIDDEN_TOKEN) is False


def test_auto_warns_once_per_fallback_and_cause(caplog):
    with caplog.at_level(logging.WARNING, logger="pytriton.server.process"):
        for _ in range(3):  # three starts (a restart, a recycle) with the same refusal
            hardening.Protections("auto").refused(hardening.HIDDEN_TOKEN, "Yama says no")
        hardening.Protections("auto").refused(hardening.HIDDEN_TOKEN, "seccomp says no")  # another cause
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2, warnings
    assert "Yama says no" in warnings[0] and "seccomp says no" in warnings[1]


def test_the_summary_names_the_mode_and_each_protection():
    protections = hardening.Protections("auto")
    protections.applied(hardening.HIDDEN_TOKEN)
    protections.skipped(hardening.SHM_GUARD, "inotify is unavailable here")
    summary = protections.summary()
    assert summary.startswith("hardening=auto:")
    assert "hidden-token: active" in summary and "shm-guard: inactive (inotify is unavailable here)" in summary


# -- the launch under each mode ---------------------------------------------------------------------------------


def test_auto_applies_the_private_launch_where_the_platform_allows_it():
    protections = hardening.Protections("auto")
    seen = _run(protections)
    assert seen["argv"] == [SECRET_FLAG] and not seen["secret_in_cmdline"]
    assert protections.active(hardening.HIDDEN_TOKEN) is True
    if _launch.chmod_filter(os.uname().machine) is not None:
        assert seen["seccomp"] == "2" and protections.active(hardening.CHMOD_FILTER) is True


def test_off_starts_the_process_plainly_and_records_nothing_as_active(caplog):
    protections = hardening.Protections("off")
    with caplog.at_level(logging.WARNING, logger="pytriton.server.process"):
        seen = _run(protections)
    assert seen["argv"] == [SECRET_FLAG]  # the product still gets its flag
    assert seen["secret_in_cmdline"] is True  # what off gives up: the token is in the command line
    assert seen["seccomp"] == "0"  # no filter
    assert [record.active for record in protections.records()] == [False, False]
    assert not caplog.records  # off is a choice, not a fallback: nothing to warn about


def test_strict_fails_the_start_when_ptrace_is_refused_naming_the_cause(refused_ptrace):
    with pytest.raises(PyTritonServerError) as raised:
        _run(hardening.Protections("strict"))
    message = str(raised.value)
    assert "hidden-token" in message and "PTRACE_TRACEME" in message and "ptrace_scope is 3" in message


def test_auto_starts_when_ptrace_is_refused_and_warns_once(refused_ptrace, caplog):
    with caplog.at_level(logging.WARNING, logger="pytriton.server.process"):
        first = _run(hardening.Protections("auto"))
        second = _run(hardening.Protections("auto"))  # a restart: no second warning
    assert first["argv"] == second["argv"] == [SECRET_FLAG]
    warnings = [record.getMessage() for record in caplog.records if "access token hidden" in record.getMessage()]
    assert len(warnings) == 1 and "ptrace_scope is 3" in warnings[0], warnings


def test_the_default_mode_is_read_from_the_environment(monkeypatch, refused_ptrace):
    monkeypatch.setenv("PYTRITON_HARDENING", "strict")
    with pytest.raises(PyTritonServerError, match="ptrace_scope is 3"):
        _launch.spawn([sys.executable, "-S", "-c", "pass", SECRET_FLAG], dict(os.environ), lambda: None)


# -- pytriton check ------------------------------------------------------------------------------------------


def test_check_lists_each_protection_and_whether_it_is_active():
    from pytriton._check import FAIL, INFO, OK, check_hardening

    items = {item.name: item for item in check_hardening({}, probe=lambda: (None, None))}
    assert "auto" in items["hardening"].detail
    assert {items[f"protection {name}"].status for name in ("hidden-token", "chmod-filter")} == {OK}
    if _launch.chmod_filter(os.uname().machine) is not None:  # the in-process start thread is confinable here
        assert items["protection inprocess-modes"].status == OK

    refused = {
        item.name: item for item in check_hardening({"PYTRITON_HARDENING": "auto"}, probe=lambda: ("Yama", None))
    }
    assert refused["protection hidden-token"].status == INFO and "Yama" in refused["protection hidden-token"].detail

    strict = {
        item.name: item for item in check_hardening({"PYTRITON_HARDENING": "strict"}, probe=lambda: ("Yama", None))
    }
    assert (
        strict["protection hidden-token"].status == FAIL
        and "strict refuses to start" in strict["protection hidden-token"].detail
    )
    assert strict["protection chmod-filter"].status == OK

    off = check_hardening({"PYTRITON_HARDENING": "off"}, probe=lambda: pytest.fail("off probes nothing"))
    assert all("inactive" in item.detail for item in off[1:]) and "off" in off[0].detail

    [invalid] = check_hardening({"PYTRITON_HARDENING": "maybe"})
    assert invalid.status == FAIL and "off, auto, strict" in invalid.detail


def test_check_names_why_the_in_process_start_thread_cannot_be_confined(monkeypatch):
    from pytriton._check import FAIL, check_hardening

    monkeypatch.setattr(_launch, "confine_thread", lambda: "unshare(CLONE_FS) refused (Operation not permitted)")
    strict = {item.name: item for item in check_hardening({"PYTRITON_HARDENING": "strict"}, probe=lambda: (None, None))}
    item = strict["protection inprocess-modes"]
    assert item.status == FAIL and "unshare(CLONE_FS) refused" in item.detail and "strict refuses" in item.detail
    [invalid] = check_hardening({"PYTRITON_HARDENING": "maybe"})
    assert invalid.status == FAIL and "off, auto, strict" in invalid.detail
