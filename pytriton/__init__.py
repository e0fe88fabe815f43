"""pytriton: serve plain Python callables as NVIDIA Triton Inference Server models.

The package root stays import-light on purpose: the proxy module that runs inside Triton's
Python-backend stub may import ``pytriton.proxy`` with only numpy available.
Import the public API from its modules: ``pytriton.triton``, ``pytriton.decorators``,
``pytriton.model_config``, ``pytriton.client``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
