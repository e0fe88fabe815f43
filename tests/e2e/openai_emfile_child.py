"""Helper process for issue 42's scenario (tests/e2e/test_supervisor.py): a ``Triton`` with an ``OpenAIFrontend``.

Arguments: ``HTTP GRPC METRICS``. Serves examples/openai_chat.py's models through the frontend on a
free port, prints one JSON line (the frontend's port, this process's ``RLIMIT_NOFILE`` after
``run()``, the server pid) and then ``serve()``s; ``served`` once ``serve()`` returned. The test
starts it with the descriptor limits of the case it checks (a systemd service's soft 1024).
"""

import json
import pathlib
import resource
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[2]))  # the repository root: examples/ is not installed

from examples.openai_chat import bind_models  # noqa: E402
from pytriton.openai import OpenAIFrontend  # noqa: E402
from pytriton.triton import Triton, TritonConfig  # noqa: E402


def main() -> None:
    http, grpc, metrics = (int(value) for value in sys.argv[1:4])
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    models = bind_models(triton)
    triton.run()
    with OpenAIFrontend(triton, models, port=0) as frontend:
        info = {
            "frontend_port": frontend.port,
            "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
            "server_pid": triton._backend.server.pid,
        }
        print(json.dumps(info), flush=True)
        triton.serve(monitoring_period_sec=0.2)
    print("served", flush=True)


if __name__ == "__main__":
    main()
