"""The frontend's HTTP client for Triton (pytriton/openai/_http.py) against a fake HTTP server on a socket."""

import asyncio
import json

import numpy as np
import pytest

from pytriton.openai._http import (
    TritonHttp,
    TritonHttpError,
    _deserialize_bytes,
    _serialize_bytes,
    decode_response,
    encode_request,
)


def _answer(outputs, status=200, close=False):
    """An HTTP answer carrying ``outputs`` in the binary tensor extension (or an error body)."""
    if status != 200:
        body = json.dumps({"error": outputs}).encode()
        head = f"HTTP/1.1 {status} Bad\r\nContent-Length: {len(body)}\r\n\r\n"
        return head.encode() + body
    tensors, chunks = [], []
    for name, value in outputs.items():
        if value.dtype == np.object_:
            data = b"".join(len(item).to_bytes(4, "little") + item for item in value.reshape(-1))
            datatype = "BYTES"
        else:
            data, datatype = value.tobytes(), {"float32": "FP32", "int64": "INT64"}[str(value.dtype)]
        tensors.append({"name": name, "shape": list(value.shape), "datatype": datatype,
                        "parameters": {"binary_data_size": len(data)}})  # fmt: skip
        chunks.append(data)
    header = json.dumps({"model_name": "m", "outputs": tensors}).encode()
    body = header + b"".join(chunks)
    extra = "Connection: close\r\n" if close else ""
    head = f"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


class FakeTriton:
    """Answers each request with the next of ``answers``; records requests and connections."""

    def __init__(self, answers, close_after=None):
        self.answers = list(answers)
        self.requests = []
        self.connections = 0
        self.close_after = close_after  # close each connection after this many requests, without answering more

    async def handle(self, reader, writer):
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers["content-length"]))
                if self.close_after is not None and served >= self.close_after:
                    break  # the request is dropped unanswered: an idle-timeout close racing the request
                self.requests.append((lines[0], headers, body))
                served += 1
                answer = self.answers.pop(0)
                if answer is None:
                    await asyncio.sleep(30)  # never answers
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_):
        self.server.close()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def test_encode_decode_roundtrip_of_bytes_and_numbers():
    inputs = {"text": np.array([[b"hi", b""]], dtype=object), "x": np.arange(3, dtype=np.float32)}
    body, length = encode_request(inputs, {"temperature": 0.5})
    header = json.loads(body[:length])
    assert header["parameters"] == {"temperature": 0.5, "binary_data_output": True}
    assert [t["datatype"] for t in header["inputs"]] == ["BYTES", "FP32"]
    assert header["inputs"][0]["shape"] == [1, 2]
    assert body[length:] == b"\x02\x00\x00\x00hi\x00\x00\x00\x00" + np.arange(3, dtype=np.float32).tobytes()
    # Triton's answers have the same layout: decode what a fake Triton would send back.
    answer = _answer({"text": inputs["text"], "x": inputs["x"]})
    head, _, payload = answer.partition(b"\r\n\r\n")
    outputs = decode_response(payload, int(head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0]))
    assert outputs["text"].tolist() == [[b"hi", b""]]
    assert outputs["x"].dtype == np.float32 and outputs["x"].tolist() == [0.0, 1.0, 2.0]


def test_decode_json_data_without_binary_header():
    body = json.dumps({"outputs": [{"name": "n", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}).encode()
    assert decode_response(body, None)["n"].tolist() == [1, 2]


def test_requests_reuse_one_kept_alive_connection_and_send_the_path_and_headers():
    async def main():
        answers = [_answer({"out": np.array([[b"ok"]], dtype=object)}) for _ in range(3)]
        async with FakeTriton(answers) as fake:
            client = TritonHttp("127.0.0.1", fake.port, headers={"triton-access-token": "t"})
            for _ in range(3):
                outputs = await client.infer("my model", 2, {"in": np.array([[b"q"]], dtype=object)}, None)
                assert outputs["out"].tolist() == [[b"ok"]]
            await client.close()
        return fake

    fake = run(main())
    assert fake.connections == 1
    line, headers, _ = fake.requests[0]
    assert line == "POST /v2/models/my%20model/versions/2/infer HTTP/1.1"
    assert headers["triton-access-token"] == "t" and "inference-header-content-length" in headers


def test_a_connection_closed_while_idle_is_replaced_and_the_request_sent_again():
    async def main():
        answers = [_answer({"out": np.array([1], dtype=np.int64)}) for _ in range(2)]
        async with FakeTriton(answers, close_after=1) as fake:
            client = TritonHttp("127.0.0.1", fake.port)
            first = await client.infer("m", None, {"in": np.array([1], dtype=np.int64)}, None)
            second = await client.infer("m", None, {"in": np.array([2], dtype=np.int64)}, None)
            await client.close()
        return fake, first, second

    fake, first, second = run(main())
    assert first["out"].tolist() == second["out"].tolist() == [1]
    assert fake.connections == 2 and len(fake.requests) == 2


def test_connection_close_answer_is_not_reused():
    async def main():
        answers = [_answer({"out": np.array([1], dtype=np.int64)}, close=True) for _ in range(2)]
        async with FakeTriton(answers) as fake:
            client = TritonHttp("127.0.0.1", fake.port)
            for _ in range(2):
                await client.infer("m", None, {"in": np.array([1], dtype=np.int64)}, None)
            await client.close()
        return fake

    assert run(main()).connections == 2


@pytest.mark.parametrize(
    "status, name", [(400, "INVALID_ARGUMENT"), (404, "NOT_FOUND"), (503, "UNAVAILABLE"), (500, "INTERNAL")]
)
def test_triton_errors_carry_status_name_and_message(status, name):
    async def main():
        async with FakeTriton([_answer("went wrong", status=status)]) as fake:
            client = TritonHttp("127.0.0.1", fake.port)
            with pytest.raises(TritonHttpError) as info:
                await client.infer("m", None, {"in": np.array([1], dtype=np.int64)}, None)
            await client.close()
        return info.value

    error = run(main())
    assert (error.status, error.message) == (name, "went wrong")


def test_cancelled_request_closes_its_connection_and_the_next_opens_a_new_one():
    async def main():
        answers = [None, _answer({"out": np.array([3], dtype=np.int64)})]
        async with FakeTriton(answers) as fake:
            client = TritonHttp("127.0.0.1", fake.port)
            task = asyncio.ensure_future(client.infer("m", None, {"in": np.array([1], dtype=np.int64)}, None))
            while not fake.requests:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            outputs = await client.infer("m", None, {"in": np.array([1], dtype=np.int64)}, None)
            await client.close()
        return fake, outputs

    fake, outputs = run(main())
    assert outputs["out"].tolist() == [3]
    assert fake.connections == 2


def test_unreachable_triton_raises_oserror():
    async def main():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(OSError):
            await TritonHttp("127.0.0.1", port).infer("m", None, {"in": np.array([1], dtype=np.int64)}, None)

    run(main())


@pytest.mark.parametrize(
    "value",
    [
        np.array([b"x"], dtype=object),
        np.array([[b"", "é".encode()], [b"\x00\xff", b"long" * 100]], dtype=object),
        np.array(["text"], dtype=object),
        np.empty((0,), dtype=object),
    ],
)
def test_bytes_tensors_use_tritons_wire_format(value):
    from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

    expected = serialize_byte_tensor(value)
    raw = _serialize_bytes(value)
    assert raw == (expected.item() if expected.size else b"")
    decoded = _deserialize_bytes(raw)
    assert decoded.dtype == np.object_
    assert decoded.tolist() == (deserialize_bytes_tensor(raw).tolist() if raw else [])


def test_a_truncated_bytes_tensor_is_an_error():
    with pytest.raises(TritonHttpError, match="truncated"):
        _deserialize_bytes(b"\x05\x00\x00\x00abc")
