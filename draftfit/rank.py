"""Stage 6 — rank: every candidate draft for a target through compat -> memory -> acceptance -> speedup.

Runs from the catalog alone (no tokenizer files, no torch) so that `draftfit rank` answers in well under a
second. Stages that are not installed in this build show as 'n/a' instead of failing the ranking.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from draftfit.catalog.specs import GpuSpec, ModelSpec, draft_candidates, resolve_gpu, resolve_model
from draftfit.errors import DraftfitError
from draftfit.compat import tokenizers as compat_mod; from draftfit.memory import plan as memory_mod; from draftfit.acceptance import prior as priors
from draftfit.launch.serve import serve_command
from draftfit.memory import plan as memory_mod
from draftfit.speedup import predict as speedup

DEFAULT_GPU = "H100-80GB"
TP_CHOICES = (1, 2, 4, 8)
WORKLOADS = ("code", "math", "chat")
MIN_GAIN = 1.05  # speedup.py's NO_SPECULATION_BELOW: under 5 % is noise next to the risk
PLAN_K = 4  # K assumed when sizing memory (the draft's KV does not depend on K; activations barely do)


@dataclass
class Candidate:
    draft: str
    hub_id: str
    method: str
    params_b: float
    verdict: str  # tokenizer verdict: identical | compatible | incompatible | n/a
    vllm_accepts: bool | None
    compat_source: str = ""
    compat_notes: list[str] = field(default_factory=list)
    compat_fix: str | None = None
    fits: bool | None = None
    kv_tokens: int | None = None
    kv_tokens_without_draft: int | None = None
    draft_pool_share: float | None = None  # share of the KV pool the draft's own KV takes
    draft_weights_gib: float | None = None
    headroom_gib: float | None = None
    memory_reason: str = ""
    memory_fix: str | None = None
    acceptance: float | None = None
    acceptance_low: float | None = None
    acceptance_high: float | None = None
    acceptance_source: str = ""
    acceptance_citation: str = ""
    relation: str = ""
    best_k: int | None = None
    best_k_by_batch: dict[int, int | None] = field(default_factory=dict)
    speedup: dict[int, float | None] = field(default_factory=dict)
    speedup_low: dict[int, float | None] = field(default_factory=dict)
    speedup_high: dict[int, float | None] = field(default_factory=dict)
    speedup_source: str = ""
    speedup_notes: list[str] = field(default_factory=list)  # the step-cost model's notes (host-bound, no table)
    per_k: dict[int, dict] = field(default_factory=dict)  # first batch: speedup per K (for --explain)
    decision: str = ""  # speculate | don't | incompatible | does not fit | n/a
    reason: str = ""
    group: int = 0

    def to_json(self) -> dict:
        return {
            "draft": self.draft, "hub_id": self.hub_id, "method": self.method, "params_b": self.params_b,
            "verdict": self.verdict, "vllm_accepts": self.vllm_accepts, "compat_source": self.compat_source,
            "fits": self.fits, "kv_tokens": self.kv_tokens, "kv_tokens_without_draft": self.kv_tokens_without_draft,
            "draft_pool_share": self.draft_pool_share, "draft_weights_gib": self.draft_weights_gib,
            "acceptance": self.acceptance, "acceptance_low": self.acceptance_low,
            "acceptance_high": self.acceptance_high, "acceptance_source": self.acceptance_source,
            "acceptance_citation": self.acceptance_citation, "relation": self.relation, "best_k": self.best_k,
            "best_k_by_batch": {str(b): k for b, k in self.best_k_by_batch.items()},
            "speedup": {str(b): v for b, v in self.speedup.items()},
            "speedup_low": {str(b): v for b, v in self.speedup_low.items()},
            "speedup_notes": self.speedup_notes,
            "speedup_high": {str(b): v for b, v in self.speedup_high.items()},
            "speedup_source": self.speedup_source, "decision": self.decision, "reason": self.reason,
        }


@dataclass
class RankResult:
    target: ModelSpec
    gpu: GpuSpec
    tp: int
    tp_note: str
    gpu_note: str
    workload: str
    temperature: float
    batches: tuple[int, ...]
    candidates: list[Candidate]
    serve_command: str | None
    winner: str | None
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_json(self) -> dict:
        return {
            "target": self.target.name, "target_hub_id": self.target.hub_id, "gpu": self.gpu.name, "tp": self.tp,
            "tp_note": self.tp_note, "gpu_note": self.gpu_note, "workload": self.workload,
            "temperature": self.temperature, "batches": list(self.batches),
            "candidates": [c.to_json() for c in self.candidates], "winner": self.winner,
            "serve_command": self.serve_command, "notes": self.notes,
        }


def choose_tp(target: ModelSpec, gpu: GpuSpec, util: float, max_model_len: int | None) -> tuple[int, str]:
    """Smallest TP (dividing the attention heads) at which the target alone fits."""

    last_reason = ""
    for tp in TP_CHOICES:
        if target.num_attention_heads % tp:
            continue
        try:
            plan = memory_mod.plan_memory(target, None, gpu, tp=tp, util=util, max_model_len=max_model_len)
        except DraftfitError as exc:
            last_reason = f"TP={tp}: {exc.message}"
            continue
        if plan.fits:
            note = f"TP={tp}: the smallest tensor-parallel size at which {target.name} fits on {gpu.name}"
            if last_reason:
                note += f" ({last_reason})"
            return tp, note + "; pass --tp to choose"
        last_reason = f"TP={tp}: {plan.reason or 'does not fit'}"
    return TP_CHOICES[-1], f"TP={TP_CHOICES[-1]}: {target.name} does not fit on {gpu.name} even at TP=8 ({last_reason})"


def predict_pair_speedup(target: ModelSpec, draft: ModelSpec, gpu: GpuSpec, *, tp: int, est, batches):
    """Speedup prediction for K = 1..8 from an acceptance estimate (measured or prior). The estimate object
    carries its band, which speedup.py turns into each prediction's low/high with the step-cost uncertainty.
    rank, preflight and serve-cmd all predict through here."""

    return speedup.predict_speedup(target, draft, gpu, tp=tp, acceptance=est, batches=tuple(batches),
                                   k_values=range(1, 9))


def _fill_speedup(c: Candidate, target, draft, gpu, tp, est, batches):
    """Speedup per batch at the best K."""
    pred = predict_pair_speedup(target, draft, gpu, tp=tp, est=est, batches=batches)
    c.speedup_source = pred.source
    c.speedup_notes = [n for n in pred.notes if n.startswith("host-bound")]
    for b in batches:
        per_k = pred.batches[b].per_k
        # Report the best K's number even when it does not pay (speedup.py then says best_k=0).
        k_best = max(per_k, key=lambda k: per_k[k]["speedup"])
        s, lo, hi = per_k[k_best]["speedup"], per_k[k_best]["low"], per_k[k_best]["high"]
        c.speedup[b] = round(float(s), 3)
        c.speedup_low[b] = round(float(min(lo, s)), 3)
        c.speedup_high[b] = round(float(max(hi, s)), 3)
        c.best_k_by_batch[b] = int(k_best)
        if b == batches[0]:
            c.per_k = {int(k): {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                       for k, v in per_k.items()}
    c.best_k = c.best_k_by_batch.get(batches[0])
    return pred.verdict


def rank(target_name: str, *, gpu_name: str | None = None, tp: int | None = None, workload: str = "chat",
         temperature: float = 0.0, batches: tuple[int, ...] = (1,), util: float = 0.9,
         max_model_len: int | None = None, extra_candidates: tuple[str, ...] = (), top: int | None = None,
         vllm_version: str | None = None) -> RankResult:
    t0 = time.perf_counter()
    if workload not in WORKLOADS:
        raise DraftfitError(f"unknown workload {workload!r}", fix="use --workload code, math or chat")
    if temperature < 0:
        raise DraftfitError(f"temperature must be >= 0 (got {temperature})", fix="pass --temperature 0..2")
    batches = tuple(sorted(set(int(b) for b in batches)))
    if not batches or batches[0] < 1:
        raise DraftfitError(f"batch sizes must be positive (got {batches})", fix="pass e.g. --batch 1,32")
    target = resolve_model(target_name)
    if target.is_eagle:
        raise DraftfitError(f"{target.name} is an EAGLE head, not a target model",
                            fix=f"rank for the model it drafts for: {', '.join(target.draft_for)}")
    gpu_note = ""
    if gpu_name is None:
        gpu_name = DEFAULT_GPU
        gpu_note = f"GPU not given: assuming {DEFAULT_GPU} (pass --gpu)"
    gpu = resolve_gpu(gpu_name)


    if tp is None:
        tp, tp_note = choose_tp(target, gpu, util, max_model_len)
    else:
        if tp < 1:
            raise DraftfitError(f"--tp must be >= 1 (got {tp})", fix="pass --tp 1, 2, 4 or 8")
        if target.num_attention_heads % tp:
            raise DraftfitError(f"{target.name} has {target.num_attention_heads} attention heads, not divisible by "
                                f"TP={tp}", fix="pick a TP that divides the head count (1, 2, 4, 8)")
        tp_note = f"TP={tp} (given)"

    drafts: list[ModelSpec] = list(draft_candidates(target))
    seen = {d.name for d in drafts}
    for extra in extra_candidates:
        spec = resolve_model(extra)
        if spec.name not in seen:
            drafts.append(spec)
            seen.add(spec.name)

    try:
        kv_alone = memory_mod.plan_memory(target, None, gpu, tp=tp, util=util, max_model_len=max_model_len).kv_tokens
    except DraftfitError:
        kv_alone = None

    cands: list[Candidate] = []
    for d in drafts:
        c = Candidate(draft=d.name, hub_id=d.hub_id or d.local_path, method=d.method, params_b=d.params_b,
                      verdict="n/a", vllm_accepts=None)
        # compat
        rep = compat_mod.catalog_verdict(target, d)
        c.verdict, c.vllm_accepts = rep.verdict, rep.vllm_accepts
        c.compat_source, c.compat_notes, c.compat_fix = rep.source, list(rep.notes), rep.fix
        # memory
        try:
            plan = memory_mod.plan_memory(target, d, gpu, tp=tp, util=util, max_model_len=max_model_len,
                                          num_speculative_tokens=PLAN_K)
            c.fits, c.kv_tokens = bool(plan.fits), plan.kv_tokens
            c.draft_pool_share, c.draft_weights_gib = plan.draft_pool_share, plan.draft_weights_gib
            c.headroom_gib = plan.headroom_gib
            c.memory_reason, c.memory_fix = plan.reason or "", plan.fix
        except DraftfitError as exc:
            c.fits, c.memory_reason = False, exc.message
            c.memory_fix = exc.fix
        c.kv_tokens_without_draft = kv_alone
        # acceptance
        est = priors.prior_acceptance(target, d, workload, temperature)
        c.acceptance, c.acceptance_low, c.acceptance_high = est.alpha, est.low, est.high
        c.acceptance_source, c.acceptance_citation, c.relation = est.source, est.citation, est.relation
        incompatible = c.verdict == "incompatible" or est.relation == "incompatible" or c.vllm_accepts is False
        # speedup
        sp_verdict = None
        c.speedup = {b: None for b in batches}
        c.speedup_low, c.speedup_high = dict(c.speedup), dict(c.speedup)
        if incompatible:
            c.speedup_source = "not computed: tokenizer incompatible"
        else:
            sp_verdict = _fill_speedup(c, target, d, gpu, tp, est, batches)
        _decide(c, batches, sp_verdict)
        cands.append(c)

    def key(c: Candidate):
        s = c.speedup.get(batches[0])
        return (c.group, -(s if s is not None else -1.0), -(c.acceptance or 0.0), c.params_b)

    cands.sort(key=key)
    winner = next((c for c in cands if c.group == 0 and c.decision == "speculate"), None)
    notes: list[str] = []
    serve = None
    if winner is not None:

        wspec = next(d for d in drafts if d.name == winner.draft)
        cmd = serve_command(target, wspec, k=winner.best_k or PLAN_K, tp=tp, max_model_len=max_model_len,
                            util=util if util != 0.9 else None, vllm_version=vllm_version)
        serve = cmd.text
        notes += cmd.notes
    else:
        notes.append("no candidate is predicted to speed up this layout: serve without speculation")
    if top:
        cands = cands[:top]
    return RankResult(target=target, gpu=gpu, tp=tp, tp_note=tp_note, gpu_note=gpu_note, workload=workload,
                      temperature=temperature, batches=batches, candidates=cands, serve_command=serve,
                      winner=winner.draft if winner else None, notes=notes,
                      elapsed_s=round(time.perf_counter() - t0, 3))


def _decide(c: Candidate, batches, sp_verdict) -> None:
    if c.verdict == "incompatible" or c.relation == "incompatible":
        c.group, c.decision = 2, "incompatible"
        c.reason = c.compat_fix or (c.compat_notes[0] if c.compat_notes else "different tokenizer")
        return
    if c.vllm_accepts is False:
        c.group, c.decision = 2, "incompatible"
        c.reason = "vLLM rejects the pair (vocab_size differs): " + (c.compat_fix or "pick another draft")
        return
    if c.fits is False:
        c.group, c.decision = 1, "does not fit"
        c.reason = (c.memory_reason or "target + draft do not fit") + (f"; fix: {c.memory_fix}" if c.memory_fix else "")
        return
    s = c.speedup.get(batches[0])
    if s is None:
        c.group, c.decision, c.reason = 0, "n/a", "no speedup prediction"
        return
    if s >= MIN_GAIN:
        c.decision = "speculate"
        tail = [b for b in batches if (c.speedup.get(b) or 0) < MIN_GAIN]
        c.reason = f"{s:.2f}x at batch {batches[0]} with K={c.best_k}" + (
            f"; not at batch {', '.join(map(str, tail))} (< {MIN_GAIN:g}x)" if tail else "")
    else:
        c.decision = "don't"
        c.reason = (f"best is {s:.2f}x (K={c.best_k}) at batch {batches[0]}: below {MIN_GAIN:g}x, the draft's "
                    "cost eats its acceptance")
    c.group = 0


def fmt_num(v, digits=2, suffix="") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}{suffix}"


def fmt_tokens(n) -> str:
    if n is None:
        return "n/a"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.0f}k"
    return str(int(n))
