"""The data path between Triton and the user's callables.

``types`` holds the public ``Request`` type. The private modules implement the proxy:
``_wire`` (protocol and shared-memory arenas, shared by both sides), ``_stub`` (the model that
runs inside Triton's Python-backend stub), ``_worker`` (the user-side loop that calls the bound
callable) and ``_binding`` (one bound model: config, repository files, workers).

This package must stay importable inside the stub (standard library and numpy only): keep imports lazy here.

Unit tests: tests/unit/test_wire.py, tests/unit/test_stub.py, tests/unit/test_worker.py,
tests/unit/test_binding.py (one per module).
"""
