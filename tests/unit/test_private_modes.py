"""The in-process backend's mode clamp (pytriton/inprocess/_private_modes.py), on real libraries of this interpreter.

The patch changes a library's calls for the rest of the process, so each case runs in a child
interpreter: Python's own ``os.fchmod``/``os.chmod`` (libpython or the executable) and
``_posixshmem.shm_open`` (the extension behind multiprocessing.shared_memory) stand in for the
backend's boost code. Before the patch the child sees the mode it asked for; after it, the group and
other bits are gone, from the call that creates the region.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from pytriton.inprocess import _private_modes

CHILD = textwrap.dedent(
    """
    import ctypes, json, mmap, os, stat, sys, tempfile, uuid
    import _posixshmem
    from pytriton.inprocess import _private_modes as m

    class Info(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

    def mode(path):
        return stat.S_IMODE(os.stat(path).st_mode)

    out = {}
    os.umask(0)  # the clamp, not the umask, must narrow the modes
    directory = tempfile.mkdtemp()
    target = os.path.join(directory, "f")
    descriptor = os.open(target, os.O_CREAT | os.O_RDWR, 0o600)
    name = "/pytriton-clamp-test-" + uuid.uuid4().hex
    # before: the calls do what they are asked
    os.fchmod(descriptor, 0o644)
    out["fchmod_before"] = mode(target)
    shm = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    out["shm_before"] = mode("/dev/shm" + name)
    os.close(shm)
    _posixshmem.shm_unlink(name)
    # libpython (or the executable that embeds it) holds os.fchmod's and os.chmod's calls
    info = Info()
    ctypes.CDLL(None).dladdr(ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p), ctypes.byref(info))
    path = info.fname.decode()
    if not os.path.isabs(path) or not os.path.exists(path):
        path = os.path.realpath(sys.executable)
    with open(path, "rb") as elf:
        header = elf.read(18)
    base = info.fbase if header[16] == 3 else 0  # ET_DYN: relative to the load base; ET_EXEC: absolute
    slots = m.relocations(path, tuple(m.CLAMPED))
    got = base + slots["fchmod"][0]
    protection = m.page_protection(got)
    out["patch"] = m.patch(base, path, required=("fchmod",))
    out["patch_again"] = m.patch(base, path, required=("fchmod",))
    out["protection_kept"] = m.page_protection(got) == protection
    out["missing"] = m.protect(ctypes.CDLL(_posixshmem.__file__), _posixshmem.__file__) is not None
    os.fchmod(descriptor, 0o755)
    out["fchmod_after"] = mode(target)
    os.chmod(target, 0o4777)
    out["chmod_after"] = mode(target)
    os.fchmod(descriptor, 0o500)
    out["fchmod_narrow"] = mode(target)
    os.close(descriptor)
    os.unlink(target)
    os.rmdir(directory)
    # the extension behind shared_memory: shm_open with the mode in the third argument
    library = ctypes.CDLL(_posixshmem.__file__)
    out["shm_patch"] = m.patch(m._load_base(library._handle), _posixshmem.__file__, required=("shm_open",))
    shm = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
    out["shm_after"] = mode("/dev/shm" + name)
    os.close(shm)
    _posixshmem.shm_unlink(name)
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the trampolines exist for x86_64 only (docs/security.md)")
def test_clamped_calls_create_and_keep_files_private():
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["fchmod_before"] == 0o644 and out["shm_before"] == 0o644  # the control: nothing clamped yet
    assert out["patch"] is None and out["patch_again"] is None and out["protection_kept"]
    assert out["missing"]  # _posixshmem calls no fchmod: protect() refuses it and changes nothing
    assert out["fchmod_after"] == 0o700 and out["chmod_after"] == 0o4700 and out["fchmod_narrow"] == 0o500
    assert out["shm_patch"] is None and out["shm_after"] == 0o600


def test_trampoline_code():
    code = _private_modes.trampoline_code("x86_64", 1, 0x1122334455667788)
    assert code == b"\x83\xe6\xc0\xff\x25\x00\x00\x00\x00" + bytes.fromhex("8877665544332211")
    assert _private_modes.trampoline_code("x86_64", 2, 1)[:3] == b"\x83\xe2\xc0"  # edx: the third argument
    assert _private_modes.trampoline_code("aarch64", 1, 1) is None
    assert _private_modes.trampoline_code("x86_64", 0, 1) is None


def test_relocations_refuse_a_file_that_is_not_elf64(tmp_path):
    bogus = tmp_path / "lib.so"
    bogus.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ValueError, match="not a little-endian ELF64"):
        _private_modes.relocations(str(bogus), ("fchmod",))
    assert _private_modes.patch(0, str(bogus), ("fchmod",)) is not None  # a reason, nothing changed


def test_a_library_that_is_not_preloaded_is_reported_once(tmp_path, caplog):
    _private_modes._WARNED.clear()
    try:
        assert not _private_modes.protect_python_backend(tmp_path)
        assert not _private_modes.protect_python_backend(tmp_path)
    finally:
        _private_modes._WARNED.clear()
    warnings = [
        record.getMessage() for record in caplog.records if "shared-memory regions private" in record.getMessage()
    ]
    assert len(warnings) == 1 and "was not preloaded" in warnings[0]
