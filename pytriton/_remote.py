"""``RemoteTriton``'s command-line side: the ``tritonserver`` command a ``RemoteTriton`` can bind into (docs/remote.md).

``RemoteTriton`` itself is a ``Triton`` constructed with the remote backend: the class is in
:mod:`pytriton.triton` (importable from here too), the backend in :mod:`pytriton._serving.remote`.
:func:`server_command` builds the argv and environment of a server started with
``--model-control-mode=explicit`` from this machine's pytriton install; ``pytriton server-command``
prints it (:func:`command_text`).

Unit tests: tests/unit/test_remote.py; with a server: tests/e2e/test_remote.py.
"""

from __future__ import annotations

import pathlib
import secrets
from typing import Dict, List, Optional, Sequence, Tuple, Union

from pytriton._serving.launched import server_environment
from pytriton._serving.plan import LaunchPlan
from pytriton._serving.policy import REMOTE_LIFECYCLE_POLICY
from pytriton._serving.remote import CONNECT_TIMEOUT_S, LOAD_TIMEOUT_S, TRANSPORTS
from pytriton.proxy._binding import backend_region_prefix
from pytriton.server.command import LaunchSettings
from pytriton.server.distribution import find_server, shared_libpython_dir, stub_environment
from pytriton.server.security import AccessPolicy, TritonSecurityConfig
from pytriton.server.triton_config import TritonConfig
from pytriton.triton import RemoteTriton

__all__ = [
    "CONNECT_TIMEOUT_S",
    "LOAD_TIMEOUT_S",
    "REMOTE_LIFECYCLE_POLICY",
    "TRANSPORTS",
    "RemoteTriton",
    "command_text",
    "server_command",
]


def server_command(
    model_repository: Union[str, pathlib.Path],
    config: Optional[TritonConfig] = None,
    security_config: Optional[TritonSecurityConfig] = None,
    region_prefix: Optional[str] = None,
) -> Tuple[List[str], Dict[str, str]]:
    """The argv and environment of a ``tritonserver`` that :class:`RemoteTriton` can bind into.

    Built from this machine's pytriton install, like ``Triton`` builds its own: explicit model
    control, no auto-completion, the Python backend, the stub environment first on ``PATH`` and
    this interpreter's ``libpython`` first to load. ``config`` sets the ports and addresses (8000,
    8001, 8002 on 127.0.0.1 by default); ``security_config`` restricts endpoints (by default the
    model-repository and other management endpoints need ``security_config.access_token``).
    ``pytriton server-command`` prints it (docs/remote.md).
    """
    config = config or TritonConfig()
    security = security_config if security_config is not None else TritonSecurityConfig()
    distribution = find_server(config.tritonserver_dir)
    plan = LaunchPlan.build(
        distribution.binary,
        config,
        LaunchSettings(
            model_repository=pathlib.Path(model_repository),
            backend_directory=distribution.backend_dir,
            cache_directory=distribution.cache_dir,
            shm_region_prefix=region_prefix or backend_region_prefix(f"pytriton-remote-{secrets.token_hex(4)}"),
            access=AccessPolicy(config, security),
            triton_version=distribution.version,
        ),
    )
    env = server_environment(
        stub_environment().bin_dir,
        [shared_libpython_dir(), *distribution.library_dirs],
        malloc_arena_max=config.server_malloc_arena_max,
        allocator=config.server_allocator,
    )
    return plan.to_argv(), env


def command_text(
    argv: Sequence[str],
    env: Dict[str, str],
    names: Sequence[str] = ("PATH", "LD_LIBRARY_PATH", "MALLOC_ARENA_MAX", "LD_PRELOAD", "MALLOC_CONF"),
) -> str:
    """``env NAME=value ... argv`` as one shell line (only the variables that matter)."""
    import shlex

    assignments = [f"{name}={env[name]}" for name in names if name in env]
    return " ".join(shlex.quote(part) for part in ["env", *assignments, *argv])
