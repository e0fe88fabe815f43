"""pytriton.ray on a local two-node Ray cluster (``ray.cluster_utils.Cluster``, marker ``ray``).

Run with ``make test-ray`` (its own venv with ``ray[serve]``; the default ``make test`` deselects
the marker). Every Ray address is pinned to 127.0.0.1: ``node_ip_address`` for each node and
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (without it Ray 2.60's GCS advertises the machine's
external address). The cluster's processes are ended by ``Cluster.shutdown`` (their own pids),
never by ``ray stop``.

Node layout: the head has ``slot: 1`` and ``head: 2``; each worker ``slot: 1``. A deployment
asking ``slot: 1`` per replica with two replicas is placed on both nodes; one asking ``head: 1``
stays on the head.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.e2e import ray_models

pytestmark = [pytest.mark.ray]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # every address of this node: loopback
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",  # autoscaling reacts in seconds
    "PYTHONPATH": REPO,  # the replicas import tests.e2e.ray_models
}
_NODE = {
    "node_ip_address": "127.0.0.1",
    "object_store_memory": 80 * 1024 * 1024,
    "include_dashboard": False,
    "num_cpus": 2,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Cluster:
    def __init__(self):
        try:
            import ray
            from ray import serve
            from ray.cluster_utils import Cluster
        except ImportError:  # never a silent skip: the marker chose these tests
            pytest.fail("Ray is not installed in this environment: run these tests with `make test-ray`")
        self.ray, self.serve = ray, serve
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(resources={"slot": 1, "head": 2}, **_NODE))
        self.worker = self.cluster.add_node(resources={"slot": 1}, **_NODE)
        ray.init(address=self.cluster.address, logging_level="WARNING")
        self.port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port}, proxy_location="HeadOnly")

    def node_ids(self):
        return {n["NodeID"] for n in self.ray.nodes() if n["Alive"]}

    def running_replicas(self, app: str) -> int:
        status = self.serve.status().applications[app].deployments["PyTriton"]
        return int(status.replica_states.get("RUNNING", 0))

    def close(self):
        try:
            self.serve.shutdown()
        finally:
            self.ray.shutdown()
            self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster():
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(_ENV)
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    made = _Cluster()
    try:
        yield made
    finally:
        made.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _app(cluster, bind, name, **options):
    from pytriton.ray import build_app

    return cluster.serve.run(build_app(bind, **options), name=name, route_prefix=f"/{name}")


def _wheres(handle, want: int, limit: int = 60):
    """Replica descriptions (``where()``) until ``want`` distinct replicas answered (bounded)."""
    seen = {}
    for _ in range(limit):
        entry = handle.where.remote().result(timeout_s=60)
        seen[entry["pid"], entry["node_id"]] = entry
        if len(seen) >= want:
            break
    return list(seen.values())


def _post(url, body, timeout=30):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _tree(roots):
    """The pids of ``roots`` and all their descendants (from /proc)."""
    children = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry))
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return seen


def _non_loopback_sockets(cluster):
    """TCP sockets of the cluster's processes (and their children) on any address but loopback."""
    import re
    import subprocess

    nodes = [cluster.cluster.head_node, *cluster.cluster.worker_nodes]
    roots = [p.process.pid for node in nodes for procs in node.all_processes.values() for p in procs]
    pids = _tree(roots) | {os.getpid()}
    lines = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, check=True).stdout.splitlines()[1:]
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    bad = []
    for line in lines:
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if not owners & pids:
            continue
        fields = line.split()
        local = fields[3].rsplit(":", 1)[0].strip("[]")
        peer = fields[4].rsplit(":", 1)[0].strip("[]")
        if fields[0] == "LISTEN":
            # Ray Serve 2.60 binds each replica's inter-deployment gRPC server on "[::]:0", hard-coded
            # (ray/serve/_private/replica.py): a listener on every address that nothing here dials.
            # A listener on a specific external address would be a leak.
            if local not in loopback and not (local == "*" and "ray::ServeRepli" in line):
                bad.append(line)
        elif local not in loopback or peer not in loopback:
            bad.append(line)  # a connection off loopback
    return bad


def test_replicas_on_both_nodes_answer_by_handle_and_http(cluster):
    from pytriton.ray import max_ongoing_requests_for

    handle = _app(
        cluster,
        ray_models.bind_identity,
        "both",
        num_replicas=2,
        ray_actor_options={"num_cpus": 0, "resources": {"slot": 1}},
    )
    try:
        replicas = _wheres(handle, 2)
        assert {r["node_id"] for r in replicas} == cluster.node_ids()  # one replica on each node
        assert len({r["shm_prefix"] for r in replicas}) == 2
        config = cluster.serve.status().applications["both"].deployments["PyTriton"]
        assert config.status == "HEALTHY"
        assert max_ongoing_requests_for(ray_models.bind_identity) == 16 * 1 * 2

        rng = np.random.default_rng(0)
        for _ in range(8):  # handle path: numpy in, numpy out, bit-exact
            x = rng.standard_normal((3, 5)).astype(np.float32)
            out = handle.infer.remote({"x": x}, "Identity").result(timeout_s=60)
            np.testing.assert_array_equal(out["y"], x)
        out = handle.infer.remote({"x": np.ones((1, 2), np.float32)}).result(timeout_s=60)  # one model: name optional
        np.testing.assert_array_equal(out["y"], np.ones((1, 2), np.float32))

        base = f"http://127.0.0.1:{cluster.port}/both"
        body = {
            "id": "r1",
            "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6.5]}],
        }
        status, answer = _post(f"{base}/v2/models/Identity/infer", body)
        assert status == 200, answer
        assert answer["id"] == "r1" and answer["model_name"] == "Identity"
        assert answer["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6.5]}]
        # Refusals are clear and leave good traffic alone.
        status, answer = _post(f"{base}/v2/models/Nope/infer", body)
        assert status == 404 and "Nope" in answer["error"]
        status, answer = _post(f"{base}/v2/models/Identity/infer", {"inputs": [{"name": "x"}]})
        assert status == 400 and "shape" in answer["error"]
        status, answer = _post(
            f"{base}/v2/models/Identity/infer",
            {"inputs": [{"name": "z", "shape": [1, 1], "datatype": "FP32", "data": [1]}]},
        )
        assert status == 400, answer
        assert "Traceback" not in answer["error"]
        status, answer = _post(f"{base}/v2/models/Identity/infer", body)
        assert status == 200 and answer["outputs"][0]["data"] == [1, 2, 3, 4, 5, 6.5]
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=30) as response:
            assert response.status == 200 and json.loads(response.read()) == {"ready": True}
        with urllib.request.urlopen(f"{base}/v2/models/Identity", timeout=30) as response:
            assert json.loads(response.read())["name"] == "Identity"
        # The cluster, its replicas and the proxy talk over loopback only.
        assert _non_loopback_sockets(cluster) == []
    finally:
        cluster.serve.delete("both")


def test_two_replicas_on_one_node_keep_their_own_shared_memory(cluster):
    handle = _app(
        cluster,
        ray_models.bind_identity,
        "same",
        num_replicas=2,
        ray_actor_options={"num_cpus": 0, "resources": {"head": 1}},
    )
    try:
        replicas = _wheres(handle, 2)
        assert len(replicas) == 2 and len({r["node_id"] for r in replicas}) == 1
        prefixes = [r["shm_prefix"] for r in replicas]
        assert prefixes[0] != prefixes[1]
        regions = os.listdir("/dev/shm")
        for prefix in prefixes:  # each replica's stub made regions under its own prefix
            assert any(name.startswith(prefix) for name in regions), (prefix, sorted(regions)[:20])
        # Both replicas serve concurrent requests bit-exact.
        xs = [np.full((2, 4), i, np.float32) for i in range(24)]
        responses = [handle.infer.remote({"x": x}, "Identity") for x in xs]
        for x, response in zip(xs, responses):
            np.testing.assert_array_equal(response.result(timeout_s=60)["y"], x)
    finally:
        cluster.serve.delete("same")


def _load(handle, stop: threading.Event, threads: int, log: list, lock: threading.Lock, limit_s: float, inflight=None):
    """``threads`` callers, each one request in flight, until ``stop`` (or ``limit_s``).

    ``log`` gets ``(start, end, ok, error)`` per finished request; ``inflight`` (a dict, if given)
    holds the start time of each caller's request while it is in flight.
    """
    inflight = {} if inflight is None else inflight

    def caller(index):
        deadline = time.monotonic() + limit_s
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            x = np.full((1, 4), index * 100000 + n, np.float32)
            started = time.monotonic()
            inflight[index] = started
            try:
                out = handle.infer.remote({"x": x}).result(timeout_s=60)
                ok = bool(np.array_equal(out["y"], x))
                error = None if ok else "wrong data"
            except Exception as exc:  # noqa: BLE001 - every failure counts, whatever its kind
                ok, error = False, type(exc).__name__
            with lock:
                log.append((started, time.monotonic(), ok, error))
                inflight.pop(index, None)
            n += 1

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    return workers


def test_worker_node_killed_under_load_requests_carry_on(cluster, capsys):
    handle = _app(
        cluster,
        ray_models.bind_identity,
        "kill",
        num_replicas=2,
        ray_actor_options={"num_cpus": 0, "resources": {"slot": 1}},
    )
    try:
        replicas = _wheres(handle, 2)
        assert len({r["node_id"] for r in replicas}) == 2
        stop, lock, log, inflight = threading.Event(), threading.Lock(), [], {}
        workers = _load(handle, stop, threads=16, log=log, lock=lock, limit_s=120, inflight=inflight)
        deadline = time.monotonic() + 60
        while len(log) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = len(log)
        assert before >= 200 and all(ok for _, _, ok, _ in log), log[:5]
        killed_at = time.monotonic()
        cluster.cluster.remove_node(cluster.worker, allow_graceful=False)  # SIGKILL of the node's processes
        kill_s = time.monotonic() - killed_at  # how long remove_node itself took

        def settled():  # 300 successes since the kill, 200 requests after the last failure
            with lock:
                entries = list(log)
            last_failure = max([s for s, _, ok, _ in entries if not ok], default=killed_at)
            since_kill = sum(1 for s, _, ok, _ in entries if ok and s > killed_at)
            return since_kill >= 300 and sum(1 for s, _, _, _ in entries if s > last_failure) >= 200

        def finished(snapshot):  # every request in flight at the snapshot has finished
            with lock:
                return all(inflight.get(index) != started for index, started in snapshot.items())

        # Ray's router keeps routing to the dead replica until the controller has seen it die (about
        # 1 s here): wait for that, then for the requests in flight then to finish, then for 200
        # requests after the last failure.
        deadline = time.monotonic() + 90
        while cluster.running_replicas("kill") != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        with lock:
            snapshot = dict(inflight)
        while not (finished(snapshot) and settled()) and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for worker in workers:
            worker.join(timeout=90)
        failed = [entry for entry in log if not entry[2]]
        after_ok = [entry for entry in log if entry[2] and entry[0] > killed_at]
        with capsys.disabled():
            print(
                f"\nkill a worker under load: {len(failed)} failed of {len(log)} requests "
                f"({before} before the kill, {len(after_ok)} succeeded after it; errors: "
                f"{dict(collections.Counter(e[3] for e in failed))}; failed requests started "
                f"{sorted(round((e[0] - killed_at) * 1e3) for e in failed)} ms after remove_node began, "
                f"which returned after {kill_s * 1e3:.0f} ms)"
            )
        assert len(after_ok) >= 300  # requests carry on, on the head's replica
        # Only requests routed to the dead replica fail (in flight there, or sent before the router
        # saw it gone, which took up to about 0.9 s here): at most its max_ongoing_requests (32) at a
        # time, each with a replica-death error.
        assert len(failed) <= 32
        assert {e[3] for e in failed} <= {"ActorUnavailableError", "ActorDiedError", "RayActorError"}, failed
        # Failures stop once the router knows: at least 200 requests after the last one, all served.
        last_failure = max([e[0] for e in failed], default=killed_at)
        later = [e for e in log if e[0] > last_failure]
        assert len(later) >= 200 and all(ok for _, _, ok, _ in later)
        assert handle.where.remote().result(timeout_s=60)["node_id"] in cluster.node_ids()
    finally:
        cluster.serve.delete("kill")
        cluster.worker = cluster.cluster.add_node(resources={"slot": 1}, **_NODE)  # a fresh worker for what follows
        cluster.cluster.wait_for_nodes()


def test_queue_time_autoscaling_scales_up_under_load_and_down_when_idle(cluster, capsys):
    from pytriton.ray import queue_time_autoscaling

    autoscaling = queue_time_autoscaling(
        min_replicas=1,
        max_replicas=2,
        target_queue_ms=5.0,
        upscale_delay_s=1.0,
        downscale_delay_s=2.0,
        look_back_period_s=2.0,
    )
    handle = _app(
        cluster,
        ray_models.bind_slow_identity,
        "auto",
        autoscaling_config=autoscaling,
        ray_actor_options={"num_cpus": 0, "resources": {"head": 1}},
    )
    try:
        assert cluster.running_replicas("auto") == 1
        stop, lock, log = threading.Event(), threading.Lock(), []
        workers = _load(handle, stop, threads=32, log=log, lock=lock, limit_s=150)
        deadline, scaled_up_after = time.monotonic() + 120, None
        started = time.monotonic()
        while time.monotonic() < deadline:
            if cluster.running_replicas("auto") == 2:
                scaled_up_after = time.monotonic() - started
                break
            time.sleep(0.5)
        stop.set()
        for worker in workers:
            worker.join(timeout=90)
        assert scaled_up_after is not None, "no second replica within 120 s of 32 requests in flight"
        assert log and all(ok for _, _, ok, _ in log)
        deadline, scaled_down_after = time.monotonic() + 120, None
        started = time.monotonic()
        while time.monotonic() < deadline:
            if cluster.running_replicas("auto") == 1:
                scaled_down_after = time.monotonic() - started
                break
            time.sleep(0.5)
        assert scaled_down_after is not None, "still two replicas 120 s after the load stopped"
        with capsys.disabled():
            print(
                f"\nqueue-time autoscaling: 1 -> 2 replicas after {scaled_up_after:.1f} s of load, 2 -> 1 after {scaled_down_after:.1f} s idle"
            )
        x = np.ones((1, 4), np.float32)
        np.testing.assert_array_equal(handle.infer.remote({"x": x}).result(timeout_s=60)["y"], x)
    finally:
        cluster.serve.delete("auto")
