"""pytriton on Ray Serve against a plain Ray Serve deployment of the same identity model, one run.

    .venv-ray/bin/python -m bench.ray_serve [--requests 300] [--inflight 32] [--burst 1500] [--rounds 2]

Starts a one-node Ray cluster on 127.0.0.1 (every address pinned to loopback), deploys
``pytriton.ray.build_app(bind_identity)`` (one replica, an embedded ``Triton``) and a plain Ray
Serve deployment whose replica returns its input (same float32 ``[1, 16]`` request, same KServe v2
JSON route for HTTP, same ``max_ongoing_requests``), and measures each through a
``DeploymentHandle`` and through Ray's HTTP proxy: p50 of sequential calls, and requests per second
with ``--inflight`` requests in flight. The two deployments are measured alternately, ``--rounds``
times; the table gives the median of the rounds. Then a model taking 20 ms a batch of up to 16, one
replica, through the handle: with Ray's default ``max_ongoing_requests`` (5), 5 and ``--inflight``
callers, and with the value ``build_app`` derives (32), ``--inflight`` callers. Ends the cluster by its own process ids.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X = np.arange(16, dtype=np.float32).reshape(1, 16)
BODY = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": X.ravel().tolist()}]}
).encode()


class PlainIdentity:
    """The plain Ray Serve deployment: the same identity, the same handle method and HTTP route."""

    async def infer(self, inputs: Dict[str, Any], model_name: Any = None) -> Dict[str, np.ndarray]:
        return {"y": np.asarray(inputs["x"])}

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        body = json.loads(await request.body())
        entry = body["inputs"][0]
        y = np.asarray(entry["data"], dtype=np.float32).reshape(entry["shape"])
        return JSONResponse(
            {
                "model_name": "Identity",
                "outputs": [{"name": "y", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}],
            }
        )


def _p50_handle(handle, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        out = handle.infer.remote({"x": X}).result()
        times.append(time.perf_counter() - start)
        assert np.array_equal(out["y"], X)
    return statistics.median(times) * 1e3


def _p50_http(port: int, path: str, n: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        connection.request("POST", path, BODY, {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, data
    connection.close()
    return statistics.median(times) * 1e3


async def _rps_handle(handle, inflight: int, total: int) -> float:
    remaining = [total]

    async def caller():
        while remaining[0] > 0:
            remaining[0] -= 1
            out = await handle.infer.remote({"x": X})
            assert np.array_equal(out["y"], X)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(inflight)))
    return total / (time.perf_counter() - start)


async def _rps_http(port: int, path: str, inflight: int, total: int) -> float:
    import aiohttp

    remaining = [total]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight)) as session:

        async def caller():
            while remaining[0] > 0:
                remaining[0] -= 1
                async with session.post(f"http://127.0.0.1:{port}{path}", data=BODY) as response:
                    await response.read()
                    assert response.status == 200

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(inflight)))
        return total / (time.perf_counter() - start)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="sequential requests per p50 (default 300)")
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--burst", type=int, default=1500, help="requests per throughput figure (default 1500)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": REPO})
    sys.path.insert(0, REPO)
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from pytriton.ray import build_app, max_ongoing_requests_for
    from tests.e2e.ray_models import bind_identity, bind_identity_backend, bind_slow_identity_16

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "node_ip_address": "127.0.0.1",
            "num_cpus": 2,
            "include_dashboard": False,
            "object_store_memory": 80 << 20,
        },
    )
    try:
        ray.init(address=cluster.address, logging_level="WARNING")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        ongoing = max_ongoing_requests_for(bind_identity)
        apps = {
            "pytriton": serve.run(build_app(bind_identity, num_replicas=1), name="pt", route_prefix="/pt"),
            'pytriton, instance_kind="backend"': serve.run(
                build_app(bind_identity_backend, num_replicas=1), name="ptb", route_prefix="/ptb"
            ),
            "plain Ray Serve": serve.run(
                serve.deployment(
                    PlainIdentity, name="Plain", max_ongoing_requests=ongoing, ray_actor_options={"num_cpus": 0}
                ).bind(),
                name="plain",
                route_prefix="/plain",
            ),
        }
        paths = {
            "pytriton": "/pt/v2/models/Identity/infer",
            'pytriton, instance_kind="backend"': "/ptb/v2/models/Identity/infer",
            "plain Ray Serve": "/plain/v2/models/Identity/infer",
        }
        results: Dict[str, Dict[str, List[float]]] = {k: {} for k in apps}
        for name, handle in apps.items():  # warm up both paths
            _p50_handle(handle, 30)
            _p50_http(port, paths[name], 30)
        for _ in range(args.rounds):
            for name, handle in apps.items():
                row = results[name]
                row.setdefault("handle_p50_ms", []).append(_p50_handle(handle, args.requests))
                row.setdefault("http_p50_ms", []).append(_p50_http(port, paths[name], args.requests))
                row.setdefault("handle_rps", []).append(asyncio.run(_rps_handle(handle, args.inflight, args.burst)))
                row.setdefault("http_rps", []).append(
                    asyncio.run(_rps_http(port, paths[name], args.inflight, args.burst))
                )
        # max_ongoing_requests and the batcher: a model taking 20 ms a batch of up to 16, 32 in flight,
        # with Ray's default of 5 against the derived value.
        batching: Dict[str, float] = {}
        derived = max_ongoing_requests_for(bind_slow_identity_16)
        for label, value in (("Ray's default, 5", 5), (f"derived, {derived}", derived)):
            slow = serve.run(
                build_app(bind_slow_identity_16, num_replicas=1, max_ongoing_requests=value),
                name="slow",
                route_prefix="/slow",
            )
            _p50_handle(slow, 5)
            if value < args.inflight:  # as many callers as slots: what the slots alone allow
                batching[f"{label}, {value} callers"] = asyncio.run(_rps_handle(slow, value, args.burst // 3))
            batching[f"{label}, {args.inflight} callers"] = asyncio.run(
                _rps_handle(slow, args.inflight, args.burst // 3)
            )
            serve.delete("slow")
        medians = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in results.items()}
        print(
            json.dumps(
                {
                    "args": vars(args),
                    "max_ongoing_requests": ongoing,
                    "load_average": os.getloadavg(),
                    "results": medians,
                    "batching_model_handle_rps": batching,
                },
                indent=1,
            )
        )
        print()
        print(
            f"| Ray Serve 2.60, identity float32 [1,16] | handle p50 | HTTP p50 | handle, {args.inflight} in flight | HTTP, {args.inflight} in flight |"
        )
        print("| --- | --- | --- | --- | --- |")
        for name, figures in medians.items():
            print(
                f"| {name} | {figures['handle_p50_ms']:.2f} ms | {figures['http_p50_ms']:.2f} ms | "
                f"{figures['handle_rps']:,.0f} req/s | {figures['http_rps']:,.0f} req/s |"
            )
        print()
        print("| 20 ms a batch of up to 16, one replica, handle | max_ongoing_requests, callers | req/s |")
        print("| --- | --- | --- |")
        for label, rps in batching.items():
            print(f"| pytriton | {label} | {rps:,.0f} |")
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
