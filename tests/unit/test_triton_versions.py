"""Supported Triton builds, reading a server's version, choosing a build, and the version gates.

No server runs here: installs are made from fake wheels, and a server directory is a folder with the
files ``find_server`` looks at. tests/e2e/test_check.py checks the version read from a real install
against the live server's metadata (``make test-triton-older`` runs it on an older build).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pathlib
import re
from types import SimpleNamespace

import numpy as np
import pytest

from pytriton._serving.backend import State
from pytriton._serving.plan import LaunchPlan
from pytriton.exceptions import PyTritonServerError, PyTritonServerNotInstalledError
from pytriton.model_config import Tensor
from pytriton.server import distribution as dist
from pytriton.server import versions
from pytriton.server.command import LaunchSettings
from pytriton.server.install import InstallError, install_server
from pytriton.server.triton_config import TritonConfig
from pytriton.triton import Triton
from tests.unit.test_install import _fake_wheel

ROOT = pathlib.Path(__file__).parents[2]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTRITON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PYTRITON_TRITONSERVER_DIR", raising=False)
    monkeypatch.delenv(versions.VERSION_ENV, raising=False)
    monkeypatch.setattr(dist, "NGC_DIR", tmp_path / "no-ngc")
    return tmp_path / "home"


def _server_dir(root: pathlib.Path, version: str = "") -> pathlib.Path:
    """A folder laid out like a server install (binary, backend with this Python's stub)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tritonserver").write_text("#!/bin/sh\n")
    backend = root / f"backends-py{dist.python_tag()}" / "python"
    backend.mkdir(parents=True)
    (backend / "triton_python_backend_stub").write_text("stub")
    if version:
        (root / versions.VERSION_FILE).write_text(f"{version}\n")
    return root


def _pin_fake_wheel(tmp_path, monkeypatch, triton: str) -> pathlib.Path:
    # The install's mechanics, on any interpreter CI runs: the build is taken to ship this Python's
    # stub (the older builds have none for 3.13; test_an_older_build_refuses_a_python_it_has_no_stub_for).
    build = dataclasses.replace(versions.BUILDS[triton], pythons=((3, 8), (3, 13)))
    monkeypatch.setitem(versions.BUILDS, triton, build)
    wheel = _fake_wheel(tmp_path / f"nvidia_pytriton-{build.wheel_version}-py3-none-manylinux_2_35_x86_64.whl")
    monkeypatch.setitem(build.sha256, dist.machine_arch(), hashlib.sha256(wheel.read_bytes()).hexdigest())
    return wheel


# -- versions and builds -----------------------------------------------------------------------------
def test_ranges_compare_on_the_bounds_own_length():
    assert versions.in_range("2.51.0", ("2.48", "2.51"))
    assert versions.in_range("2.51.7", ("2.48", "2.51"))
    assert not versions.in_range("2.52.0", ("2.48", "2.51"))
    assert not versions.in_range("2.47.0", ("2.48", None))
    assert versions.in_range("2.59.0", ("2.59", None)) and not versions.in_range("2.58.9", ("2.59", None))
    assert versions.in_range("2.4.1", ("2", None)) and not versions.in_range("1.26.4", ("2", None))
    assert versions.range_text(("2.59", None)) == "2.59 and later"
    assert versions.range_text((None, None)) == "any version"
    with pytest.raises(ValueError, match="not a version"):
        versions.parse("2.51-rc1")


def test_resolve_matches_major_minor_and_names_the_supported_builds():
    assert versions.resolve("2.48").triton == "2.48.0"
    assert versions.resolve("2.48.0").triton == "2.48.0"
    assert versions.resolve("2.48.1").triton == "2.48.0"  # an NGC patch release shares the 2.48 build
    assert versions.resolve("2.51").wheel_version == "0.7.0"
    with pytest.raises(ValueError, match=r"Triton 2\.45 is not a build pytriton supports; supported: 2\.51\.0"):
        versions.resolve("2.45")
    with pytest.raises(ValueError, match="supported"):
        versions.resolve("latest")


def test_every_build_is_pinned_by_a_sha256_and_the_default_is_2_51():
    assert versions.DEFAULT_VERSION == dist.TRITON_VERSION == "2.51.0"
    assert dist.SOURCE_WHEEL_SHA256 is versions.BUILDS["2.51.0"].sha256
    assert {"2.48.0", "2.49.0", "2.50.0", "2.51.0"} <= set(versions.BUILDS)
    for build in versions.BUILDS.values():
        assert re.fullmatch(r"[0-9a-f]{64}", build.sha256["x86_64"]), build
    assert versions.BUILDS["2.48.0"].pythons[1] == (3, 12)  # no 3.13 stub before 2.51


def test_selected_version_from_the_environment():
    assert versions.selected_version({}) == "2.51.0"
    assert versions.selected_version({versions.VERSION_ENV: "2.48"}) == "2.48.0"
    with pytest.raises(ValueError, match=f"{versions.VERSION_ENV}=2.30: .*supported"):
        versions.selected_version({versions.VERSION_ENV: "2.30"})


def test_read_version_from_the_file_then_the_install_marker(tmp_path):
    root = _server_dir(tmp_path / "a", "2.48.0")
    assert versions.read_version(root) == "2.48.0"
    marked = _server_dir(tmp_path / "b")
    assert versions.read_version(marked) is None
    (marked / versions.COMPLETE_MARKER).write_text(versions.BUILDS["2.51.0"].sha256["x86_64"] + "\n")
    assert versions.read_version(marked) == "2.51.0"  # an install made before TRITON_VERSION was written
    (marked / versions.COMPLETE_MARKER).write_text("0" * 64 + "\n")
    assert versions.read_version(marked) is None


# -- finding and choosing a server ---------------------------------------------------------------------
def test_explicit_server_of_an_unsupported_version_is_refused_naming_the_supported(home, tmp_path, monkeypatch):
    root = _server_dir(tmp_path / "ngc-23.10", "2.39.0")
    monkeypatch.setenv("PYTRITON_TRITONSERVER_DIR", str(root))
    with pytest.raises(PyTritonServerNotInstalledError, match=r"Triton 2\.39\.0, which pytriton does not support"):
        dist.find_server()
    (root / versions.VERSION_FILE).write_text("2.50.0\n")
    found = dist.find_server()
    assert found.root == root and found.version == "2.50.0"
    assert versions.server_version() == "2.50.0"


def test_server_without_a_version_is_refused_saying_how_to_declare_it(home, tmp_path):
    root = _server_dir(tmp_path / "custom")
    with pytest.raises(PyTritonServerNotInstalledError, match="Cannot tell which Triton version") as caught:
        dist.find_server(root)
    assert str(root / versions.VERSION_FILE) in str(caught.value)


def test_ngc_container_server_is_accepted_when_supported(home, tmp_path, monkeypatch):
    ngc = _server_dir(tmp_path / "opt-tritonserver", "2.49.0")
    monkeypatch.setattr(dist, "NGC_DIR", ngc)
    assert dist.find_server().version == "2.49.0"
    (ngc / versions.VERSION_FILE).write_text("2.40.0\n")
    with pytest.raises(PyTritonServerNotInstalledError, match="does not support"):
        dist.find_server()


def test_environment_chooses_among_installed_builds(home, tmp_path, monkeypatch):
    for version in ("2.51.0", "2.48.0"):
        root = _server_dir(home / "tritonserver" / version, version)
        (root / versions.COMPLETE_MARKER).write_text("x\n")
    assert dist.find_server().version == "2.51.0"
    monkeypatch.setenv(versions.VERSION_ENV, "2.48")
    found = dist.find_server()
    assert found.root == home / "tritonserver" / "2.48.0" and found.version == "2.48.0"
    monkeypatch.setenv(versions.VERSION_ENV, "2.49")
    with pytest.raises(PyTritonServerNotInstalledError, match=r"pytriton install-server --triton 2\.49\.0"):
        dist.find_server()
    monkeypatch.setenv(versions.VERSION_ENV, "2.48")
    monkeypatch.setenv("PYTRITON_TRITONSERVER_DIR", str(home / "tritonserver" / "2.51.0"))
    with pytest.raises(PyTritonServerNotInstalledError, match=r"asks for Triton 2\.48\.0, but .* is Triton 2\.51\.0"):
        dist.find_server()


def test_python_range_follows_the_build():
    dist.check_python_supported((3, 13), triton="2.51.0")
    with pytest.raises(PyTritonServerError, match=r"3\.9 to 3\.12; this is Python 3\.13\. Triton 2\.48\.0"):
        dist.check_python_supported((3, 13), triton="2.48.0")
    dist.check_python_supported((3, 12), triton="2.48.0")


# -- installing a chosen build ---------------------------------------------------------------------------
def test_install_an_older_build_beside_the_default(home, tmp_path, monkeypatch):
    default = install_server(_pin_fake_wheel(tmp_path, monkeypatch, "2.51.0"), stub_env=False, progress=lambda _: None)
    older_wheel = _pin_fake_wheel(tmp_path, monkeypatch, "2.48.0")
    messages = []
    older = install_server(older_wheel, stub_env=False, progress=messages.append, triton="2.48")
    assert default == home / "tritonserver" / "2.51.0" and older == home / "tritonserver" / "2.48.0"
    assert (older / versions.VERSION_FILE).read_text() == "2.48.0\n"
    assert (default / "bin" / "tritonserver").is_file()  # untouched
    assert "Installed Triton 2.48.0" in messages[-1]
    monkeypatch.setenv(versions.VERSION_ENV, "2.48.0")
    assert dist.find_server().root == older


def test_install_verifies_against_the_chosen_builds_pin(home, tmp_path, monkeypatch):
    wheel = _pin_fake_wheel(tmp_path, monkeypatch, "2.51.0")  # pinned for 2.51 only
    # On any interpreter: the refusal tested here is the pin's, not the missing 3.13 stub's.
    monkeypatch.setitem(
        versions.BUILDS, "2.48.0", dataclasses.replace(versions.BUILDS["2.48.0"], pythons=((3, 8), (3, 13)))
    )
    with pytest.raises(InstallError, match=r"not the expected nvidia-pytriton 0\.5\.10 wheel \(Triton 2\.48\.0\)"):
        install_server(wheel, stub_env=False, progress=lambda _: None, triton="2.48")
    assert not (home / "tritonserver" / "2.48.0").exists()


def test_an_older_build_refuses_a_python_it_has_no_stub_for():
    with pytest.raises(PyTritonServerError, match=r"this is Python 3\.13\. Triton 2\.48\.0's Python backend"):
        dist.check_python_supported((3, 13), triton="2.48.0")
    dist.check_python_supported((3, 13), triton="2.51.0")  # 2.51 ships a 3.13 stub


def test_install_of_an_unsupported_build_fails_before_downloading(home, monkeypatch):
    from pytriton.server import install

    def no_download(*args, **kwargs):
        raise AssertionError("must not download")

    monkeypatch.setattr(install, "download_wheel", no_download)
    with pytest.raises(InstallError, match=r"Triton 2\.46 is not a build pytriton supports; supported: .*2\.48\.0"):
        install_server(None, stub_env=False, progress=lambda _: None, triton="2.46")


def test_install_server_command_takes_triton(home, tmp_path, monkeypatch, capsys):
    from pytriton._cli import main

    wheel = _pin_fake_wheel(tmp_path, monkeypatch, "2.49.0")
    assert main(["install-server", "--triton", "2.49", "--from-wheel", str(wheel), "--no-stub-env"]) == 0
    assert (home / "tritonserver" / "2.49.0" / versions.VERSION_FILE).read_text() == "2.49.0\n"
    assert main(["install-server", "--triton", "3.0", "--no-stub-env"]) == 1
    assert "error: Triton 3.0 is not a build pytriton supports" in capsys.readouterr().err


def test_check_reports_the_server_version(home, tmp_path, monkeypatch):
    from pytriton import _check

    root = _server_dir(home / "tritonserver" / "2.50.0", "2.50.0")
    (root / versions.COMPLETE_MARKER).write_text(versions.BUILDS["2.50.0"].sha256["x86_64"] + "\n")
    monkeypatch.setenv(versions.VERSION_ENV, "2.50")
    items = {item.name: item for item in _check.check_server()}
    assert items["server version"].status == _check.OK
    assert items["server version"].detail.startswith(f"Triton 2.50.0 ({versions.VERSION_ENV}; supported: 2.51.0")
    assert "nvidia-pytriton==0.5.12" in items["server wheel pin"].detail
    monkeypatch.setenv(versions.VERSION_ENV, "9.9")
    items = {item.name: item for item in _check.check_server()}
    assert items["server version"].status == _check.FAIL and "supported" in items["server version"].detail


# -- gates --------------------------------------------------------------------------------------------------
def test_gate_is_inactive_outside_its_range_with_one_debug_line(caplog):
    gate = versions.Gate("test-gate", "a bug", "nowhere", triton=("2.48", "2.50"), numpy=("2", None))
    with caplog.at_level(logging.DEBUG, logger="pytriton.server.versions"):
        assert gate.active("2.49.0") and gate.active("2.50.3", numpy="2.1.0")
        assert not caplog.records
        assert not gate.active("2.51.0")
        assert not gate.active("2.51.0")  # logged once per gate and versions
        assert not gate.active("2.49.0", numpy="1.26.4")
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "test-gate inactive: Triton 2.51.0 is outside 2.48 to 2.50 (a bug)",
        "test-gate inactive: numpy 1.26.4 is outside 2 and later (a bug)",
    ]
    assert all(record.levelno == logging.DEBUG for record in caplog.records)


def _argv(triton_version, **config):
    plan = LaunchPlan.build(
        pathlib.Path("/srv/bin/tritonserver"),
        TritonConfig(**config),
        LaunchSettings(
            model_repository=pathlib.Path("/repo"),
            backend_directory=pathlib.Path("/backends"),
            cache_directory=None,
            shm_region_prefix="pfx",
            triton_version=triton_version,
        ),
    )
    return plan.to_argv()


def test_http_max_input_size_is_passed_to_servers_that_have_it():
    assert f"--http-max-input-size={2 * 1024**3}" in _argv("2.59.0")
    assert "--http-max-input-size=1048576" in _argv("2.62.1", max_request_bytes=1 << 20)
    for version in ("2.51.0", "2.48.0", None):  # the flag does not exist there: tritonserver would refuse it
        assert not any(arg.startswith("--http-max-input-size") for arg in _argv(version))
    assert not any(arg.startswith("--http-max-input-size") for arg in _argv("2.59.0", max_request_bytes=0))


def test_stub_numpy2_gate_follows_numpy():
    assert versions.STUB_NUMPY2.active(numpy="2.4.0") and not versions.STUB_NUMPY2.active(numpy="1.26.4")


def test_every_gate_names_existing_code():
    names = [gate.name for gate in versions.GATES]
    assert len(names) == len(set(names))
    for gate in versions.GATES:
        for part in gate.where.split(","):
            path = part.strip().split(" ")[0]
            assert (ROOT / "pytriton" / path).is_file(), f"{gate.name}: {path} does not exist"


# Lines that name 2.51 as a fact about the server, not a workaround of one of its bugs.
_FACTS = {
    "server/security.py": "the endpoint groups the server can restrict",
    "proxy/stubside/_pb_types.py": "the shapes of the backend's objects, for the type checker",
    "proxy/stubside/_stub.py": "the error code Triton maps (line 117)",
    "proxy/_tracing.py": "where Triton exports traces by default",
    "inprocess/_errorlog.py": "the wording of Triton's failed-load log lines",
    "server/distribution.py": "the default build",
    "server/install.py": "the default build",
    "server/versions.py": "the builds",
    "_cli.py": "the default build",
}


def test_every_file_pinning_2_51_is_covered_by_a_gate_or_states_a_fact():
    covered = {part.strip().split(" ")[0] for gate in versions.GATES for part in gate.where.split(",")}
    pinning = {
        str(path.relative_to(ROOT / "pytriton"))
        for path in (ROOT / "pytriton").rglob("*.py")
        if re.search(r"\b2\.51\b", path.read_text())
    }
    uncovered = sorted(pinning - covered - set(_FACTS))
    assert not uncovered, f"name the version range of these workarounds in server/versions.py GATES: {uncovered}"


def test_architecture_doc_lists_every_gate_with_its_ranges():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for gate in versions.GATES:
        row = next((line for line in text.splitlines() if line.startswith(f"| `{gate.name}` |")), None)
        assert row is not None, f"docs/architecture.md, Version gates: no row for {gate.name}"
        assert f"Triton {versions.range_text(gate.triton)}" in row, row
        if gate.numpy is not None:
            assert f"numpy {versions.range_text(gate.numpy)}" in row, row


def test_dead_stub_request_gate_covers_the_builds_whose_backend_waits_without_a_timeout():
    # python_backend r24.07-r24.09 (2.48-2.50) wait for a stub's reply with no timeout; r24.10 (2.51) polls its health.
    gate = versions.DEAD_STUB_REQUEST_UNANSWERED
    assert [v for v in sorted(versions.BUILDS, key=versions.parse) if gate.active(v)] == ["2.48.0", "2.49.0", "2.50.0"]


@pytest.mark.parametrize("version, warned", [("2.48.0", True), ("2.50.0", True), ("2.51.0", False), (None, False)])
def test_a_lost_stub_warns_that_its_request_stays_unanswered_only_where_the_build_does_that(
    version, warned, monkeypatch, caplog
):
    # The Triton and state seams as in tests/unit/test_self_healing.py; no server runs.
    monkeypatch.setattr(versions, "_SERVER_VERSION", version)
    caplog.set_level(logging.WARNING, logger="pytriton._serving.supervisor")
    triton = Triton()
    x = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    triton.bind("Model", lambda requests: [], x, x)
    try:
        triton._state = State.RUNNING
        triton._backend._server = SimpleNamespace(pid=42, is_alive=lambda: True)
        triton._supervisor.on_stub_lost("Model", 0, 42)
        assert triton._supervisor._events.get_nowait() == ("stub", ("Model", 0))  # replaced on every build
    finally:
        triton._backend._server = None
        triton.stop()
    lines = [r.getMessage() for r in caplog.records if "is never answered" in r.getMessage()]
    assert bool(lines) == warned, lines
    if warned:
        assert f"on Triton {version} " in lines[0] and "its own timeout" in lines[0]
