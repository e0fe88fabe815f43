"""Old ``tensorrtserver.api`` client code, unchanged, against a model served by ``Triton``.

``legacy_simple_client`` is written the way code for the legacy client was (the names, the
per-sample input lists, ``InferContext.ResultFormat``, the callback signature); only the URL it is
given changes. Run with ``python examples/legacy_client.py``.
"""

# The client function keeps the legacy code's own style (str.format) on purpose.
# ruff: noqa: UP032

from __future__ import annotations

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT


@batch
def add_sub(INPUT0, INPUT1):  # noqa: N803 - the legacy "simple" model's tensor names
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


# ---- legacy client code: as it was written for tensorrtserver.api ----------------------------------
def legacy_simple_client(url, protocol_name):
    from tensorrtserver.api import (
        InferContext,
        InferenceServerException,
        ProtocolType,
        ServerHealthContext,
    )

    protocol = ProtocolType.from_str(protocol_name)
    health_ctx = ServerHealthContext(url, protocol, verbose=False)
    print("Live: {}  Ready: {}".format(health_ctx.is_live(), health_ctx.is_ready()))
    health_ctx.close()

    infer_ctx = InferContext(url, protocol, "simple", None, False)
    input0_data = np.arange(start=0, stop=16, dtype=np.int32)
    input1_data = np.ones(shape=16, dtype=np.int32)
    batch_size = 1
    result = infer_ctx.run(
        {"INPUT0": (input0_data,), "INPUT1": (input1_data,)},
        {"OUTPUT0": InferContext.ResultFormat.RAW, "OUTPUT1": InferContext.ResultFormat.RAW},
        batch_size,
    )
    output0_data = result["OUTPUT0"][0]
    output1_data = result["OUTPUT1"][0]
    for i in range(16):
        if (input0_data[i] + input1_data[i]) != output0_data[i] or (input0_data[i] - input1_data[i]) != output1_data[i]:
            raise SystemExit("error: incorrect result")
    print("{} + {} = {}".format(input0_data[:4], input1_data[:4], output0_data[:4]))

    # Top-2 of OUTPUT0 through the server's classification extension: (index, value, label).
    top = infer_ctx.run(
        {"INPUT0": (input0_data,), "INPUT1": (input1_data,)}, {"OUTPUT0": (InferContext.ResultFormat.CLASS, 2)}
    )["OUTPUT0"][0]
    print("top-2 of OUTPUT0: {}".format([(idx, val) for idx, val, _ in top]))

    completed = []

    def completion_callback(ctx, request_id):
        completed.append(request_id)

    for k in range(4):
        infer_ctx.async_run(
            completion_callback,
            {"INPUT0": (input0_data * k,), "INPUT1": (input1_data,)},
            {"OUTPUT1": InferContext.ResultFormat.RAW},
            batch_size,
        )
    for _ in range(4):
        request_id = infer_ctx.get_ready_async_request(True)
        infer_ctx.get_async_run_results(request_id, True)
    print("async requests completed: {}".format(len(completed)))

    try:
        infer_ctx.run({"INPUT0": (input0_data,)}, {"OUTPUT0": InferContext.ResultFormat.RAW}, batch_size)
    except InferenceServerException as ex:
        print("expected error: {}".format(ex.message()))
    infer_ctx.close()


# ----------------------------------------------------------------------------------------------------
def main() -> None:
    with Triton(config=TritonConfig()) as triton:
        i32 = np.int32
        triton.bind(
            "simple",
            add_sub,
            [Tensor(name="INPUT0", shape=(16,), dtype=i32), Tensor(name="INPUT1", shape=(16,), dtype=i32)],
            [Tensor(name="OUTPUT0", shape=(16,), dtype=i32), Tensor(name="OUTPUT1", shape=(16,), dtype=i32)],
            config=ModelConfig(max_batch_size=8),
        )
        triton.run()
        for url, protocol in ((triton.http_url, "http"), (triton.grpc_url, "grpc")):
            print("-- {} ({})".format(url, protocol))
            legacy_simple_client(url.split("://", 1)[1], protocol)


if __name__ == "__main__":
    main()
