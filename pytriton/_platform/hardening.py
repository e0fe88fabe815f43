"""One switch for every protection pytriton adds on top of Triton: ``PYTRITON_HARDENING=off|auto|strict``.

The protections (docs/security.md, "Hardening modes"):

- ``hidden-token``: the access token never appears in the server's command line (the private launch
  traces the new process with ``ptrace`` and swaps one argv pointer; _platform/launch.py);
- ``chmod-filter``: a seccomp filter on the server and its stubs refuses any ``chmod`` that would let
  group or other open a shared-memory region (_platform/launch.py);
- ``shm-guard``: an inotify watcher narrows each region of this instance to 0600 on sight
  (server/_shm_guard.py; the in-process server's defence, a second line for the others);
- ``inprocess-modes``: the in-process server's Python backend creates its regions 0600 from the start:
  the server is created from a thread with its own umask 077 and the chmod filter, which the threads
  Triton starts from it inherit (launch.py, :func:`~pytriton._platform.launch.call_confined`); no
  other thread of the user's process is touched.

Modes:

- ``auto`` (the default): apply what the platform allows; each protection that cannot be applied is
  logged once per process at WARNING with its cause (e.g. Yama refuses ``ptrace``) and the start goes on;
- ``strict``: a protection that cannot be applied fails the start with
  :class:`~pytriton.exceptions.PyTritonServerError` naming the protection and the cause;
- ``off``: none is applied. The product works the same way (same endpoints, same data path), with
  what each protection closes left open (listed in docs/security.md).

The mode comes from ``TritonConfig(hardening=...)`` when set, else from ``PYTRITON_HARDENING``, else
``auto``; it is resolved once per server start (:func:`resolve`) and an invalid value is an error
naming the variable and the choices. :class:`Protections` is the record a start fills (each
:class:`Protection` active or not, with its cause); ``pytriton check`` and the startup DEBUG line show it.
Unit tests: tests/unit/test_hardening.py.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Dict, List, Mapping, NamedTuple, Optional, Set, Tuple

from pytriton.exceptions import PyTritonServerError, PyTritonValidationError

ENV = "PYTRITON_HARDENING"
OFF, AUTO, STRICT = "off", "auto", "strict"
MODES = (OFF, AUTO, STRICT)
DEFAULT = AUTO

LOGGER = logging.getLogger("pytriton.server.process")  # where the server's launch has always logged

HIDDEN_TOKEN = "hidden-token"
CHMOD_FILTER = "chmod-filter"
SHM_GUARD = "shm-guard"
INPROCESS_MODES = "inprocess-modes"

WHAT = {
    HIDDEN_TOKEN: "the access token is kept out of the server's command line (/proc/<pid>/cmdline)",
    CHMOD_FILTER: "a seccomp filter keeps the Python backend's shared-memory regions 0600 from their first byte",
    SHM_GUARD: "an inotify guard narrows this instance's shared-memory regions to 0600 on sight",
    INPROCESS_MODES: "the in-process Python backend creates its shared-memory regions 0600",
}
"""What each protection does, in words (for ``pytriton check`` and the logs)."""


def parse(value: Optional[str], source: str = ENV) -> Optional[str]:
    """``value`` as a mode (case and spaces ignored); None for None or empty; raises on anything else."""
    if value is None or not value.strip():
        return None
    mode = value.strip().lower()
    if mode not in MODES:
        raise PyTritonValidationError(
            f"{source}={value!r} is not a hardening mode; use one of {', '.join(MODES)} "
            f"(auto: apply what the platform allows; strict: refuse to start without every protection; "
            f"off: apply none). See docs/security.md, 'Hardening modes'."
        )
    return mode


def resolve(configured: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The mode of one server start: ``configured`` (``TritonConfig.hardening``), else ``PYTRITON_HARDENING``, else auto."""
    chosen = parse(configured, "TritonConfig.hardening")
    if chosen is not None:
        return chosen
    environ = os.environ if environ is None else environ
    return parse(environ.get(ENV)) or DEFAULT


class Protection(NamedTuple):
    """One protection of one start: whether it is active and, when not, why."""

    name: str
    active: bool
    cause: str = ""

    def describe(self) -> str:
        if self.active:
            return f"{self.name}: active"
        return f"{self.name}: inactive ({self.cause})"


_warned: Set[Tuple[str, str]] = set()
_warned_lock = threading.Lock()


class Protections:
    """What one start applied, filled by the launch; a refusal raises under ``strict``, warns once under ``auto``."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise PyTritonValidationError(f"unknown hardening mode {mode!r}; use one of {', '.join(MODES)}")
        self.mode = mode
        self._records: Dict[str, Protection] = {}

    @property
    def enabled(self) -> bool:
        """False under ``off``: the launch applies no protection at all."""
        return self.mode != OFF

    def applied(self, name: str) -> None:
        self._records[name] = Protection(name, True)

    def skipped(self, name: str, cause: str = "PYTRITON_HARDENING=off") -> None:
        """Not attempted (``off``, or not relevant here): recorded, never warned about."""
        self._records[name] = Protection(name, False, cause)

    def refused(self, name: str, cause: str, message: str = "") -> None:
        """The platform refused ``name`` because of ``cause``.

        ``strict``: raises :class:`PyTritonServerError` naming both. ``auto``: records it and logs one
        WARNING per (protection, cause) per process (restarts do not repeat it): ``message`` (which
        should name the cause and what is exposed), else a generic line naming the cause.
        """
        self._records[name] = Protection(name, False, cause)
        if self.mode == STRICT:
            raise PyTritonServerError(
                f"PYTRITON_HARDENING=strict: cannot apply the protection '{name}' ({WHAT.get(name, name)}): "
                f"{cause}. Fix the cause, or set PYTRITON_HARDENING=auto to start without it (with a warning) "
                f"(docs/security.md, 'Hardening modes')."
            )
        key = (name, cause)
        with _warned_lock:
            if key in _warned:
                return
            _warned.add(key)
        if message:
            LOGGER.warning("%s", message)
        else:
            LOGGER.warning(
                "Protection '%s' (%s) is not applied: %s (PYTRITON_HARDENING=auto; strict would refuse to start; "
                "docs/security.md).",
                name,
                WHAT.get(name, name),
                cause,
            )

    def records(self) -> List[Protection]:
        return list(self._records.values())

    def active(self, name: str) -> Optional[bool]:
        """Whether ``name`` is active; None if this start has no record of it."""
        record = self._records.get(name)
        return None if record is None else record.active

    def summary(self) -> str:
        """One line for the startup DEBUG log: the mode and each protection's state."""
        parts = "; ".join(record.describe() for record in self._records.values()) or "none recorded"
        return f"hardening={self.mode}: {parts}"


def forget_warnings() -> None:
    """Let every fallback warn again (tests)."""
    with _warned_lock:
        _warned.clear()
