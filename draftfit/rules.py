"""The decision rules every stage shares, each written once.

rank, preflight, serve-cmd, launch-script, speedup and monitor all decide through these; none keeps a copy.
"""

from __future__ import annotations

from typing import Literal, get_args

# A best speedup under this is not worth a second model and its KV cache: say "don't". 5 % is about the
# run-to-run spread of a quiet calibrated configuration (CalibrationTable.step_band's floor, 6 %).
NO_SPECULATION_BELOW = 1.05

# K assumed when sizing memory: the draft's KV does not depend on K, activations barely do.
PLAN_K = 4

# The K range draftfit predicts over and measures up to (vLLM accepts more; past 8 no catalog pair gains).
K_MAX = 8
K_VALUES = tuple(range(1, K_MAX + 1))

# The built-in prompt sets (draftfit/data/prompts/<workload>.jsonl) and the priors' workload feature.
Workload = Literal["code", "code-edit", "math", "chat", "summarization"]
WORKLOADS: tuple[str, ...] = get_args(Workload)
# What each workload stands for (shown by every --workload's --help). code-edit is kept apart from code because a
# rewrite repeats most of its input, which is where prompt lookup and suffix decoding pay most.
WORKLOAD_MEANING: dict[str, str] = {
    "code": "write new code from a signature and docstring (HumanEval)",
    "code-edit": "rewrite given code under an edit instruction (HumanEval solutions)",
    "math": "step-by-step word problems (GSM8K)",
    "chat": "open-ended first user turns (ShareGPT)",
    "summarization": "summarize a long given text (long ShareGPT answers)",
}
WORKLOAD_HELP = "; ".join(f"{w}: {WORKLOAD_MEANING[w]}" for w in WORKLOADS)

TP_CHOICES = (1, 2, 4, 8)


def worth_speculating(speedup: float | None) -> bool:
    """The single "worth it" rule: speculation pays when the predicted speedup reaches NO_SPECULATION_BELOW."""
    return speedup is not None and speedup >= NO_SPECULATION_BELOW


def best_k(per_k_speedup: dict[int, float]) -> int:
    """The K with the highest speedup; ties go to the smaller K (less draft work for the same gain)."""
    return max(sorted(per_k_speedup), key=lambda k: per_k_speedup[k])


def best_k_for_mix(per_batch_per_k: dict[int, dict[int, float]], weights: dict[int, float] | None = None) -> int:
    """The one K that maximises the user's batch mix: the weighted mean speedup over the batch sizes asked
    about (equal weights by default). Used when a single K is served (no per-batch schedule)."""
    batches = sorted(per_batch_per_k)
    ks = sorted(set.intersection(*(set(per_batch_per_k[b]) for b in batches)))
    w = {b: (weights or {}).get(b, 1.0) for b in batches}
    total = sum(w.values()) or 1.0
    return max(ks, key=lambda k: sum(w[b] * per_batch_per_k[b][k] for b in batches) / total)
