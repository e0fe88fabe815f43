"""Helpers under the module paths NVIDIA PyTriton uses (``pytriton.utils.workspace``)."""
