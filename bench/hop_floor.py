"""The floor of the thread kind's hop: what a request costs when your process does no work at all.

Usage::

    python -m bench.hop_floor [COUNT] [ROUNDS]

Issue 30 asks thread instances for a sequential p50 within 1.2x of a plain Python-backend model.
A thread instance's callable runs in your process, so each batch crosses from the stub to that
process and back. This script asks how much of the ratio is that crossing alone. One server serves:

- ``thread``: the ``[1,16]`` float32 identity as a thread instance (``bench.models.bind_identity``);
- ``thread_prepared``: the same binding, but its worker answers every batch after the first with
  the reply it built for the first one: no decoding into ``Request`` objects, no callable, no
  encoding. What is left is the hop itself (the stub's message, two socket hand-offs, the wake-ups
  of both processes) and the stub's own work, which is the least any cross-process design pays;
- ``plain_identity``: the plain Python-backend identity, the baseline.

One client process measures the three in alternating blocks of 50 sequential HTTP requests
(``bench.load.latency_interleaved``), COUNT requests each (default 3000), ROUNDS times (default 3).
Before and after, ``bench.host.probe`` measures the bare wake-up round trip between two processes
on different CPUs after 500 us idle, the cost a hop cannot avoid on this host. The script prints
each round's p50 and ratio, their medians, and the 1.2x budget in microseconds against that round
trip, and writes ``bench/results/hop_floor.json``.

Only this script's process is changed, and only while it runs: the prepared reply replaces
``InstanceWorker._infer_on`` for the ``thread_prepared`` model, and is put back at the end.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
from typing import Any, Dict, Iterator, List

from bench import ab, host
from bench.__main__ import ROOT, load, load_plain_models
from bench.models import bind_identity
from pytriton.proxy import _worker

PREPARED = "thread_prepared"
MODELS = ["thread", PREPARED, "plain_identity"]


@contextlib.contextmanager
def _prepared_replies() -> Iterator[Dict[str, Any]]:
    """While inside, the ``thread_prepared`` worker answers each batch with its first batch's reply.

    Yields a dict whose ``"reply"`` is that reply once built (the caller checks it was used).
    """
    real = _worker.InstanceWorker._infer_on
    prepared: Dict[str, Any] = {}

    def infer_on(self: _worker.InstanceWorker, session: Any, message: Any) -> Any:
        if self._config.model_name != PREPARED:
            return real(self, session, message)
        if "reply" not in prepared:  # the first batch runs for real (the [1,16] reply is inline)
            prepared["reply"] = real(self, session, message)
        return prepared["reply"]

    _worker.InstanceWorker._infer_on = infer_on  # type: ignore[method-assign]
    try:
        yield prepared
    finally:
        _worker.InstanceWorker._infer_on = real  # type: ignore[method-assign]


def run(count: int = 3000, rounds: int = 3) -> Dict[str, Any]:
    """Measure the three models in ``rounds`` rounds; returns each round's p50s and ratios, and their medians."""
    probes = [host.probe()]
    per_round: List[Dict[str, Any]] = []
    with _prepared_replies() as prepared:
        with ab._served({"thread": {}, PREPARED: {}}, bind_identity, plain=True) as (triton, http_port, _):
            load_plain_models(http_port, ["plain_identity"], triton.get_access_token())
            for _ in range(rounds):
                measured = load(
                    {"scenario": "latency_interleaved", "protocol": "http", "port": http_port, "models": MODELS,
                     "count": count, "max_s": 300.0},
                    timeout_s=400.0,
                )  # fmt: skip
                baseline = measured["plain_identity"]["p50_ms"]
                per_round.append(
                    {name: {"p50_us": measured[name]["p50_ms"] * 1000, "ratio": measured[name]["p50_ms"] / baseline}
                     for name in MODELS}
                )  # fmt: skip
        if "reply" not in prepared:
            raise RuntimeError("the prepared-reply model never answered: nothing was measured for it")
    probes.append(host.probe())
    medians = {
        name: {key: statistics.median(row[name][key] for row in per_round) for key in ("p50_us", "ratio")}
        for name in MODELS
    }
    wake = [probe["wake_rtt_us"] for probe in probes if probe.get("wake_rtt_us") is not None]
    return {
        "count": count,
        "rounds": per_round,
        "median": medians,
        "budget_1_2x_us": 0.2 * medians["plain_identity"]["p50_us"],
        "wake_rtt_us": wake,
        "host": probes,
    }


def main() -> int:
    arguments = sys.argv[1:]
    if arguments and arguments[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    count = int(arguments[0]) if arguments else 3000
    rounds = int(arguments[1]) if len(arguments) > 1 else 3
    result = run(count, rounds)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "hop_floor.json").write_text(json.dumps(result, indent=2))
    print(f"{'round':>5s} " + " ".join(f"{name + ' p50 us':>22s} {'ratio':>6s}" for name in MODELS))
    for number, row in enumerate(result["rounds"]):
        print(f"{number:5d} " + " ".join(f"{row[name]['p50_us']:22.0f} {row[name]['ratio']:6.2f}" for name in MODELS))
    median = result["median"]
    print("  med " + " ".join(f"{median[name]['p50_us']:22.0f} {median[name]['ratio']:6.2f}" for name in MODELS))
    wake = ", ".join(f"{value:.0f}" for value in result["wake_rtt_us"]) or "not measured"
    print(
        f"1.2x of the plain p50 leaves {result['budget_1_2x_us']:.0f} us for the proxy; a bare cross-CPU "
        f"wake-up round trip between two processes on this host (before, after): {wake} us"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
