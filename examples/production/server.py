"""The production pattern in one file: a PyTorch-style model, its weights loaded once, served by ``serve()``.

Run it, then call it from another shell with ``client.py`` or curl (README.md beside this file)::

    pytriton serve server:create_app --app-dir examples/production     # HTTP 8000, gRPC 8001, metrics 8002
    pytriton serve server:create_app --app-dir examples/production --http-port 9000
    python examples/production/server.py --http-port 9000               # the same, without the command

The model is written the way a PyTorch model is (a module class with ``forward``, a state dict read
from a file, ``eval()``, inference without gradients, batch-first tensors), in numpy so that the
example needs no multi-gigabyte download. With PyTorch the same file changes in the four places
marked ``torch:`` below. The weights (``weights.npz``, made by ``make_weights.py``) stand in for
yours.

The same file is what the container image in ``deploy/`` serves (docs/deployment.md): everything
deployment-specific comes from the command line or the environment:

* ``PYTRITON_TRITON_CONFIG_*``: any ``TritonConfig`` field, the ports and addresses included
  (``--http-port`` and friends win over them);
* ``MODEL_WEIGHTS``: the weights file (default: ``weights.npz`` next to this file);
* ``SERVER_WORKSPACE``: where the server writes its model repository (the image: ``/workspace``);
* ``SERVER_ACCESS_TOKEN``: the token the management endpoints require; unset: a random one only
  this process knows.

``SIGINT`` (Ctrl-C) or ``SIGTERM`` stops it: requests in flight finish (at most
``exit_timeout_secs``), then the server and everything it made are removed; exit status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pathlib
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

MODEL_NAME = "Classifier"
LABELS = ("setosa", "versicolor", "virginica")  # what the three output classes mean
WEIGHTS = pathlib.Path(__file__).with_name("weights.npz")

# torch: `no_grad = torch.inference_mode` (no autograd bookkeeping while serving).
no_grad = contextlib.nullcontext


# torch: delete Module and Linear, and use torch.nn.Module and torch.nn.Linear instead.
class Module:
    """The part of ``torch.nn.Module`` this example uses: parameters by name, ``eval()``, ``__call__``."""

    def __init__(self) -> None:
        self.training = True
        self._parameters: Dict[str, np.ndarray] = {}
        self._modules: Dict[str, Module] = {}

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, np.ndarray):
            self._parameters[name] = value
        super().__setattr__(name, value)

    def state_dict(self, prefix: str = "") -> Dict[str, np.ndarray]:
        state = {prefix + name: value for name, value in self._parameters.items()}
        for name, module in self._modules.items():
            state.update(module.state_dict(f"{prefix}{name}."))
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy ``state`` into the parameters; names and shapes must match exactly (as torch's strict mode)."""
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
        for name, value in state.items():
            if value.shape != own[name].shape:
                raise ValueError(f"weights do not fit the model: {name} has shape {value.shape}, not {own[name].shape}")
            own[name][...] = value  # in place, as torch does: the modules hold these very arrays

    def eval(self) -> Module:
        self.training = False
        for module in self._modules.values():
            module.eval()
        return self

    def forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)


class Linear(Module):
    """``y = x @ weight.T + bias``, with torch's parameter names and shapes."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = np.zeros((out_features, in_features), dtype=np.float32)
        self.bias = np.zeros((out_features,), dtype=np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight.T + self.bias


class Classifier(Module):
    """Four measurements of a flower in, the probabilities of its three species out; batch-first."""

    def __init__(self, features: int = 4, hidden: int = 16, classes: int = len(LABELS)) -> None:
        super().__init__()
        self.hidden = Linear(features, hidden)
        self.out = Linear(hidden, classes)

    def forward(self, x: np.ndarray) -> np.ndarray:
        logits = self.out(np.maximum(self.hidden(x), 0.0))
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        return exp / exp.sum(axis=1, keepdims=True)


def load_model(path: pathlib.Path = WEIGHTS) -> Classifier:
    """The model with its trained weights, ready for inference; raises if the file is missing or does not fit."""
    if not path.is_file():
        raise FileNotFoundError(f"model weights not found at {path}: set MODEL_WEIGHTS or run make_weights.py")
    model = Classifier()
    # torch: `model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))`
    with np.load(path, allow_pickle=False) as state:
        model.load_state_dict({name: state[name] for name in state.files})
    return model.eval()


def make_infer_func(model: Classifier) -> Callable[..., Any]:
    """The callable Triton calls with whole batches: ``features`` [N, 4] in, two outputs of N rows each."""

    @batch
    def infer(features: np.ndarray) -> Dict[str, np.ndarray]:
        # torch: `torch.from_numpy(features)` in, `.numpy()` out (or `.to("cuda")` and back on a GPU).
        with no_grad():
            probabilities = model(features).astype(np.float32)
        return {"probabilities": probabilities, "label": probabilities.argmax(axis=1)[:, None].astype(np.int64)}

    return infer


def bind(triton: Triton, model: Classifier) -> None:
    triton.bind(
        model_name=MODEL_NAME,
        infer_func=make_infer_func(model),
        inputs=[Tensor(name="features", shape=(4,), dtype=np.float32)],
        outputs=[
            Tensor(name="probabilities", shape=(len(LABELS),), dtype=np.float32),
            Tensor(name="label", shape=(1,), dtype=np.int64),
        ],
        config=ModelConfig(max_batch_size=64),
    )


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Serve the example classifier until SIGINT or SIGTERM.")
    parser.add_argument("--address", help="address of all three endpoints (default 0.0.0.0, every interface)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8000)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 8001)")
    parser.add_argument("--metrics-port", type=int, help="metrics port (default 8002)")
    parser.add_argument("--weights", type=pathlib.Path, help=f"weights file (default {WEIGHTS.name} next to this file)")
    return parser.parse_args(argv)


def server_config(environ: Optional[Mapping[str, str]] = None, args: Sequence[str] = ()) -> TritonConfig:
    """``PYTRITON_TRITON_CONFIG_*`` from ``environ`` (default: this process's), overridden by ``args``."""
    parsed = _parse_args(list(args))
    config = TritonConfig.from_env(environ).to_dict()
    explicit = {
        "http_port": parsed.http_port,
        "grpc_port": parsed.grpc_port,
        "metrics_port": parsed.metrics_port,
        **{f"{name}_address": parsed.address for name in ("http", "grpc", "metrics")},
    }
    config.update({name: value for name, value in explicit.items() if value is not None})
    return TritonConfig(**{name: value for name, value in config.items() if value is not None})


def security_config(environ: Optional[Mapping[str, str]] = None) -> TritonSecurityConfig:
    """Management endpoints need a token: ``SERVER_ACCESS_TOKEN`` if set, else a random one."""
    environ = os.environ if environ is None else environ
    return TritonSecurityConfig(access_token=environ.get("SERVER_ACCESS_TOKEN") or None)


def create_app(argv: Sequence[str] = ()) -> Triton:
    """The server with the model bound, not yet running: what ``pytriton serve server:create_app`` serves.

    ``argv``: this file's own options (``main``); ``pytriton serve`` passes none, its options arrive
    as ``PYTRITON_TRITON_CONFIG_*`` variables.
    """
    args = _parse_args(list(argv))
    weights = args.weights or pathlib.Path(os.environ.get("MODEL_WEIGHTS") or WEIGHTS)
    model = load_model(weights)  # once, before the server starts: a bad file fails here, not per request
    workspace = os.environ.get("SERVER_WORKSPACE") or None
    triton = Triton(config=server_config(args=argv), security_config=security_config(), workspace=workspace)
    bind(triton, model)
    return triton


def main(argv: Optional[List[str]] = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    with create_app(argv) as triton:
        # Blocks until SIGINT/SIGTERM, then drains requests in flight and stops; an unrecoverable
        # server failure raises (exit status 1).
        triton.serve()


if __name__ == "__main__":
    main()
