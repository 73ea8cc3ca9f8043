"""Stage: speedup — expected TPOT speedup of speculative decoding for each K and batch size.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023
(arXiv:2211.17192): with i.i.d. acceptance a, a step that drafts K tokens yields on average
E = (1 - a^(K+1)) / (1 - a) tokens (eq. 1), and costs K*c + 1 plain target steps when a draft pass
costs c of a target pass, so the walltime improvement is E / (K*c + 1) (Theorem 3.8).

For a measured acceptance curve a_i = P(the first i drafts are all accepted), E = 1 + sum_{i<=K} a_i.
draftfit replaces K*c + 1 with measured or modelled step costs (draftfit.speedup.stepcost):
speedup(K, B) = E(K) * plain_step(B) / speculative_step(K, B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from draftfit.acceptance.curve import _check_alpha, _check_curve, expected_tokens_per_step, extend_curve
from draftfit.errors import DraftfitError
from draftfit.rules import NO_SPECULATION_BELOW, best_k
from draftfit.engine.rules import VllmRules
from draftfit.speedup.stepcost import step_cost_model

LEVIATHAN = "Leviathan et al. 2023, arXiv:2211.17192, eq. 1 and Thm 3.8"


def analytic_speedup(alpha, k: int, c: float) -> float:
    """Leviathan et al.'s expected walltime improvement E / (K*c + 1)."""
    if c < 0:
        raise DraftfitError(f"cost ratio c = {c} is negative", fix="c = draft step time / target step time")
    return expected_tokens_per_step(alpha, k) / (int(k) * float(c) + 1.0)




@dataclass
class SimpleSpeedup:
    """`draftfit speedup --alpha --k --c`: the closed form, with where it came from."""

    speedup: float
    expected_tokens_per_step: float
    k: int
    c: float
    alpha: float | None
    acceptance_curve: list | None
    source: str = LEVIATHAN
    per_k: dict = field(default_factory=dict)  # K -> speedup, for context
    best_k: int | None = None


def simple_speedup(*, k: int, c: float, alpha=None, curve=None, k_values=range(1, 9)) -> SimpleSpeedup:
    acc = curve if curve is not None else alpha
    if acc is None:
        raise DraftfitError("no acceptance given", fix="pass --alpha, --acceptance-curve or --run")
    per_k = {kk: round(analytic_speedup(acc, kk, c), 4) for kk in k_values}
    best = max(per_k, key=per_k.get)
    return SimpleSpeedup(speedup=analytic_speedup(acc, k, c), expected_tokens_per_step=expected_tokens_per_step(acc, k),
                         k=k, c=c, alpha=alpha, acceptance_curve=list(curve) if curve is not None else None,
                         per_k=per_k, best_k=best)


# ---------------------------------------------------------------------------------------------------
# Full prediction: acceptance x step costs per batch size
# ---------------------------------------------------------------------------------------------------

@dataclass
class BatchPrediction:
    batch: int
    best_k: int  # 0 when speculation does not pay
    speedup: float  # at best_k (1.0 when best_k == 0)
    low: float
    high: float
    per_k: dict  # K -> {speedup, low, high, expected_tokens_per_step, spec_step_ms, tpot_ms}
    base_step_ms: float
    c: float
    spec_overhead_ms: float
    source: str
    verdict: str  # 'speculate' | "don't"
    measured: dict = field(default_factory=dict)  # K -> measured speedup at the calibration's acceptance


@dataclass
class SpeedupPrediction:
    target: str
    draft: str
    gpu: str
    tp: int
    alpha: float
    acceptance_curve: list
    acceptance_source: str
    batches: dict  # batch -> BatchPrediction
    source: str  # step costs: 'calibrated:<file>' | 'roofline prior'
    verdict: str  # 'speculate' if any batch gains >= 5 %, else "don't"
    recommended_k: int
    k_schedule: list | None  # vLLM num_speculative_tokens_per_batch_size [(lo, hi, K)] when K varies
    notes: list = field(default_factory=list)
    citation: str = LEVIATHAN
    context_len: int | None = None  # mean tokens of context per sequence the step costs assume
    # The key names every command's JSON shares for the same things (rank's candidates, serve-cmd, preflight).
    k: int | None = None  # = recommended_k
    decision: str = ""  # = verdict: speculate | don't
    step_cost_vllm: str = ""  # the vLLM version(s) whose step-cost tables the step costs come from
    vllm_version: str = ""  # the vLLM asked for ("" when none was); the band is widened when it has no tables


def _acceptance_parts(acceptance):
    """(curve_or_alpha, alpha, low_acc, high_acc, source) from a float, a list, or an estimate object."""
    if isinstance(acceptance, (int, float)):
        a = _check_alpha(acceptance)
        return a, a, a, a, "given"
    if isinstance(acceptance, (list, tuple)):
        curve = _check_curve(acceptance)
        return curve, curve[0], curve, curve, "given curve"
    alpha = getattr(acceptance, "alpha", None) or getattr(acceptance, "acceptance_rate", None)
    if alpha is None:
        raise DraftfitError(f"cannot read an acceptance rate from {type(acceptance).__name__}",
                            fix="pass a float alpha or a per-position list")
    curve = getattr(acceptance, "per_position", None)
    acc = _check_curve(curve) if curve else _check_alpha(alpha)
    low = getattr(acceptance, "low", None) or getattr(acceptance, "ci_low", None)
    high = getattr(acceptance, "high", None) or getattr(acceptance, "ci_high", None)
    src = getattr(acceptance, "source", None) or (f"run {acceptance.run_id}" if getattr(acceptance, "run_id", None)
                                                   else type(acceptance).__name__)
    if low is not None and high is not None and alpha:
        # Scale the curve position by position so the band keeps its shape.
        lo_acc = [v * (low / alpha) ** (i + 1) for i, v in enumerate(acc)] if isinstance(acc, list) else low
        hi_acc = [min(v * (high / alpha) ** (i + 1), 1.0) for i, v in enumerate(acc)] if isinstance(acc, list) \
            else min(high, 1.0)
        if isinstance(hi_acc, list):  # keep it non-increasing after clipping
            for i in range(1, len(hi_acc)):
                hi_acc[i] = min(hi_acc[i], hi_acc[i - 1])
        return acc, float(alpha), lo_acc, hi_acc, src
    return acc, float(alpha), acc, acc, src


def k_schedule(best_by_batch: dict) -> list | None:
    """vLLM's num_speculative_tokens_per_batch_size (inclusive batch ranges, first starting at 1), split at
    the geometric midpoints between the batch sizes asked about; None when one K serves all."""
    items = sorted(best_by_batch.items())
    if len({k for _, k in items}) <= 1:
        return None
    ranges = []
    start = 1
    for i, (b, k) in enumerate(items):
        if i + 1 < len(items):
            end = max(int(math.sqrt(b * items[i + 1][0])), start)
        else:  # vLLM carries the last K past the final range; 1024 covers the default max_num_seqs
            end = max(1024, b)
        ranges.append([start, end, k])
        start = end + 1
    merged = []
    for r in ranges:
        if merged and merged[-1][2] == r[2]:
            merged[-1][1] = r[1]
        else:
            merged.append(r)
    return [tuple(r) for r in merged]


def check_invariants(target: str, draft: str, batch: int, base_step_ms: float, per_k: dict) -> None:
    """The physics every prediction must obey, checked before a number is printed: a speculative step costs at
    least a plain step (it verifies at least the plain step's tokens), so the speedup never exceeds the expected
    tokens per step; the band is finite and contains the point estimate. A violation is a bug in the step-cost
    model for this pair, reported as an error naming it, never a printed number."""
    for k, r in per_k.items():
        where = f"{target} + {draft} at batch {batch}, K={k}"
        vals = (base_step_ms, r["spec_step_ms"], r["speedup"], r["low"], r["high"])
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
            raise DraftfitError(f"step-cost model gave a non-finite value for {where}: {vals}",
                                fix="report it: the step-cost model is wrong for this pair")
        if r["spec_step_ms"] < base_step_ms * (1 - 1e-9):
            raise DraftfitError(f"step-cost model priced a speculative step ({r['spec_step_ms']:.2f} ms) under a plain "
                                f"step ({base_step_ms:.2f} ms) for {where}",
                                fix="report it: the step-cost model is wrong for this pair")
        if r["speedup"] > r["expected_tokens_per_step"] * (1 + 1e-9):
            raise DraftfitError(f"speedup {r['speedup']:.2f}x exceeds the {r['expected_tokens_per_step']:.2f} expected "
                                f"tokens per step for {where}", fix="report it: the step-cost model is wrong here")
        if not r["low"] - 1e-9 <= r["speedup"] <= r["high"] + 1e-9:
            raise DraftfitError(f"band [{r['low']:.2f}-{r['high']:.2f}] misses its point {r['speedup']:.2f}x for "
                                f"{where}", fix="report it: the step-cost model is wrong for this pair")


def predict_speedup(target, draft, gpu, *, tp: int = 1, acceptance, batches=(1,), k_values=range(1, 9),
                    context_len: int = 1024, calibration_dir=None, rules: VllmRules | None = None, kv_dtype_bytes: int = 2,
                    predictor: str | None = None) -> SpeedupPrediction:
    """Predicted TPOT speedup for each K and batch size, best K per batch, band, verdict and K schedule.
    rules: the Layout's engine.rules (whose step-cost tables; None: 0.26's tables, band as calibrated).
    predictor: a name in stepcost.PREDICTORS to force one ('roofline' where a table exists); None lets
    stepcost.select_predictor choose."""
    ks = sorted({int(k) for k in k_values})
    if not ks or ks[0] < 1:
        raise DraftfitError("K values must be 1 or more", fix="e.g. --k 4, or leave --k out for 1..8")
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1:
        raise DraftfitError("batch sizes must be 1 or more", fix="e.g. --batch 1,8,32")
    acc, alpha, acc_lo, acc_hi, acc_src = _acceptance_parts(acceptance)
    model = step_cost_model(target, draft, gpu, batches=batches, k_values=ks, tp=tp, context_len=context_len,
                            calibration_dir=calibration_dir, rules=rules,
                            kv_dtype_bytes=kv_dtype_bytes, predictor=predictor)
    # The richest table the step costs came from: its measured speedups are shown beside the predictions.
    table = model.tables[0] if model.source.startswith("calibrated") and model.tables else None
    out: dict = {}
    for b in batches:
        sc = model.per_batch[b]
        per_k = {}
        for k in ks:
            ratio = sc.base_step_ms / sc.spec_step_ms[k]
            e, e_lo, e_hi = (expected_tokens_per_step(x, k) for x in (acc, acc_lo, acc_hi))
            band = sc.band(k)
            per_k[k] = {"speedup": e * ratio, "low": e_lo * ratio * (1 - band),
                        "high": e_hi * ratio * (1 + band), "expected_tokens_per_step": e,
                        "spec_step_ms": sc.spec_step_ms[k], "tpot_ms": sc.spec_step_ms[k] / e}
            if sc.terms.get(k):  # the step as a named sum with each term's source (roofline prior)
                per_k[k]["terms"] = sc.terms[k]
        check_invariants(model.target, model.draft, b, sc.base_step_ms, per_k)
        best = best_k({k: per_k[k]["speedup"] for k in ks})
        best_s = per_k[best]["speedup"]
        speculate = best_s >= NO_SPECULATION_BELOW
        measured = {}
        if table is not None:
            for k in ks:
                m = table.speedup(k, b)
                if m is not None:
                    measured[k] = m
        out[b] = BatchPrediction(
            batch=b, best_k=best if speculate else 0, speedup=best_s if speculate else 1.0,
            low=per_k[best]["low"] if speculate else min(per_k[best]["low"], 1.0),
            high=per_k[best]["high"] if speculate else max(per_k[best]["high"], 1.0), per_k=per_k,
            base_step_ms=sc.base_step_ms, c=sc.c, spec_overhead_ms=sc.spec_overhead_ms, source=sc.source,
            verdict="speculate" if speculate else "don't", measured=measured)
    notes = list(model.notes)
    if table is not None:
        notes.append(f"measured speedups are at the calibration's synthetic acceptance {table.acceptance}")
    best_by_batch = {b: p.best_k for b, p in out.items()}
    schedule = k_schedule(best_by_batch)
    dominant = batches[0] if len(batches) == 1 else max(out, key=lambda b: out[b].speedup if out[b].best_k else 0)
    recommended = out[batches[0]].best_k if len(batches) == 1 else (max(best_by_batch.values()) if schedule
                                                                     else out[dominant].best_k)
    if schedule:
        notes.append("best K changes with batch size: set num_speculative_tokens to the largest K "
                     f"({max(best_by_batch.values())}) and num_speculative_tokens_per_batch_size "
                     f"{[list(r) for r in schedule]} (vLLM's dynamic speculative decoding, 0.26+)")
    verdict = "speculate" if any(p.verdict == "speculate" for p in out.values()) else "don't"
    if verdict == "don't":
        notes.append(f"no batch size gains {NO_SPECULATION_BELOW - 1:.0%} or more: run without speculation")
    return SpeedupPrediction(
        target=model.target, draft=model.draft, gpu=model.gpu, tp=tp, alpha=alpha,
        acceptance_curve=extend_curve(acc, max(ks)) if isinstance(acc, list) else [alpha ** (i + 1) for i in range(max(ks))],
        acceptance_source=acc_src, batches=out, source=model.source, verdict=verdict, recommended_k=recommended,
        k_schedule=schedule, notes=notes, context_len=context_len, k=recommended,
        decision=verdict, step_cost_vllm=model.vllm_version, vllm_version=rules.tables_key if rules else "")
