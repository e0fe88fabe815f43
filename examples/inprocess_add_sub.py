"""Call a Triton model inside this process: no server binary, no port, no network.

The script writes a one-model repository (a plain Python-backend ``add_sub``) into a temporary
directory, starts Triton in-process through ``pytriton.inprocess`` (the bundled server library, see
docs/inprocess.md), checks the model's answers the way a unit test would, and stops the server.

Run with ``python examples/inprocess_add_sub.py`` after ``pytriton install-server``.
"""

from __future__ import annotations

import pathlib
import tempfile
import textwrap

import numpy as np

import pytriton.inprocess as tritonserver

MODEL = textwrap.dedent("""\
    import numpy as np
    import triton_python_backend_utils as pb_utils

    NUMPY2 = int(np.__version__.split(".")[0]) >= 2  # the stub's own conversions need numpy 1.x


    def _in(request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return np.from_dlpack(tensor).copy() if NUMPY2 else tensor.as_numpy()


    def _out(name, array):
        return pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(array)) if NUMPY2 else pb_utils.Tensor(name, array)


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                a, b = _in(request, "a"), _in(request, "b")
                responses.append(pb_utils.InferenceResponse([_out("add", a + b), _out("sub", a - b)]))
            return responses
    """)

CONFIG = """\
name: "add_sub"
backend: "python"
max_batch_size: 0
input [{ name: "a" data_type: TYPE_FP32 dims: [-1] }, { name: "b" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "add" data_type: TYPE_FP32 dims: [-1] }, { name: "sub" data_type: TYPE_FP32 dims: [-1] }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="inprocess-example-") as repository:
        (pathlib.Path(repository) / "add_sub" / "1").mkdir(parents=True)
        (pathlib.Path(repository) / "add_sub" / "1" / "model.py").write_text(MODEL)
        (pathlib.Path(repository) / "add_sub" / "config.pbtxt").write_text(CONFIG)

        server = tritonserver.Server(model_repository=repository)
        server.start(wait_until_ready=True, timeout=120)
        try:
            a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
            b = np.array([0.5, 0.5, 0.5], dtype=np.float32)
            for response in server.model("add_sub").infer(inputs={"a": a, "b": b}):
                total = np.from_dlpack(response.outputs["add"])  # a view of the output, no copy
                difference = np.from_dlpack(response.outputs["sub"])
            np.testing.assert_allclose(total, a + b)
            np.testing.assert_allclose(difference, a - b)
            print(f"a + b = {total}")
            print(f"a - b = {difference}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
