"""One evaluation of a (target, drafter) pair on a validated Layout: compat -> memory -> acceptance -> speedup
-> decision. rank, preflight, serve-cmd, launch-script and speedup all read a PairEvaluation; none re-derives a
stage, and every rule they share (best K, the worth-it threshold, the K schedule) is applied here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from draftfit.acceptance.prior import AcceptanceEstimate, measured_acceptance, prior_acceptance
from draftfit.acceptance.method_prior import method_acceptance
from draftfit.catalog.shapes import act_dtype, as_served, kv_dtype_bytes
from draftfit.catalog.specs import NO_MODEL_METHODS, ModelSpec, method_drafter, resolve_model
from draftfit.compat.tokenizers import CompatReport
from draftfit.compat.vllm_accepts import (  # noqa: F401  (vllm_verdict: re-exported)
    _checked_vocab_fix, _compat, _vllm_verdict, vllm_verdict)
from draftfit.errors import DraftfitError
from draftfit.engine.command import ServeCommand, serve_command
from draftfit.engine.methods import speculative_method
from draftfit.layout import Layout
from draftfit.memory.plan import ONLINE_QUANTIZATIONS, MemoryPlan, plan_memory
from draftfit.rules import K_VALUES, NO_SPECULATION_BELOW, PLAN_K, best_k, best_k_for_mix, worth_speculating
from draftfit.speedup.predict import SpeedupPrediction, k_schedule, predict_speedup

# Decision actions, in the order rank groups them.
SPECULATE, DONT, INCOMPATIBLE, NO_FIT = "speculate", "don't", "incompatible", "does not fit"


@dataclass
class BatchOutcome:
    """What one batch size will run and get: the K it runs (from the schedule or the one K served)."""

    k: int
    speedup: float
    low: float
    high: float
    best_k: int  # the K that would be best at this batch alone
    worth_it: bool


@dataclass
class Decision:
    action: str  # speculate | don't | incompatible | does not fit
    reason: str
    fix: str | None = None
    k: int | None = None  # num_speculative_tokens to serve (the largest K of the schedule when there is one)
    k_schedule: list | None = None  # vLLM num_speculative_tokens_per_batch_size [(lo, hi, K)], when K varies
    per_batch: dict[int, BatchOutcome] = field(default_factory=dict)
    mix_speedup: float | None = None  # mean over the layout's batch sizes at the K each runs
    mix_low: float | None = None  # the same at the low end of each band: what rank sorts by
    basis: str = ""  # 'calibrated' (measured step costs) | 'roofline prior': how comparable two rows are


@dataclass
class PairEvaluation:
    layout: Layout
    draft: ModelSpec
    method: str  # vLLM speculative method: draft_model | eagle3 | eagle
    compat: CompatReport
    vllm_runs: bool  # False: vLLM refuses the pair or fails at start-up
    vllm_reason: str
    memory: MemoryPlan | None
    memory_error: str
    memory_fix: str | None
    acceptance: AcceptanceEstimate | None  # None: no prior for this method and nothing measured
    speedup: SpeedupPrediction | None
    decision: Decision

    @property
    def target(self) -> ModelSpec:
        return self.layout.target


def method_of(draft: ModelSpec) -> str:
    """vLLM's speculative method for the drafter: the serve command's rule, the one home of it."""
    return speculative_method(draft)



def resolve_drafter(target: ModelSpec, draft: str | ModelSpec) -> ModelSpec:
    """A drafter name as users type it: a method keyword (ngram, suffix), or a model (catalog, hub id, folder)."""
    if isinstance(draft, ModelSpec):
        return draft
    key = str(draft).strip().lower()
    if key in NO_MODEL_METHODS:
        return method_drafter(key, target)
    return resolve_model(str(draft))

def served_spec(layout: Layout) -> ModelSpec:
    """The target as it will run: with the layout's weight format, which the roofline's weight traffic reads."""
    return as_served(layout.target, layout.quantization)


def measure_it(target: ModelSpec, draft: ModelSpec) -> str:
    """The fix where no acceptance prior exists for a drafter: the measurement that gives one."""
    return f"measure it on your traffic (`draftfit measure {target.name} {draft.name} --prompts-file F`)"


def acceptance_for(target: ModelSpec, draft: ModelSpec, workload: str = "chat",
                   temperature: float = 0.0) -> AcceptanceEstimate | None:
    """The acceptance a drafter is priced at when the user gives none: their stored measurement of the pair first,
    else the prior (a model-free drafter's replayed one, a draft model's or head's fitted one, each with its band
    and citation). None: no prior exists for the method (suffix) and nothing is measured."""
    if draft.method in NO_MODEL_METHODS:
        return (measured_acceptance(target, draft, workload, temperature)
                or method_acceptance(draft.method, workload, temperature))
    return prior_acceptance(target, draft, workload, temperature)


def evaluate_pair(layout: Layout, draft: str | ModelSpec, *, acceptance: AcceptanceEstimate | None = None,
                  k_values=K_VALUES) -> PairEvaluation:
    """Every stage for one drafter on `layout`. `acceptance` overrides the store/prior lookup (a measured run)."""
    target = layout.target
    d = resolve_drafter(target, draft)
    compat = _compat(target, d)
    runs, why, vfix = _vllm_verdict(target, d, compat, layout.tp, layout.engine)
    if compat.fix:  # the tokenizer fix is printed too (preflight, rank): it passes the same start-up rules
        compat = replace(compat, fix=_checked_vocab_fix(target, d, compat.fix, layout.tp, layout.engine))
    memory, mem_err, mem_fix = None, "", None
    if layout.gpu is not None:
        try:
            memory = plan_memory(target, None if d.method in NO_MODEL_METHODS else d, layout.gpu, tp=layout.tp, util=layout.util,
                                 max_model_len=layout.max_model_len, num_speculative_tokens=layout.k or PLAN_K,
                                 quantization=layout.quantization, kv_cache_dtype=layout.kv_cache_dtype,
                                 dtype=layout.dtype, max_num_seqs=layout.max_num_seqs, strict=False,
                                 rules=layout.engine.rules)
            if not memory.fits:
                # The fix in the options of draftfit's own commands (rank, preflight take it), vLLM's beside it.
                first = memory.fixes[0] if memory.fixes else None
                mem_err = memory.reason or "target + draft do not fit"
                mem_fix = f"{first['draftfit']} (vLLM: {first['fix']})" if first else memory.fix
        except DraftfitError as exc:
            mem_err, mem_fix = exc.message, exc.fix
    est = acceptance if acceptance is not None else acceptance_for(target, d, layout.workload, layout.temperature)
    # No prior for this method (suffix): an honest "measure it", never a made-up number; decide() says so.
    unmeasured = None if est is not None else f"no acceptance prior for {d.name}: {measure_it(target, d)}"
    if getattr(est, "relation", "") == "incompatible" and runs:
        runs, why = False, "the draft's tokens do not mean what the target's mean (acceptance prior: incompatible)"
        vfix = vfix or "pick a draft of the target's family"
    pred = None
    if runs and layout.gpu is not None and est is not None:
        ks = (layout.k,) if layout.k else tuple(k_values)
        pred = predict_speedup(served_spec(layout), d, layout.gpu, tp=layout.tp, acceptance=est, batches=layout.batches,
                               k_values=ks, context_len=min(layout.max_model_len, 1024),
                               rules=layout.engine.rules,
                               # --kv-cache-dtype: the KV bytes the roofline reads, as the memory plan sizes them
                               kv_dtype_bytes=kv_dtype_bytes(layout.kv_cache_dtype,
                                                             act_dtype(layout.dtype, target)[1]))
    decision = decide(layout, runs, why, vfix, memory, mem_err, mem_fix, pred, unmeasured=unmeasured)
    return PairEvaluation(layout=layout, draft=d, method=method_of(d), compat=compat, vllm_runs=runs, vllm_reason=why,
                          memory=memory, memory_error=mem_err, memory_fix=mem_fix, acceptance=est, speedup=pred,
                          decision=decision)


def decide(layout: Layout, runs: bool, why: str, vfix: str | None, memory: MemoryPlan | None, mem_err: str,
           mem_fix: str | None, pred: SpeedupPrediction | None, *, unmeasured: str | None = None) -> Decision:
    """The K to serve and whether to speculate at all, from the speedup of every (batch, K).

    With a fixed K (--k) every batch runs it. Otherwise each batch's best K; when those differ the command
    carries vLLM's num_speculative_tokens_per_batch_size schedule and each batch is shown at the K its range
    runs; when they agree, the one K that maximises the mean over the user's batch sizes. Speculate when that
    mean reaches NO_SPECULATION_BELOW."""
    if not runs:
        return Decision(INCOMPATIBLE, why, vfix)
    if mem_err:
        return Decision(NO_FIT, mem_err, mem_fix)
    if unmeasured:  # a drafter with no acceptance to predict from
        return Decision(DONT, unmeasured, None)
    if pred is None:
        return Decision(DONT, "no GPU given: speedup not predicted", "pass --gpu")
    per_k = {b: {k: row["speedup"] for k, row in pred.batches[b].per_k.items()} for b in layout.batches}
    bests = {b: best_k(per_k[b]) for b in layout.batches}
    schedule = None
    if layout.k:
        runs_k = {b: layout.k for b in layout.batches}
    else:
        schedule = k_schedule(bests)
        runs_k = bests if schedule else {b: best_k_for_mix(per_k) for b in layout.batches}
    per_batch = {}
    for b in layout.batches:
        row = pred.batches[b].per_k[runs_k[b]]
        s = float(row["speedup"])
        per_batch[b] = BatchOutcome(k=runs_k[b], speedup=round(s, 3), low=round(float(min(row["low"], s)), 3),
                                    high=round(float(max(row["high"], s)), 3), best_k=bests[b],
                                    worth_it=worth_speculating(s))
    n = len(per_batch)
    mix = sum(o.speedup for o in per_batch.values()) / n
    mix_low = sum(o.low for o in per_batch.values()) / n
    k_served = max(runs_k.values())
    basis = "calibrated" if pred.source.startswith("calibrated") else "roofline prior"
    at = ", ".join(f"{o.speedup:.2f}x at batch {b} (K={o.k})" for b, o in per_batch.items())
    if worth_speculating(mix):
        tail = [b for b, o in per_batch.items() if not o.worth_it]
        reason = at + (f"; not worth it at batch {', '.join(map(str, tail))} (< {NO_SPECULATION_BELOW:g}x)"
                       if tail else "")
        action = SPECULATE
    else:
        reason = (f"{at}: below {NO_SPECULATION_BELOW:g}x over the batch sizes asked about, the draft's cost eats "
                  "its acceptance")
        action = DONT
    return Decision(action, reason, None, k=k_served, k_schedule=[list(r) for r in schedule] if schedule else None,
                    per_batch=per_batch, mix_speedup=round(mix, 3), mix_low=round(mix_low, 3), basis=basis)


def command_for(ev: PairEvaluation, *, force: bool = False, server: str = "vllm", k: int | None = None,
                **serve_kwargs) -> ServeCommand:
    """The serve command for an evaluation, on the layout's engine. A pair vLLM refuses or that does not fit never
    leaves as a runnable command: DraftfitError (exit 1) with the reason and the fix, unless `force`, which keeps a
    warning note. The command serves what was planned: where the memory was planned (a GPU given), at the layout's
    util (VllmRules.served_util leaves the flag out only where that is vLLM's own default); `util` in
    `serve_kwargs` is an explicit one."""
    dec = ev.decision
    warning = None
    if dec.action in (INCOMPATIBLE, NO_FIT):
        msg = f"{ev.draft.name} for {ev.target.name}: {dec.action}: {dec.reason}"
        if not force:
            raise DraftfitError(msg, fix=(dec.fix or "pick another draft") + "; --force prints the command anyway",
                                exit_code=1)
        warning = f"WARNING (--force): {msg}"
    layout = ev.layout
    k_served = k or dec.k or layout.k or PLAN_K
    extra = list(serve_kwargs.pop("extra_args", None) or [])
    if layout.max_num_seqs is not None and server == "vllm":
        extra += ["--max-num-seqs", str(layout.max_num_seqs)]
    offline = False
    if layout.quantization not in ("none", "auto", "") and not ev.target.quantization:
        # Every weight format the ranking priced is in the command (a quantized checkpoint's own format needs no
        # flag: vLLM reads its quantization_config). fp8/bitsandbytes: vLLM quantizes while loading; awq, gptq
        # and mxfp4 load only from a checkpoint published in that format, which the note asks for.
        serve_kwargs.setdefault("quantization", layout.quantization)
        offline = layout.quantization not in ONLINE_QUANTIZATIONS
    if layout.kv_cache_dtype != "auto":
        serve_kwargs.setdefault("kv_cache_dtype", layout.kv_cache_dtype)
    if serve_kwargs.get("util") is None and ev.memory is not None and server == "vllm":
        serve_kwargs["util"] = layout.util  # the util the memory (and so the ranking) was planned at
    cmd = serve_command(ev.target, ev.draft, k=k_served, tp=layout.tp, engine=layout.engine, server=server,
                        k_schedule=None if (k or layout.k) else dec.k_schedule, extra_args=extra or None,
                        **serve_kwargs)
    if offline:
        cmd.notes.append(f"--quantization {layout.quantization}: vLLM loads {layout.quantization} weights only from a "
                         f"checkpoint in that format; serve {ev.target.name}'s {layout.quantization} export (its "
                         "folder or hub id) in place of the model above, or use --quantization fp8")
    if warning:
        cmd.notes.insert(0, warning)
    return cmd
