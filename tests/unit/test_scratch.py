"""Attribution of the Python backend's scratch directory (server/_scratch.py), on a fake /tmp."""

import pytest

from pytriton.server import _scratch


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(_scratch, "SCRATCH_ROOT", str(tmp_path))
    (tmp_path / "python_env_older").mkdir()  # another server's, from before
    return tmp_path


def test_the_one_new_directory_is_claimed_and_removed(root):
    tracker = _scratch.ScratchDirTracker()
    tracker.before_first_load()
    (root / "python_env_ours").mkdir()
    (root / "unrelated").mkdir()
    assert tracker.after_first_load(True) == str(root / "python_env_ours")
    # Later loads change nothing.
    tracker.before_first_load()
    (root / "python_env_later").mkdir()
    assert tracker.after_first_load(True) == str(root / "python_env_ours")
    tracker.remove()
    tracker.remove()  # idempotent
    assert sorted(p.name for p in root.iterdir()) == ["python_env_later", "python_env_older", "unrelated"]


def test_two_new_directories_are_ambiguous(root):
    tracker = _scratch.ScratchDirTracker()
    tracker.before_first_load()
    (root / "python_env_a").mkdir()
    (root / "python_env_b").mkdir()
    assert tracker.after_first_load(True) is None
    tracker.remove()
    assert (root / "python_env_a").exists() and (root / "python_env_b").exists()


def test_nothing_is_claimed_after_a_failed_load(root):
    tracker = _scratch.ScratchDirTracker()
    tracker.before_first_load()
    (root / "python_env_maybe").mkdir()
    assert tracker.after_first_load(False) is None
    assert tracker.after_first_load(True) is None  # the window is closed for good


def test_a_directory_that_is_no_longer_empty_is_kept(root):
    tracker = _scratch.ScratchDirTracker()
    tracker.before_first_load()
    (root / "python_env_ours").mkdir()
    tracker.after_first_load(True)
    (root / "python_env_ours" / "env").mkdir()  # an execution environment was extracted into it
    tracker.remove()
    assert (root / "python_env_ours" / "env").exists()


def test_no_window_no_claim(root):
    tracker = _scratch.ScratchDirTracker()
    (root / "python_env_new").mkdir()
    assert tracker.after_first_load(True) is None
