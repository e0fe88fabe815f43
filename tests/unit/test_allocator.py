"""Which malloc the server gets (pytriton/server/_allocator.py): found, preloaded, or explained."""

from __future__ import annotations

import logging
import pathlib

import pytest

from pytriton._serving.launched import server_environment as _server_environment
from pytriton.exceptions import PyTritonValidationError
from pytriton.server import _allocator
from pytriton.server.triton_config import TritonConfig


@pytest.fixture()
def libs(tmp_path):
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    return tmp_path


def test_named_allocators_are_found_in_the_given_directories(libs, tmp_path):
    assert _allocator.resolve("jemalloc", [libs]) == libs / "libjemalloc.so.2"
    assert _allocator.resolve("tcmalloc", [libs]) == libs / "libtcmalloc_minimal.so.4"
    assert _allocator.resolve("auto", [libs]) == libs / "libjemalloc.so.2"
    assert _allocator.resolve(None, [libs]) == libs / "libjemalloc.so.2"
    assert _allocator.resolve("glibc", [libs]) is None
    assert _allocator.resolve(str(libs / "libtcmalloc_minimal.so.4")) == libs / "libtcmalloc_minimal.so.4"


def test_a_missing_or_unknown_allocator_says_what_to_do(tmp_path, monkeypatch, caplog):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PyTritonValidationError, match="apt-get install libjemalloc2"):
        _allocator.resolve("jemalloc", [empty])
    with pytest.raises(PyTritonValidationError, match="unknown; use one of auto, jemalloc, tcmalloc, glibc"):
        _allocator.resolve("mimalloc", [empty])
    with pytest.raises(PyTritonValidationError, match="no such file"):
        _allocator.resolve(str(empty / "libnothing.so"))
    # auto without jemalloc: glibc's malloc, and one warning naming the package
    monkeypatch.setattr(_allocator, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="pytriton.triton"):
        assert _allocator.resolve("auto", [empty]) is None
        assert _allocator.resolve("auto", [empty]) is None
    warnings = [record.getMessage() for record in caplog.records if "jemalloc is not installed" in record.getMessage()]
    assert len(warnings) == 1 and "libjemalloc2" in warnings[0] and "server_allocator='glibc'" in warnings[0]


def test_preload_goes_first_and_keeps_what_the_user_preloads():
    env = {"LD_PRELOAD": "/opt/libmine.so"}
    _allocator.preload(env, pathlib.Path("/usr/lib/libjemalloc.so.2"))
    assert env["LD_PRELOAD"] == "/usr/lib/libjemalloc.so.2 /opt/libmine.so"
    assert env["MALLOC_CONF"] == _allocator.JEMALLOC_CONF and "background_thread:true" in env["MALLOC_CONF"]
    own = {"MALLOC_CONF": "narenas:2"}  # the user's jemalloc settings win
    _allocator.preload(own, pathlib.Path("/usr/lib/libjemalloc.so.2"))
    assert own["MALLOC_CONF"] == "narenas:2"
    tcmalloc: dict = {}
    _allocator.preload(tcmalloc, pathlib.Path("/usr/lib/libtcmalloc_minimal.so.4"))
    assert "MALLOC_CONF" not in tcmalloc
    _allocator.preload(env, pathlib.Path("/usr/lib/libjemalloc.so.2"))  # not twice
    assert env["LD_PRELOAD"] == "/usr/lib/libjemalloc.so.2 /opt/libmine.so"
    untouched = {"PATH": "/bin"}
    _allocator.preload(untouched, None)
    assert untouched == {"PATH": "/bin"}


def test_the_server_environment_preloads_the_choice_only_there(libs, monkeypatch):
    monkeypatch.setattr(_allocator, "library_dirs", lambda: [libs])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    stub, lib_dirs = pathlib.Path("/stub/bin"), [pathlib.Path("/lib/python")]
    assert _server_environment(stub, lib_dirs)["LD_PRELOAD"] == str(libs / "libjemalloc.so.2")
    assert _server_environment(stub, lib_dirs, allocator="tcmalloc")["LD_PRELOAD"] == str(
        libs / "libtcmalloc_minimal.so.4"
    )
    assert "LD_PRELOAD" not in _server_environment(stub, lib_dirs, allocator="glibc")


def test_the_config_field_and_its_environment_variable():
    assert TritonConfig(server_allocator="glibc").server_allocator == "glibc"
    config = TritonConfig.from_env({"PYTRITON_TRITON_CONFIG_SERVER_ALLOCATOR": "tcmalloc"})
    assert config.server_allocator == "tcmalloc"


def test_under_jemalloc_the_server_may_not_map_more_than_the_machine(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nSwapTotal:       1000000 kB\n")
    jemalloc = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert _allocator.data_limit(jemalloc, str(meminfo)) == 25_000_000 * 1024
    assert _allocator.data_limit({"LD_PRELOAD": "/opt/libtcmalloc.so.4"}, str(meminfo)) is None
    assert _allocator.data_limit({}, str(meminfo)) is None
    assert _allocator.data_limit(jemalloc, str(tmp_path / "missing")) is None
