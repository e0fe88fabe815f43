"""Triton's error lines of an in-process server whose user configured no log, kept for its errors.

Triton reports a model that failed to load at start-up only as "failed to load all models"; the
model's own error (a ``SyntaxError`` in its ``model.py``, an exception in ``initialize``) is written
to Triton's log alone. Without ``log_error``/``log_file`` that log went nowhere, so
:class:`pytriton.inprocess.Server` sends the error lines to a private file (a fresh ``0700``
directory) for the server's lifetime and quotes each model's reason in the start-up error. The file
holds error lines only and is removed when the server stops or fails to start.

Unit test: tests/unit/test_inprocess.py (reasons read from a log, the file's lifetime).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import List

# Triton's lines naming a model that did not load, and why (2.51 quotes the message): a model whose
# instance failed ("failed to load 'name' version 1: Internal: SyntaxError: ..."), and a model folder
# it could not read ("Poll failed for model directory 'name': failed to read text proto ...").
_FAILED_LOAD = re.compile(r"(?:failed to load|Poll failed for model directory) '([^']+)'(?: version (\d+))?: (.*)")


class ErrorLog:
    """A private file receiving one server's error lines; :meth:`remove` deletes it (idempotent)."""

    def __init__(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="pytriton-inprocess-log-")
        self.path = os.path.join(self._directory, "errors.log")

    def load_failures(self, limit: int = 5) -> List[str]:
        """``"'name' version 1: <reason>"`` per failed model load in the log, at most ``limit``."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as log:
                lines = log.read().splitlines()
        except OSError:
            return []
        found: List[str] = []
        for line in lines:
            match = _FAILED_LOAD.search(line)
            if match is None:
                continue
            name, version, reason = match.groups()
            reason = reason.rstrip().rstrip('"').replace('\\"', '"').replace("\\n", " ").strip()
            entry = f"{name!r}" + (f" version {version}" if version else "") + f": {reason}"
            if entry not in found:
                found.append(entry)
        return found[:limit]

    def remove(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)
