"""The policies a ``Triton`` is constructed with: when its server starts (``TritonLifecyclePolicy``), restarts.

:class:`TritonLifecyclePolicy` is public (``pytriton.triton.TritonLifecyclePolicy``, as ``TritonConfig``
is ``pytriton.triton.TritonConfig``); :func:`lifecycle_policy` and :func:`restart_policy` check the
constructor's arguments with errors that name them. Owns no resource. Unit tests:
tests/unit/test_self_healing.py (restart arguments), tests/unit/test_remote.py (the remote default).
"""

from __future__ import annotations

import dataclasses

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.server._restarts import RestartPolicy


@dataclasses.dataclass(frozen=True)
class TritonLifecyclePolicy:
    """When the server starts and where its model store lives (NVIDIA PyTriton's names and defaults).

    Args:
        launch_triton_on_startup: True (the default, as in NVIDIA PyTriton): entering the
            ``Triton`` context starts the server, and a model bound inside the block is loaded
            before ``bind`` returns. False: the server starts at :meth:`Triton.run` (or ``serve()``)
            with every model bound by then. Without a ``with`` block the server always starts at
            ``run()``.
        local_model_store: the model store is a directory of this process's workspace. pytriton
            always writes the store locally (``TritonConfig.model_repository`` or the workspace).

    Both flags are validated and kept (:attr:`Triton.triton_lifecycle_policy`). ``RemoteTriton``
    (a server started elsewhere) reads ``launch_triton_on_startup`` as "connect on entering the
    context" and ``local_model_store`` as shared repository, or files sent with each load
    (docs/remote.md).
    """

    launch_triton_on_startup: bool = True
    local_model_store: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if not isinstance(getattr(self, field.name), bool):
                raise PyTritonBadParameterError(
                    f"TritonLifecyclePolicy.{field.name} must be a bool, got {getattr(self, field.name)!r}."
                )


# RemoteTriton's default: connect on entering the ``with`` block, send the model files with each load.
REMOTE_LIFECYCLE_POLICY = TritonLifecyclePolicy(launch_triton_on_startup=True, local_model_store=False)


def lifecycle_policy(value: object, default: TritonLifecyclePolicy) -> TritonLifecyclePolicy:
    """``triton_lifecycle_policy`` as given (``None``: ``default``); a clear error for anything else."""
    if value is None:
        return default
    if not isinstance(value, TritonLifecyclePolicy):
        raise PyTritonBadParameterError(
            f"triton_lifecycle_policy must be a TritonLifecyclePolicy, got {type(value).__name__}."
        )
    return value


def restart_policy(max_server_restarts: object, restart_window_s: object) -> RestartPolicy:
    """The restart policy of ``Triton(max_server_restarts=..., restart_window_s=...)``, the values checked."""
    if isinstance(max_server_restarts, bool) or not isinstance(max_server_restarts, int) or max_server_restarts < 0:
        raise PyTritonBadParameterError(f"max_server_restarts must be an int >= 0, got {max_server_restarts!r}.")
    if isinstance(restart_window_s, bool) or not isinstance(restart_window_s, (int, float)) or restart_window_s <= 0:
        raise PyTritonBadParameterError(f"restart_window_s must be a positive number, got {restart_window_s!r}.")
    return RestartPolicy(max_server_restarts, float(restart_window_s))
