"""Pins the public surface: adding or removing an exported name must be a deliberate change."""

import importlib

import pytest

# The legacy tensorrtserver.api layer: the same names under both import paths.
LEGACY = [
    "DataType",
    "InferContext",
    "InferRequestHeader",
    "InferenceServerException",
    "ModelConfig",
    "ModelControlContext",
    "ModelInput",
    "ModelOutput",
    "ModelReadyState",
    "ModelRepositoryContext",
    "ModelRepositoryIndex",
    "ModelStatus",
    "ProtocolType",
    "ResultFormat",
    "ServerHealthContext",
    "ServerReadyState",
    "ServerStatus",
    "ServerStatusContext",
    "SharedMemoryControlContext",
    "SharedMemoryStatus",
    "serialize_string_tensor",
]
LEGACY_SHM = [
    "SharedMemoryException",
    "SharedMemoryHandle",
    "create_shared_memory_region",
    "destroy_shared_memory_region",
    "get_contents_as_numpy",
    "mapped_shared_memory_regions",
    "set_shared_memory_region",
]

EXPECTED = {
    "pytriton": ["__version__"],
    "pytriton.triton": [
        "RemoteTriton",
        "Triton",
        "TritonConfig",
        "TritonLifecyclePolicy",
        "TritonSecurityConfig",
        "Workspace",
    ],
    "pytriton.openai": ["ChatModel", "EmbeddingModel", "OpenAIFrontend"],
    "pytriton.client.auth": ["create_auth_headers", "extract_access_token_from_headers"],
    "pytriton.client.utils": [
        "LATEST_MODEL_VERSION",
        "ModelState",
        "TritonUrl",
        "create_client_from_url",
        "get_model_config",
        "get_model_state",
        "wait_for_model_ready",
        "wait_for_server_ready",
    ],
    "pytriton.client.warnings": ["NotSupportedTimeoutWarning", "PyTritonWarning"],
    "pytriton.pipeline": [
        "CHAIN_PARAMETER",
        "MAX_HOPS",
        "ModelHandle",
        "PipelineCancelledError",
        "PipelineCycleError",
        "model",
    ],
    "pytriton.model_config": [
        "DeviceKind",
        "DynamicBatcher",
        "ModelConfig",
        "QueuePolicy",
        "SequenceBatcher",
        "SequenceStrategy",
        "Tensor",
        "TimeoutAction",
    ],
    "pytriton.client": [
        "AsyncioDecoupledModelClient",
        "AsyncioModelClient",
        "DecoupledModelClient",
        "FuturesModelClient",
        "ModelClient",
    ],
    "pytriton.decorators": [
        "ConstantPadder",
        "InferenceRequest",
        "InferenceRequests",
        "InferenceResult",
        "InferenceResults",
        "ModelConfigDict",
        "TritonContext",
        "batch",
        "batch_cancelled",
        "convert_output",
        "current_requests",
        "fill_optionals",
        "first_value",
        "get_inference_request_batch_size",
        "get_model_config",
        "get_triton_context",
        "group_by_keys",
        "group_by_values",
        "pad_batch",
        "sample",
        "triton_context",
    ],
    "pytriton.exceptions": [
        "PyTritonError",
        "PyTritonValidationError",
        "PyTritonInvalidOperationError",
        "PyTritonModelAlreadyBoundError",
        "PyTritonBadParameterError",
        "PyTritonModelConfigError",
        "PyTritonUnrecoverableError",
        "PyTritonRuntimeError",
        "PyTritonServerError",
        "PyTritonServerNotInstalledError",
    ],
    "pytriton.client.exceptions": [
        "PyTritonClientError",
        "PyTritonClientValueError",
        "PyTritonClientInvalidUrlError",
        "PyTritonClientUrlParseError",
        "PyTritonClientInferenceServerError",
        "PyTritonClientPermissionError",
        "PyTritonClientModelDoesntSupportBatchingError",
        "PyTritonClientTimeoutError",
        "PyTritonClientModelUnavailableError",
        "PyTritonClientClosedError",
        "PyTritonClientQueueFullError",
        "PyTritonClientRuntimeError",
    ],
    "pytriton.client.legacy": LEGACY,
    "tensorrtserver.api": LEGACY,
    "pytriton.client.legacy.shared_memory": LEGACY_SHM,
    "tensorrtserver.shared_memory": LEGACY_SHM,
    "pytriton.proxy.types": [
        "Request",
        "Requests",
        "Response",
        "Responses",
        "InferenceRequest",
        "InferenceRequests",
        "InferenceResult",
        "InferenceResults",
    ],
}


@pytest.mark.parametrize("module_name", sorted(EXPECTED))
def test_exported_names(module_name):
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(EXPECTED[module_name])
    for name in module.__all__:
        assert hasattr(module, name), name


def test_spec_module_paths_resolve():
    from pytriton.client.client import AsyncioModelClient, FuturesModelClient, ModelClient  # noqa: F401
    from pytriton.model_config.common import DeviceKind, DynamicBatcher, QueuePolicy, TimeoutAction  # noqa: F401
    from pytriton.model_config.model_config import ModelConfig  # noqa: F401
    from pytriton.model_config.tensor import Tensor  # noqa: F401


def test_security_names_resolve_where_nvidia_pytriton_has_them():
    from pytriton.triton import (  # noqa: F401
        DEFAULT_PROTECTED_ENDPOINTS,
        TRITON_ACCESS_HEADER,
        VALID_TRITON_ENDPOINTS,
        Triton,
        TritonSecurityConfig,
    )

    assert TRITON_ACCESS_HEADER == "triton-access-token"
    assert callable(Triton.get_access_token)


def test_legacy_star_import_and_alias_identity():
    namespace: dict = {}
    exec("from tensorrtserver.api import *", namespace)
    import pytriton.client.legacy as legacy

    assert all(namespace[name] is getattr(legacy, name) for name in LEGACY)


def test_package_root_stays_light():
    # The proxy inside Triton's stub imports pytriton.proxy with only numpy available.
    import subprocess
    import sys

    code = "import sys, pytriton, pytriton.proxy, pytriton.proxy.stubside._wire; print('tritonclient' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
