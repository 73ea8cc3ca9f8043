"""User-facing errors: one line that names the problem and the fix, and an exit code.

The CLI catches DraftfitError and prints `error: <message>` with no traceback; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class DraftfitError(Exception):
    """A mistake or a missing prerequisite the user can fix. `exit_code` 2 by default (bad input)."""

    exit_code = 2

    def __init__(self, message: str, fix: str | None = None, exit_code: int | None = None):
        self.message = message
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(self.one_line())

    def one_line(self) -> str:
        return f"{self.message} — {self.fix}" if self.fix else self.message


class UnknownModelError(DraftfitError):
    pass


class UnknownGpuError(DraftfitError):
    pass


class MissingDependencyError(DraftfitError):
    """An optional heavy dependency (vllm, transformers, sklearn...) is not installed."""

    exit_code = 3


def require(module: str, extra: str = "full"):
    """Import an optional dependency inside the command that needs it, or fail with the install fix."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"this command needs the Python package '{module.split('.')[0]}' ({exc})",
            fix=f"`.venv/bin/pip install -e '.[{extra}]'` in the clone (or `make test`, which installs everything)",
        ) from None
