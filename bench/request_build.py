"""What building one ``Request`` costs: ``Request.__init__`` against pytriton's own builder.

Usage: ``python -m bench.request_build [--count N]``. Prints, for each way, the time per request
warm (``timeit``, the best of 5 loops of 20,000) and cold (the median of ``N`` single builds, each
after 8 MiB of memory was touched so that the caches hold none of it, as in the stub and the worker,
which run with caches that the server and the client evicted since the last request).

The ways: ``Request(...)`` (what a callable or a test writes), ``types._wire_request`` (what every
pytriton path uses, issue 43 item 5) and ``types._fill`` alone on a bare object (the one place the
slots are written; the builder is this plus one call). No server, no files; a few seconds.
"""

from __future__ import annotations

import argparse
import time
import timeit
from typing import Callable, Dict, List, Optional

import numpy as np
import numpy.typing as npt

from pytriton.proxy import types
from pytriton.proxy.types import Request

_EVICT = np.zeros(8 << 20, np.uint8)


def _cold_ns(build: Callable[[], object], count: int) -> float:
    """The median time of ``count`` single builds, each after the caches were filled with other data."""
    times: List[int] = []
    for _ in range(count):
        _EVICT[::64] += 1  # one byte per cache line of 8 MiB: more than the last-level cache here
        started = time.perf_counter_ns()
        build()
        times.append(time.perf_counter_ns() - started)
    times.sort()
    return float(times[len(times) // 2])


def measure(count: int) -> Dict[str, Dict[str, float]]:
    """Warm and cold nanoseconds per request for each way of building one."""
    data: Dict[str, npt.NDArray[np.generic]] = {"INPUT": np.zeros(16, np.float32)}

    def fill_only() -> None:
        types._fill(types._new_object(Request), data, None, None, None, None, 0)

    ways: Dict[str, Callable[[], object]] = {
        "Request.__init__": lambda: Request(data, None, requested_output_names=None, timeout_s=None),
        "_wire_request": lambda: types._wire_request(data, None, None, None, None, 0),
        "_fill on a bare object": fill_only,
    }
    results: Dict[str, Dict[str, float]] = {}
    for name, build in ways.items():
        warm = min(timeit.repeat(build, number=20000, repeat=5)) / 20000 * 1e9
        results[name] = {"warm_ns": warm, "cold_ns": _cold_ns(build, count)}
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000, help="cold builds per way (default 3000)")
    args = parser.parse_args(argv)
    for name, figures in measure(max(1, args.count)).items():
        print(f"{name:24s} warm {figures['warm_ns']:6.0f} ns   cold (median) {figures['cold_ns']:6.0f} ns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
