"""The models under test: pytriton callables and their plain Python-backend twins (the baseline).

A plain model runs its work inside Triton's stub process with no second process: the physical limit
of this architecture. Both kinds are served by the same ``tritonserver`` in the same run.
"""

from __future__ import annotations

import pathlib
import textwrap

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

QUEUE_DELAY_US = 2000
STREAM_MAX_BATCH = 1


class BatchCounter:
    """Identity callable that records the batch sizes it sees."""

    def __init__(self) -> None:
        self.sizes: list = []

    def __call__(self, requests):
        self.sizes.append(sum(len(r["INPUT"]) for r in requests))
        return [{"OUTPUT": r["INPUT"]} for r in requests]


def identity(requests):
    return [{"OUTPUT": r["INPUT"]} for r in requests]


@batch
def batch_identity(INPUT):  # noqa: N803 - the input's name
    return {"OUTPUT": INPUT}


def bind_identity(triton, name: str, infer_func=identity) -> None:
    """``infer_func`` (an identity) bound as ``name``: [16] fp32 in and out, batches of up to 32."""
    triton.bind(
        name,
        infer_func,
        [Tensor(name="INPUT", shape=(16,), dtype=np.float32)],
        [Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=32),
    )


def bind_batch_identity(triton, name: str = "batch_identity") -> None:
    """The bound model of the in-process scenarios (bench/inprocess.py): a ``@batch`` identity, [16] fp32."""
    bind_identity(triton, name, batch_identity)


def bind_stream(triton, name: str) -> None:
    """The streaming scenario's generator (:func:`stream`) bound as ``name``, a decoupled model."""
    triton.bind(
        name,
        stream,
        [Tensor(name="N", shape=(1,), dtype=np.int32)],
        [Tensor(name="OUTPUT", shape=(1,), dtype=np.int32)],
        config=ModelConfig(max_batch_size=STREAM_MAX_BATCH, decoupled=True),
    )


def stream(requests):
    count = int(requests[0]["N"].flat[0])
    for step in range(count):
        yield [{"OUTPUT": np.array([[step]], dtype=np.int32)} for _ in requests]


def bind_project_models(triton, counter: BatchCounter) -> None:
    """Bind the project's side of every scenario."""
    f32 = np.float32
    bind_identity(triton, "proxy_identity")
    triton.bind(
        "proxy_large",
        identity,
        [Tensor(name="INPUT", shape=(-1,), dtype=np.uint8)],
        [Tensor(name="OUTPUT", shape=(-1,), dtype=np.uint8)],
        config=ModelConfig(max_batch_size=1),
    )
    triton.bind(
        "proxy_batched",
        counter,
        [Tensor(name="INPUT", shape=(16,), dtype=f32)],
        [Tensor(name="OUTPUT", shape=(16,), dtype=f32)],
        config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=QUEUE_DELAY_US)),
    )
    bind_stream(triton, "proxy_stream")


_PLAIN_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())])
            for r in requests
        ]
"""

# A plain model that spends BUSY_US of CPU in execute() before answering: a reference for what a
# given amount of extra per-batch time costs end to end on this machine.
BUSY_US = 150
_PLAIN_BUSY = _PLAIN_IDENTITY.replace(
    "    def execute(self, requests):\n",
    "    def execute(self, requests):\n"
    "        import time\n"
    f"        end = time.perf_counter() + {BUSY_US}e-6\n"
    "        while time.perf_counter() < end:\n"
    "            pass\n",
)

if _PLAIN_BUSY == _PLAIN_IDENTITY:  # the busy-wait must really be in there, or the reference row lies
    raise RuntimeError("bench: could not build the busy reference model from the identity model")

_PLAIN_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy().flat[0])
            for step in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[step]], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _config(name: str, dims: str, dtype: str, max_batch: int, extra: str = "", input_name: str = "INPUT") -> str:
    return (
        textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch}
        input [{{ name: "{input_name}" data_type: {dtype} dims: [{dims}] }}]
        output [{{ name: "OUTPUT" data_type: {dtype if input_name == "INPUT" else "TYPE_INT32"} dims: [{dims}] }}]
        instance_group [{{ kind: KIND_CPU count: 1 }}]
        """)
        + extra
    )


def write_plain_models(repository: pathlib.Path) -> list:
    """Write the baseline models into ``repository``; returns their names."""
    models = {
        "plain_identity": (_PLAIN_IDENTITY, _config("plain_identity", "16", "TYPE_FP32", 32)),
        "plain_busy": (_PLAIN_BUSY, _config("plain_busy", "16", "TYPE_FP32", 32)),
        "plain_large": (_PLAIN_IDENTITY, _config("plain_large", "-1", "TYPE_UINT8", 1)),
        "plain_batched": (
            _PLAIN_IDENTITY,
            _config(
                "plain_batched",
                "16",
                "TYPE_FP32",
                32,
                f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US} }}\n",
            ),
        ),
        "plain_stream": (
            _PLAIN_STREAM,
            _config(
                "plain_stream",
                "1",
                "TYPE_INT32",
                STREAM_MAX_BATCH,
                "model_transaction_policy { decoupled: true }\n",
                input_name="N",
            ),
        ),
    }
    for name, (source, config) in models.items():
        (repository / name / "1").mkdir(parents=True, exist_ok=True)
        (repository / name / "1" / "model.py").write_text(source)
        (repository / name / "config.pbtxt").write_text(config)
    return list(models)
