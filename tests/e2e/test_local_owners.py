"""Another local user against the directories pytriton writes model files into (issue 42, item 2).

The other user is ``nobody`` (through ``setpriv``, as in tests/e2e/test_local_users.py); this process
serves as root. Each scenario is the attack end to end, and reports what it achieved:

- the other user creates the repository (0777) first and plants a symlink where
  ``pytriton_private.json`` will go, pointing at a file of root's: pytriton refuses the repository,
  and root's file keeps its content and mode (before: it was truncated, overwritten and made 0600);
- the other user creates the workspace (0777) and the model's directories in it first, and renames
  their own ``model.py`` into place once the model is served; a crash restarts the server: pytriton
  refuses the workspace, so the planted code never runs (before: it ran as root after the restart);
- a repository root made itself (0755) serves normally; if a version directory later becomes
  writable by others and the other user renames a ``pytriton_backend.pkl`` into it, the restarted
  server's stub refuses to load it (before: unpickling it ran their code as root).

All three need root (to act as another user): without it they are skipped, and say so.
"""

from __future__ import annotations

import os
import pathlib
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import textwrap
from typing import Iterator, Optional

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton._platform.paths import UnsafePathError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e import process_models
from tests.e2e.test_local_users import SYSTEM_PYTHON, another_user

pytestmark = another_user

X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(-1,), dtype=np.float32)]


def as_nobody(code: str) -> None:
    """Run ``code`` (Python, standard library) as ``nobody`` with no groups; fail the test if it fails."""
    nobody = pwd.getpwnam("nobody")
    done = subprocess.run(  # noqa: S603
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", SYSTEM_PYTHON,
         "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.fixture()
def shared() -> Iterator[pathlib.Path]:
    """A directory like ``/tmp`` (1777, root's) both users can create entries in; ``drop/`` is nobody's own."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="pytriton-owners-", dir="/tmp"))
    work.chmod(0o1777)
    as_nobody(f"import os; os.mkdir({str(work / 'drop')!r}); os.chmod({str(work / 'drop')!r}, 0o777)")
    yield work
    shutil.rmtree(work, ignore_errors=True)


def _infer(port: int, model: str) -> bool:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        x = np.arange(4, dtype=np.float32).reshape(1, -1)
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return bool(np.array_equal(client.infer(model, [tensor], timeout=30).as_numpy("y"), x * 2))
    except Exception:  # refused while the server restarts
        return False
    finally:
        client.close()


def _crash_and_wait(triton: Triton, done) -> None:
    """Kill the running server; wait (bounded) until ``done()`` once the supervisor started another.

    The restarted server loads its models from the files on disk (nothing is written again).
    """
    server = triton._backend.server
    assert server is not None and server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    assert wait_for(done, 180, 0.2), "the restarted server neither loaded nor refused the model"


def test_a_repository_another_user_created_is_refused_and_their_symlink_not_followed(shared):
    repository = shared / "models"
    victim = shared / "root-owned.conf"
    victim.write_text("root's configuration\n")
    victim.chmod(0o644)
    as_nobody(f"""
        import os
        version = {str(repository / "Identity" / "1")!r}
        os.makedirs(version)
        for path in ({str(repository)!r}, os.path.dirname(version), version):
            os.chmod(path, 0o777)
        os.symlink({str(victim)!r}, os.path.join(version, "pytriton_private.json"))
    """)
    error: Optional[BaseException] = None
    # Entering the block starts the server, which checks the repository before writing anything.
    try:
        with Triton(config=TritonConfig(model_repository=repository, **triton_ports())) as triton:
            triton.bind("Identity", process_models.doubled, X, Y, config=ModelConfig(max_batch_size=4))
            triton.run()
    except UnsafePathError as exc:
        error = exc
    assert victim.read_text() == "root's configuration\n", "pytriton wrote through the planted symlink"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644 and victim.stat().st_uid == 0
    assert error is not None, "pytriton served from a repository another user owns"
    message = str(error)
    assert str(repository) in message and "nobody" in message and "directory you created" in message, message


def test_model_code_another_user_renames_into_their_workspace_never_runs(shared):
    workspace = shared / "workspace"
    marker = shared / "drop" / "ran-as-root"
    as_nobody(f"""
        import os
        version = {str(workspace / "model-store" / "Identity" / "1")!r}
        os.makedirs(version)
        path = version
        while path != {str(shared)!r}:
            os.chmod(path, 0o777)
            path = os.path.dirname(path)
    """)
    error: Optional[BaseException] = None
    try:
        triton = Triton(workspace=workspace, config=TritonConfig(**triton_ports()))
    except UnsafePathError as exc:
        error = exc
    else:  # what the other user achieves where pytriton keeps their directories
        with triton:
            triton.bind("Identity", process_models.doubled, X, Y, config=ModelConfig(max_batch_size=4))
            triton.run()
            as_nobody(f"""
                import os
                planted = {str(shared / "drop" / "model.py")!r}
                with open(planted, "w") as file:
                    file.write("import os\\nopen({str(marker)!r}, 'w').close()\\nraise SystemExit\\n")
                os.rename(planted, {str(workspace / "model-store" / "Identity" / "1" / "model.py")!r})
            """)
            _crash_and_wait(triton, marker.exists)
    assert not marker.exists(), "the other user's model.py ran as root after the crash restart"
    assert error is not None and str(workspace) in str(error) and "nobody" in str(error), error
    assert list((workspace / "model-store" / "Identity" / "1").iterdir()) == []  # nothing written there


def test_a_users_own_repository_serves_and_a_payload_renamed_in_later_is_refused_by_the_stub(shared):
    repository = shared / "models"
    repository.mkdir(mode=0o755)  # made by the serving user, as a user would: mode 0755 is fine
    marker = shared / "drop" / "ran-as-root"
    log = shared / "server.log"
    ports = triton_ports()
    config = TritonConfig(model_repository=repository, log_file=log, **ports)
    with Triton(config=config) as triton:
        triton.bind(
            "Identity", process_models.doubled, X, Y, config=ModelConfig(max_batch_size=4), instance_kind="backend"
        )
        triton.run()
        assert _infer(ports["http_port"], "Identity")  # healthy traffic
        # Later the version directory becomes writable by others (a restored backup, a careless chmod),
        # and the other user renames their own payload into it.
        version = repository / "Identity" / "1"
        (repository / "Identity").chmod(0o755)
        version.chmod(0o777)
        as_nobody(f"""
            import os, pickle
            class Planted:
                def __reduce__(self):
                    return (os.system, ("touch {marker}",))
            planted = {str(shared / "drop" / "payload")!r}
            with open(planted, "wb") as file:
                pickle.dump(Planted(), file)
            os.rename(planted, {str(version / "pytriton_backend.pkl")!r})
        """)
        refused = "pytriton refuses to load"
        _crash_and_wait(triton, lambda: marker.exists() or refused in log.read_text(errors="replace"))
        assert not marker.exists(), "the other user's payload was unpickled as root after the crash restart"
        text = log.read_text(errors="replace")
        assert f"{refused} {version}" in text and "drwxrwxrwx" in text, text[-3000:]
