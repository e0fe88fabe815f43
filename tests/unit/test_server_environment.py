"""The server's environment: stub first on PATH, libraries first to load, one malloc arena by default."""

from __future__ import annotations

import pathlib

from pytriton._serving.launched import SERVER_MALLOC_ARENA_MAX
from pytriton._serving.launched import server_environment as _server_environment

STUB = pathlib.Path("/stub/bin")
LIBS = [pathlib.Path("/lib/python"), pathlib.Path("/lib/triton")]


def test_stub_first_on_path_and_libraries_first_to_load(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/lib")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = _server_environment(STUB, LIBS)
    assert env["PATH"].split(":")[0] == "/stub/bin"
    assert env["LD_LIBRARY_PATH"] == "/lib/python:/lib/triton:/opt/lib"
    assert "PYTHONPATH" not in env


def test_one_malloc_arena_by_default_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert _server_environment(STUB, LIBS)["MALLOC_ARENA_MAX"] == str(SERVER_MALLOC_ARENA_MAX) == "1"
    assert _server_environment(STUB, LIBS, malloc_arena_max=4)["MALLOC_ARENA_MAX"] == "4"
    assert "MALLOC_ARENA_MAX" not in _server_environment(STUB, LIBS, malloc_arena_max=0)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert _server_environment(STUB, LIBS)["MALLOC_ARENA_MAX"] == "8"
