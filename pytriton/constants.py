"""Constants under the names NVIDIA PyTriton publishes in ``pytriton.constants``.

``PYTRITON_HOME`` is the directory pytriton really uses (``$PYTRITON_HOME``, else
``~/.cache/pytriton``), read once at import; pytriton itself looks the variable up each time it needs
the directory (``pytriton.server.distribution.pytriton_home``), so a later change still takes effect.

Unit test: tests/unit/test_api_drift.py (the names and values code written for NVIDIA PyTriton
uses).
"""

from __future__ import annotations

from pytriton.server.distribution import pytriton_home

__all__ = [
    "CREATE_TRITON_CLIENT_TIMEOUT_S",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_METRICS_PORT",
    "DEFAULT_TRITON_STARTUP_TIMEOUT_S",
    "PYTRITON_HOME",
    "TRITON_CONTEXT_FIELD_NAME",
    "TRITON_LOCAL_IP",
    "TRITON_PYTHON_BACKEND_INTERPRETER_DIRNAME",
]

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
# Where local clients reach a server bound to a wildcard address; also pytriton's default bind address.
TRITON_LOCAL_IP = "127.0.0.1"
# Attribute under which decorators find the Triton context on a bound callable (or its instance).
TRITON_CONTEXT_FIELD_NAME = "triton_context"
# Kept for compatibility; pytriton names the stub's private environment differently (docs/architecture.md).
TRITON_PYTHON_BACKEND_INTERPRETER_DIRNAME = "python_backend_interpreter"
# How long run() waits for the server and its models to become ready.
DEFAULT_TRITON_STARTUP_TIMEOUT_S = 120
CREATE_TRITON_CLIENT_TIMEOUT_S = 10


PYTRITON_HOME = pytriton_home().resolve()
