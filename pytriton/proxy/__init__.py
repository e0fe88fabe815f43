"""The data path between Triton and the user's callables.

``types`` holds the public ``Request`` type. ``stubside`` is everything that runs inside Triton's
Python-backend stub, one package copied whole into each model version (the wire protocol, arenas
and tensor encoding in it are shared by both sides); ``_stub_model`` is the ``model.py`` that loads
it there. The other private modules are the user's side: ``_worker`` (the loop that calls the bound
callable), ``_process`` and ``_process_child`` (process instances) and ``_binding`` (one bound
model: config, repository files, workers).

Keep imports lazy here: importing ``pytriton.proxy.stubside`` from the user's side runs this file.

Unit tests: tests/unit/test_worker.py, tests/unit/test_binding.py, tests/unit/test_stub_package.py
(one per module).
"""
