"""What a backend instance's stub imports before its first ``execute``, and how long that takes.

Usage: ``python -m bench.stub_imports [--repeats N] [--main MODULE] [--importtime]``.

A backend instance (``bind(..., instance_kind="backend")``) loads pytriton's stub package, then, in
``InlineModel.initialize``, puts the user's ``sys.path`` behind its own, imports
``pytriton.proxy._backend_kind`` from the user's environment and unpickles the callable, after running
the user's main module as ``__mp_main__`` (``multiprocessing``'s spawn rules). This script replays
exactly that in a fresh interpreter of the stub's own environment (the real stub embeds the same
Python with the same environment, but reads no ``PYTHON*`` variable, so ``-X importtime`` cannot be
switched on inside it): the copied package and ``model.py`` as ``bind`` writes them, the server's real
``triton_python_backend_utils.py``, the package's bytecode from pytriton's cache, and a payload packed as ``bind`` packs it, for
``bench.models.identity`` with ``--main`` (default ``bench.startup_child``, which imports
``pytriton.triton``; ``--main ''`` for none) as the main module. The handshake with the user's
process and the stub's own start are not in it.

Prints one JSON object: the median seconds of the package load (``model.py`` and the stub package,
numpy and ``triton_python_backend_utils`` already imported, as in the stub; ``--no-bytecode``: copied
without its bytecode, as before ``proxy/_bytecode.py``) and of the ``initialize`` imports
over the repeats (each in a new interpreter), and the modules the ``initialize`` step imported
beyond the package load, grouped by top-level name. ``--importtime`` prints Python's
``-X importtime`` report of one more run instead (on stderr).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

import numpy as np

from bench.__main__ import ROOT
from bench.models import identity
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.proxy import _backend_kind, _binding, _process
from pytriton.server.distribution import find_server, pytriton_home, stub_environment

_REPLAY = """
import importlib, importlib.util, json, pickle, sys, time
version_dir, backend_dir, params_file, payload_file = sys.argv[1:5]
sys.path.append(backend_dir)  # where the stub finds triton_python_backend_utils
import numpy, triton_python_backend_utils  # the stub has both before it loads model.py
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("model", version_dir + "/model.py")
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)  # the package: _pytriton_stubside._stub and what it imports
loaded = time.perf_counter()
before = set(sys.modules)
inline = importlib.import_module("_pytriton_stubside._inline")
params = json.load(open(params_file))
inline._user_path(params)
runner = importlib.import_module(inline._RUNNER_MODULE).InlineRunner.load(open(payload_file, "rb").read(), 0)
tracing = importlib.import_module("pytriton.proxy._tracing") if params.get("trace") else None
done = time.perf_counter()
print(json.dumps({"package_s": loaded - started, "initialize_s": done - loaded,
                  "modules": sorted(set(sys.modules) - before)}))
"""


def _payload(main: Optional[str]) -> bytes:
    """A backend model's payload for ``bench.models.identity``, as ``bind`` packs it, with ``main`` as main module."""
    config = TritonModelConfig(
        model_name="proxy_identity",
        max_batch_size=32,
        inputs=[TensorSpec(name="INPUT", shape=(16,), dtype=np.float32)],
        outputs=[TensorSpec(name="OUTPUT", shape=(16,), dtype=np.float32)],
    )
    preparation: Dict[str, Any] = {
        "sys_path": [str(ROOT), *(entry for entry in sys.path if entry and entry != str(ROOT))],
        "sys_argv": ["-m", main or ""],
        "dir": str(ROOT),
    }
    if main:
        preparation["init_main_from_name"] = main
    real = _process.preparation_data
    _process.preparation_data = lambda payloads=(): preparation  # type: ignore[assignment]  # pack() asks it
    try:
        return _backend_kind.pack([_process.dump_callable(identity, "proxy_identity", 0, "backend")], config, False)
    finally:
        _process.preparation_data = real  # type: ignore[assignment]


def replay(repeats: int, main: Optional[str], importtime: bool = False, bytecode: bool = True) -> Dict[str, Any]:
    """Replay the stub's imports ``repeats`` times (fresh interpreters); medians and the modules of the last run."""
    python = stub_environment().bin_dir / "python3"
    utils = find_server().backend_dir / "python" / "triton_python_backend_utils.py"
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        version_dir = root / "repo" / "proxy_identity" / "1"
        version_dir.mkdir(parents=True)
        backend = root / "backend"
        backend.mkdir()
        (backend / utils.name).write_bytes(utils.read_bytes())
        payload = _payload(main)
        (root / "payload.pkl").write_bytes(payload)
        params = {"backend_path": pickle.loads(payload)["preparation"]["sys_path"], "trace": False}
        (root / "params.json").write_text(json.dumps(params))
        argv = [str(version_dir), str(backend), str(root / "params.json"), str(root / "payload.pkl")]
        flags = ["-X", "importtime"] if importtime else []
        runs: List[Dict[str, Any]] = []
        for _ in range(1 if importtime else repeats):
            # A fresh copy each time, as each model load gets (the interpreter writes its own bytecode
            # of what it compiled): as Triton.bind writes it; without bytecode as before.
            for cache in version_dir.rglob("__pycache__"):
                shutil.rmtree(cache)
            _binding.write_stub_package(version_dir, pytriton_home() / "bytecode" if bytecode else None)
            done = subprocess.run(
                [str(python), "-I", *flags, "-c", _REPLAY, *argv],
                capture_output=True, text=True, timeout=120, cwd=root, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"the replay failed:\n{done.stderr[-3000:]}")
            if importtime:
                sys.stderr.write(done.stderr)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    groups: Dict[str, int] = {}
    for name in runs[-1]["modules"]:
        top = name.split(".")[0]
        groups[top] = groups.get(top, 0) + 1
    return {
        "repeats": len(runs),
        "main": main,
        "bytecode": bytecode,
        "package_s": round(statistics.median(run["package_s"] for run in runs), 4),
        "initialize_s": round(statistics.median(run["initialize_s"] for run in runs), 4),
        "initialize_samples": [round(run["initialize_s"], 4) for run in runs],
        "initialize_modules": len(runs[-1]["modules"]),
        "by_top_level": dict(sorted(groups.items(), key=lambda item: -item[1])),
        "modules": runs[-1]["modules"],
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--main", default="bench.startup_child", help="the user's main module ('' for none)")
    parser.add_argument("--importtime", action="store_true", help="print -X importtime of one run on stderr")
    parser.add_argument("--modules", action="store_true", help="list every module initialize imported")
    parser.add_argument("--no-bytecode", action="store_true", help="copy the stub package without its bytecode")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats takes a positive count")
    result = replay(args.repeats, args.main or None, args.importtime, not args.no_bytecode)
    if not args.modules:
        result.pop("modules")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
