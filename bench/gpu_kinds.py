"""CUDA tensors through DLPack into a callable of each instance kind, against the plain Python backend.

Usage: ``python -m bench.gpu_kinds [--device cuda|cpu] [--rounds N] [--out DIR]``. Needs PyTorch; ``--device
cpu`` runs the same path without a GPU (a smoke run of the benchmark itself, not a GPU figure).
Results: ``DIR/gpu_kinds.json`` and ``DIR/gpu_kinds.md`` (default ``bench/results/``).

One ``Triton`` serves, for the same work on the device:

* ``plain_gpu`` / ``plain_gpu_large``: plain Python-backend models (the physical limit) whose
  ``execute`` hands Triton's input tensor to PyTorch through DLPack (``Tensor.to_dlpack``), moves it to
  the device, computes there and returns the result as a host numpy array;
* ``gpu_<kind>`` / ``gpu_large_<kind>`` for ``thread``, ``process`` and ``backend``: the same work in
  a ``@batch`` callable, whose host numpy input goes to PyTorch through ``torch.from_dlpack`` (a
  view, no copy) before the move to the device.

Small models double ``[16]`` float32 rows (max batch 32, dynamic batcher); large ones add 1 to a
uint8 vector of any length (max batch 1). Every model is first checked for the right answer with the
raw ``tritonclient`` (one request each; a model that fails is reported with its error and left out
of the figures). Per round: sequential HTTP p50 of the small models (``bench.load.latency_interleaved``)
and 1 MiB / 16 MiB HTTP throughput at p50 of the large ones (``bench.load.large_http``); each figure
is the median over the rounds and is given as a ratio to the plain model of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from bench import kinds, report
from bench._common import ROOT, free_ports, load, load_plain_models
from pytriton.decorators import batch
from pytriton.triton import Triton, TritonConfig

KINDS = kinds.KINDS
SMALL = ["plain_gpu", *(f"gpu_{kind}" for kind in KINDS)]
LARGE = ["plain_gpu_large", *(f"gpu_large_{kind}" for kind in KINDS)]
SIZES = {"1MiB": 1 << 20, "16MiB": 16 << 20}
# The device the callables compute on: read in every process that runs them (the user's process,
# worker processes, backend stubs), which inherit it through the environment.
DEVICE_VARIABLE = "PYTRITON_BENCH_DEVICE"

# The stub imports from its own environment (numpy 1.x); the user's environment, where PyTorch is,
# goes behind it on sys.path, as instance_kind="backend" does (proxy/_backend_kind.py).
_PLAIN_MODEL = """
import sys

sys.path.extend(entry for entry in {paths!r} if entry not in sys.path)

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

DEVICE = torch.device({device!r})


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT")
            x = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).to(DEVICE)
            y = {work}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", y.cpu().numpy())]))
        return responses
"""


# torch and the device, looked up at the first call in each process (as the plain model does once
# at import): importing torch here would make `import bench.gpu_kinds` need it.
_TORCH: List[Any] = []


def _torch_device() -> Tuple[Any, Any]:
    """``(torch, device)``, imported and read once per process."""
    if not _TORCH:
        import torch

        _TORCH[:] = [torch, torch.device(os.environ.get(DEVICE_VARIABLE, "cuda"))]
    return _TORCH[0], _TORCH[1]


@batch
def double_on_device(INPUT: np.ndarray) -> Dict[str, np.ndarray]:  # noqa: N803 - the input's name
    """``2 * INPUT``, computed on the device: DLPack view of the host array, copy to the device, back."""
    torch, device = _torch_device()
    x = torch.from_dlpack(INPUT).to(device)
    return {"OUTPUT": (x * 2).cpu().numpy()}


@batch
def increment_on_device(INPUT: np.ndarray) -> Dict[str, np.ndarray]:  # noqa: N803 - the input's name
    """``INPUT + 1`` (uint8, wrapping), computed on the device like :func:`double_on_device`."""
    torch, device = _torch_device()
    x = torch.from_dlpack(INPUT).to(device)
    return {"OUTPUT": (x + 1).cpu().numpy()}


def _plain_config(name: str, dims: str, dtype: str, max_batch: int, extra: str = "") -> str:
    return textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch}
        input [{{ name: "INPUT" data_type: {dtype} dims: [{dims}] }}]
        output [{{ name: "OUTPUT" data_type: {dtype} dims: [{dims}] }}]
        instance_group [{{ kind: KIND_CPU count: 1 }}]
        """) + extra  # fmt: skip


def write_plain_models(repository: pathlib.Path, device: str) -> None:
    """``plain_gpu`` and ``plain_gpu_large``: the plain Python-backend twins of the bound models."""
    models = {
        "plain_gpu": ("x * 2", _plain_config("plain_gpu", "16", "TYPE_FP32", 32, "dynamic_batching { }\n")),
        "plain_gpu_large": ("x + 1", _plain_config("plain_gpu_large", "-1", "TYPE_UINT8", 1)),
    }
    for name, (work, config) in models.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(
            _PLAIN_MODEL.format(paths=[entry for entry in sys.path if entry], device=device, work=work)
        )
        (repository / name / "config.pbtxt").write_text(config)


def bind_models(triton: Any) -> None:
    """The same work as the plain models, bound once per instance kind (the small ones with the
    dynamic batcher, as ``plain_gpu``)."""
    kinds.bind_models(triton, ("gpu_", double_on_device), ("gpu_large_", increment_on_device))


def check_answers(http_port: int, token: Optional[str]) -> Dict[str, Optional[str]]:
    """One request per model with the raw ``tritonclient``: ``None`` where the answer is right, else why not."""
    import tritonclient.http as httpclient

    from pytriton.client.auth import create_auth_headers

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=120.0)
    headers = create_auth_headers(token, "http")
    small = np.arange(32, dtype=np.float32).reshape(2, 16)
    large = np.random.default_rng(0).integers(0, 256, size=(1, 1 << 20), dtype=np.uint8)
    cases: Dict[str, Any] = {name: (small, "FP32", small * 2) for name in SMALL}
    cases.update({name: (large, "UINT8", large + np.uint8(1)) for name in LARGE})
    verdicts: Dict[str, Optional[str]] = {}
    for name, (array, datatype, expected) in cases.items():
        tensor = httpclient.InferInput("INPUT", list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        try:
            answer = client.infer(name, [tensor], headers=headers).as_numpy("OUTPUT")
        except Exception as exc:  # noqa: BLE001 - the error is the finding
            verdicts[name] = f"{type(exc).__name__}: {exc}"[:2000]
            continue
        verdicts[name] = None if np.array_equal(answer, expected) else f"wrong answer: {answer.ravel()[:8]!r}"
    client.close()
    return verdicts


def _round(ports: Dict[str, int], small: List[str], large: List[str], count: int, reverse: bool) -> Dict[str, Any]:
    small, large = (small[::-1], large[::-1]) if reverse else (small, large)
    figures: Dict[str, Dict[str, float]] = {model: {} for model in small}
    measured = load(
        {"scenario": "latency_interleaved", "protocol": "http", "port": ports["http"], "models": small,
         "count": count, "warmup": 100, "max_s": 120.0},
        timeout_s=240.0,
    )  # fmt: skip
    for model in small:
        figures[model]["http_p50_ms"] = measured[model]["p50_ms"]
    for size_name, size in SIZES.items():
        for model in large:
            measured = load(
                {"scenario": "large_http", "port": ports["http"], "model": model, "bytes": size, "count": 20,
                 "max_s": 30.0},
                timeout_s=120.0,
            )  # fmt: skip
            figures.setdefault(SMALL[LARGE.index(model)], {})[f"http_{size_name}_mb_s"] = measured["mb_per_s"]
    return figures


def summarize(rounds: List[Dict[str, Dict[str, float]]]) -> Dict[str, Any]:
    """Medians over the rounds per model and figure, and each as a ratio to ``plain_gpu``'s."""
    models = {model for measured in rounds for model in measured}
    medians = {
        model: {
            figure: statistics.median(r[model][figure] for r in rounds if figure in r.get(model, {}))
            for figure in {f for r in rounds for f in r.get(model, {})}
        }
        for model in sorted(models, key=lambda m: SMALL.index(m) if m in SMALL else len(SMALL))
    }
    plain = medians.get("plain_gpu", {})
    ratios = {
        model: {figure: value / plain[figure] for figure, value in figures.items() if plain.get(figure)}
        for model, figures in medians.items()
    }
    return {"medians": medians, "ratios": ratios}


def table(results: Dict[str, Any]) -> str:
    """Markdown: what ran where, the answer checks, absolute medians and ratios to the plain model."""
    environment = results["environment"]
    lines = [
        f"Device: {environment['device_name']} (`--device {environment['device']}`), torch {environment['torch']}, "
        f"Python {environment['python']}, {environment['cpus']} CPUs, load average "
        + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in results["load_average"])
        + f"; {results['rounds']} rounds, median. Command: `{results['command']}`.",
        "",
        "| model | answer |",
        "| --- | --- |",
    ]
    lines += [f"| {name} | {'right' if why is None else why} |" for name, why in results["answers"].items()]
    figures = ["http_p50_ms", *(f"http_{size}_mb_s" for size in SIZES)]
    for title, key, form in (("Medians", "medians", "{:.3f}"), ("Ratio to `plain_gpu`", "ratios", "{:.2f}x")):
        lines += ["", f"{title}:", "", "| model | " + " | ".join(figures) + " |"]
        lines.append("| --- | " + " | ".join("---:" for _ in figures) + " |")
        for model, values in results["summary"][key].items():
            cells = [form.format(values[f]) if f in values else "-" for f in figures]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _environment(device: str) -> Dict[str, Any]:
    import torch

    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu"
    return {
        "device": device,
        "device_name": name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
    }


def run(device: str, rounds: int, count: int, progress: Callable[[str], None] = print) -> Dict[str, Any]:
    """Serve the plain models and every kind on ``device``, check the answers, measure ``rounds`` rounds."""
    os.environ[DEVICE_VARIABLE] = device  # before run(): workers and stubs inherit the environment
    http_port, grpc_port, metrics_port = free_ports(3)
    ports = {"http": http_port, "grpc": grpc_port}
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-gpu-") as directory:
        repository = pathlib.Path(directory)
        write_plain_models(repository, device)
        config = TritonConfig(
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, model_repository=repository
        )
        with Triton(config=config) as triton:
            bind_models(triton)
            started = time.monotonic()
            triton.run()
            load_plain_models(http_port, ["plain_gpu", "plain_gpu_large"], triton.get_access_token())
            progress(f"serving after {time.monotonic() - started:.1f} s")
            answers = check_answers(http_port, triton.get_access_token())
            progress("answers: " + json.dumps(answers))
            small = [m for m in SMALL if answers[m] is None]
            large = [m for m in LARGE if answers[m] is None]
            measured, load_average = [], []
            for number in range(rounds):
                before = os.getloadavg()[0]
                measured.append(_round(ports, small, large, count, reverse=bool(number % 2)))
                load_average.append((before, os.getloadavg()[0]))
                progress(f"round {number + 1}/{rounds} done")
    return {
        "command": f"python -m bench.gpu_kinds --device {device} --rounds {rounds} --count {count}",
        "environment": _environment(device),
        "rounds": rounds,
        "load_average": load_average,
        "answers": answers,
        "per_round": measured,
        "summary": summarize(measured),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_kinds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device the callables compute on (default cuda)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=1000, help="sequential small requests per model and round")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    results = run(args.device, max(1, args.rounds), max(1, args.count))
    report.write(args.out, "gpu_kinds", results, table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
