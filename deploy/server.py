"""The example server the container image runs: one ``@batch`` identity model, ``Identity``.

Everything deployment-specific comes from the environment, so that the image stays the same from
``docker run`` to Kubernetes and KServe (docs/deployment.md):

* ``PYTRITON_TRITON_CONFIG_*``: any ``TritonConfig`` field (pytriton reads these itself); the
  Kubernetes Deployment sets ``PYTRITON_TRITON_CONFIG_EXIT_TIMEOUT_SECS``, the bound on draining
  in-flight requests after SIGTERM. Addresses and ports are fixed here (every interface, 8000,
  8001, 8002) because the image, the probes and the Service are written for them.
* ``SERVER_WORKSPACE``: the directory for the model repository and the files pytriton writes at run
  time. The image sets it to ``/workspace``; in Kubernetes that is a writable ``emptyDir``, so the
  root filesystem, ``$PYTRITON_HOME`` (the server install) included, can be read-only.
* ``SERVER_ACCESS_TOKEN``: the token the management endpoints (model loading, statistics, ...)
  require. Unset: a random token only this process knows, i.e. nobody outside can use them.

``server_config()`` is what the manifests' unit test (tests/unit/test_deploy.py) checks the probes,
ports and termination timing against.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

MODEL_NAME = "Identity"
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002


def server_config(environ: Optional[Mapping[str, str]] = None) -> TritonConfig:
    """The settings the server runs with: ``PYTRITON_TRITON_CONFIG_*`` overridden by the fixed ones here.

    Same precedence as ``Triton`` itself (explicit over environment over defaults); a field that is
    ``None`` here is pytriton's default (``exit_timeout_secs``: 30 s).
    """
    from_env = {key: value for key, value in TritonConfig.from_env(environ).to_dict().items() if value is not None}
    fixed = {
        "http_address": "0.0.0.0",
        "http_port": HTTP_PORT,
        "grpc_address": "0.0.0.0",
        "grpc_port": GRPC_PORT,
        "metrics_address": "0.0.0.0",  # Prometheus scrapes /metrics (the autoscaler's queue time) from outside
        "metrics_port": METRICS_PORT,
    }
    return TritonConfig(**{**from_env, **fixed})


def security_config(environ: Optional[Mapping[str, str]] = None) -> TritonSecurityConfig:
    """Management endpoints need a token: ``SERVER_ACCESS_TOKEN`` if set, else a random one."""
    environ = os.environ if environ is None else environ
    return TritonSecurityConfig(access_token=environ.get("SERVER_ACCESS_TOKEN") or None)


@batch
def identity(x: np.ndarray) -> dict:
    """Return the batch unchanged (the shape of any real model: arrays in, arrays out)."""
    return {"y": x}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workspace = os.environ.get("SERVER_WORKSPACE") or None
    with Triton(config=server_config(), security_config=security_config(), workspace=workspace) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=identity,
            inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
            outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
            config=ModelConfig(max_batch_size=64),
        )
        # Blocks until SIGTERM (Kubernetes, `docker stop`) or SIGINT, then drains in-flight requests
        # for at most exit_timeout_secs and stops; an unrecoverable server failure raises (exit 1).
        triton.serve()


if __name__ == "__main__":
    main()
