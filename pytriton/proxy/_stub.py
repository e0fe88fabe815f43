"""The proxy model that runs inside Triton's Python-backend stub.

``Triton.bind`` copies this file as ``model.py`` (and ``_wire.py`` beside it as
``_pytriton_wire.py``) into the model repository. Only the standard library and numpy are
available here (the stub's own environment), so nothing else from pytriton may be imported.

Per model instance (one stub process each) the proxy claims a free *slot* of the model by taking
an exclusive ``flock`` on ``slot-<n>.lock``; the kernel releases it when the stub exits, however it
exits, so a restarted instance finds its slot free again without any handshake timeout. It then
talks to that slot's worker thread in the user's process over one Unix stream socket; if the
user's process dies, the socket closes and pending requests fail at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

try:  # the copy placed next to model.py by Triton.bind
    import _pytriton_wire as _wire  # type: ignore[import-not-found]
except ImportError:  # imported from the package (tests, type checking)
    from pytriton.proxy import _wire


# The stub is compiled against numpy 1.x. pytriton gives it a numpy 1.x environment where one
# exists; on Python 3.13 (no numpy 1.x build) it runs with numpy 2, whose ABI breaks the stub's
# own numpy conversions (empty float tensors, crashes on strings) while DLPack still works.
# Triton.bind refuses BYTES tensors in that mode (DLPack cannot carry them).
_NUMPY2 = int(np.__version__.split(".")[0]) >= 2


def _dlpack_output(name: str, array: Any) -> Any:
    if not (array.flags.writeable and array.flags.c_contiguous):
        array = np.array(array, copy=True, order="C")  # DLPack exports writable, contiguous arrays only
    return pb_utils.Tensor.from_dlpack(name, array)


def _errors(message: str, requests: List[Any]) -> List[Any]:
    """One error response per request."""
    return [pb_utils.InferenceResponse(error=pb_utils.TritonError(message)) for _ in requests]


class UserProcessGone(RuntimeError):
    """The process that bound the model is no longer running."""


class TritonPythonModel:
    """Forwards every batch to the bound callable in the user's process."""

    def initialize(self, args: Dict[str, Any]) -> None:
        """Claim a slot, connect to its worker and say hello (waits for the worker, no fixed timeout)."""
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self._user_pid = int(params["pytriton.user_pid"])
        self._endpoint_dir = params["pytriton.endpoint_dir"]
        slots = int(params["pytriton.slots"])
        self._decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        # With one declared output there is nothing to filter (Triton rejects unknown names before
        # execute), so the per-request call for the requested names can be skipped.
        self._single_output = len(config.get("output", [])) == 1
        self._lock_fd = self._claim_slot(slots)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(os.path.join(self._endpoint_dir, f"slot-{self._slot}.sock"))
        # Poll for replies instead of sleeping (only while they usually come within the window): a
        # fast callable then answers without paying for a wake-up of this process.
        self._channel = _wire.Channel(self._socket, poll_s=float(params.get("pytriton.spin_us", "0")) / 1e6)
        self._arena = _wire.Arena(f"{params['pytriton.shm_prefix']}-s{self._slot}")
        self._reader = _wire.ArenaReader()
        reply = self._call((_wire.HELLO, os.getpid()))
        if reply[0] != _wire.WELCOME:
            raise pb_utils.TritonModelException(f"pytriton: unexpected handshake reply {reply[0]}")

    def _claim_slot(self, slots: int) -> int:
        deadline = time.monotonic() + 60.0
        while True:
            for slot in range(slots):
                fd = os.open(os.path.join(self._endpoint_dir, f"slot-{slot}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._slot = slot
                return fd
            # Every slot is held: an instance being unloaded has not exited yet. Wait for it.
            if time.monotonic() > deadline:
                raise pb_utils.TritonModelException(f"pytriton: all {slots} instance slots stay busy")
            self._check_user_alive()
            time.sleep(0.01)

    def _check_user_alive(self) -> None:
        try:
            os.kill(self._user_pid, 0)
        except ProcessLookupError:
            raise UserProcessGone(
                f"the pytriton process (pid {self._user_pid}) that bound this model is gone"
            ) from None
        except PermissionError:
            pass

    def _call(self, message: Any) -> Any:
        """Send one message and wait for the reply.

        There is no timeout: a callable may legitimately run for a long time, and if the user's
        process dies the kernel closes the socket, which ends the wait at once.
        """
        try:
            self._channel.send(message)
            return self._channel.recv()
        except (EOFError, OSError):
            raise UserProcessGone(f"the pytriton process (pid {self._user_pid}) closed the connection") from None

    def _receive(self) -> Any:
        try:
            return self._channel.recv()
        except (EOFError, OSError):
            raise UserProcessGone(f"the pytriton process (pid {self._user_pid}) closed the connection") from None

    def _encode(self, requests: List[Any], requested: List[Any]) -> Any:
        groups = []
        entries = []
        for request, names in zip(requests, requested):
            if _NUMPY2:
                groups.append([(tensor.name(), np.from_dlpack(tensor)) for tensor in request.inputs()])
            else:
                groups.append([(tensor.name(), tensor.as_numpy()) for tensor in request.inputs()])
            raw_parameters = request.parameters()
            entries.append((json.loads(raw_parameters) if raw_parameters != "{}" else None, names))
        segment, metas = _wire.write_tensors(self._arena, groups)
        return (_wire.INFER, segment, [(meta, params, names) for meta, (params, names) in zip(metas, entries)])

    def _responses(self, reply: Any, requested: List[Any]) -> List[Any]:
        buffer = self._reader.attach(reply[1]) if reply[1] else None
        own = self._arena.buffer
        Tensor = _dlpack_output if _NUMPY2 else pb_utils.Tensor
        read = _wire.read_tensor
        responses = []
        for metas, names in zip(reply[2], requested):
            tensors = [Tensor(m[0], read(buffer, m, False, own)) for m in metas if names is None or m[0] in names]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _settle(self, reply: Any) -> None:
        """The worker's last reply for a batch ends with True if the callable kept views of our arena."""
        if reply[-1] is True:
            self._arena.close()  # the next batch gets a fresh segment; the kept arrays keep the old one

    def execute(self, requests: List[Any]) -> Optional[List[Any]]:
        """Run one batch through the user's callable and return (or stream) the responses."""
        if self._single_output:
            requested: List[Any] = [None] * len(requests)
        else:
            requested = [request.requested_output_names() or None for request in requests]
        try:
            message = self._encode(requests, requested)
        except Exception as exc:  # malformed input we cannot forward
            return self._fail(requests, f"pytriton proxy could not read the request: {exc}")
        try:
            reply = self._call(message)
        except UserProcessGone as exc:
            return self._fail(requests, str(exc))
        if not self._decoupled:
            try:
                if reply[0] == _wire.OK:
                    return self._responses(reply, requested)
                return self._fail(requests, reply[1] if reply[0] == _wire.ERROR else "pytriton: unexpected reply")
            finally:
                self._settle(reply)
        self._stream(requests, requested, reply)
        return None

    def _stream(self, requests: List[Any], requested: List[Any], reply: Any) -> None:
        """Send each streamed chunk to its clients as it arrives, then the final flag.

        A client that cancelled (checked at every acknowledgement, each ``STREAM_WINDOW`` chunks at
        most) or whose response Triton refused gets nothing more; once no client of the batch is
        left, the worker is told to stop the generator. Whatever happens, the stream's messages are
        read to the end, so the next batch starts in step.
        """
        senders = [request.get_response_sender() for request in requests]
        live = [True] * len(senders)
        try:
            unacknowledged = 0
            while reply[0] == _wire.CHUNK:
                if any(live):
                    try:
                        responses = self._responses(reply, requested)
                    except Exception as exc:  # e.g. Triton could not allocate the output: end the stream
                        responses = _errors(f"pytriton proxy could not build a streamed response: {exc}", senders)
                        self._send(senders, live, responses)
                        live = [False] * len(senders)
                    else:
                        self._send(senders, live, responses)
                unacknowledged += 1
                if reply[1] or unacknowledged >= _wire.STREAM_WINDOW:
                    unacknowledged = 0
                    for index, sender in enumerate(senders):
                        live[index] = live[index] and not sender.is_cancelled()
                    reply = self._call((_wire.NEXT,) if any(live) else (_wire.CANCEL,))
                else:
                    reply = self._receive()
            if reply[0] == _wire.ERROR:
                self._send(senders, live, _errors(reply[1], senders))
            self._settle(reply)
        except UserProcessGone as exc:
            self._send(senders, live, _errors(str(exc), senders))
        for sender in senders:
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:  # already closed by Triton (e.g. cancelled); nothing left to release
                pass

    @staticmethod
    def _send(senders: List[Any], live: List[bool], responses: List[Any]) -> None:
        """Send one response per live client; a client whose response Triton refuses is dropped."""
        for index, (sender, response) in enumerate(zip(senders, responses)):
            if live[index]:
                try:
                    sender.send(response)
                except Exception:
                    live[index] = False

    def _fail(self, requests: List[Any], message: str) -> Optional[List[Any]]:
        responses = _errors(message, requests)
        if not self._decoupled:
            return responses
        for request, response in zip(requests, responses):
            sender = request.get_response_sender()
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def finalize(self) -> None:
        """Tell the worker this instance is going away and release every resource."""
        try:
            self._socket.settimeout(1.0)
            self._channel.send((_wire.BYE,))
            self._channel.recv()
        except (EOFError, OSError):
            pass
        self._socket.close()
        self._arena.close()
        self._reader.close()
        os.close(self._lock_fd)
