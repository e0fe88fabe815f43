"""Models the in-process e2e tests write into a temporary repository (plain Python backend).

Like tests/e2e/test_legacy_client.py, every model copies pytriton's stub helpers next to its
``model.py`` so it works with the numpy 1.x stub environment and with numpy 2 on Python 3.13.
This module holds no tests (it is imported by the ``test_inprocess_*`` modules).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from typing import Dict, Mapping, Optional, Tuple

from pytriton.proxy._binding import copy_stub_package

HEADER = textwrap.dedent("""\
    import os
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    from _pytriton_stubside import _stub_bytes as stub_bytes
    from _pytriton_stubside import _stub_dlpack as stub_dlpack
    from _pytriton_stubside import _tensors as tensors

    stub_bytes.install(pb_utils)


    def _in(request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if stub_bytes.NUMPY2:
            return np.from_dlpack(tensor).copy()
        return tensor.as_numpy()


    def _out(name, array):
        if stub_bytes.NUMPY2:
            return stub_dlpack.tensor(pb_utils, name, np.array(array, order="C"))
        return pb_utils.Tensor(name, array)


    class TritonPythonModel:
    """)


def _body(code: str) -> str:
    return HEADER + textwrap.indent(textwrap.dedent(code), "    ")


MODELS: Dict[str, Tuple[str, str]] = {
    # Batched identity behind the dynamic batcher; it delays a little so concurrent calls queue up.
    "identity": (
        _body("""\
        def execute(self, requests):
            time.sleep(0.02)
            return [pb_utils.InferenceResponse([_out("OUTPUT0", _in(r, "INPUT0"))]) for r in requests]
        """),
        """
        max_batch_size: 16
        dynamic_batching { max_queue_delay_microseconds: 20000 }
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]
        """,
    ),
    "add_sub": (
        _body("""\
        def execute(self, requests):
            responses = []
            for r in requests:
                a, b = _in(r, "INPUT0"), _in(r, "INPUT1")
                responses.append(pb_utils.InferenceResponse([_out("OUTPUT0", a + b), _out("OUTPUT1", a - b)]))
            return responses
        """),
        """
        max_batch_size: 0
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [4] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }]
        """,
    ),
    "strings": (
        _body("""\
        def execute(self, requests):
            responses = []
            for r in requests:
                carrier = stub_bytes.input_payload(pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy())
                x = tensors.deserialize_bytes(carrier.data, 0, len(carrier.data), carrier.shape)
                y = np.array([v.upper() for v in x.ravel()], dtype=object).reshape(x.shape)
                out = stub_bytes.output_tensor(pb_utils, "text_output", tensors.serialize_bytes(y), y.shape)
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
        """),
        """
        max_batch_size: 0
        input [{ name: "text_input" data_type: TYPE_STRING dims: [-1] }]
        output [{ name: "text_output" data_type: TYPE_STRING dims: [-1] }]
        """,
    ),
    # Decoupled: COUNT responses, OUT = 0..COUNT-1, final flag on the last. FAIL_AT >= 0 sends an
    # error response (final) at that index instead. Checks cancellation between sends.
    "stream": (
        _body("""\
        def execute(self, requests):
            for r in requests:
                sender = r.get_response_sender()
                count = int(_in(r, "COUNT").flat[0])
                fail_at = int(_in(r, "FAIL_AT").flat[0])
                delay = float(_in(r, "DELAY").flat[0])
                for i in range(count):
                    if sender.is_cancelled():
                        error = pb_utils.TritonError("cancelled by the client", pb_utils.TritonError.CANCELLED)
                        sender.send(pb_utils.InferenceResponse(error=error),
                                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        break
                    if i == fail_at:
                        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"failed at {i}")),
                                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        break
                    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == count - 1 else 0
                    sender.send(pb_utils.InferenceResponse([_out("OUT", np.array([i], dtype=np.int32))]), flags=flags)
                    if delay:
                        time.sleep(delay)
            return None
        """),
        """
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [
          { name: "COUNT" data_type: TYPE_INT32 dims: [1] },
          { name: "FAIL_AT" data_type: TYPE_INT32 dims: [1] },
          { name: "DELAY" data_type: TYPE_FP32 dims: [1] }
        ]
        output [{ name: "OUT" data_type: TYPE_INT32 dims: [1] }]
        """,
    ),
    # Raises in execute for negative input; exits its stub process for input 99.
    "faulty": (
        _body("""\
        def execute(self, requests):
            responses = []
            for r in requests:
                x = _in(r, "INPUT0")
                if float(x.flat[0]) == 99:
                    os._exit(3)
                if float(x.flat[0]) < 0:
                    raise pb_utils.TritonModelException("negative input refused")
                responses.append(pb_utils.InferenceResponse([_out("OUTPUT0", x)]))
            return responses
        """),
        """
        max_batch_size: 0
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]
        """,
    ),
}


def write_repository(root: pathlib.Path, names: Tuple[str, ...] = tuple(MODELS)) -> pathlib.Path:
    """Write the named models into ``root`` (created); returns ``root``."""
    for name in names:
        source, config = MODELS[name]
        version = root / name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(source)
        copy_stub_package(version)  # Triton puts the version directory on the stub's sys.path
        body = textwrap.dedent(config).strip()
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n{body}\ninstance_group [{{ kind: KIND_CPU count: 1 }}]\n'
        )
    return root


def ended(returncode: int) -> str:
    """How a child process ended, in words (``"was killed by SIGSEGV"``, ``"exited with 1"``)."""
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with {returncode}"


def clean_after_child(pid: int) -> None:
    """What the in-process server of a child ``pid`` that crashed left: its stubs outlive it, and its regions.

    Both carry the child's pid in their names (``pytriton-inproc-<pid>-``): the stubs are killed
    (SIGKILL) and the regions removed. Harmless after a child that ended cleanly (nothing is left).
    """
    from pytriton._platform import proc
    from pytriton.proxy.stubside import _arena

    tag = f"pytriton-inproc-{pid}-"
    for entry in os.listdir(proc.PROC):
        if entry.isdigit() and any(tag in word for word in proc.cmdline(int(entry)) or ()):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    for name in os.listdir(_arena.SHM_DIR):
        if name.startswith(tag):
            try:
                os.unlink(os.path.join(_arena.SHM_DIR, name))
            except OSError:
                pass


def run_child(
    module: str, repository: pathlib.Path, *args: str, env: Optional[Mapping[str, str]] = None, timeout_s: float = 300
) -> Tuple[int, str, str]:
    """Run ``python -m module repository *args`` from the project root: (exit status, stdout, stderr).

    Output goes to files beside ``repository``, not pipes: the stubs of a child that crashed would
    hold pipes open. A child still running after ``timeout_s`` is killed; after any child that did
    not exit with 0, :func:`clean_after_child` ends what its server left.
    """
    out_path, err_path = repository.parent / "child.out", repository.parent / "child.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        child = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", module, str(repository), *args],
            stdout=out,
            stderr=err,
            cwd=pathlib.Path(__file__).parents[2],
            env=None if env is None else dict(env),
        )
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.returncode != 0:
                clean_after_child(child.pid)
    return child.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
