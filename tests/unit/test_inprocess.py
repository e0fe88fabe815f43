"""Unit tests of pytriton.inprocess that need no server: enums, errors, tensors, the ctypes layer."""

from __future__ import annotations

import ctypes
import pathlib
import tempfile
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import pytriton.inprocess as tritonserver
from pytriton.exceptions import PyTritonServerNotInstalledError
from pytriton.inprocess import _enums, _errors, _lib, _server, _tensor


@pytest.fixture
def tmp_path():
    """A temporary directory removed when the test ends (pytest's own would be kept for a while)."""
    with tempfile.TemporaryDirectory(prefix="pytriton-inproc-test-") as directory:
        yield pathlib.Path(directory)


# -- enums ------------------------------------------------------------------------------------------
def test_enum_values_follow_the_c_api():
    assert tritonserver.DataType.FP32 == 11 and tritonserver.DataType.BYTES == 13 and tritonserver.DataType.BF16 == 14
    assert [m.value for m in tritonserver.MemoryType] == [0, 1, 2]
    assert tritonserver.ModelControlMode.EXPLICIT == 2 and tritonserver.ModelControlMode.POLL == 1
    assert tritonserver.LogFormat.ISO8601 == 1
    assert tritonserver.InstanceGroupKind.MODEL == 3
    assert tritonserver.ModelBatchFlag.FIRST_DIM == 2
    assert tritonserver.ModelTxnPropertyFlag.DECOUPLED == 2
    assert tritonserver.ResponseCompleteFlag.FINAL == 1
    assert _enums.ErrorCode.CANCELLED == 7


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
)
def test_numpy_dtype_round_trip(dtype):
    data_type = _enums.data_type_of(np.dtype(dtype))
    assert _enums.numpy_dtype(data_type) == np.dtype(dtype)


def test_bytes_like_dtypes_and_unmapped_types():
    for dtype in (object, "S4", "U3"):
        assert _enums.data_type_of(np.dtype(dtype)) == tritonserver.DataType.BYTES
    with pytest.raises(ValueError):
        _enums.numpy_dtype(tritonserver.DataType.BF16)
    with pytest.raises(ValueError):
        _enums.data_type_of(np.dtype(np.complex64))


# -- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "code, cls",
    [
        (0, tritonserver.UnknownError),
        (1, tritonserver.InternalError),
        (2, tritonserver.NotFoundError),
        (3, tritonserver.InvalidArgumentError),
        (4, tritonserver.UnavailableError),
        (5, tritonserver.UnsupportedError),
        (6, tritonserver.AlreadyExistsError),
        (7, tritonserver.CancelledError),
        (42, tritonserver.UnknownError),
    ],
)
def test_error_codes_map_to_the_spec_classes(code, cls):
    error = _errors.error_from_code(code, "message")
    assert type(error) is cls and isinstance(error, tritonserver.TritonError) and str(error) == "message"


# -- a fake library -------------------------------------------------------------------------------
class _FakeFunction:
    def __init__(self, name: str, calls: List[Tuple[str, Tuple[Any, ...]]], results: Dict[str, Any]):
        self.name, self.calls, self.results = name, calls, results
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        self.calls.append((self.name, args))
        result = self.results.get(self.name)
        return result(*args) if callable(result) else result


class FakeCDLL:
    """Stands in for the server library: records calls, returns configured results (None: success)."""

    def __init__(self, **results: Any) -> None:
        self.calls: List[Tuple[str, Tuple[Any, ...]]] = []
        self.results = results
        self.functions: Dict[str, _FakeFunction] = {}

    def __getattr__(self, name: str) -> _FakeFunction:
        if name.startswith("__"):
            raise AttributeError(name)
        functions = self.__dict__["functions"]
        if name not in functions:
            functions[name] = _FakeFunction(name, self.__dict__["calls"], self.__dict__["results"])
        return functions[name]

    def called(self, name: str) -> List[Tuple[Any, ...]]:
        return [args for called, args in self.calls if called == name]


def test_library_sets_prototypes_and_check_deletes_each_error_once():
    fake = FakeCDLL(TRITONSERVER_ErrorCode=lambda error: 2, TRITONSERVER_ErrorMessage=lambda error: b"no such model")
    lib = _lib.Library(fake)
    assert fake.functions["TRITONSERVER_ServerNew"].restype is ctypes.c_void_p
    assert len(fake.functions["TRITONSERVER_InferenceResponseOutput"].argtypes) == 11
    lib.check(None)
    assert fake.called("TRITONSERVER_ErrorDelete") == []
    with pytest.raises(tritonserver.NotFoundError, match="no such model"):
        lib.check(1234)
    assert fake.called("TRITONSERVER_ErrorDelete") == [(1234,)]


def test_dependencies_are_loaded_first_by_absolute_path(tmp_path):
    (tmp_path / "libdep-1.so.1").write_text("")
    (tmp_path / "libinner-2.so").write_text("")
    target = tmp_path / "libtritonserver-x.so"
    loaded: List[str] = []

    def loader(name: str) -> str:
        if name == str(target) and str(tmp_path / "libdep-1.so.1") not in loaded:
            raise OSError(f"{target}: libdep-1.so.1: cannot open shared object file: No such file or directory")
        if name.endswith("libdep-1.so.1") and str(tmp_path / "libinner-2.so") not in loaded:
            raise OSError(f"{name}: libinner-2.so: cannot open shared object file: No such file or directory")
        loaded.append(name)
        return name

    assert _lib._load_with_dependencies(target, tmp_path, loader) == str(target)
    assert loaded == [str(tmp_path / "libinner-2.so"), str(tmp_path / "libdep-1.so.1"), str(target)]


def test_unrelated_load_errors_and_missing_files_are_raised(tmp_path):
    def broken(name: str) -> None:
        raise OSError(f"{name}: invalid ELF header")

    with pytest.raises(OSError, match="invalid ELF header"):
        _lib._load_with_dependencies(tmp_path / "lib.so", tmp_path, broken)

    def missing_elsewhere(name: str) -> None:
        raise OSError(f"{name}: libnowhere.so.3: cannot open shared object file: No such file or directory")

    with pytest.raises(OSError, match="libnowhere"):
        _lib._load_with_dependencies(tmp_path / "lib.so", tmp_path, missing_elsewhere)


def test_server_not_installed_names_the_install_command(monkeypatch):
    from pytriton.server import distribution

    def not_installed(*args: Any) -> None:
        raise PyTritonServerNotInstalledError("Triton is not installed. Run `pytriton install-server` once")

    monkeypatch.setattr(_lib, "_LIBRARY", None)
    monkeypatch.setattr(distribution, "find_server", not_installed)
    with pytest.raises(tritonserver.UnavailableError, match="pytriton install-server"):
        _lib.library()


def test_install_without_server_library(tmp_path):
    (tmp_path / "lib").mkdir()
    with pytest.raises(tritonserver.UnavailableError, match="libtritonserver"):
        _lib.find_library_file(tmp_path)


# -- options ---------------------------------------------------------------------------------------
def test_options_are_written_to_the_c_options():
    fake = FakeCDLL()
    lib = _lib.Library(fake)
    options = tritonserver.Options(
        model_repository="relative/repo",
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
        startup_models=["a", "b"],
        backend_configuration={"python": {"shm-default-byte-size": "1048576"}},
        log_file="/tmp/x.log",
        rate_limiter_resources=[tritonserver.RateLimiterResource("R", 2, -1)],
    )
    options._apply(lib, 77, "prefix-")
    (repo_call,) = fake.called("TRITONSERVER_ServerOptionsSetModelRepositoryPath")
    assert pathlib.Path(repo_call[1].decode()).is_absolute()
    assert fake.called("TRITONSERVER_ServerOptionsSetModelControlMode") == [(77, 2)]
    assert [args[1] for args in fake.called("TRITONSERVER_ServerOptionsSetStartupModel")] == [b"a", b"b"]
    backend = {(a[1], a[2]): a[3] for a in fake.called("TRITONSERVER_ServerOptionsSetBackendConfig")}
    assert backend == {
        (b"python", b"shm-default-byte-size"): b"1048576",
        (b"python", b"shm-region-prefix-name"): b"prefix-",
    }
    assert fake.called("TRITONSERVER_ServerOptionsSetExitTimeout") == [(77, 30)]


def test_options_need_a_repository_and_default_to_the_install():
    with pytest.raises(tritonserver.InvalidArgumentError, match="model_repository"):
        tritonserver.Options()._apply(_lib.Library(FakeCDLL()), 1, "p-")
    options = tritonserver.Options()
    assert (pathlib.Path(options.backend_directory) / "python").is_dir()


def test_options_errors_are_raised_with_the_spec_type():
    fake = FakeCDLL(
        TRITONSERVER_ServerOptionsSetLogFile=lambda *args: 99,
        TRITONSERVER_ErrorCode=lambda error: 3,
        TRITONSERVER_ErrorMessage=lambda error: b"bad log file",
    )
    with pytest.raises(tritonserver.InvalidArgumentError, match="bad log file"):
        tritonserver.Options(model_repository="r", log_file="/nope/x")._apply(_lib.Library(fake), 1, "p-")
    assert fake.called("TRITONSERVER_ErrorDelete") == [(99,)]


def test_server_before_start():
    server = tritonserver.Server(model_repository="/nonexistent", exit_timeout=3)
    assert server.options.exit_timeout == 3
    assert not server.live() and not server.ready()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.model("m")
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.metadata()
    server.stop()  # harmless before start


# -- tensors ---------------------------------------------------------------------------------------
def test_tensor_from_dlpack_shares_memory_both_ways():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = tritonserver.Tensor.from_dlpack(array)
    assert tensor.data_type == tritonserver.DataType.FP32 and list(tensor.shape) == [2, 3]
    assert tensor.data_ptr == array.ctypes.data and tensor.size == 24
    assert tensor.memory_type == tritonserver.MemoryType.CPU and tensor.memory_type_id == 0
    view = np.from_dlpack(tensor)
    assert view.ctypes.data == array.ctypes.data
    np.testing.assert_array_equal(view, array)
    assert tensor.to_host() is tensor and tensor.to_device("cpu") is tensor


def test_tensor_over_foreign_memory_keeps_its_owner():
    owner = np.arange(4, dtype=np.int32)
    buffer = tritonserver.MemoryBuffer(owner.ctypes.data + 4, tritonserver.MemoryType.CPU, 0, 8, owner)
    tensor = tritonserver.Tensor(tritonserver.DataType.INT32, [2], buffer)
    del owner
    np.testing.assert_array_equal(np.from_dlpack(tensor), [1, 2])


def test_bool_and_half_tensors():
    for array in (np.array([True, False]), np.array([1.5, -2], dtype=np.float16)):
        np.testing.assert_array_equal(np.from_dlpack(tritonserver.Tensor.from_dlpack(array)), array)


def test_memory_buffer_from_dlpack():
    array = np.array([100], dtype=np.uint8)
    buffer = tritonserver.MemoryBuffer.from_dlpack(array)
    assert (
        buffer.data_ptr == array.ctypes.data and buffer.size == 1 and buffer.memory_type == tritonserver.MemoryType.CPU
    )


def test_bytes_tensors_round_trip():
    tensor = tritonserver.Tensor.from_string_array(np.array([["a", "bé"], ["", "long text"]]))
    assert tensor.data_type == tritonserver.DataType.BYTES and list(tensor.shape) == [2, 2]
    assert tensor.to_string_array().tolist() == [["a", "bé"], ["", "long text"]]
    raw = tritonserver.Tensor.from_bytes_array([b"\x00\xff", "x"])
    assert raw.to_bytes_array().tolist() == [b"\x00\xff", b"x"]
    assert raw.size == 4 + 2 + 4 + 1


def test_bytes_tensor_errors():
    with pytest.raises(tritonserver.InvalidArgumentError):
        tritonserver.Tensor.from_string_array([b"bytes"])
    with pytest.raises(tritonserver.InvalidArgumentError):
        tritonserver.Tensor.from_bytes_array([1, 2])
    with pytest.raises(tritonserver.InvalidArgumentError, match="BYTES"):
        tritonserver.Tensor.from_dlpack(np.zeros(2, np.float32)).to_bytes_array()
    with pytest.raises(tritonserver.InvalidArgumentError, match="DLPack"):
        np.from_dlpack(tritonserver.Tensor.from_string_array(["a"]))
    truncated = np.frombuffer(b"\x05\x00\x00\x00abc", dtype=np.uint8).copy()
    buffer = tritonserver.MemoryBuffer(truncated.ctypes.data, tritonserver.MemoryType.CPU, 0, truncated.size, truncated)
    with pytest.raises(tritonserver.InvalidArgumentError, match="Truncated"):
        tritonserver.Tensor(tritonserver.DataType.BYTES, [1], buffer).to_bytes_array()


def test_devices():
    assert _tensor.parse_device("gpu:1") == (tritonserver.MemoryType.GPU, 1)
    assert _tensor.parse_device((tritonserver.MemoryType.CPU_PINNED, 0)) == (tritonserver.MemoryType.CPU_PINNED, 0)
    assert _tensor.parse_device((tritonserver.DLDeviceType.kDLCUDA, 2)) == (tritonserver.MemoryType.GPU, 2)
    assert _tensor.parse_device(tritonserver.MemoryType.CPU) == (tritonserver.MemoryType.CPU, 0)
    with pytest.raises(tritonserver.InvalidArgumentError):
        _tensor.parse_device("tpu")
    tensor = tritonserver.Tensor.from_dlpack(np.zeros(2, np.float32))
    for device in ("gpu", (tritonserver.MemoryType.GPU, 0), tritonserver.MemoryType.GPU):
        with pytest.raises(tritonserver.UnsupportedError, match="GPU"):
            tensor.to_device(device)


def test_input_conversion():
    assert tritonserver.Tensor._from_object(["a", "b"]).data_type == tritonserver.DataType.BYTES
    assert tritonserver.Tensor._from_object(np.int64(3)).shape == []
    fortran = np.asfortranarray(np.ones((2, 3), np.float32))
    converted = tritonserver.Tensor._from_object(fortran)
    np.testing.assert_array_equal(np.from_dlpack(converted), fortran)
    with pytest.raises(tritonserver.InvalidArgumentError):
        tritonserver.Tensor._from_object(np.zeros(2, np.complex64))


def test_public_names():
    for name in tritonserver.__all__:
        assert hasattr(tritonserver, name)
    assert issubclass(_server.ModelDictionary, dict)


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
)
def test_fast_data_type_agrees_with_the_general_path(dtype):
    array = np.zeros((2, 3), dtype)
    assert _tensor.fast_data_type(array) == tritonserver.Tensor._from_object(array).data_type
    assert (
        _tensor.fast_data_type(np.zeros((), dtype)) == tritonserver.Tensor._from_object(np.zeros((), dtype)).data_type
    )


def test_fast_data_type_leaves_everything_else_to_the_general_path():
    data = np.zeros((2, 3), np.float32)
    others = [
        np.asfortranarray(data),  # not C-contiguous
        data[:, ::2],
        data.astype(">f4"),  # byte-swapped
        np.array([b"x"], dtype=object),
        np.array(["x"]),
        np.zeros(2, np.complex64),  # no Triton type: the general path raises the error
        np.ma.masked_array(data),  # a subclass
        data.tolist(),
        tritonserver.Tensor.from_dlpack(data),
    ]
    assert [_tensor.fast_data_type(value) for value in others] == [None] * len(others)


def test_thread_state_keeper_ensures_once_per_thread():
    import threading

    calls: List[int] = []
    keeper = _lib._ThreadStateKeeper()
    keeper._ensure = lambda: calls.append(threading.get_ident()) or 0  # type: ignore[assignment]
    keeper()
    keeper()
    thread = threading.Thread(target=lambda: (keeper(), keeper()))
    thread.start()
    thread.join(10)
    assert len(calls) == 2 and calls[0] != calls[1]  # once on this thread, once on the other
    keeper._ensure = None  # no C API (not CPython): nothing to keep, nothing fails
    other = threading.Thread(target=keeper)
    other.start()
    other.join(10)
    assert len(calls) == 2


def test_name_and_shape_caches_are_bounded(monkeypatch):
    from pytriton.inprocess import _request

    monkeypatch.setattr(_request, "_CACHE_LIMIT", 4)
    monkeypatch.setattr(_request, "_NAMES", {})
    monkeypatch.setattr(_request, "_SHAPES", {})
    for index in range(10):
        assert _request._encoded(f"name-{index}") == f"name-{index}".encode()
        assert list(_request._shape_array((index, 2))) == [index, 2]
    assert len(_request._NAMES) <= 4 and len(_request._SHAPES) <= 4
    assert _request._shape_array((9, 2)) is _request._shape_array((9, 2))  # reused while cached
    assert list(_request._shape_array(())) == [0]  # a scalar still passes a valid pointer


def test_array_address_matches_numpy_for_every_layout():
    read_only = np.ones(4)
    read_only.flags.writeable = False
    arrays = [
        np.ones(4, np.float32),
        np.ones(4)[1:],  # a view with an offset
        np.zeros(0),  # no byte to point at: the general path
        np.ones((3, 4))[:, ::2],  # not contiguous: the general path
        np.frombuffer(b"abcd", np.uint8),  # read-only: the general path
        read_only,
        np.ones(()),
    ]
    assert [_tensor.array_address(array) for array in arrays] == [array.ctypes.data for array in arrays]


def test_gpu_metrics_stay_off_without_an_nvidia_driver_unless_verbose(monkeypatch):
    # DCGM prints "Error: Failed to initialize NVML" to the process's stderr where no driver answers.
    from pytriton.inprocess import _options

    def gpu_metrics_flag(available: bool, **options: Any) -> Any:
        monkeypatch.setattr(_options, "nvml_available", lambda: available)
        fake = FakeCDLL()
        tritonserver.Options(model_repository="r", **options)._apply(_lib.Library(fake), 1, "p-")
        ((_, flag),) = fake.called("TRITONSERVER_ServerOptionsSetGpuMetrics")
        return flag

    assert gpu_metrics_flag(False) is False
    assert gpu_metrics_flag(False, log_verbose=1) is True  # the line stays available for diagnosis
    assert gpu_metrics_flag(True) is True
    assert gpu_metrics_flag(True, gpu_metrics=False) is False


def test_nvml_probe_answers_once(monkeypatch):
    from pytriton.inprocess import _options

    monkeypatch.setattr(_options, "_NVML", [])
    first = _options.nvml_available()
    assert isinstance(first, bool)
    assert _options.nvml_available() is first
    assert len(_options._NVML) == 1


def test_error_log_quotes_each_model_that_did_not_load():
    from pytriton.inprocess._errorlog import ErrorLog

    log = ErrorLog()
    try:
        assert log.load_failures() == []  # nothing written yet
        directory = pathlib.Path(log.path).parent
        assert directory.stat().st_mode & 0o777 == 0o700
        pathlib.Path(log.path).write_text(
            'E1126 11:51:01.425717 3063 server.cc:241] "CudaDriverHelper has not been initialized."\n'
            'E1126 11:51:01.958505 3063 backend_model.cc:692] "ERROR: Failed to create instance: SyntaxError: x"\n'
            "E1126 11:51:01.958610 3063 model_lifecycle.cc:642] \"failed to load 'add_sub' version 1: Internal: "
            "SyntaxError: expected ':' (model.py, line 17)\"\n"
            'E1126 11:51:12.416954 4258 model_repository_manager.cc:1460] "Poll failed for model directory '
            "'broken': failed to read text proto from /r/broken/config.pbtxt\"\n"
            "E1126 11:51:02.000000 3063 model_lifecycle.cc:642] \"failed to load 'add_sub' version 1: Internal: "
            "SyntaxError: expected ':' (model.py, line 17)\"\n"
        )
        assert log.load_failures() == [
            "'add_sub' version 1: Internal: SyntaxError: expected ':' (model.py, line 17)",
            "'broken': failed to read text proto from /r/broken/config.pbtxt",
        ]
    finally:
        log.remove()
    assert not directory.exists()
    log.remove()  # idempotent
