"""One heavy job at a time on small machines: vLLM engines and model conversions take this lock."""

from __future__ import annotations

import contextlib
import fcntl
import os

LOCK_PATH = os.environ.get("DRAFTFIT_HEAVY_LOCK", "/tmp/draftfit-heavy.lock")


@contextlib.contextmanager
def heavy_lock():
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
