"""Process instances through their seams, no server: pytriton/proxy/_process.py and _process_child.py.

Pickling is checked in this process (round trips, the errors bind() raises). ``ProcessInstance`` is
driven by a fake stub over the slot's real Unix socket: it starts real worker processes, which
must serve, forward their logs and events, survive nothing they should not, be replaced after a
crash and leave no process or segment behind.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from pytriton.decorators import TritonContext, batch
from pytriton.exceptions import PyTritonBadParameterError, PyTritonUnrecoverableError
from pytriton.model_config.tensor import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _process
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy.stubside import _arena, _messages, _tensors, _wire
from pytriton.proxy.types import Request
from tests.conftest import shm_entries, wait_for
from tests.unit import process_callables as calls

TIMEOUT_S = 60


def _requests(*values):
    return [Request({"k": np.array([[value]], dtype=np.int32)}) for value in values]


def _round_trip(func, context=None):
    return _process.load_callable(_process.dump_callable(func, "Unit", 0), context or TritonContext())


# -- pickling ------------------------------------------------------------------------------------
def test_module_level_functions_and_decorated_functions_travel_by_name():
    assert _round_trip(calls.echo) is calls.echo
    assert _round_trip(calls.doubled) is calls.doubled  # a wrapt wrapper: pickled by name
    assert _round_trip(calls.needs_the_model_config) is calls.needs_the_model_config


def test_objects_decorated_methods_partials_and_bind_time_decorators_travel_by_value():
    counter = calls.Counter(10)
    counter.calls = 2
    copy = _round_trip(counter)
    assert type(copy) is calls.Counter and copy is not counter and (copy.start, copy.calls) == (10, 2)
    method = _round_trip(counter.infer)  # a decorated method: getattr(copy of the object, "infer")
    assert method(_requests(1))[0]["y"].tolist() == [[13]]
    wrapped = _round_trip(batch(calls.Offset(100)))  # a decorator applied at bind time
    assert wrapped(_requests(1))[0]["y"].tolist() == [[101]]
    partial = _round_trip(functools.partial(calls.doubled))
    assert partial(_requests(4))[0]["y"].tolist() == [[8]]


def test_the_triton_context_is_left_out_and_replaced():
    counter = calls.Counter(0)
    counter.__triton_context__ = TritonContext()  # what bind() attaches in the user's process
    mine = TritonContext()
    assert _round_trip(counter, mine).__triton_context__ is mine


def test_what_cannot_travel_is_refused_with_the_fix():
    factor = 2

    def closure(requests):
        return requests * factor

    class Holder:
        def __init__(self):
            self.lock = threading.Lock()

        def infer(self, requests):
            return requests

    for func in (lambda requests: requests, closure, Holder().infer):
        with pytest.raises(PyTritonBadParameterError) as refused:
            _process.dump_callable(func, "Unit", 1)
        message = str(refused.value)
        assert "Model 'Unit'" in message and "instance 1" in message and "cannot be pickled" in message
        assert "at module level" in message and "instance_kind='thread'" in message


def test_a_function_of_an_unimportable_main_module_is_refused(monkeypatch):
    main = types.ModuleType("__main__")  # an interactive session: no __file__, no __spec__

    def infer(requests):
        return requests

    infer.__module__, infer.__qualname__ = "__main__", "infer"
    main.infer = infer
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(PyTritonBadParameterError, match="interactive session or 'python -c'.*move it to a module"):
        _process.dump_callable(infer, "Unit", 0)


def test_the_main_module_is_run_in_the_worker_only_for_a_callable_that_refers_to_it(monkeypatch, tmp_path):
    script = tmp_path / "serve.py"
    script.write_text("def infer(requests):\n    return requests\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    exec(compile(script.read_text(), str(script), "exec"), main.__dict__)  # noqa: S102 - the script, as __main__
    main.infer.__module__ = "__main__"
    monkeypatch.setitem(sys.modules, "__main__", main)
    from_main = _process.dump_callable(main.infer, "Unit", 0)
    from_module = _process.dump_callable(calls.echo, "Unit", 0)
    holding_main = _process.dump_callable(functools.partial(calls.Offset, main.infer), "Unit", 0)
    assert _process.preparation_data([from_main])["init_main_from_path"] == str(script)
    assert _process.preparation_data([from_module, holding_main])["init_main_from_path"] == str(script)
    prepared = _process.preparation_data([from_module])
    assert not any(key.startswith("init_main_from_") for key in prepared)  # the script is not run again
    assert prepared["sys_path"] and prepared["dir"] == os.getcwd()  # imports still resolve as here


def test_instance_kind_is_checked():
    assert _process.check_instance_kind("process", "Unit") == "process"
    with pytest.raises(PyTritonBadParameterError, match="instance_kind must be 'thread'.*or 'process'"):
        _process.check_instance_kind("processes", "Unit")


def test_the_status_page_round_trips():
    status = _process.Status.create()
    try:
        assert status.read() == (False, False, False, 0, 0.0)
        status.write(True, True, False, 1234, 5.5)
        assert status.read() == (True, True, False, 1234, 5.5)
    finally:
        status.close()
    assert status.read() == (False, False, False, 0, 0.0)


# -- a ProcessInstance and its worker processes, driven by a fake stub ----------------------------
def _config(decoupled=False):
    return TritonModelConfig(
        model_name="Unit",
        batching=True,
        max_batch_size=4,
        decoupled=decoupled,
        inputs=_resolve_tensors([Tensor(name="k", shape=(1,), dtype=np.int32)], "INPUT", "Unit"),
        outputs=_resolve_tensors([Tensor(name="y", shape=(1,), dtype=np.int32)], "OUTPUT", "Unit"),
    )


class Events:
    def __init__(self):
        self.lost = []
        self.unrecoverable = []


@pytest.fixture()
def make_instance(tmp_path):
    instances = []
    prefix = f"pytriton-{os.getpid()}-unit{secrets.token_hex(3)}"

    def make(func, payload=None, launch_only=False):
        events = Events()
        instance = _process.ProcessInstance(
            path=str(tmp_path / f"slot-{len(instances)}.sock"),
            payload=payload if payload is not None else _process.dump_callable(func, "Unit", 0),
            config=_config(),
            strict=False,
            shm_prefix=f"{prefix}-w{len(instances)}",
            on_unrecoverable=events.unrecoverable.append,
            name=f"Unit-{len(instances)}",
            on_stub_lost=lambda generation, server_pid: events.lost.append((generation, server_pid)),
        )
        instances.append(instance)
        instance.launch()
        if not launch_only:
            instance.wait_ready()
        return instance, events

    yield make
    pids = []
    for instance in instances:
        pids.append(instance.pid)
        instance.stop()
    assert not any(pid is not None and _running(pid) for pid in pids), "a worker process was left behind"
    assert not shm_entries(prefix)


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


class FakeStub:
    """One connection to the instance's socket, as the stub makes it (hello, infer, bye)."""

    def __init__(self, instance, pid=None, generation=0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(instance._path)
        self.channel = _wire.SocketChannel(self.sock)
        self.channel.send(_messages.Hello(os.getpid() if pid is None else pid, generation))
        assert type(self.channel.recv()) is _messages.Welcome
        self.arena = _arena.SharedArena(f"pytriton-{os.getpid()}-unitstub{secrets.token_hex(3)}")

    def infer(self, value):
        segment, metas = _tensors.write_tensors(self.arena, [[("k", np.array([[value]], np.int32))]])
        self.channel.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
        return self.channel.recv()

    def close(self):
        self.sock.close()
        self.arena.close()


def _value(reply):
    assert type(reply) is _messages.Ok, reply
    return int(np.frombuffer(reply.results[0][0].data, dtype=np.int32)[0])


def test_a_worker_process_serves_and_publishes_its_state(make_instance):
    instance, _ = make_instance(calls.pid)
    assert instance.pid not in (None, os.getpid()) and not instance.connected and not instance.busy
    stub = FakeStub(instance)
    try:
        assert wait_for(lambda: instance.connected, 10)
        assert _value(stub.infer(0)) == instance.pid
        assert instance.last_active > 0 and not instance.busy
    finally:
        stub.close()


def test_decorators_find_the_model_config_in_the_worker_process(make_instance):
    instance, _ = make_instance(calls.needs_the_model_config)
    stub = FakeStub(instance)
    try:
        assert _value(stub.infer(6)) == 6
    finally:
        stub.close()


def test_log_records_and_unrecoverable_errors_reach_the_parent(make_instance, caplog):
    caplog.set_level(logging.INFO)
    instance, events = make_instance(calls.echo)
    stub = FakeStub(instance)
    try:
        assert _value(stub.infer(-2)) == -2
        reply = stub.infer(-3)
        assert type(reply) is _messages.Error and "cannot go on" in reply.text
    finally:
        stub.close()
    assert wait_for(lambda: events.unrecoverable, 10)
    assert isinstance(events.unrecoverable[0], PyTritonUnrecoverableError)
    warning = [r for r in caplog.records if r.name == "tests.process_callables"]
    assert warning and warning[0].getMessage() == f"worker {instance.pid} saw -2"
    failed = [r for r in caplog.records if "inference callable failed" in r.getMessage()]
    assert failed and "PyTritonUnrecoverableError: cannot go on" in failed[0].exc_text  # the traceback came along


def test_a_crashed_worker_process_is_replaced_and_its_stub_served_again(make_instance, caplog):
    instance, _ = make_instance(calls.echo)
    old = instance.pid
    stub = FakeStub(instance)
    with pytest.raises(EOFError):
        stub.infer(-1)  # SIGSEGV in the worker process
    stub.close()
    assert wait_for(lambda: instance.pid not in (None, old), TIMEOUT_S)
    assert instance.restarts == 1 and not instance.busy
    assert any("died (killed by SIGSEGV)" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)
    stub = FakeStub(instance)  # what the stub does on its next batch
    try:
        assert _value(stub.infer(9)) == 9
    finally:
        stub.close()


def test_a_stuck_call_failed_by_the_watch_is_answered_and_the_same_worker_process_serves_on(make_instance):
    """Issue 42 item 4 (pytriton/_serving/unresponsive.py): the stub gets the retryable error, connects again and is
    served by the same worker process (not replaced: a process ending now could take the new connection)."""
    instance, _ = make_instance(calls.sleeps_on_negative)
    pid = instance.pid
    stub = FakeStub(instance)
    segment, metas = _tensors.write_tensors(stub.arena, [[("k", np.array([[-5]], np.int32))]])
    stub.channel.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
    assert wait_for(lambda: instance.busy, TIMEOUT_S)
    assert instance.fail_stuck_call(_messages.STUCK_TEXT)
    reply = stub.channel.recv()
    assert type(reply) is _messages.Error and reply.text == _messages.STUCK_TEXT
    stub.close()
    assert wait_for(lambda: not instance.busy, TIMEOUT_S)
    stub = FakeStub(instance)  # what the stub does on its next batch
    try:
        assert _value(stub.infer(4)) == 4
    finally:
        stub.close()
    assert instance.pid == pid and instance.restarts == 0
    assert not instance.fail_stuck_call(_messages.STUCK_TEXT)  # nothing in a call now


def test_a_dead_stub_is_reported_and_old_generations_are_retired(make_instance):
    instance, events = make_instance(calls.echo)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = FakeStub(instance, generation=0)
    lost = FakeStub(instance, pid=dead.pid, generation=0)
    lost.close()  # no goodbye, and its process is gone
    try:
        assert wait_for(lambda: events.lost, 10)
        assert events.lost[0][0] == 0
        assert instance.retire(1) == [os.getpid()]
        assert not instance.retired_busy()
    finally:
        live.close()


def test_a_callable_the_worker_cannot_import_fails_wait_ready(make_instance, monkeypatch):
    module = types.ModuleType("pytriton_unit_ghost")  # exists in this process only

    def infer(requests):
        return requests

    infer.__module__, infer.__qualname__ = module.__name__, "infer"
    module.infer = infer
    monkeypatch.setitem(sys.modules, module.__name__, module)
    payload = _process.dump_callable(infer, "Unit", 0)
    with pytest.raises(
        _process.WorkerStartError, match="No module named 'pytriton_unit_ghost'.*instance_kind='thread'"
    ):
        make_instance(None, payload=payload)


def test_repeated_start_failures_give_up_and_close_the_socket(make_instance, monkeypatch):
    monkeypatch.setattr(_process, "_RESTART_BACKOFF_S", (0.0,))
    monkeypatch.setattr(_process, "MAX_START_FAILURES", 2)
    instance, _ = make_instance(calls.echo)
    instance._payload = b"not a pickle"  # the next worker processes fail to load it
    os.kill(instance.pid, signal.SIGKILL)
    assert wait_for(lambda: instance._gave_up, TIMEOUT_S)
    assert not instance.connected
    with pytest.raises(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(instance._path)


def test_stop_kills_a_worker_process_that_does_not_stop(make_instance):
    instance, _ = make_instance(calls.echo)
    pid = instance.pid
    os.kill(pid, signal.SIGSTOP)  # cannot answer "stop"
    instance.stop(timeout_s=0.2)
    assert not _running(pid)


@pytest.mark.parametrize("other_kind", ["process", "backend"])
def test_binding_a_callable_on_another_kind_leaves_the_thread_models_config(other_kind):
    """The decorators of a thread instance read the config its bind recorded in this process.

    A process or backend instance gets its context where it runs; recording it here too (keyed by
    the callable) made a later bind of the same callable on that kind replace the thread model's.
    """
    from pytriton.model_config import ModelConfig
    from pytriton.triton import Triton

    x = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    triton = Triton()
    try:
        triton.bind("Threaded", calls.doubled, x, x, config=ModelConfig(max_batch_size=4))
        triton.bind("Elsewhere", calls.doubled, x, x, config=ModelConfig(max_batch_size=8), instance_kind=other_kind)
        config = triton.triton_context.model_configs[calls.doubled]
        assert (config.model_name, config.max_batch_size) == ("Threaded", 4)
    finally:
        triton.stop()
