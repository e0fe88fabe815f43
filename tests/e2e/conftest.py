"""End-to-end fixtures, the ``e2e`` marker, and CI's reviewed list of the e2e modules run on every leg.

CI (``.ci/run``, docs/development.md "CI") runs the whole end-to-end suite once, on python3 with
numpy 2. Its other legs (numpy 1.x in the user's environment, the oldest and the newest Python) run
every unit test and only the e2e modules of :data:`LEG_MODULES`, chosen because their behaviour
depends on that leg's interpreter or numpy. A module gets a leg's marker here, not in its own file, so
that the whole choice reads and is reviewed in one place; ``tests/unit/test_ci_legs.py`` pins that
every e2e module is either listed or in :data:`FULL_RUN_ONLY`, and that the names exist.
"""

from __future__ import annotations

import pathlib
from typing import Dict, FrozenSet, Tuple

import pytest

from pytriton.server.distribution import find_server
from tests.e2e._kinds import KINDS

E2E_DIR = pathlib.Path(__file__).resolve().parent

# The legs' markers (pyproject.toml registers them; .ci/run selects each with -m "not e2e or <marker>").
NUMPY1 = "numpy1_leg"  # numpy 1.x in the user's environment (Python 3.11; the stub's numpy 1.x is the same)
PY39 = "py39_leg"  # the oldest supported Python: its syntax and stdlib in the user's process and the stub
PY313 = "py313_leg"  # the newest: CPython 3.13, and numpy 2 inside the backend stub (no numpy 1.x there)
LEGS = (NUMPY1, PY39, PY313)

# Evidence: "git log" (commits named), and where the code branches (pytriton/proxy/stubside/_stub.py,
# _stub_bytes.py and _inline.py on numpy 2 in the stub; pytriton/proxy/_process.py on dtype names).
# The stub runs the interpreter of the leg (one stub build per minor version), so every module that
# moves tensors through it runs the leg's stub-side code; the list keeps those where that code differs.
LEG_MODULES: Dict[str, Tuple[str, ...]] = {
    # Every dtype and BYTES through both kinds: the user-side arenas as numpy arrays (numpy 1.x), the
    # stub's DLPack and string paths (numpy 2 on 3.13: 6e1a0da, CI's 3.13 step failed
    # test_large_inputs_modified_in_place[*-backend]), the stub-side proxy on the 3.9 interpreter.
    "test_data_path.py": (NUMPY1, PY39, PY313),
    # The backend kind's pickles: the callable and numpy scalar types travel from the user's numpy to
    # the stub's (c9f8cc9: numpy 2's numpy.bool is not in numpy 1.x; fc597fa: outputs under numpy 2 in
    # the stub), and are unpickled by the leg's interpreter in the stub.
    "test_backend_instances.py": (NUMPY1, PY39, PY313),
    # ModelClient builds and reads tensors with the user's numpy (dtype mapping, BYTES as object arrays).
    "test_clients.py": (NUMPY1,),
    # The tensorrtserver.api layer converts with the user's numpy; its plain Python-backend models take
    # the DLPack path under numpy 2 in the stub (test_legacy_client.py's own NUMPY2 branches; 7ae23b2).
    "test_legacy_client.py": (NUMPY1, PY313),
    # In-process server: tensors handed to the server library from the user's numpy through ctypes;
    # its Python-backend models branch on numpy 2 in the stub (inprocess_models.py; 7ae23b2). Its stubs
    # are forked from threads of a process that used gRPC, which aborted on 3.9 (1af195c).
    "test_inprocess_server.py": (NUMPY1, PY39, PY313),
    # Process instances: the callable pickled into worker processes that the leg's stdlib starts and
    # signals (multiprocessing, signal handling), which read and write their tensors with the user's numpy.
    "test_process_instances.py": (NUMPY1, PY39),
    # @batch, @group_by_values, padding: numpy work on the user's side (and in the stub for the
    # backend kind), on the numpy of the leg.
    "test_decorators_live.py": (NUMPY1, PY313),
    # String (BYTES) tensors through the numpy-2 stub on 3.13 (7ae23b2 lists it with the data path).
    "test_openai.py": (PY313,),
    # A backend callable's print: the stub's own interpreter (3.9's and 3.13's builds) runs with its
    # sys.stdout/sys.stderr replaced by an io.TextIOBase subclass (stubside/_stub_print.py).
    "test_backend_print.py": (PY39, PY313),
    # Sequence controls: the stub's C-API table fix is made when a config names TYPE_STRING, sequence
    # controls included (7ae23b2); control tensors through DLPack under numpy 2.
    "test_sequences.py": (PY313,),
    # Unloading RemoteTriton models: their stubs did not exit on 3.13 (a8c5f05, fixed by f923a29) and
    # on 3.9 (8e37de9: a cancelled gRPC stream's final response held the model).
    "test_remote.py": (PY39, PY313),
    # Cancellation and the thread interrupt: CPython 3.13's async exception escapes a loop's try
    # (ba94fee, python/cpython#130279); a client-timeout test was FLAKY on 3.9 only (77e085c).
    "test_cancellation.py": (PY39, PY313),
    # The repository API's reload: 3.9 stubs honour PYTHONDONTWRITEBYTECODE and wrote no bytecode
    # cache, so a reload of an unchanged model was a no-op there only (09d60e7).
    "test_security.py": (PY39,),
}

# The e2e modules that run in the full run only: their behaviour is the same on every leg (server
# life cycle, supervision, HTTP/gRPC limits and metrics, documentation and examples in subprocesses
# of python3), or what differed there is covered by a listed module above. Deciding where a new e2e
# module goes is part of its review (tests/unit/test_ci_legs.py fails until it is in one of the two).
FULL_RUN_ONLY: FrozenSet[str] = frozenset(
    {
        "test_api_drift_live.py",
        "test_lifecycle_policy.py",
        "test_local_owners.py",
        "test_serve_cli.py",
        "test_supervisor.py",
        "test_bench_ab.py",
        "test_build_differences.py",
        "test_check.py",
        "test_clients_compat.py",
        "test_docs.py",
        "test_drain.py",
        "test_embedded.py",
        "test_examples.py",
        "test_hardening.py",
        "test_healing.py",
        "test_hostile_requests.py",
        "test_inprocess_example.py",
        "test_inprocess_lifecycle.py",
        "test_inprocess_reload.py",
        "test_inprocess_stop.py",
        "test_lifecycle.py",
        "test_limits.py",
        "test_local_users.py",
        "test_memory.py",
        "test_metrics.py",
        "test_pipeline.py",
        "test_ray_replica.py",
        "test_ray.py",  # marker `ray`: deselected by `make test`, run by `make test-ray` (its own venv)
        "test_production_example.py",
        "test_start_overlap.py",
        "test_tracing.py",
        "test_unresponsive.py",
        "test_versions.py",
        "test_warmup.py",
    }
)


def leg_markers(path: pathlib.Path) -> Tuple[str, ...]:
    """The markers CI selects by for a test in file ``path``: ``e2e`` and its legs under tests/e2e, else none."""
    if E2E_DIR not in pathlib.Path(path).resolve().parents:
        return ()
    return ("e2e",) + LEG_MODULES.get(pathlib.Path(path).name, ())


def pytest_collection_modifyitems(config, items):
    # pytest calls this hook with every collected item, unit tests included: mark by the item's path.
    for item in items:
        for name in leg_markers(pathlib.Path(str(item.path))):
            item.add_marker(getattr(pytest.mark, name))


@pytest.fixture(scope="session", autouse=True)
def _server_installed():
    # The e2e suite needs the real server: fail loudly (never skip) if it is missing.
    find_server()


@pytest.fixture(params=KINDS)
def kind(request):
    """The instance kind a test runs on: ``thread`` or ``backend`` (tests/e2e/_kinds.py)."""
    return request.param
