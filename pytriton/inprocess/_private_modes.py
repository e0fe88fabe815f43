"""Make the in-process Python backend create its shared-memory regions 0600 from their first byte.

Why: Triton's Python backend creates one region per stub in ``/dev/shm`` with boost.interprocess,
which calls ``shm_open(name, O_CREAT|O_EXCL|O_RDWR, 0644)`` and then ``fchmod(fd, 0644)``. In the
in-process server (:mod:`pytriton.inprocess`, ``Triton(embedded=True)``) that code runs inside the
user's own process, where pytriton must not set a umask or a seccomp filter for the whole
application (as it does for a server it launches, server/_launch.py). Another local user watching
``/dev/shm`` with inotify could open a region between its creation and any later narrowing, and
keep the descriptor to read later requests' tensors.

How: only the backend library's own calls are changed. Once ``libtriton_python.so`` is loaded
(pytriton preloads it with ``RTLD_NOW``, before the server exists: inprocess/_lib.py), its global
offset table entries for ``shm_open``, ``fchmod`` and ``chmod`` are pointed at three tiny native
trampolines that clear the group and other bits of the ``mode`` argument and jump to the real libc
function. The backend then creates each region 0600 (minus the umask) and its ``fchmod`` keeps it
0600: the region is private from the ``shm_open`` that creates it, at start, after stub restarts
and after recycles, for every in-process server of the process. Nothing else in the process is
touched: the rest of the application calls libc directly.

The trampolines are machine code written into one anonymous page mapped read+execute (x86_64 only:
``and <mode register>, ~0o077; jmp *real``). Where that is not possible (another architecture, a
policy that forbids executable anonymous memory, a library without those relocations),
:func:`protect` returns the reason and the caller keeps the shared-memory guard
(server/_shm_guard.py) as the only defence, with a WARNING (docs/security.md).

Lifetime: the page and the patched entries live as long as the process (the library is never
unloaded: pytriton keeps its handle). Patching is idempotent and thread-safe.

Unit tests: tests/unit/test_private_modes.py.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import pathlib
import platform
import struct
import threading
from typing import Dict, List, Optional, Tuple

LOGGER = logging.getLogger("pytriton.inprocess")

CLAMPED = {"shm_open": 2, "fchmod": 1, "chmod": 1}
"""libc functions whose ``mode`` argument is clamped, with the argument's index."""

_MODE_MASK = 0o077  # group and other permission bits
_RTLD_DI_LINKMAP = 2
_R_X86_64_GLOB_DAT = 6
_R_X86_64_JUMP_SLOT = 7
_SHT_RELA = 4
# x86_64 System V: arguments 1 and 2 (0-based) in esi and edx. "and esi/edx, imm8" sign-extends
# 0xC0 to 0xFFFFFFC0 (= ~0o077); then "jmp qword ptr [rip+0]" followed by the absolute target.
_X86_64_CLEAR = {1: b"\x83\xe6\xc0", 2: b"\x83\xe2\xc0"}
_X86_64_JUMP = b"\xff\x25\x00\x00\x00\x00"

_LOCK = threading.Lock()
_WARNED: List[str] = []
_PATCHED: Dict[int, str] = {}  # link-map base address -> library path, for idempotence
_PAGE: List[mmap.mmap] = []  # the trampoline page, kept for the process's life
_TRAMPOLINES: Dict[str, int] = {}


def trampoline_code(machine: str, argument: int, target: int) -> Optional[bytes]:
    """Machine code that clears ``~0o077`` from argument ``argument`` and jumps to ``target``; None if unsupported."""
    if machine != "x86_64" or argument not in _X86_64_CLEAR:
        return None
    return _X86_64_CLEAR[argument] + _X86_64_JUMP + struct.pack("<Q", target)


def relocations(path: str, names: Tuple[str, ...]) -> Dict[str, List[int]]:
    """Offsets (relative to the load base) of the GOT entries that resolve ``names`` in ELF64 ``path``.

    Only ``R_X86_64_JUMP_SLOT`` and ``R_X86_64_GLOB_DAT`` relocations count (the ones a call through the
    PLT or a function pointer uses). Raises ``OSError``/``ValueError`` if the file is not a little-endian
    ELF64 object.
    """
    with open(path, "rb") as source:
        data = source.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    found: Dict[str, List[int]] = {}
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_RELA or not entsize:
            continue
        symtab = sections[link]
        strtab = sections[symtab[6]]
        for index in range(size // entsize):
            r_offset, r_info, _ = struct.unpack_from("<QQq", data, offset + index * entsize)
            if r_info & 0xFFFFFFFF not in (_R_X86_64_JUMP_SLOT, _R_X86_64_GLOB_DAT):
                continue
            (st_name,) = struct.unpack_from("<I", data, symtab[4] + (r_info >> 32) * symtab[9])
            start = strtab[4] + st_name
            name = data[start : data.index(b"\0", start)].decode(errors="replace")
            if name in names:
                found.setdefault(name, []).append(r_offset)
    return found


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _load_base(handle: int) -> int:
    libc = _libc()
    link_map = ctypes.c_void_p()
    if libc.dlinfo(ctypes.c_void_p(handle), _RTLD_DI_LINKMAP, ctypes.byref(link_map)) != 0 or not link_map.value:
        raise OSError("dlinfo(RTLD_DI_LINKMAP) failed")
    return int(ctypes.c_size_t.from_address(link_map.value).value)  # struct link_map: l_addr comes first


def _trampolines(machine: str) -> Dict[str, int]:
    """One read+execute page holding a trampoline per clamped function (built once)."""
    if _TRAMPOLINES:
        return _TRAMPOLINES
    libc = _libc()
    codes = []
    for name, argument in CLAMPED.items():
        target = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
        code = trampoline_code(machine, argument, int(target or 0))
        if not target or code is None:
            raise OSError(f"no trampoline for {name} on {machine}")
        codes.append((name, code))
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    offsets = {}
    position = 0
    for name, code in codes:
        page[position : position + len(code)] = code
        offsets[name] = position
        position += (len(code) + 15) & ~15
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    _protect(base, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC)  # refused where W^X policies forbid it
    _PAGE.append(page)
    _TRAMPOLINES.update({name: base + offset for name, offset in offsets.items()})
    return _TRAMPOLINES


def _protect(address: int, length: int, prot: int) -> None:
    libc = _libc()
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = address & ~(mmap.PAGESIZE - 1)
    if libc.mprotect(ctypes.c_void_p(start), address + length - start, prot) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mprotect: {os.strerror(error)}")


def page_protection(address: int) -> int:
    """The ``PROT_*`` bits of the mapping that holds ``address`` in this process (``/proc/self/maps``)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(part, 16) for part in span.split("-"))
            if start <= address < end:
                bits = {"r": mmap.PROT_READ, "w": mmap.PROT_WRITE, "x": mmap.PROT_EXEC}
                return sum(bit for flag, bit in bits.items() if flag in perms)
    raise OSError(f"address {address:#x} is not mapped")


def protect(library: ctypes.CDLL, path: str) -> Optional[str]:
    """Clamp the modes the loaded ``library`` (from ``path``) passes to ``shm_open``/``fchmod``/``chmod``.

    Returns None when done (or done before for this library), else why it could not be done; nothing
    is changed then.
    """
    try:
        base = _load_base(int(library._handle))
    except OSError as exc:
        return str(exc)
    return patch(base, path, required=("shm_open", "fchmod"))


def patch(base: int, path: str, required: Tuple[str, ...]) -> Optional[str]:
    """Point the GOT entries of :data:`CLAMPED` functions in the object at load base ``base`` at the trampolines.

    ``path`` is the object's ELF file; ``required`` are the functions it must import (else nothing is
    changed). Returns None when done, else why not.
    """
    machine = platform.machine()
    with _LOCK:
        if _PATCHED.get(base) == path:
            return None
        try:
            slots = relocations(path, tuple(CLAMPED))
            missing = [name for name in required if name not in slots]
            if missing:
                return f"{os.path.basename(path)} does not call {', '.join(missing)} through its GOT"
            trampolines = _trampolines(machine)
            for name, offsets in slots.items():
                for offset in offsets:
                    slot = base + offset
                    original = page_protection(slot)
                    if not original & mmap.PROT_WRITE:  # RELRO makes this part of the GOT read-only
                        _protect(slot, 8, original | mmap.PROT_WRITE)
                    ctypes.c_uint64.from_address(slot).value = trampolines[name]  # one aligned 8-byte store
                    if not original & mmap.PROT_WRITE:
                        _protect(slot, 8, original)
        except (OSError, ValueError, IndexError, struct.error) as exc:
            return str(exc)
        _PATCHED[base] = path
        return None


def protect_python_backend(backend_directory: pathlib.Path) -> bool:
    """Apply :func:`protect` to the Python backend that inprocess/_lib.py preloaded from ``backend_directory``.

    Returns True if its regions will be created private; otherwise logs one WARNING per process that
    says why and what is exposed (the shared-memory guard then narrows each region on sight).
    """
    from pytriton.inprocess import _lib

    path = backend_directory / "python" / "libtriton_python.so"
    library = _lib.preloaded(path) if path.is_file() else None
    reason = protect(library, str(path.resolve())) if library is not None else f"{path} was not preloaded"
    if reason is None:
        return True
    with _LOCK:
        if not _WARNED:
            _WARNED.append(reason)
            LOGGER.warning(
                "Cannot make the in-process Python backend create its shared-memory regions private (%s): each "
                "region is readable by other local users until pytriton narrows it (docs/security.md).",
                reason,
            )
    return False


def refusal() -> Optional[str]:
    """Why :func:`protect_python_backend` last failed in this process (the WARNING's cause); None if it never did."""
    with _LOCK:
        return _WARNED[0] if _WARNED else None


__all__ = ["CLAMPED", "patch", "protect", "protect_python_backend", "refusal", "relocations", "trampoline_code"]
