"""End to end: the arenas give their memory back after a large request, once the instance is idle.

The Python backend's regions are recycled for a model on each instance kind; the arenas are those
of thread (and process) instances: a backend instance has none.
"""

from __future__ import annotations

import os

import numpy as np
import tritonclient.grpc as grpcclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.stubside import _arena
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e._kinds import KINDS, bind_kinds, model
from tests.e2e.kind_models import fresh_copy

MIB = 1 << 20


def _shared_mib(pid: int) -> float:
    """Shared-memory pages mapped into ``pid`` (RssShmem), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssShmem line")


def test_arena_memory_returns_after_a_large_request():
    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        triton.bind(
            "Copy",
            fresh_copy,
            [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
            [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
            config=ModelConfig(max_batch_size=1),
        )
        triton.run()
        before = _shared_mib(os.getpid())
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
        try:
            x = np.random.default_rng(5).integers(0, 255, size=(1, 96 * MIB), dtype=np.uint8)
            tensor = grpcclient.InferInput("x", list(x.shape), "UINT8")
            tensor.set_data_from_numpy(x)
            assert np.array_equal(client.infer("Copy", [tensor]).as_numpy("x"), x)
            # This process read the input from the stub's arena and wrote the output into its own:
            # both are mapped here, so they show in this process's shared memory.
            after = _shared_mib(os.getpid())
            assert after - before > 150, (before, after)
            # Once the instance has been idle for RELEASE_IDLE_S, each arena keeps RELEASE_KEEP at most.
            keep = 2 * _arena.RELEASE_KEEP / MIB
            assert wait_for(lambda: _shared_mib(os.getpid()) <= before + keep + 4, timeout_s=30, interval_s=0.2), (
                before,
                _shared_mib(os.getpid()),
            )
            # The arenas still work, at full size, after giving their memory back.
            assert np.array_equal(client.infer("Copy", [tensor]).as_numpy("x"), x)
        finally:
            client.close()


def _backend_region_kib(prefix: str) -> int:
    """Resident KiB of every Python-backend region of one ``Triton`` (allocated blocks)."""
    return sum(
        os.stat(os.path.join("/dev/shm", name)).st_blocks // 2
        for name in os.listdir("/dev/shm")
        if name.startswith(prefix)
    )


def test_grown_backend_regions_are_recycled_once_the_model_is_idle(caplog):
    # The model on each instance kind (tests/e2e/_kinds.py) in one server: each grows its regions
    # and is reloaded once idle (a backend instance's callable is unpickled again by its new stub).
    ports = triton_ports()
    config = TritonConfig(python_backend_shm_recycle_idle_secs=1, **ports)
    with Triton(config=config) as triton:
        bind_kinds(
            triton,
            "Copy",
            [fresh_copy, fresh_copy],
            [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
            [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
            config=ModelConfig(max_batch_size=1),
        )
        triton.run()
        prefix = f"{triton._shm_prefix}-pb"
        before = _backend_region_kib(prefix)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
        try:
            x = np.random.default_rng(6).integers(0, 255, size=(1, 48 * MIB), dtype=np.uint8)
            tensor = grpcclient.InferInput("x", list(x.shape), "UINT8")
            tensor.set_data_from_numpy(x)
            with caplog.at_level("INFO", logger="pytriton._serving.supervisor"):
                for kind in KINDS:
                    assert np.array_equal(client.infer(model("Copy", kind), [tensor]).as_numpy("x"), x), kind
                grown = _backend_region_kib(prefix)
                assert grown - before > 2 * 64 * 1024, (before, grown)  # inputs and outputs passed through them
                # Once idle, the models are reloaded: new stubs, new small regions, the grown ones removed.
                assert wait_for(lambda: _backend_region_kib(prefix) <= before * 1.2, timeout_s=60, interval_s=0.2), (
                    before,
                    _backend_region_kib(prefix),
                )
            given_back = [record.getMessage() for record in caplog.records if "to give it back" in record.getMessage()]
            assert all(any(f"Model {model('Copy', kind)}:" in text for text in given_back) for kind in KINDS), (
                given_back
            )
            # The models serve on, bit-exact, from their new instances.
            small = x[:, : 4 * MIB]
            tensor = grpcclient.InferInput("x", list(small.shape), "UINT8")
            tensor.set_data_from_numpy(small)
            for _ in range(4):
                for kind in KINDS:
                    assert np.array_equal(client.infer(model("Copy", kind), [tensor]).as_numpy("x"), small), kind
            assert triton.is_alive()
        finally:
            client.close()
