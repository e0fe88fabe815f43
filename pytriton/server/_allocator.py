"""Which ``malloc`` the ``tritonserver`` process (and its stubs) runs with.

Triton's own documentation recommends jemalloc or tcmalloc over glibc's ``malloc`` because glibc keeps
memory that the server freed after large requests (its heaps fragment and are rarely trimmed). pytriton
cannot link the server binary against another allocator, but the dynamic loader can put one in front of
glibc's: ``LD_PRELOAD`` in the server's environment only (never in the user's process). The stubs are
started by the server and inherit it.

Choices (``TritonConfig.server_allocator``, also ``PYTRITON_TRITON_CONFIG_SERVER_ALLOCATOR``):

* ``"auto"`` (the default, ``None``): jemalloc if its library is installed, else glibc's ``malloc``
  with one warning that says what to install (``apt-get install libjemalloc2`` on Debian/Ubuntu);
* ``"jemalloc"`` / ``"tcmalloc"``: that library, or a clear error if it is not installed;
* ``"glibc"``: no preload (glibc's ``malloc``, tuned by ``server_malloc_arena_max``);
* an absolute path to a shared library: that library.

Why jemalloc first: the figures in docs/soak.md ("Server memory and the allocator").

Unit tests: tests/unit/test_allocator.py.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sysconfig
from typing import Dict, List, Optional, Sequence

from pytriton._platform import proc
from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger("pytriton.triton")

CHOICES = ("auto", "jemalloc", "tcmalloc", "glibc")
ENV = "PYTRITON_TRITON_CONFIG_SERVER_ALLOCATOR"
# Sonames of Debian's/Ubuntu's packages (libjemalloc2, libgoogle-perftools4), and RHEL's.
_LIBRARIES: Dict[str, Sequence[str]] = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"),
}
_PACKAGES = {
    "jemalloc": "apt-get install libjemalloc2 (Debian/Ubuntu) or dnf install jemalloc (RHEL/Fedora)",
    "tcmalloc": "apt-get install libgoogle-perftools4 (Debian/Ubuntu) or dnf install gperftools-libs (RHEL/Fedora)",
}
_warned = False
# jemalloc gives freed memory back only while it allocates, unless a background thread purges it:
# without that the server stayed 1.22x above its start after the 48-connection soak, with it 1.06x
# (docs/soak.md). Dirty pages go back after 1 s idle, and are not kept "muzzy" in between.
# retain:false: jemalloc otherwise keeps freed address space mapped read-write for reuse, which
# counts in VmData and so against the server's RLIMIT_DATA cap (server/process.py, cap_memory):
# after a few large requests a legitimate 1 GiB output failed with "failed to reserve ... bytes"
# (3 of 3 runs of tests/e2e/test_data_path.py; 0 of 3 with retain:false).
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,retain:false"


def library_dirs() -> List[pathlib.Path]:
    """Where distributions install these libraries, most specific first."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [f"/usr/lib/{multiarch}" if multiarch else "", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib64"]
    return [pathlib.Path(d) for d in dirs if d]


def find(name: str, dirs: Optional[Sequence[pathlib.Path]] = None) -> Optional[pathlib.Path]:
    """The installed library of allocator ``name`` ("jemalloc" or "tcmalloc"), or None."""
    for directory in library_dirs() if dirs is None else dirs:
        for soname in _LIBRARIES[name]:
            candidate = directory / soname
            if candidate.is_file():
                return candidate
    return None


def resolve(choice: Optional[str], dirs: Optional[Sequence[pathlib.Path]] = None) -> Optional[pathlib.Path]:
    """The library to preload for ``choice`` (see the module doc), or None for glibc's ``malloc``.

    Raises ``PyTritonValidationError`` for an unknown choice or a named allocator that is not installed.
    """
    global _warned
    if choice is None:  # the config left it open: the environment may choose (also for explicit configs)
        choice = os.environ.get(ENV, "") or "auto"
    if choice == "glibc":
        return None
    if choice.startswith("/"):
        path = pathlib.Path(choice)
        if not path.is_file():
            raise PyTritonValidationError(
                f"TritonConfig.server_allocator={choice!r}: no such file; give an installed shared library, "
                f"or one of {', '.join(CHOICES)}."
            )
        return path
    if choice == "auto":
        found = find("jemalloc", dirs)
        if found is None and not _warned:
            _warned = True
            LOGGER.warning(
                "jemalloc is not installed, so tritonserver runs with glibc's malloc, which keeps memory freed after "
                "large requests (docs/soak.md). Install it: %s; or set TritonConfig(server_allocator='glibc') "
                "(PYTRITON_TRITON_CONFIG_SERVER_ALLOCATOR=glibc) to silence this.",
                _PACKAGES["jemalloc"],
            )
        return found
    if choice not in _LIBRARIES:
        raise PyTritonValidationError(
            f"TritonConfig.server_allocator={choice!r} is unknown; use one of {', '.join(CHOICES)} or an absolute path "
            "to a shared library."
        )
    found = find(choice, dirs)
    if found is None:
        raise PyTritonValidationError(
            f"TritonConfig.server_allocator={choice!r}, but {choice} is not installed here "
            f"(looked for {', '.join(_LIBRARIES[choice])} in {', '.join(str(d) for d in (dirs or library_dirs()))}). "
            f"Install it: {_PACKAGES[choice]}; or use server_allocator='auto' or 'glibc'."
        )
    return found


def preload(env: Dict[str, str], library: Optional[pathlib.Path]) -> None:
    """Put ``library`` first in ``env``'s ``LD_PRELOAD`` (the server's environment; nothing if None).

    For jemalloc also :data:`JEMALLOC_CONF` as ``MALLOC_CONF``, unless ``env`` has one already.
    """
    if library is None:
        return
    existing = [entry for entry in env.get("LD_PRELOAD", "").replace(":", " ").split() if entry != str(library)]
    env["LD_PRELOAD"] = " ".join([str(library), *existing])
    if "jemalloc" in library.name:
        env.setdefault("MALLOC_CONF", JEMALLOC_CONF)


def data_limit(env: Dict[str, str], meminfo: Optional[str] = None) -> Optional[int]:
    """The soft ``RLIMIT_DATA`` for a server started with ``env``: the machine's RAM plus swap under jemalloc, else None.

    jemalloc maps memory with ``MAP_NORESERVE`` wherever the kernel overcommits heuristically (the
    default), which takes away the kernel's refusal of a single allocation larger than the machine:
    a request declaring a 32 GiB tensor then made the server touch pages until the OOM killer ended
    it (or something else on the machine), where glibc's ``malloc`` failed at once (``std::bad_alloc``,
    a clean restart). A data limit of RAM plus swap restores that refusal and nothing else.
    """
    if "jemalloc" not in env.get("LD_PRELOAD", ""):
        return None
    sizes = proc.meminfo(meminfo) if meminfo is not None else proc.meminfo()
    if "MemTotal" not in sizes:
        return None
    return sizes["MemTotal"] + sizes.get("SwapTotal", 0)


__all__ = ["CHOICES", "JEMALLOC_CONF", "data_limit", "find", "library_dirs", "preload", "resolve"]
