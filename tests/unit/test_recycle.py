"""server/_recycle.py: finding the server's stubs and their grown regions, on a fake /proc and /dev/shm."""

from __future__ import annotations

import os
import pathlib

from pytriton.server import _recycle

MIB = 1 << 20
STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"
PREFIX = "pytriton-1-tok-pb"


def _process(proc: pathlib.Path, pid: int, parent: int, argv: list) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    # The command in parentheses may itself contain ") ": the fields start after the last one.
    (entry / "stat").write_text(f"{pid} (odd) name) S {parent} {pid} 0 0\n")
    (entry / "cmdline").write_bytes(b"\0".join(word.encode() for word in argv) + b"\0")


def _region(shm: pathlib.Path, name: str, written: int, apparent: int) -> None:
    with open(shm / name, "wb") as file:
        file.write(os.urandom(written))  # incompressible: a compressing file system allocates it all
        file.truncate(apparent)  # the rest is a hole: no blocks allocated


def _stub(repository: pathlib.Path, model: str, region: str) -> list:
    return [STUB, f"{repository}/{model}/1/model.py", region, "4194304", "16777216", "100"]


def test_stub_regions_reads_each_stub_of_the_server_and_its_resident_bytes(tmp_path):
    proc, shm, repository = tmp_path / "proc", tmp_path / "shm", tmp_path / "repo"
    for folder in (proc, shm):
        folder.mkdir()
    (proc / "self").mkdir()  # not a pid
    _process(proc, 100, 1, ["tritonserver", "--model-repository", str(repository)])
    _process(proc, 101, 100, _stub(repository, "Big", f"{PREFIX}-Big_0"))
    _region(shm, f"{PREFIX}-Big_0", written=3 * MIB, apparent=64 * MIB)
    _process(proc, 102, 100, _stub(repository, "Small", f"{PREFIX}-Small_0"))
    _region(shm, f"{PREFIX}-Small_0", written=MIB, apparent=MIB)
    # Ignored: another server's stub, a stub of another repository, a region without the prefix,
    # a region that is gone already, and a child of the server that is no stub.
    _process(proc, 200, 1, ["tritonserver"])
    _process(proc, 201, 200, _stub(repository, "Big", f"{PREFIX}-Big_1"))
    _region(shm, f"{PREFIX}-Big_1", written=MIB, apparent=MIB)
    _process(proc, 103, 100, _stub(tmp_path / "other", "Big", f"{PREFIX}-Big_2"))
    _region(shm, f"{PREFIX}-Big_2", written=MIB, apparent=MIB)
    _process(proc, 104, 100, _stub(repository, "Big", "someone-else-Big_0"))
    _region(shm, "someone-else-Big_0", written=MIB, apparent=MIB)
    _process(proc, 105, 100, _stub(repository, "Gone", f"{PREFIX}-Gone_0"))
    _process(proc, 106, 100, ["/bin/sh", "-c", f"{repository}/Big/1/model.py", f"{PREFIX}-Big_0"])

    regions = _recycle.stub_regions(100, repository, PREFIX, proc=proc, shm=shm)

    assert sorted(regions) == [101, 102]
    assert (regions[101][0], regions[102][0]) == ("Big", "Small")
    # Resident means allocated blocks, not the apparent size of the file (64 MiB, mostly a hole).
    assert 3 * MIB <= regions[101][1] < 32 * MIB
    assert regions[102][1] >= MIB
    assert os.stat(shm / f"{PREFIX}-Big_0").st_size == 64 * MIB


def test_grown_models_keeps_the_largest_region_above_the_threshold():
    regions = {1: ("A", 20 * MIB), 2: ("A", 30 * MIB), 3: ("B", 16 * MIB), 4: ("C", 17 * MIB)}
    assert _recycle.grown_models(regions, 16 * MIB) == {"A": 30 * MIB, "C": 17 * MIB}
    assert _recycle.grown_models(regions, 64 * MIB) == {}
    assert _recycle.grown_models({}, 0) == {}


def test_any_region_over_looks_only_at_this_servers_regions_in_shm(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    _region(shm, f"{PREFIX}-Small_0", written=MIB, apparent=64 * MIB)  # apparent size is not resident
    _region(shm, "someone-else-Big_0", written=3 * MIB, apparent=3 * MIB)
    assert not _recycle.any_region_over(PREFIX, 2 * MIB, shm=shm)
    _region(shm, f"{PREFIX}-Big_0", written=3 * MIB, apparent=3 * MIB)
    assert _recycle.any_region_over(PREFIX, 2 * MIB, shm=shm)
    assert not _recycle.any_region_over(PREFIX, 4 * MIB, shm=shm)
    assert not _recycle.any_region_over(PREFIX, 0, shm=tmp_path / "missing")


# -- pinned model generations: regions without a live stub, and when the server is replaced ----------


def test_live_stub_regions_names_only_regions_of_live_stubs_of_this_server(tmp_path):
    proc, repository = tmp_path / "proc", tmp_path / "repo"
    proc.mkdir()
    _process(proc, 100, 1, ["tritonserver"])
    _process(proc, 101, 100, _stub(repository, "Echo", f"{PREFIX}-aaa"))
    _process(proc, 102, 100, [])  # a dead stub not yet reaped (a zombie): empty command line
    _process(proc, 103, 100, ["/bin/sh", f"{PREFIX}-ccc"])  # no stub
    _process(proc, 200, 1, ["tritonserver"])
    _process(proc, 201, 200, _stub(repository, "Echo", f"{PREFIX}-ddd"))  # another server's stub
    assert _recycle.live_stub_regions(100, PREFIX, proc=proc) == {f"{PREFIX}-aaa"}


def test_server_regions_lists_this_servers_prefix_only(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    for name in (f"{PREFIX}-aaa", f"{PREFIX}-bbb", "someone-else-aaa"):
        (shm / name).write_bytes(b"x")
    assert _recycle.server_regions(PREFIX, shm=shm) == {f"{PREFIX}-aaa", f"{PREFIX}-bbb"}
    assert _recycle.server_regions(PREFIX, shm=tmp_path / "missing") == set()


def test_pinned_regions_counts_a_region_only_after_the_grace_without_a_live_stub():
    now = [0.0]
    pinned = _recycle.PinnedRegions(grace_s=5.0, clock=lambda: now[0])
    assert pinned.update({"a", "b"}, {"a", "b"}) == set() and not pinned.tracking
    # b's stub died: a grace period first (a region exists for a moment around every load and unload)
    assert pinned.update({"a", "b"}, {"a"}) == set() and pinned.tracking
    now[0] = 4.9
    assert pinned.update({"a", "b", "c"}, {"a"}) == set()  # c: a load under way, no stub yet
    now[0] = 5.0
    assert pinned.update({"a", "b", "c"}, {"a"}) == {"b"}
    now[0] = 9.95
    assert pinned.update({"a", "b", "c"}, {"a"}) == {"b", "c"}
    # c got its stub, b's region was removed after all (an unload that completed): both forgotten
    now[0] = 20.0
    assert pinned.update({"a", "c"}, {"a", "c"}) == set() and not pinned.tracking
    assert pinned.update({"a", "c"}, {"a"}) == set()  # c's stub died now: its grace starts again


def test_server_recycle_reason_idle_server_any_pinned_busy_server_at_the_limit():
    assert _recycle.server_recycle_reason(0, 16, 100.0, 10.0) is None
    reason = _recycle.server_recycle_reason(1, 16, 10.0, 10.0)
    assert reason is not None and "idle" in reason
    assert _recycle.server_recycle_reason(1, 16, 9.9, 10.0) is None  # not idle long enough
    assert _recycle.server_recycle_reason(15, 16, None, 10.0) is None  # a batch runs, below the limit
    reason = _recycle.server_recycle_reason(16, 16, None, 10.0)
    assert reason is not None and "limit of 16" in reason
    assert _recycle.server_recycle_reason(99, 0, None, 10.0) is None  # 0: never under traffic
    assert _recycle.server_recycle_reason(99, 0, 11.0, 10.0) is not None


def test_pinned_limit_reads_the_variable_and_refuses_nonsense():
    import pytest

    assert _recycle.pinned_limit({}) == _recycle.PINNED_REGIONS_LIMIT
    assert _recycle.pinned_limit({"PYTRITON_RECYCLE_PINNED_REGIONS": " 4 "}) == 4
    assert _recycle.pinned_limit({"PYTRITON_RECYCLE_PINNED_REGIONS": "0"}) == 0
    for bad in ("-1", "many", "2.5"):
        with pytest.raises(ValueError, match="PYTRITON_RECYCLE_PINNED_REGIONS"):
            _recycle.pinned_limit({"PYTRITON_RECYCLE_PINNED_REGIONS": bad})


def test_model_stubs_lists_the_live_stubs_of_one_model_of_this_server(tmp_path):
    proc, repository = tmp_path / "proc", tmp_path / "repo"
    proc.mkdir()
    _process(proc, 100, 1, ["tritonserver"])
    _process(proc, 102, 100, _stub(repository, "Echo", f"{PREFIX}-b"))
    _process(proc, 101, 100, _stub(repository, "Echo", f"{PREFIX}-a"))
    _process(proc, 103, 100, _stub(repository, "Other", f"{PREFIX}-c"))  # another model
    _process(proc, 104, 100, ["/bin/sh", f"{repository}/Echo/1/model.py"])  # not a stub
    _process(proc, 201, 200, _stub(repository, "Echo", f"{PREFIX}-d"))  # another server's stub
    (proc / "105").mkdir()  # a zombie stub: state Z, empty command line
    (proc / "105" / "stat").write_text("105 (triton_python_) Z 100 105 0 0\n")
    (proc / "105" / "cmdline").write_bytes(b"")
    assert _recycle.model_stubs(100, "Echo", proc=proc) == [101, 102]
    assert _recycle.model_stubs(100, "Other", proc=proc) == [103]
