"""``Workspace``: what it creates, what ``clean()`` removes, and what the crash guard may remove."""

from __future__ import annotations

import gc
import os
import pathlib
import subprocess
import sys
import weakref

import pytest

from pytriton.server.workspace import Workspace, cleanup_paths


@pytest.fixture()
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("PYTRITON_HOME", str(home))
    return home


def test_a_workspace_without_a_path_lives_under_pytriton_home_and_goes_entirely(home):
    workspace = Workspace()
    assert workspace.path.parent == home and workspace.path.name.startswith("workspace_")
    assert workspace.exists()
    repository = workspace.subdir("model_repository")
    (repository / "m" / "1").mkdir(parents=True)
    (workspace.path / "server.log").write_text("log")
    assert cleanup_paths(workspace) == workspace.path  # the watchdog may remove all of it
    workspace.clean()
    assert not workspace.exists()
    assert home.exists()
    workspace.clean()  # idempotent


def test_two_workspaces_do_not_share_a_directory(home):
    first, second = Workspace(), Workspace()
    try:
        assert first.path != second.path
    finally:
        first.clean()
        second.clean()


def test_an_existing_directory_keeps_what_pytriton_did_not_create(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("the user's")
    (target / "existing").mkdir()
    workspace = Workspace(target)
    assert workspace.path == target.resolve()
    assert workspace.subdir("existing") == target / "existing"  # not created by pytriton
    created = workspace.subdir("model_repository")
    (created / "file").write_text("x")
    assert cleanup_paths(workspace) is None  # the watchdog must not remove the user's directory
    workspace.clean()
    assert not created.exists()
    assert (target / "notes.txt").read_text() == "the user's" and (target / "existing").is_dir()
    workspace.clean()


def test_a_new_directory_given_by_path_is_created_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    workspace = Workspace("~/deep/work")
    assert workspace.path == (tmp_path / "deep" / "work").resolve() and workspace.exists()
    assert repr(workspace) == f"Workspace({str(workspace.path)!r})"
    assert cleanup_paths(workspace) == workspace.path
    workspace.clean()
    assert not workspace.exists() and (tmp_path / "deep").exists()


def test_a_workspace_nobody_cleans_is_removed_when_it_is_collected(home):
    workspace = Workspace()
    path = workspace.path
    del workspace
    gc.collect()
    assert not path.exists()


def test_a_workspace_nobody_cleans_is_removed_at_interpreter_exit(home):
    # What every test-suite run did with a Triton its fixture marked stopped without stop(): the
    # directory outlived the process. A normal exit now removes it.
    code = "from pytriton.server.workspace import Workspace; import sys; KEEP = Workspace(); print(KEEP.path)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    path = pathlib.Path(done.stdout.strip())
    assert path.parent == home and not path.exists()


def test_a_forked_child_leaves_its_parents_workspace_alone(home):
    workspace = Workspace()
    try:
        pid = os.fork()
        if pid == 0:  # the child drops its copy and runs the exit-time finalizers, as any exit would
            try:
                del workspace
                gc.collect()
                weakref.finalize._exitfunc()  # type: ignore[attr-defined]
            finally:
                os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        assert workspace.exists()
    finally:
        workspace.clean()
    assert not workspace.exists()
