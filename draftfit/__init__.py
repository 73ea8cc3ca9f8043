"""draftfit: pick, size and tune a drafter for vLLM speculative decoding.

The package's top level is the API (the CLI imports it like any user):

    from draftfit import build_layout, evaluate_pair
    from draftfit.rank import rank                 # every candidate for a target, sorted
    layout = build_layout("Llama-3.1-70B", gpu="H200", tp=2, batches=(1, 32))
    ev = evaluate_pair(layout, "Llama-3.2-1B")      # compat, memory, acceptance, speedup, decision
    print(ev.decision.action, ev.decision.k, ev.decision.per_batch)

Names load on first use (PEP 562), so `import draftfit` and `draftfit --help` stay fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_API = {
    "DraftfitError": "draftfit.errors",
    "Layout": "draftfit.layout",
    "build_layout": "draftfit.layout",
    "PairEvaluation": "draftfit.pipeline",
    "evaluate_pair": "draftfit.pipeline",
    "command_for": "draftfit.pipeline",
    "RankResult": "draftfit.rank",
    "resolve_model": "draftfit.catalog.specs",
    "resolve_gpu": "draftfit.catalog.specs",
    "check_pair": "draftfit.compat.tokenizers",
    "plan_memory": "draftfit.memory.plan",
    "prior_acceptance": "draftfit.acceptance.prior",
    "predict_speedup": "draftfit.speedup.predict",
    "serve_command": "draftfit.engine.command",
}
__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'draftfit' has no attribute {name!r}")
