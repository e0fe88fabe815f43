"""Unit-test a model with no port: ``Triton(embedded=True)`` serves it inside the test process.

The model code and the ``bind`` call are exactly what a production server would use; only the
``Triton`` is embedded (docs/inprocess.md, "Embedded Triton"): no ``tritonserver`` process, no port
to pick, no network. Requests still go through Triton itself (its dynamic batcher, its checks of
names, dtypes and shapes) and through pytriton's proxy to the callable.

Run with ``python examples/embedded_unit_test.py`` (after ``pytriton install-server``), or let
pytest or unittest collect ``ClassifierTest``.
"""

from __future__ import annotations

import sys
import unittest

import numpy as np

import pytriton.inprocess as tritonserver
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def classify(logits):
    """The model under test: softmax probabilities and the most likely class of each row."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    return {"probabilities": probabilities.astype(np.float32), "label": probabilities.argmax(axis=1)[:, None]}


def bind_models(triton: Triton) -> None:
    """Shared by the production entry point and the tests."""
    triton.bind(
        "Classifier",
        classify,
        inputs=[Tensor(name="logits", shape=(-1,), dtype=np.float32)],
        outputs=[
            Tensor(name="probabilities", shape=(-1,), dtype=np.float32),
            Tensor(name="label", shape=(1,), dtype=np.int64),
        ],
        config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=100)),
    )


class ClassifierTest(unittest.TestCase):
    """One embedded Triton for the whole class: starting one takes well under a second here."""

    triton: Triton

    @classmethod
    def setUpClass(cls) -> None:
        cls.triton = Triton(embedded=True)
        bind_models(cls.triton)
        cls.triton.run()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.triton.stop()  # no stub process, shared-memory segment or directory is left

    def test_probabilities_sum_to_one_and_the_label_is_the_largest_logit(self) -> None:
        with self.triton.client("Classifier") as client:  # ModelClient's infer_sample / infer_batch
            result = client.infer_sample(np.array([0.5, 3.0, -1.0], dtype=np.float32))
        self.assertAlmostEqual(float(result["probabilities"].sum()), 1.0, places=5)
        self.assertEqual(int(result["label"][0]), 1)

    def test_a_batch_gets_one_answer_per_row(self) -> None:
        logits = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.5]], dtype=np.float32)
        result = self.triton.client("Classifier").infer_batch(logits)
        self.assertEqual(result["label"].ravel().tolist(), [0, 1, 1])

    def test_a_wrong_dtype_is_refused_by_triton(self) -> None:
        with self.assertRaisesRegex(tritonserver.InvalidArgumentError, "data-type"):
            self.triton.client("Classifier").infer_sample(np.array([0.5, 3.0], dtype=np.float64))


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ClassifierTest)
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    passed = result.testsRun - len(result.failures) - len(result.errors)
    print(f"{passed} of {result.testsRun} model tests passed, with no port")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
