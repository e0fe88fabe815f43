"""Attribution of the Python backend's scratch directory (server/_scratch.py), on a fake /tmp."""

import fcntl
import os
import threading

import pytest

from pytriton.server import _scratch


@pytest.fixture()
def root(scratch_root):
    (scratch_root / "python_env_older").mkdir()  # another server's, from before
    return scratch_root


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


def test_two_servers_starting_at_once_each_claim_their_own(root):
    # What made the scratch-directory tests flaky on a busy machine: another pytriton server's
    # backend started inside this one's window, both saw two new directories and claimed none.
    first, second = _scratch.ScratchDirTracker(), _scratch.ScratchDirTracker()
    first.before_first_load()
    second_in_window = threading.Event()
    waiter = threading.Thread(target=lambda: (second.before_first_load(), second_in_window.set()))
    waiter.start()
    try:
        (root / "python_env_first").mkdir()  # the first server's backend starts: its window closes
        assert second_in_window.wait(10), "the second window never opened"
        (root / "python_env_second").mkdir()
        assert second.after_first_load(True) == str(root / "python_env_second")
        assert first.after_first_load(True) == str(root / "python_env_first")
    finally:
        waiter.join(10)
        first.remove()
        second.remove()
    assert not (root / "python_env_first").exists() and not (root / "python_env_second").exists()


def test_a_window_without_a_new_directory_ends_with_the_load(root):
    first, second = _scratch.ScratchDirTracker(), _scratch.ScratchDirTracker()
    first.before_first_load()  # e.g. an in-process server whose backend another one already started
    assert first.after_first_load(True) is None
    second.before_first_load()  # not kept waiting: the lock was released
    (root / "python_env_second").mkdir()
    assert second.after_first_load(True) == str(root / "python_env_second")


def test_a_lock_held_too_long_is_waited_for_only_so_long(root, tmp_path, monkeypatch):
    monkeypatch.setattr(_scratch, "LOCK_WAIT_S", 0.2)
    (tmp_path / "home").mkdir()
    holder = os.open(tmp_path / "home" / _scratch.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        tracker = _scratch.ScratchDirTracker()
        tracker.before_first_load()  # goes ahead without the lock, by elimination alone
        (root / "python_env_ours").mkdir()
        assert tracker.after_first_load(True) == str(root / "python_env_ours")
    finally:
        os.close(holder)
