"""The serving core: where a ``Triton``'s server runs, how it is started, watched, healed and stopped.

``pytriton.triton.Triton`` is the model registry and the public methods; everything it delegates about
the server lives here (docs/architecture.md, "The serving core"):

- :mod:`.backend`: the ``ServerBackend`` protocol a backend implements, the ``Registry`` protocol the
  backends and the supervisor see of a ``Triton``, the lifecycle ``State``;
- :mod:`.launched`, :mod:`.embedded`, :mod:`.remote`: the three backends (the ``tritonserver`` binary,
  the server library in this process, a server started elsewhere);
- :mod:`.plan`: ``LaunchPlan``, one server start, rendered to argv or to in-process options;
- :mod:`.endpoints`: what a launched server is asked over its network endpoints;
- :mod:`.supervisor`: restarts, stub replacement, memory recycling and the drain;
- :mod:`.unresponsive`: the unresponsive-model watch the supervisor runs;
- :mod:`.trace_settings`: per-model trace settings, kept by name and sent through the backend;
- :mod:`.running`: the running ``Triton`` objects of this process, for ``pytriton.pipeline``.

The package sits above ``pytriton.server``, ``pytriton.proxy`` and ``pytriton._platform`` and below
``pytriton.triton``: it never imports ``triton``, ``pipeline`` or the command line
(tests/unit/test_import_graph.py). This file imports nothing, so importing one module loads only what it needs.
"""
