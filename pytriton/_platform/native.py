"""The few C-library and CPython calls pytriton makes outside the in-process API's binding of Triton.

- :func:`die_with_parent`: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills a child (the
  server, a process instance's worker) when the thread that started it ends, even by SIGKILL. Safe
  between ``fork`` and ``exec``: ``prctl`` is resolved at import, so the child loads no library.
- :func:`raise_in_thread`: CPython's ``PyThreadState_SetAsyncExc`` (a callable past its deadline).
- :func:`inotify_watch`: an inotify descriptor on one directory (the shared-memory guard).

Everything else that needs ``ctypes`` lives in this package too: the private launch's ``ptrace`` and
seccomp filter, and the in-process server's confined start thread, are in ``launch.py``
(tests/unit/test_platform_boundary.py keeps such calls inside the layer).
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable, Optional, Type

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Optional[Callable[..., int]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has prctl
        return None


_PRCTL = _load_prctl()  # resolved before any fork: the child must not load libraries


def die_with_parent() -> bool:
    """Ask the kernel for SIGKILL when the parent (the thread that forked this process) ends; False if refused."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def inotify_watch(directory: str, mask: int) -> int:
    """A new non-blocking, close-on-exec inotify descriptor watching ``directory`` for ``mask``; raises ``OSError``.

    The caller owns the descriptor (``os.close`` it); events are read from it with ``os.read``.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        descriptor = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    except AttributeError as exc:  # pragma: no cover - a libc without inotify
        raise OSError(f"no inotify in this C library: {exc}") from None
    if descriptor < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1 failed")
    if libc.inotify_add_watch(descriptor, directory.encode(), mask) < 0:
        error = ctypes.get_errno()
        os.close(descriptor)
        raise OSError(error, f"cannot watch {directory}")
    return int(descriptor)


def raise_in_thread(ident: int, exc_type: Type[BaseException]) -> bool:
    """Ask Python to raise ``exc_type`` in the thread ``ident``; False if that thread is gone.

    Python raises it at the thread's next eval-breaker check (a loop's backward jump, a function's
    start), which in pure-Python code comes within a few bytecodes.
    """
    return bool(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type)))
