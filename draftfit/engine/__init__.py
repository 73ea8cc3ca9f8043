"""The engine a command is for, resolved once into the Layout: EngineTarget(version, modelled, note, rules).
resolve_target is the ONE default rule (the version given, else an installed GPU vLLM, else the newest modelled);
check_version is the one policy for a version draftfit does not model. Imports only errors, paths, catalog."""

from __future__ import annotations

import re
from dataclasses import dataclass

from draftfit.engine.rules import VLLM_RULES, VllmRules
from draftfit.engine import versions as _versions
from draftfit.engine.versions import MODELLED, parse_version, resolve_vllm_version
from draftfit.errors import DraftfitError

_VERSION_RE = re.compile(r"^v?\d+\.\d+(\.\d+)*([.+\-]?[A-Za-z0-9]+)*$")


@dataclass(frozen=True)
class EngineTarget:
    version: str  # the vLLM version asked for (or installed, or the default)
    modelled: str  # the modelled version standing for it (versions.MODELLED)
    note: str  # which version and why (the layout's notes and --json)
    rules: VllmRules
    # Where the version came from: "requested" (--vllm-version), "installed" (a GPU vLLM here) or "newest" (none of
    # those: the newest modelled). The serve command states the version only when it was not a default.
    origin: str = "newest"

    @property
    def requested(self) -> str | None:
        """The version the user passed (--vllm-version), None when none was."""
        return self.version if self.origin == "requested" else None

    @property
    def mapped(self) -> bool:
        """The version is not modelled exactly: another modelled version's rules stand for it (note says why)."""
        return parse_version(self.version)[:2] != parse_version(self.modelled)[:2]

    @property
    def is_default(self) -> bool:
        return self.origin == "newest"


def check_version(version: str | None, option: str = "--vllm-version") -> str | None:
    """The version as given, or DraftfitError: not a version (banana, empty, 0.0, 0.0.0), or older than the oldest
    modelled (its methods, flags and start-up rules are not draftfit's to predict: a 0.6 has no EAGLE-3)."""
    if version is None:
        return None
    text = str(version).strip()
    v = parse_version(text)
    if len(v) < 2 or v[0] > 9 or not _VERSION_RE.match(text) or not any(v):
        raise DraftfitError(f"{option} {version!r} is not a vLLM version",
                            fix=f"pass one of the modelled versions: {', '.join(m + '.0' for m in MODELLED)}")
    if v[:2] < parse_version(MODELLED[0]):
        raise DraftfitError(f"{option} {text} is older than the oldest vLLM draftfit models ({MODELLED[0]}): its "
                            f"methods, flags and start-up rules are not modelled",
                            fix=f"upgrade vLLM, or pass one of {', '.join(m + '.0' for m in MODELLED)}")
    return text


def resolve_target(version: str | None = None) -> EngineTarget:
    """The engine for `version` (checked), else an installed GPU vLLM, else the newest modelled."""
    checked = check_version(version)
    used, modelled, note = resolve_vllm_version(checked)
    origin = "requested" if checked else ("installed" if installed_gpu_vllm_version() else "newest")
    return EngineTarget(version=used, modelled=modelled, note=note, rules=VLLM_RULES[modelled], origin=origin)


def installed_gpu_vllm_version() -> str | None:
    return _versions.installed_gpu_vllm_version()  # looked up through the module: tests monkeypatch it there


def rules_for(modelled: str) -> VllmRules:
    return VLLM_RULES[modelled]
