"""pytriton on Ray Serve: replicas that each run an embedded pytriton ``Triton`` (docs/ray.md).

Install with the ``ray`` extra (``pip install 'pytriton[ray]'``, Python 3.10 or later). Ray is
imported only by :func:`build_app`, so this package imports without it.

    from ray import serve
    from pytriton.ray import build_app, queue_time_autoscaling

    def bind_models(triton):            # runs once in every replica
        triton.bind("Identity", infer_fn, inputs=[...], outputs=[...], config=ModelConfig(max_batch_size=64))

    handle = serve.run(build_app(bind_models, num_replicas=2))
    outputs = handle.infer.remote({"x": batch}, "Identity").result()

:func:`max_ongoing_requests_for` states how the replicas' ``max_ongoing_requests`` follows the
models' batching; :class:`QueueTimePolicy` scales the replica count on the time requests wait in
Triton's queue.
"""

# Unit tests: tests/unit/test_ray_parts.py (no Ray); on a two-node Ray cluster: tests/e2e/test_ray.py.

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from pytriton.model_config import ModelConfig
from pytriton.ray._replica import BindModels, PyTritonReplica, PyTritonRequestError, parse_v2_inputs
from pytriton.triton import TritonConfig

# An object of Ray's API (an application, an autoscaling context): untyped here, since Ray is an
# optional dependency that the type checker does not see.
RayObject = Any

__all__ = [
    "BindModels",
    "PyTritonReplica",
    "PyTritonRequestError",
    "QueueTimePolicy",
    "build_app",
    "max_ongoing_requests_for",
    "parse_v2_inputs",
    "queue_time_autoscaling",
]

# The metric PyTritonReplica.record_autoscaling_stats reports and QueueTimePolicy reads.
QUEUE_METRIC = "pytriton_queue_ms"


class _BindRecorder:
    """Stands in for ``Triton`` while ``bind_models`` runs in the driver: records each ``bind``.

    Nothing is started or loaded. Any other use of ``triton`` raises, telling the user to pass
    ``max_ongoing_requests`` explicitly.
    """

    def __init__(self) -> None:
        self.models: List[Tuple[str, int, int]] = []  # (name, max_batch_size or 0, instances)

    def bind(
        self,
        model_name: str,
        infer_func: object,
        inputs: object = None,
        outputs: object = None,
        *args: object,
        **kwargs: object,
    ) -> None:
        config = kwargs.get("config")
        if config is None and len(args) >= 2:  # bind(name, func, inputs, outputs, model_version, config)
            config = args[1]
        config = config if isinstance(config, ModelConfig) else ModelConfig()
        instances = len(infer_func) if isinstance(infer_func, (list, tuple)) else 1
        self.models.append((model_name, config.max_batch_size if config.batching else 0, instances))

    def __getattr__(self, name: str) -> RayObject:
        raise AttributeError(
            f"pytriton.ray: bind_models used triton.{name} while its models were being counted in the "
            "driver; pass max_ongoing_requests= to build_app to skip that count"
        )


def max_ongoing_requests_for(bind_models: BindModels) -> int:
    """The ``max_ongoing_requests`` of a replica serving what ``bind_models`` binds.

    The rule: for each bound model, ``max(1, max_batch_size) * instances * 2`` (``max_batch_size``
    0 for a model without batching; ``instances`` the number of callables bound), summed over the
    models. That lets every instance run a full batch while one more full batch waits in Triton's
    queue to be formed, so Triton's dynamic batcher sees enough requests to fill batches; Ray's
    default of 5 would hand it at most 5 requests at a time however large ``max_batch_size`` is.

    ``bind_models`` is called here with a recorder standing in for ``Triton`` (only ``bind`` is
    recorded; the callables are not called).
    """
    recorder = _BindRecorder()
    bind_models(recorder)  # type: ignore[arg-type]
    if not recorder.models:
        raise ValueError("bind_models bound no model: call triton.bind(...) in it")
    return sum(max(1, batch) * instances * 2 for _, batch, instances in recorder.models)


class QueueTimePolicy:
    """A Ray Serve autoscaling policy on the time requests wait in Triton's queue.

    Every replica reports the mean queue time of the requests it finished since its previous
    report (``PyTritonReplica.record_autoscaling_stats``); Ray aggregates it per replica over
    ``look_back_period_s``. The desired replica count is ``current * mean_queue_ms /
    target_queue_ms`` (rounded up), so a queue twice the target asks for twice the replicas; Ray
    then applies ``min_replicas``/``max_replicas`` and the up/down-scale delays. Without reports yet
    it keeps the current count.
    """

    def __init__(self, target_queue_ms: float = 10.0) -> None:
        if not target_queue_ms > 0:
            raise ValueError(f"target_queue_ms must be > 0, got {target_queue_ms!r}")
        self.target_queue_ms = float(target_queue_ms)

    def __call__(self, ctx: RayObject) -> Tuple[int, Dict[str, object]]:
        current = int(ctx.current_num_replicas)
        per_replica = (ctx.aggregated_metrics or {}).get(QUEUE_METRIC) or {}
        if current == 0 or not per_replica:
            return int(ctx.target_num_replicas), {}
        mean_queue_ms = sum(per_replica.values()) / len(per_replica)
        return max(1, math.ceil(current * mean_queue_ms / self.target_queue_ms)), {}


def queue_time_autoscaling(
    min_replicas: int = 1,
    max_replicas: int = 2,
    target_queue_ms: float = 10.0,
    upscale_delay_s: float = 10.0,
    downscale_delay_s: float = 60.0,
    look_back_period_s: float = 10.0,
) -> Dict[str, object]:
    """An ``autoscaling_config`` for :func:`build_app` that scales on Triton's queue time (:class:`QueueTimePolicy`)."""
    return {
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "upscale_delay_s": upscale_delay_s,
        "downscale_delay_s": downscale_delay_s,
        "look_back_period_s": look_back_period_s,
        "policy": {
            "policy_function": QueueTimePolicy,
            "policy_kwargs": {"target_queue_ms": target_queue_ms},
        },
    }


def build_app(
    bind_models: BindModels,
    *,
    triton_config: Optional[TritonConfig] = None,
    name: str = "PyTriton",
    max_ongoing_requests: Optional[int] = None,
    **deployment_options: object,
) -> RayObject:
    """A Ray Serve application whose replicas serve what ``bind_models`` binds (``serve.run`` it).

    Args:
        bind_models: ``bind_models(triton)`` binds the models on each replica's embedded ``Triton``.
        triton_config: each replica's ``TritonConfig`` (ports are ignored: nothing listens).
        name: the deployment's name.
        max_ongoing_requests: requests one replica takes at a time; default
            :func:`max_ongoing_requests_for` ``(bind_models)``.
        deployment_options: passed to ``serve.deployment`` (``num_replicas``, ``autoscaling_config``
            such as :func:`queue_time_autoscaling`, ``ray_actor_options``, ...). ``ray_actor_options``
            defaults to ``{"num_cpus": 0}``; set CPUs/GPUs/custom resources to place replicas.

    Returns:
        ``ray.serve.Application``: ``serve.run(app)`` returns a ``DeploymentHandle`` whose
        ``infer.remote(inputs, model_name)`` calls a replica in-process; Ray's HTTP proxy routes
        ``/v2/models/<m>/infer`` (KServe v2 JSON) under the application's route prefix.
    """
    from ray import serve

    if max_ongoing_requests is None:
        max_ongoing_requests = max_ongoing_requests_for(bind_models)
    deployment_options.setdefault("ray_actor_options", {"num_cpus": 0})
    deployment = serve.deployment(name=name, max_ongoing_requests=max_ongoing_requests, **deployment_options)(
        PyTritonReplica
    )
    return deployment.bind(bind_models, triton_config)
