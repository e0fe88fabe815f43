"""Everything about the ``tritonserver`` process: finding, installing, configuring, running it.

Unit tests: one per module (tests/unit/test_process.py, tests/unit/test_triton_config.py, ...).
"""
