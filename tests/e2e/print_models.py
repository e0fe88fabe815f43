"""Callables for tests/e2e/test_backend_print.py: module-level, so a backend instance's stub can load them."""

from __future__ import annotations

import sys

from pytriton.decorators import batch


@batch
def talkative(x):
    print(f"stub says: batch of {len(x)}")
    print("stub warns: on stderr", file=sys.stderr)
    return {"y": x}
