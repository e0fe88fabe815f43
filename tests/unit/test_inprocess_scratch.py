"""The in-process Python backend's scratch directory (pytriton/inprocess/_scratch.py), on a fake /tmp and /dev/shm."""

import threading

import pytest

from pytriton.inprocess import _scratch as inprocess_scratch
from pytriton.server import _scratch

PREFIX = "pytriton-inproc-1-1-"


@pytest.fixture()
def roots(tmp_path, monkeypatch):
    tmp, shm = tmp_path / "tmp", tmp_path / "shm"
    tmp.mkdir()
    shm.mkdir()
    monkeypatch.setattr(_scratch, "SCRATCH_ROOT", str(tmp))
    monkeypatch.setattr(inprocess_scratch, "SHM_ROOT", str(shm))
    monkeypatch.setenv("PYTRITON_HOME", str(tmp_path / "home"))  # where the window lock lives
    (tmp / "python_env_older").mkdir()  # another server's, from before
    return tmp, shm


def _backend_starts(tmp, shm, name="python_env_ours"):
    """What the Python backend does on its first model load: its directory, then an instance's region."""
    (tmp / name).mkdir()
    (shm / f"{PREFIX}instance_0").touch()


def test_the_directory_of_the_backend_started_in_the_window_is_claimed_and_removed(roots):
    tmp, shm = roots
    scratch = inprocess_scratch.BackendScratch()
    with scratch.window(PREFIX):
        _backend_starts(tmp, shm)
    assert scratch.path == str(tmp / "python_env_ours")
    with scratch.window(PREFIX):  # claimed: later loads open no window
        (tmp / "python_env_later").mkdir()
    assert scratch.path == str(tmp / "python_env_ours")
    scratch.remove()
    scratch.remove()  # idempotent
    assert scratch.path is None
    assert sorted(p.name for p in tmp.iterdir()) == ["python_env_later", "python_env_older"]


def test_a_load_that_did_not_start_the_backend_claims_nothing(roots):
    tmp, _ = roots
    scratch = inprocess_scratch.BackendScratch()
    with pytest.raises(RuntimeError):
        with scratch.window(PREFIX):
            (tmp / "python_env_someone_elses").mkdir()  # no region of ours: another server made it
            raise RuntimeError("the load failed")
    assert scratch.path is None


def test_no_window_once_the_backend_is_up(roots):
    tmp, shm = roots
    (shm / f"{PREFIX}instance_0").touch()  # up already (its directory was not claimed then)
    scratch = inprocess_scratch.BackendScratch()
    with scratch.window(PREFIX):
        (tmp / "python_env_someone_elses").mkdir()
    assert scratch.path is None


def test_a_second_window_in_the_process_does_not_wait_for_the_first(roots):
    tmp, shm = roots
    scratch = inprocess_scratch.BackendScratch()
    inside, leave = threading.Event(), threading.Event()

    def first() -> None:
        with scratch.window(PREFIX):
            inside.set()
            leave.wait(10)
            _backend_starts(tmp, shm)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(10)
        second_done = threading.Event()

        def second() -> None:
            with scratch.window(PREFIX):  # would wait LOCK_WAIT_S for the first's lock if it opened one
                pass
            second_done.set()

        other = threading.Thread(target=second)
        other.start()
        assert second_done.wait(5), "the second window waited for the first"
        other.join(5)
    finally:
        leave.set()
        thread.join(10)
    assert scratch.path == str(tmp / "python_env_ours")


def test_a_directory_that_is_not_empty_is_kept(roots):
    tmp, shm = roots
    scratch = inprocess_scratch.BackendScratch()
    with scratch.window(PREFIX):
        _backend_starts(tmp, shm)
    (tmp / "python_env_ours" / "extracted").mkdir()  # an execution environment: not ours to delete
    scratch.remove()
    assert (tmp / "python_env_ours").is_dir()
    assert scratch.path is None
