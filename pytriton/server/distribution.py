"""Where the ``tritonserver`` binary lives and how a Python interpreter can host its stub.

A *distribution* is a directory holding ``bin/tritonserver``, the Python backend and the
backend stubs. It is looked up in this order:

1. an explicit directory (``TritonConfig.tritonserver_dir`` or ``PYTRITON_TRITONSERVER_DIR``),
2. pytriton's own install under ``$PYTRITON_HOME/tritonserver/<version>`` (``pytriton install-server``),
3. ``/opt/tritonserver`` (NGC containers).

The Python backend runs each model instance in a ``triton_python_backend_stub`` process that embeds
CPython. The stub must be built for the running interpreter's ``major.minor``, must load *this*
interpreter's ``libpython`` and must import numpy 1.x (the stub was built against numpy 1; see
``docs/architecture.md``). :func:`stub_environment` prepares all of that.

Unit tests: tests/unit/test_install.py (finding the server), tests/unit/test_python_versions.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import platform
import sys
import sysconfig
from typing import Dict, List, Optional, Tuple

from pytriton.exceptions import PyTritonServerError, PyTritonServerNotInstalledError
from pytriton.server import versions

# The default build (versions.BUILDS lists every supported one).
TRITON_VERSION = versions.DEFAULT_VERSION
SOURCE_WHEEL_NAME = "nvidia-pytriton"
SOURCE_WHEEL_VERSION = versions.BUILDS[TRITON_VERSION].wheel_version
# sha256 of the official wheels (the same dict as the build's); install-server refuses anything else.
SOURCE_WHEEL_SHA256: Dict[str, str] = versions.BUILDS[TRITON_VERSION].sha256
NGC_DIR = pathlib.Path("/opt/tritonserver")
INSTALL_COMMAND = "pytriton install-server"
STUB_NUMPY_REQUIREMENT = "numpy>=1.21,<2"
# Pythons pytriton runs on: the server bundles a backend stub for 3.8 to 3.13 (none for 3.14), and
# the package needs 3.9 or later. Keep in step with requires-python in pyproject.toml.
SUPPORTED_PYTHONS: Tuple[Tuple[int, int], Tuple[int, int]] = ((3, 9), (3, 13))
_COMPLETE_MARKER = versions.COMPLETE_MARKER


def pytriton_home() -> pathlib.Path:
    """pytriton's cache directory: ``$PYTRITON_HOME`` or ``~/.cache/pytriton``."""
    home = os.environ.get("PYTRITON_HOME")
    return pathlib.Path(home).expanduser() if home else pathlib.Path.home() / ".cache" / "pytriton"


def install_dir(home: Optional[pathlib.Path] = None, version: Optional[str] = None) -> pathlib.Path:
    """Directory ``pytriton install-server`` unpacks build ``version`` into (default: the selected one)."""
    return (home or pytriton_home()) / "tritonserver" / (version or _selected_version())


def _selected_version() -> str:
    """``PYTRITON_TRITON_VERSION`` resolved, or the default build; a clear error for an unsupported one."""
    try:
        return versions.selected_version()
    except ValueError as exc:
        raise PyTritonServerNotInstalledError(str(exc)) from None


def python_version() -> Tuple[int, int]:
    """``(major, minor)`` of the running interpreter (one place, so tests can pretend another)."""
    return (sys.version_info.major, sys.version_info.minor)


def python_tag() -> str:
    """``major.minor`` of the running interpreter, e.g. ``3.11``."""
    major, minor = python_version()
    return f"{major}.{minor}"


def supported_pythons_text() -> str:
    """The supported interpreter range in words, e.g. ``3.9 to 3.13``."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_PYTHONS
    return f"{low_major}.{low_minor} to {high_major}.{high_minor}"


def check_python_supported(version: Optional[Tuple[int, int]] = None, triton: Optional[str] = None) -> None:
    """Raise ``PyTritonServerError`` at once if pytriton cannot serve models from this Python.

    Triton's Python backend runs each model instance in a stub that embeds CPython; each build
    ships that stub for a fixed set of versions only (2.51: 3.8 to 3.13, 2.48: 3.8 to 3.12; none for
    3.14), so nothing could be served later on. ``triton``: the build to check against (default:
    the selected one).
    """
    version = version or python_version()
    build = versions.BUILDS.get(triton or _selected_version())
    low, high = SUPPORTED_PYTHONS
    if build is not None:
        high = min(high, build.pythons[1])
    if low <= version <= high:
        return
    raise PyTritonServerError(
        f"pytriton supports Python {low[0]}.{low[1]} to {high[0]}.{high[1]}; this is Python {version[0]}.{version[1]}. "
        f"Triton {triton or _selected_version()}'s Python backend ships its model stub (which embeds CPython) for those "
        f"versions only. Create the environment with one of them, e.g. `python{high[0]}.{high[1]} -m venv .venv`."
    )


def machine_arch() -> str:
    """Normalised CPU architecture name (``x86_64`` or ``aarch64``)."""
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


@dataclasses.dataclass(frozen=True)
class ServerDistribution:
    """A located server installation.

    ``backend_dir`` is the directory passed as ``--backend-directory``: its ``python/``
    subfolder holds a stub built for the running interpreter.
    """

    root: pathlib.Path
    binary: pathlib.Path
    backend_dir: pathlib.Path
    library_dirs: List[pathlib.Path]
    cache_dir: Optional[pathlib.Path]
    # The Triton version, read once from the install's files (versions.read_version); a supported build.
    version: str = TRITON_VERSION


def _describe_candidates(candidates: List[pathlib.Path]) -> str:
    return ", ".join(str(path) for path in candidates)


def _stub_dir_for(root: pathlib.Path) -> Optional[pathlib.Path]:
    """The backend directory whose ``python/`` holds a stub for this interpreter, if any."""
    own = root / f"backends-py{python_tag()}"
    if (own / "python" / "triton_python_backend_stub").is_file():
        return own
    generic = root / "backends"
    if (generic / "python" / "triton_python_backend_stub").is_file():
        return generic
    return None


def _as_distribution(root: pathlib.Path) -> Optional[ServerDistribution]:
    binary = root / "bin" / "tritonserver"
    if not binary.is_file():
        return None
    if (root / _COMPLETE_MARKER).exists() is False and root.parent.name == "tritonserver":
        # A pytriton install directory without the marker is a half-finished install.
        return None
    backend_dir = _stub_dir_for(root)
    if backend_dir is None:
        raise PyTritonServerNotInstalledError(
            f"The Triton server in {root} has no Python backend stub for Python {python_tag()}. "
            f"Run `{INSTALL_COMMAND} --force` to reinstall it, or use a Python version the stub supports."
        )
    library_dirs = [path for path in (root / "lib",) if path.is_dir()]
    cache_dir = root / "caches"
    return ServerDistribution(
        root=root,
        binary=binary,
        backend_dir=backend_dir,
        library_dirs=library_dirs,
        cache_dir=cache_dir if cache_dir.is_dir() else None,
        version=_supported_version(root),
    )


def _supported_version(root: pathlib.Path) -> str:
    """The install's Triton version if it is a supported build; else a clear error naming the supported ones."""
    found = versions.read_version(root)
    if found is None:
        raise PyTritonServerNotInstalledError(
            f"Cannot tell which Triton version the server in {root} is: it has no {versions.VERSION_FILE} file "
            f"(NGC containers and `{INSTALL_COMMAND}` write one). pytriton supports {versions.supported_text()}; "
            f"if it is one of them, write its version (e.g. 2.51.0) into {root / versions.VERSION_FILE}."
        )
    try:
        versions.resolve(found)
    except ValueError:
        raise PyTritonServerNotInstalledError(
            f"The server in {root} is Triton {found}, which pytriton does not support; supported: "
            f"{versions.supported_text()}. Run `{INSTALL_COMMAND}` (`--triton VERSION` for another build) "
            "and unset PYTRITON_TRITONSERVER_DIR, or point it to a supported build."
        ) from None
    return found


def find_server(explicit_dir: Optional[pathlib.Path] = None) -> ServerDistribution:
    """Locate a usable server of a supported version; raise ``PyTritonServerNotInstalledError`` naming the fix if none.

    The version is read here, once per call, from the install's files, and noted for the version
    gates (``versions.server_version``). With ``PYTRITON_TRITON_VERSION`` set, only a server of
    that build is accepted.
    """
    explicit = explicit_dir or (
        pathlib.Path(os.environ["PYTRITON_TRITONSERVER_DIR"]) if os.environ.get("PYTRITON_TRITONSERVER_DIR") else None
    )
    wanted = _selected_version()
    if explicit is not None:
        explicit = explicit.expanduser()
        found = _as_distribution(explicit)
        if found is None:
            raise PyTritonServerNotInstalledError(
                f"No tritonserver found in {explicit} (expected {explicit / 'bin' / 'tritonserver'}), "
                "which was requested through TritonConfig.tritonserver_dir or PYTRITON_TRITONSERVER_DIR. "
                f"Fix the path, or unset it and run `{INSTALL_COMMAND}`."
            )
        return _chosen(found, wanted)
    candidates = [install_dir(version=wanted), NGC_DIR]
    for candidate in candidates:
        found = _as_distribution(candidate)
        if found is not None:
            return _chosen(found, wanted)
    option = "" if wanted == TRITON_VERSION else f" --triton {wanted}"
    raise PyTritonServerNotInstalledError(
        f"Triton Inference Server {wanted} is not installed (looked in {_describe_candidates(candidates)}). "
        f"Run `{INSTALL_COMMAND}{option}` once (or `python -m pytriton install-server{option}`; "
        "`--from-wheel PATH` works offline), or set PYTRITON_TRITONSERVER_DIR to an existing install."
    )


def _chosen(found: ServerDistribution, wanted: str) -> ServerDistribution:
    """``found``, noted as this process's server, if it is the build ``PYTRITON_TRITON_VERSION`` asks for."""
    if os.environ.get(versions.VERSION_ENV, "").strip() and versions.resolve(found.version).triton != wanted:
        raise PyTritonServerNotInstalledError(
            f"{versions.VERSION_ENV} asks for Triton {wanted}, but the server in {found.root} is Triton "
            f"{found.version}. Unset one of them, or run `{INSTALL_COMMAND} --triton {wanted}` and unset "
            "PYTRITON_TRITONSERVER_DIR."
        )
    versions.note_server_version(found.version)
    return found


def shared_libpython_dir() -> pathlib.Path:
    """Directory holding the running interpreter's shared ``libpython``.

    Raises ``PyTritonServerError`` when the interpreter was built without one: the backend stub
    embeds CPython and cannot work with a statically linked interpreter.
    """
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ldlibrary = sysconfig.get_config_var("LDLIBRARY") or ""
    instsoname = sysconfig.get_config_var("INSTSONAME") or ldlibrary
    shared = bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))
    if shared and libdir and any((pathlib.Path(libdir) / name).exists() for name in (instsoname, ldlibrary)):
        return pathlib.Path(libdir)
    raise PyTritonServerError(
        f"The Python interpreter {sys.executable} has no shared libpython (Py_ENABLE_SHARED="
        f"{sysconfig.get_config_var('Py_ENABLE_SHARED')}, LIBDIR={libdir!r}). Triton's Python backend embeds "
        "CPython and needs libpython3.X.so. Use an interpreter built with --enable-shared: the system "
        "Python, conda, the official python Docker images, or pyenv with "
        "PYTHON_CONFIGURE_OPTS=--enable-shared."
    )


@dataclasses.dataclass(frozen=True)
class StubEnvironment:
    """The Python environment the backend stub runs in (its ``python3`` goes first on ``PATH``)."""

    bin_dir: pathlib.Path
    own: bool  # True: pytriton's private env; False: the user's own environment
    # The stub will run with numpy 2 (Python 3.13+): numeric tensors go through DLPack and BYTES
    # tensors through the workaround in proxy/stubside/_stub_bytes.py.
    numpy2: bool = False


def stub_env_dir(home: Optional[pathlib.Path] = None) -> pathlib.Path:
    """Private environment for the stub, keyed by interpreter version and location."""
    digest = hashlib.sha256(os.path.realpath(sys.executable).encode()).hexdigest()[:10]
    return (home or pytriton_home()) / "stub-env" / f"py{python_tag()}-{digest}"


def site_packages(env_dir: pathlib.Path) -> pathlib.Path:
    """The site-packages directory of the virtual environment ``env_dir`` for this interpreter."""
    return env_dir / "lib" / f"python{python_tag()}" / "site-packages"


def _site_packages_has(env_dir: pathlib.Path, *modules: str) -> bool:
    site = site_packages(env_dir)
    return all((site / module / "__init__.py").is_file() for module in modules)


def stub_environment(home: Optional[pathlib.Path] = None) -> StubEnvironment:
    """Pick the environment the stub imports numpy from.

    pytriton's private env (made by ``install-server``) is preferred. Without it, the user's own
    environment works only if it has numpy 1.x, because the stub's numpy conversions are
    compiled against numpy 1.
    """
    private = stub_env_dir(home)
    if (private / "bin" / "python3").exists() and _site_packages_has(private, "numpy"):
        return StubEnvironment(bin_dir=private / "bin", own=True)
    import importlib.util

    if importlib.util.find_spec("numpy") is None:
        raise PyTritonServerError(
            f"The model stub needs numpy, which {sys.executable} cannot import. "
            f"Run `{INSTALL_COMMAND}` (it prepares a private environment for the stub)."
        )
    import numpy

    # The stub's numpy conversions were built against numpy 1 (versions.STUB_NUMPY2).
    numpy2 = versions.STUB_NUMPY2.active(numpy=numpy.__version__)
    if numpy2 and python_version() >= (3, 13):
        # numpy 1.x does not exist for this Python: the stub converts numeric tensors via DLPack.
        return StubEnvironment(bin_dir=pathlib.Path(sys.executable).parent, own=False, numpy2=True)
    if numpy2:
        raise PyTritonServerError(
            f"This environment has numpy {numpy.__version__}, but Triton's Python backend stub only works with "
            f"numpy 1.x, and pytriton's private stub environment for Python {python_tag()} is missing "
            f"({private}). Run `{INSTALL_COMMAND}` to create it."
        )
    return StubEnvironment(bin_dir=pathlib.Path(sys.executable).parent, own=False)
