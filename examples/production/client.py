"""Call the production example's ``Classifier`` from another process (start ``server.py`` first).

    python examples/production/client.py                              # http://127.0.0.1:8000
    python examples/production/client.py --url grpc://127.0.0.1:8001  # the same over gRPC

Sends one batch of three flowers and prints the predicted species of each. Needs only the client
side of pytriton (``pytriton.client``), not the server.
"""

from __future__ import annotations

import argparse

import numpy as np

from pytriton.client import ModelClient

LABELS = ("setosa", "versicolor", "virginica")  # the server's output classes, in order

FLOWERS = np.array(
    [
        [5.1, 3.5, 1.4, 0.2],
        [6.0, 2.9, 4.5, 1.4],
        [6.8, 3.1, 5.8, 2.2],
    ],
    dtype=np.float32,
)


def main() -> None:
    parser = argparse.ArgumentParser(description="Classify three flowers with the served model.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's HTTP or gRPC URL")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the server to be ready")
    args = parser.parse_args()
    # One client per process, reused for every request (it keeps its connection open).
    with ModelClient(args.url, "Classifier", init_timeout_s=args.timeout) as client:
        result = client.infer_batch(features=FLOWERS)  # batch-first: one row per flower
    for flower, label, probabilities in zip(FLOWERS, result["label"][:, 0], result["probabilities"]):
        print(f"{flower} -> {LABELS[label]} (p={probabilities[label]:.2f})")


if __name__ == "__main__":
    main()
