"""Measured targets beside which a separate draft model's loop runs slower than the fitted host cost says.

vLLM 0.26 runs a draft_model drafter's K-1 loop passes on the engine core's one thread; the step-cost model charges
each pass the draft's layers x one fitted host cost per layer (stepcost.draft_layer_ms), the same beside every
target. On one H200 the same draft ran its passes about 1.5x slower beside Qwen1.5-MoE-A2.7B than that cost, in
every engine start measured (three leases), while beside Mixtral-8x7B it ran as beside the dense Mistral-7B-v0.1
(docs/benchmarks.md, section bench:draft-loop-factor; history: docs/archive/GPU_CAMPAIGN.md). Why is open (the KV page size was tested and is not
it), so the factor is a measured property of that target, like a calibration table, and no other target gets one:
a target not in the file is charged the fitted cost, with the prior's host-bound band.

The file (draftfit/data/calibration/host_factors/draft_loop.json) is written by bench/draft_loop_factor.py from
raw diagnostic engines, never by hand, and only from engines whose (target, draft) has no calibration table, so a
leave-one-configuration-out score of a table never sees its own steps through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from draftfit.calibration.tables import CALIBRATION_DIR, DEFAULT_TABLE_VLLM
from draftfit.engine.versions import tables_key_of

LOOP_FACTOR_FILE = CALIBRATION_DIR / "host_factors" / "draft_loop.json"


@dataclass(frozen=True)
class DraftLoopFactor:
    """What the draft loop's host cost per layer is multiplied by beside `target` (measured)."""

    target: str
    vllm_version: str  # the modelled vLLM whose fitted host cost it scales
    factor: float  # mean over the engine pairs
    low: float  # the smallest and largest engine pair
    high: float
    n_pairs: int
    measured_with: tuple  # the drafts timed beside the target
    source: str  # where the engines' raw files and the method are

    def note(self) -> str:
        return (f"beside {self.target} a draft model's loop passes run {self.factor:.2f}x the fitted host cost per "
                f"draft layer ({self.low:.2f}-{self.high:.2f}x over {self.n_pairs} measured engine pairs with "
                f"{', '.join(self.measured_with)}, vLLM {self.vllm_version}, H200: {self.source}); "
                f"the prior charges it")


@lru_cache(maxsize=4)
def _load(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        return {}
    data = json.loads(p.read_text())
    out = {}
    for name, row in (data.get("targets") or {}).items():
        key = tables_key_of(data.get("vllm_version"))  # the file's own recorded vLLM
        out[(key, name)] = DraftLoopFactor(
            target=name, vllm_version=key, factor=float(row["factor"]),
            low=float(row["low"]), high=float(row["high"]), n_pairs=int(row["n_pairs"]),
            measured_with=tuple(row.get("measured_with", ())), source=str(data.get("source", "")))
    return out


def draft_loop_factor(target, draft, tables_key: str | None = None, path: Path | None = None):
    """The measured factor for `draft`'s loop beside `target` under `tables_key` (VllmRules.tables_key, or the
    key the overheads were fitted for; 0.26's when None),
    or None: only separate draft models (method draft_model) run the loop it was measured on; EAGLE/MTP heads,
    n-gram and suffix do not."""
    if getattr(draft, "method", "draft_model") != "draft_model":
        return None
    return _load(str(path or LOOP_FACTOR_FILE)).get((tables_key or DEFAULT_TABLE_VLLM, target.name))
