"""The stub side: everything pytriton runs inside Triton's Python-backend stub, as one package.

``Triton.bind`` copies this package whole (every ``*.py`` here; files 0600, the directory 0700)
into each model version's directory as ``_pytriton_stubside/``, and writes ``model.py`` there
from ``pytriton/proxy/_stub_model.py``, a shim that loads this package by its location. Inside the
stub only the standard library, numpy, ``triton_python_backend_utils`` and (for the TCP transport)
pyzmq exist, so the modules here import nothing else: each other through relative imports, never
``pytriton``. tests/unit/test_stub_package.py holds them to that and imports a copied package in a
fresh interpreter of the stub's environment.

The user's process imports the same modules from here (one copy of the code on both sides):

- ``_messages``: one record per message kind (and ``TensorMeta``) with its encoding; change the
  wire protocol here (both ends follow, docs/architecture.md "Where to change the wire protocol").
- ``_wire``: the ``Channel`` protocol and the messages' framing on the Unix socket.
- ``_tensors``: how a tensor is described in a message and encoded (BYTES serialisation included).
- ``_arena``: the shared-memory arenas and their idle release.
- ``_segments``: segment names and sweeping the segments of dead processes.
- ``_zmq_channel``: the TCP transport (``RemoteTriton(transport="tcp")``), both ends.
- ``_stub``: the proxy model (``TritonPythonModel``) that the stub runs.
- ``_inline``, ``_backend_page``: the model of a backend instance (``instance_kind="backend"``), which
  runs the callable in the stub (it imports ``pytriton`` from the user's environment at
  ``initialize``, by name), and the status page it shares with the user's process.
- ``_portable_pickle``: numpy objects of a backend callable pickled so that another numpy major
  version unpickles them (the callable crosses from the user's numpy to the stub's).
- ``_stub_bytes``, ``_stub_cancel``, ``_stub_dlpack``, ``_stub_exit``, ``_stub_metrics``,
  ``_stub_print``, ``_stub_slow``, ``_stub_trace``: the stub's string tensors, requests dropped
  because their client cancelled, numeric tensors through DLPack under numpy 2, unload deadline,
  metrics, a backend callable's printed output, report of a slow ``initialize`` and trace contexts.

This file runs inside the stub too: keep it free of imports.

Unit tests: tests/unit/test_stub_package.py.
"""
