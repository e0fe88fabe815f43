"""How a child process ended, in words, for the errors and logs of whoever supervised it.

Shared by the server's process (:mod:`pytriton.server.process`), self-healing, the CLI and the proxy's worker processes
(:mod:`pytriton.proxy._process`); it imports nothing of pytriton, so every layer can use it.
Unit test: tests/unit/test_self_healing.py (``test_describe_exit``).
"""

from __future__ import annotations

import signal

__all__ = ["describe_exit"]


def describe_exit(returncode: int) -> str:
    """``"killed by SIGKILL"`` or ``"exit code 1"``: how a process ended, from its return code."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
