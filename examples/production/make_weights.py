"""Train the example's classifier and write ``weights.npz`` (the file ``server.py`` loads).

Stands in for your training run: the data are three clusters of four flower measurements (means
like the Iris species'), drawn from a fixed seed, so the file is the same every time::

    python examples/production/make_weights.py     # writes examples/production/weights.npz

The weights are saved as a state dict (parameter name -> array) in ``.npz``, which loads without
pickle; with PyTorch, ``torch.save(model.state_dict(), path)`` and ``torch.load(path,
weights_only=True)`` play the same part.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from server import LABELS, WEIGHTS, Classifier  # noqa: E402  (the model class lives with the server)

MEANS = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]], dtype=np.float32)
SPREAD = np.array([0.35, 0.35, 0.2, 0.1], dtype=np.float32)


def data(rng: np.random.Generator, per_class: int = 200) -> tuple[np.ndarray, np.ndarray]:
    labels = np.repeat(np.arange(len(LABELS)), per_class)
    features = MEANS[labels] + rng.normal(size=(labels.size, 4)).astype(np.float32) * SPREAD
    return features.astype(np.float32), labels


def train(steps: int = 1500, learning_rate: float = 0.1) -> Classifier:
    """Full-batch gradient descent on the cross-entropy, the backward pass written out by hand."""
    rng = np.random.default_rng(0)
    model = Classifier()
    state = model.state_dict()
    for value in state.values():  # weights ~ N(0, 1/fan_in), biases 0
        value[...] = rng.normal(size=value.shape) / np.sqrt(value.shape[-1]) if value.ndim == 2 else 0.0
    features, labels = data(rng)
    onehot = np.eye(len(LABELS), dtype=np.float32)[labels]
    for _ in range(steps):
        hidden = np.maximum(model.hidden(features), 0.0)
        grad_logits = (model(features) - onehot) / len(labels)  # d(cross-entropy)/d(logits)
        grad_hidden = (grad_logits @ model.out.weight) * (hidden > 0)
        state["out.weight"] -= learning_rate * grad_logits.T @ hidden
        state["out.bias"] -= learning_rate * grad_logits.sum(axis=0)
        state["hidden.weight"] -= learning_rate * grad_hidden.T @ features
        state["hidden.bias"] -= learning_rate * grad_hidden.sum(axis=0)
    test_features, test_labels = data(np.random.default_rng(1), per_class=100)
    accuracy = float((model.eval()(test_features).argmax(axis=1) == test_labels).mean())
    print(f"held-out accuracy {accuracy:.3f}")
    return model


def main() -> None:
    model = train()
    np.savez(WEIGHTS, **{name: value.astype(np.float32) for name, value in model.state_dict().items()})
    print(f"wrote {WEIGHTS}")


if __name__ == "__main__":
    main()
