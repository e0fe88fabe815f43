"""RemoteTriton's two transports: sequential latency of the identity model (docs/remote.md).

Usage: ``python -m bench --only remote`` (or ``python -m bench.remote [--quick]``). Starts one
``tritonserver`` by hand (``pytriton._remote.server_command``, the model-repository endpoints
restricted by a token), whose stub environment is pytriton's plus pyzmq (:func:`stub_env_overlay`),
binds the identity model into it with ``RemoteTriton`` over each transport in turn, and measures the
p50 of sequential HTTP requests (raw tritonclient, one connection) of 64 bytes and 1 MiB. TCP runs
twice: encrypted (CURVE, the default) and in clear (``tcp_encryption=False``). The baseline, in the
same server and run: a plain Python-backend identity model with the same inputs and outputs; every
transport is also given as a ratio to it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKEN = "bench-remote-token"
SIZES = {"64 B": 16, "1 MiB": 1 << 18}  # float32 elements


def stub_env_overlay(root: pathlib.Path, with_pyzmq: bool = True) -> pathlib.Path:
    """A stub environment: the one pytriton uses, plus (or minus) this environment's pyzmq; its bin dir.

    A bare venv whose ``.pth`` lists pytriton's stub environment (numpy 1.x; this environment
    where the stub uses it) and either a folder linking this environment's pyzmq or a ``zmq``
    package that fails to import. Nothing in pytriton's install changes.
    """
    import zmq

    from pytriton.server.distribution import site_packages, stub_environment

    base = stub_environment()
    site = site_packages(base.bin_dir.parent) if base.own else sysconfig.get_paths()["purelib"]
    env = root / f"stub-env-{'zmq' if with_pyzmq else 'nozmq'}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    extra = root / f"extra-{'zmq' if with_pyzmq else 'nozmq'}"
    extra.mkdir()
    if with_pyzmq:
        zmq_dir = pathlib.Path(zmq.__file__).parent
        for item in (zmq_dir, zmq_dir.with_name("pyzmq.libs")):
            if item.exists():
                (extra / item.name).symlink_to(item)
        paths = [site, extra]
    else:
        (extra / "zmq").mkdir()
        (extra / "zmq" / "__init__.py").write_text("raise ImportError('no pyzmq in this stub environment')\n")
        paths = [extra, site]
    (site_packages(env) / "overlay.pth").write_text("".join(f"{path}\n" for path in paths))
    return env / "bin"


def _p50(client: Any, name: str, data: np.ndarray, count: int) -> float:
    import tritonclient.http as httpclient

    batch = data[np.newaxis]
    tensor = httpclient.InferInput("x", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch, binary_data=True)
    output = [httpclient.InferRequestedOutput("y", binary_data=True)]
    times: List[float] = []
    for index in range(count + 5):
        started = time.perf_counter()
        result = client.infer(name, [tensor], outputs=output)
        elapsed = time.perf_counter() - started
        if index >= 5:  # warm-up
            times.append(elapsed)
    assert np.array_equal(result.as_numpy("y"), batch)
    return statistics.median(times) * 1e3


PLAIN = "plain_identity"
_PLAIN_CONFIG = f"""name: "{PLAIN}"
backend: "python"
max_batch_size: 4
input [{{ name: "x" data_type: TYPE_FP32 dims: [-1] }}]
output [{{ name: "y" data_type: TYPE_FP32 dims: [-1] }}]
instance_group [{{ kind: KIND_CPU count: 1 }}]
"""


def _write_plain(repository: pathlib.Path) -> None:
    """The baseline: the identity in a plain Python-backend model, the same tensors as the bound one."""
    (repository / PLAIN / "1").mkdir(parents=True)
    from bench.models import _PLAIN_IDENTITY  # the main suite's baseline, with this model's tensor names

    source = _PLAIN_IDENTITY.replace('"INPUT"', '"x"').replace('"OUTPUT"', '"y"')
    if source == _PLAIN_IDENTITY:
        raise RuntimeError("bench: could not rename the baseline model's tensors")
    (repository / PLAIN / "1" / "model.py").write_text(source)
    (repository / PLAIN / "config.pbtxt").write_text(_PLAIN_CONFIG)


def run_scenarios(quick: bool) -> Dict[str, Any]:
    import tritonclient.http as httpclient

    from bench._common import free_ports, load_plain_models
    from pytriton._remote import server_command
    from pytriton.model_config import Tensor
    from pytriton.proxy.stubside import _segments
    from pytriton.triton import RemoteTriton, TritonConfig, TritonSecurityConfig

    regions = f"pytriton-bremote-{os.getpid()}-"
    counts = {"64 B": 100 if quick else 400, "1 MiB": 20 if quick else 100}
    results: Dict[str, Any] = {}
    baselines: List[Dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-remote-") as scratch:
        root = pathlib.Path(scratch)
        (root / "repository").mkdir()
        _write_plain(root / "repository")
        http, grpc, metrics = free_ports(3)
        ports = {"http_port": http}
        argv, env = server_command(
            root / "repository",
            TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics),
            TritonSecurityConfig(access_token=TOKEN),
            regions,
        )
        env["PATH"] = f"{stub_env_overlay(root)}{os.pathsep}{env['PATH']}"
        server = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )  # noqa: S603
        url = f"127.0.0.1:{ports['http_port']}"
        try:
            client = httpclient.InferenceServerClient(url)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if client.is_server_live():
                        break
                except Exception:  # noqa: BLE001 - not up yet
                    time.sleep(0.1)
            load_plain_models(http, [PLAIN], TOKEN)

            def measure(name: str) -> Dict[str, float]:
                return {
                    label: round(_p50(client, name, np.arange(n, dtype=np.float32), counts[label]), 3)
                    for label, n in SIZES.items()
                }

            for variant in ("unix", "tcp", "tcp-clear"):
                name = f"Identity_{variant.replace('-', '_')}"
                transport = variant.split("-")[0]
                encrypt = variant == "tcp"  # CURVE, RemoteTriton's default; tcp-clear: tcp_encryption=False
                with RemoteTriton(
                    f"http://{url}", access_token=TOKEN, transport=transport, tcp_encryption=encrypt
                ) as triton:
                    triton.bind(
                        name,
                        lambda requests: [{"y": request["x"]} for request in requests],
                        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
                        [Tensor(name="y", shape=(-1,), dtype=np.float32)],
                    )
                    triton.run()
                    results[variant] = measure(name)
                    # The baseline right after each transport, so that drift of a shared host hits both.
                    baselines.append(measure(PLAIN))
            results["plain Python backend"] = {
                label: round(statistics.median(b[label] for b in baselines), 3) for label in SIZES
            }
            client.close()
        finally:
            server.send_signal(signal.SIGTERM)  # a clean exit removes its /tmp/python_env_* and regions
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(10)
            _segments.sweep_segments(regions)
    return {"p50_ms": results, "requests": counts}


def table(results: Dict[str, Any]) -> str:
    """Markdown: each transport's p50 and its ratio to the plain Python-backend baseline of the same run."""
    p50 = results["p50_ms"]
    plain = p50["plain Python backend"]
    rows = [
        "| transport | 64 B p50 (ms) | ratio | 1 MiB p50 (ms) | ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for transport, values in p50.items():
        cells = [f"{values[label]:.3f} | {values[label] / plain[label]:.2f}x" for label in SIZES]
        rows.append(f"| {transport} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.remote")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = run_scenarios(args.quick)
    results["command"] = "python -m bench --only remote" + (" --quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "remote.json").write_text(json.dumps(results, indent=2))
    (args.out / "remote.md").write_text(f"Command: `{results['command']}`\n\n" + table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
