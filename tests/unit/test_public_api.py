"""Pins the public surface: adding or removing an exported name must be a deliberate change."""

import importlib

import pytest

EXPECTED = {
    "pytriton": ["__version__"],
    "pytriton.triton": ["Triton", "TritonConfig", "Workspace"],
    "pytriton.model_config": ["DeviceKind", "DynamicBatcher", "ModelConfig", "QueuePolicy", "Tensor", "TimeoutAction"],
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
        "PyTritonClientModelDoesntSupportBatchingError",
        "PyTritonClientTimeoutError",
        "PyTritonClientModelUnavailableError",
        "PyTritonClientClosedError",
        "PyTritonClientQueueFullError",
        "PyTritonClientRuntimeError",
    ],
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


def test_package_root_stays_light():
    # The proxy inside Triton's stub imports pytriton.proxy with only numpy available.
    import subprocess
    import sys

    code = "import sys, pytriton, pytriton.proxy, pytriton.proxy._wire; print('tritonclient' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
