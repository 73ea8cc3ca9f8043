"""Which `vllm serve` flags and --speculative-config keys each modelled vLLM has.

The lists are extracted from each release's wheel source by bench/vllm_flags.py (engine/arg_utils.py, the frontend
argument dataclasses, config/speculative.py SpeculativeConfig) into draftfit/data/vllm_flags/vllm-<version>.json,
whose `command` field says how. serve_command passes what it wrote through `keep_known`: a flag the version lacks is
dropped with a note, a --speculative-config key it lacks is dropped with a note, and a key the command cannot do
without (method, model, num_speculative_tokens) is refused.
"""

from __future__ import annotations

import json
from functools import lru_cache

from draftfit.errors import DraftfitError
from draftfit.paths import PACKAGE_DIR
from draftfit.engine.rules import VllmRules

FLAGS_DIR = PACKAGE_DIR / "data" / "vllm_flags"
ESSENTIAL_SPEC_KEYS = ("method", "model", "num_speculative_tokens")


@lru_cache(maxsize=None)
def flag_list(modelled: str) -> dict:
    """{'vllm_version', 'serve_flags', 'speculative_config_keys', 'command'} of one modelled version."""
    path = FLAGS_DIR / f"vllm-{modelled}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise DraftfitError(f"no flag list for vLLM {modelled} ({path})",
                            fix="reinstall draftfit, or run bench/vllm_flags.py on that vLLM's wheel") from None


def keep_known(argv: list[str], spec_cfg: dict | None, rules: VllmRules,
               first_flag: int = 0) -> tuple[list[str], dict | None, list[str]]:
    """(argv, speculative_config, notes) with what `rules`' version lacks taken out. argv[first_flag:] is read as
    `--flag [values...]` groups; --speculative-config's JSON is rewritten from the kept keys."""
    modelled = rules.tables_key
    known = flag_list(modelled)
    flags, keys = set(known["serve_flags"]), set(known["speculative_config_keys"])
    notes: list[str] = []
    if spec_cfg is not None:
        missing = [k for k in spec_cfg if k not in keys]
        essential = [k for k in missing if k in ESSENTIAL_SPEC_KEYS]
        if essential:
            raise DraftfitError(f"vLLM {modelled}'s --speculative-config has no {', '.join(essential)}",
                                fix="pass --vllm-version with the vLLM you serve with", exit_code=1)
        if missing:
            spec_cfg = {k: v for k, v in spec_cfg.items() if k in keys}
            notes.append(f"dropped speculative_config {', '.join(missing)}: vLLM {modelled} has no such key "
                         "(config/speculative.py SpeculativeConfig)")
    out, dropped, i = list(argv[:first_flag]), [], first_flag
    while i < len(argv):
        group = [argv[i]]
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            group.append(argv[i])
            i += 1
        flag = group[0]
        if flag.startswith("--") and flag not in flags:
            dropped.append(flag)
            continue
        if flag == "--speculative-config" and spec_cfg is not None:
            group = [flag, json.dumps(spec_cfg)]
        out += group
    if dropped:
        notes.append(f"dropped {', '.join(dropped)}: not a `vllm serve` flag of vLLM {modelled} (engine/arg_utils.py)")
    return out, spec_cfg, notes
