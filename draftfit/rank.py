"""Stage — rank: every candidate drafter for a target, each through pipeline.evaluate_pair, sorted.

Runs from the catalog alone (no tokenizer files, no torch) so that `draftfit rank` answers in well under a
second. No formatting here: the CLI renders the RankResult, `--json` is its dataclass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from draftfit.acceptance.method_prior import method_acceptance, published_cross_check
from draftfit.acceptance.prior import store_status
from draftfit.acceptance.user_replay import user_acceptance
from draftfit.catalog.specs import NO_MODEL_METHODS, GpuSpec, ModelSpec, draft_candidates, method_drafter, resolve_model
from draftfit.compat.tokenizers import catalog_verdict
from draftfit.errors import DraftfitError
from draftfit.layout import Layout, build_layout
from draftfit.memory.plan import plan_memory
from draftfit.pipeline import DONT, INCOMPATIBLE, NO_FIT, SPECULATE, PairEvaluation, command_for, evaluate_pair
from draftfit.speedup.stepcost import GRAPH_LIMIT_MARK, HEAD_PRIOR_MARK

_GROUP = {SPECULATE: 0, DONT: 0, NO_FIT: 1, INCOMPATIBLE: 2}


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
    # ngram / suffix: published figures beside the replayed prior (acceptance.method_prior.published_cross_check)
    acceptance_cross_check: list[dict] = field(default_factory=list)
    acceptance_mixture: dict | None = None  # ngram / suffix: draft probability and accepted length given a draft
    acceptance_mixture_builtin: dict | None = None  # the built-in reference's, beside a measured or user-file one
    relation: str = ""
    best_k: int | None = None
    best_k_by_batch: dict[int, int | None] = field(default_factory=dict)
    speedup: dict[int, float | None] = field(default_factory=dict)
    speedup_low: dict[int, float | None] = field(default_factory=dict)
    speedup_high: dict[int, float | None] = field(default_factory=dict)
    speedup_source: str = ""
    speedup_notes: list[str] = field(default_factory=list)  # the step-cost model's notes (host-bound, no table)
    per_k: dict[int, dict] = field(default_factory=dict)  # first batch: speedup per K (for --explain)
    decision: str = ""  # speculate | don't | incompatible | does not fit
    reason: str = ""
    fix: str | None = None
    group: int = 0
    k: int | None = None  # num_speculative_tokens served (the schedule's largest K when there is one)
    k_schedule: list | None = None  # vLLM num_speculative_tokens_per_batch_size, when the best K varies
    k_by_batch: dict[int, int] = field(default_factory=dict)  # the K each batch size runs
    speedup_basis: str = ""  # calibrated | roofline prior
    mix_speedup: float | None = None
    mix_low: float | None = None  # the low end of the band, averaged over batches (what the row can count on)

    def to_json(self) -> dict:
        return {
            "draft": self.draft, "hub_id": self.hub_id, "method": self.method, "params_b": self.params_b,
            "verdict": self.verdict, "vllm_accepts": self.vllm_accepts, "compat_source": self.compat_source,
            "fits": self.fits, "kv_tokens": self.kv_tokens, "kv_tokens_without_draft": self.kv_tokens_without_draft,
            "draft_pool_share": self.draft_pool_share, "draft_weights_gib": self.draft_weights_gib,
            "acceptance": self.acceptance, "acceptance_low": self.acceptance_low,
            "acceptance_high": self.acceptance_high, "acceptance_source": self.acceptance_source,
            "acceptance_citation": self.acceptance_citation, "acceptance_cross_check": self.acceptance_cross_check,
            "acceptance_mixture": self.acceptance_mixture, "acceptance_mixture_builtin": self.acceptance_mixture_builtin,
            "relation": self.relation, "best_k": self.best_k,
            "best_k_by_batch": {str(b): k for b, k in self.best_k_by_batch.items()},
            "speedup": {str(b): v for b, v in self.speedup.items()},
            "speedup_low": {str(b): v for b, v in self.speedup_low.items()},
            "speedup_notes": self.speedup_notes,
            "speedup_high": {str(b): v for b, v in self.speedup_high.items()},
            "speedup_source": self.speedup_source, "decision": self.decision, "reason": self.reason, "fix": self.fix,
            "k": self.k, "k_schedule": self.k_schedule, "k_by_batch": {str(b): k for b, k in self.k_by_batch.items()},
            "speedup_basis": self.speedup_basis, "mix_speedup": self.mix_speedup, "mix_low": self.mix_low,
        }




@dataclass
class RankResult:
    layout: Layout
    candidates: list[Candidate]
    serve_command: str | None
    winner: str | None
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    # method -> AcceptanceEstimate rank priced instead of the store/prior lookup (n-gram and suffix at the replay of
    # --prompts-file): the serving-load view (cli rank --request-rate) prices the same drafters at the same acceptance.
    given_acceptance: dict = field(default_factory=dict)

    # Shortcuts the renderer and older callers read.
    @property
    def target(self) -> ModelSpec:
        return self.layout.target

    @property
    def gpu(self) -> GpuSpec:
        return self.layout.gpu

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def batches(self) -> tuple[int, ...]:
        return self.layout.batches

    @property
    def workload(self) -> str:
        return self.layout.workload

    @property
    def temperature(self) -> float:
        return self.layout.temperature

    def to_json(self) -> dict:
        lay = self.layout
        return {
            "target": lay.target.name, "target_hub_id": lay.target.hub_id, "gpu": lay.gpu.name, "tp": lay.tp,
            "max_model_len": lay.max_model_len, "max_num_seqs": lay.max_num_seqs, "util": lay.planned_util, "util_given": lay.util is not None, "workload": lay.workload,
            "temperature": lay.temperature, "batches": list(lay.batches), "vllm_version": lay.engine.version,
            "vllm_modelled": lay.engine.modelled, "layout_notes": list(lay.notes),
            "gpu_note": next((n for n in lay.notes if n.startswith("GPU not given")), ""),
            "tp_note": next((n for n in lay.notes if n.startswith("TP=")), f"TP={lay.tp} (given)" if lay.tp_given else ""),
            "candidates": [c.to_json() for c in self.candidates], "winner": self.winner,
            "serve_command": self.serve_command, "notes": self.notes,
            "sorted_by": "mix_speedup: the predicted speedup averaged over the batch sizes, each at the K it runs",
        }


def candidate_from(ev: PairEvaluation, kv_alone: int | None) -> Candidate:
    """The row view of one evaluation (no stage is recomputed here)."""
    d, rep, est, dec = ev.draft, ev.compat, ev.acceptance, ev.decision
    c = Candidate(draft=d.name, hub_id=d.hub_id or d.local_path, method=ev.method, params_b=d.params_b,
                  verdict=rep.verdict, vllm_accepts=ev.vllm_runs, compat_source=rep.source,
                  compat_notes=list(rep.notes), compat_fix=rep.fix)
    plan = ev.memory
    if plan is not None:
        c.fits, c.kv_tokens = bool(plan.fits), plan.kv_tokens
        c.draft_pool_share, c.draft_weights_gib, c.headroom_gib = plan.draft_pool_share, plan.draft_weights_gib, \
            plan.headroom_gib
    c.memory_reason, c.memory_fix = ev.memory_error, ev.memory_fix
    if ev.memory_error and c.fits is None:
        c.fits = False
    c.kv_tokens_without_draft = kv_alone
    if est is not None:
        c.acceptance, c.acceptance_low, c.acceptance_high = est.alpha, est.low, est.high
        c.acceptance_source, c.acceptance_citation, c.relation = est.source, est.citation, est.relation
        c.acceptance_mixture = _mixture_with_speedup(est.mixture, ev)
        if est.mixture and not est.mixture.get("reference"):  # a measured run or the user's file: the built-in beside
            ref = method_acceptance(d.method, ev.layout.workload, ev.layout.temperature)
            c.acceptance_mixture_builtin = ref.mixture if ref is not None else None
    else:
        c.acceptance_source, c.relation = "none: measure it", d.method
    if d.method in NO_MODEL_METHODS:
        c.acceptance_cross_check = published_cross_check(d.method, ev.layout.workload)
    c.decision, c.reason, c.fix, c.group = dec.action, dec.reason, dec.fix, _GROUP[dec.action]
    batches = ev.layout.batches
    c.speedup = {b: None for b in batches}
    c.speedup_low, c.speedup_high = dict(c.speedup), dict(c.speedup)
    pred = ev.speedup
    if pred is None:
        c.speedup_source = "not computed: " + (dec.reason if dec.action in (INCOMPATIBLE,) else dec.action)
        return c
    c.speedup_source = pred.source
    # The notes about this row's own step costs (the shared ones, MoE and version, go once under the table).
    c.speedup_notes = [n for n in pred.notes if n.startswith("host-bound") or HEAD_PRIOR_MARK in n
                       or GRAPH_LIMIT_MARK in n]
    c.speedup_basis = dec.basis
    for b, o in dec.per_batch.items():
        c.speedup[b], c.speedup_low[b], c.speedup_high[b] = o.speedup, o.low, o.high
        c.best_k_by_batch[b] = o.best_k
        c.k_by_batch[b] = o.k
    c.k, c.k_schedule, c.best_k = dec.k, dec.k_schedule, dec.k
    c.mix_speedup, c.mix_low = dec.mix_speedup, dec.mix_low
    first = pred.batches[batches[0]].per_k
    c.per_k = {int(k): {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items()}
               for k, v in first.items()}
    return c


def _mixture_with_speedup(mixture: dict | None, ev: PairEvaluation) -> dict | None:
    """The n-gram / suffix mixture with each K's predicted speedup at the first batch size beside its tokens per
    step, and the best K: the mixture carried through to the decision (a copy: the estimate may be cached)."""
    if not mixture:
        return None
    out = {**mixture, "per_k": [dict(p) for p in mixture.get("per_k") or []]}
    pred = ev.speedup
    if pred is not None:
        b0 = ev.layout.batches[0]
        per_k = pred.batches[b0].per_k
        for p in out["per_k"]:
            hit = per_k.get(p["k"])
            p["speedup"] = round(hit["speedup"], 4) if hit else None
        out["speedup_batch"] = b0
        out["best_k"] = pred.batches[b0].best_k
    return out


def _probe_draft(target: ModelSpec, drafts: list[ModelSpec]) -> ModelSpec | None:
    """The smallest draft model vLLM would run for the target: the context is chosen so that at least it fits."""
    ok = [d for d in drafts if not d.is_eagle and d.params_b > 0 and d.vocab_size == target.vocab_size
          and catalog_verdict(target, d).verdict != "incompatible"]
    return min(ok, key=lambda d: d.params_b) if ok else None


def rank(target_name: str | ModelSpec, *, gpu_name: str | None = None, tp: int | None = None,
         workload: str = "chat", temperature: float = 0.0, batches: tuple[int, ...] = (1,), util: float = 0.9,
         max_model_len: int | None = None, extra_candidates: tuple[str, ...] = (), top: int | None = None,
         vllm_version: str | None = None, quantization: str = "none", kv_cache_dtype: str = "auto",
         max_num_seqs: int | None = None, prompts_file: str | None = None) -> RankResult:
    """`prompts_file`: the user's logged requests with their outputs; n-gram and suffix are priced at their replay
    (acceptance.user_replay), the other drafters at their stored measurement or prior for `workload`."""
    t0 = time.perf_counter()
    target = target_name if isinstance(target_name, ModelSpec) else resolve_model(str(target_name))
    drafts: list[ModelSpec] = list(draft_candidates(target))
    seen = {d.name for d in drafts}
    for extra in extra_candidates:
        spec = resolve_model(extra)
        if spec.name not in seen:
            drafts.append(spec)
            seen.add(spec.name)
    # The model-free drafters are candidates for every target: nothing to load, nothing to fit.
    drafts += [method_drafter(m, target) for m in NO_MODEL_METHODS if m not in seen]
    layout = build_layout(target, gpu=gpu_name, tp=tp, util=util, max_model_len=max_model_len, batches=batches,
                          workload=workload, temperature=temperature, vllm_version=vllm_version,
                          quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                          probe_draft=_probe_draft(target, drafts), max_num_seqs=max_num_seqs)
    try:
        kv_alone = plan_memory(target, None, layout.gpu, tp=layout.tp, util=layout.util,
                               max_model_len=layout.max_model_len, quantization=layout.quantization,
                               kv_cache_dtype=layout.kv_cache_dtype, max_num_seqs=layout.max_num_seqs,
                               rules=layout.engine.rules).kv_tokens
    except DraftfitError:
        kv_alone = None
    given = {}
    if prompts_file is not None:  # read and replayed once, before any candidate: a bad file is one line
        given = {m: user_acceptance(m, target, prompts_file) for m in NO_MODEL_METHODS}
    evals = [evaluate_pair(layout, d, acceptance=given.get(d.method) if d.method in NO_MODEL_METHODS else None)
             for d in drafts]
    cands = [candidate_from(ev, kv_alone) for ev in evals]

    def key(c: Candidate):
        # The predicted speedup averaged over the user's batch sizes, at the K each batch runs. Rows whose step
        # costs rest on different bases (calibrated tables vs the roofline prior) say so in `speedup_basis`
        # and a note; their bands (±6-45 % calibrated, ±16/46 % prior) are what to compare when they are close.
        return (c.group, -(c.mix_speedup if c.mix_speedup is not None else -1.0), -(c.acceptance or 0.0), c.params_b)

    order = sorted(range(len(cands)), key=lambda i: key(cands[i]))
    cands = [cands[i] for i in order]
    evals = [evals[i] for i in order]
    winner_i = next((i for i, c in enumerate(cands) if c.decision == SPECULATE), None)
    notes: list[str] = []
    serve = None
    if winner_i is not None:
        # The util the memory was planned at travels with it (command_for, VllmRules.served_util).
        cmd = command_for(evals[winner_i], max_model_len=layout.max_model_len)
        serve = cmd.text
        notes += cmd.notes
    else:
        notes.append("no candidate is predicted to speed up this layout: serve without speculation")
    if prompts_file is not None:
        notes.append(f"n-gram and suffix priced at the replay of {prompts_file} (your logged outputs); the other "
                     f"drafters at their measurement or prior for --workload {workload}")
    ignored = store_status()
    if ignored:
        notes.append(ignored)
    bases = {c.speedup_basis for c in cands if c.speedup_basis}
    if len(bases) > 1:
        notes.append("rows mix calibrated step costs (measured on this GPU and vLLM) with roofline-prior ones "
                     "(the basis column); the prior's band is wider, so compare bands where central values are close")
    winner = cands[winner_i].draft if winner_i is not None else None
    if top is not None:
        if top < 1:
            raise DraftfitError(f"--top {top} is not a positive count", fix="pass --top 5, or leave it out")
        cands = cands[:top]
    return RankResult(layout=layout, candidates=cands, serve_command=serve, winner=winner, notes=notes,
                      elapsed_s=round(time.perf_counter() - t0, 3), given_acceptance=given)
