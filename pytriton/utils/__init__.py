"""Helpers under the module paths NVIDIA PyTriton uses (``pytriton.utils.workspace``).

Unit test: tests/unit/test_api_drift.py (the module path and the ``Workspace`` contract).
"""
