import pytest

from pytriton.client._url import parse_url
from pytriton.client.exceptions import PyTritonClientError, PyTritonClientInvalidUrlError


@pytest.mark.parametrize(
    "url, expected",
    [
        ("grpc://localhost:9001", ("grpc", "localhost", 9001)),
        ("http://10.0.0.1:9000", ("http", "10.0.0.1", 9000)),
        ("localhost:1234", ("http", "localhost", 1234)),
        ("localhost", ("http", "localhost", 8000)),
        ("grpc://server", ("grpc", "server", 8001)),
        ("grpcs://server", ("grpcs", "server", 8001)),
        ("GRPCS://server:443", ("grpcs", "server", 443)),
        ("HTTP://Host", ("http", "Host", 8000)),
        ("http://[::1]:8000", ("http", "[::1]", 8000)),
    ],
)
def test_accepted_urls(url, expected):
    parsed = parse_url(url)
    assert (parsed.scheme, parsed.host, parsed.port) == expected


@pytest.mark.parametrize(
    "url", ["ftp://host", "https://host", "http://", "host:port", "http://host:99999", "a b", "", "grpc://h:1/x/y"]
)
def test_rejected_urls(url):
    with pytest.raises(PyTritonClientInvalidUrlError) as info:
        parse_url(url)
    assert isinstance(info.value, PyTritonClientError)
