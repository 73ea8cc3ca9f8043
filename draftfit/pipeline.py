"""One evaluation of a (target, drafter) pair on a validated Layout: compat -> memory -> acceptance -> speedup
-> decision. rank, preflight, serve-cmd, launch-script and speedup all read a PairEvaluation; none re-derives a
stage, and every rule they share (best K, the worth-it threshold, the K schedule) is applied here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftfit.acceptance.prior import AcceptanceEstimate, prior_acceptance
from draftfit.catalog.specs import ModelSpec, resolve_model
from draftfit.compat.tokenizers import CompatReport, catalog_verdict, check_pair
from draftfit.errors import DraftfitError
from draftfit.launch.serve import ServeCommand, serve_command
from draftfit.layout import Layout
from draftfit.memory.plan import MemoryPlan, plan_memory
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
    acceptance: AcceptanceEstimate
    speedup: SpeedupPrediction | None
    decision: Decision

    @property
    def target(self) -> ModelSpec:
        return self.layout.target


def method_of(draft: ModelSpec) -> str:
    return "eagle3" if draft.method.startswith("eagle3") else ("eagle" if draft.is_eagle else "draft_model")


def _vllm_verdict(target: ModelSpec, draft: ModelSpec, compat: CompatReport, tp: int) -> tuple[bool, str, str | None]:
    """Whether vLLM accepts and starts the pair, and the fix when not. The rules vLLM applies are its own:
    draft_model checks only vocab_size equality (the draft gets the target's tokenizer); an EAGLE head runs only
    for the target it was trained for; the draft runs at the target's TP, so its heads must divide."""
    if draft.is_eagle:
        if target.name not in draft.draft_for:
            return False, (f"{draft.name} is an EAGLE head trained for {', '.join(draft.draft_for) or 'another model'},"
                           f" not {target.name}: its hidden states would not match"), \
                "pick the head published for this target (`draftfit rank` lists it), or a draft model"
        return True, "EAGLE head trained for this target", None
    if compat.verdict == "incompatible":
        return False, "the tokenizers differ: the draft's token ids mean other text than the target's", \
            compat.fix or "pick a draft of the target's tokenizer family"
    if not compat.vllm_accepts or draft.vocab_size != target.vocab_size:
        return False, (f"vLLM refuses the pair: vocab_size {target.vocab_size} (target) vs {draft.vocab_size} "
                       "(draft); draft_model checks that they are equal"), \
            compat.fix or "pick a draft with the target's vocab_size (same family and size class)"
    if draft.num_attention_heads % tp:
        return False, f"{draft.name}'s {draft.num_attention_heads} attention heads do not divide TP={tp}", \
            "use a TP that divides both models' heads"
    return True, "vLLM accepts the pair (equal vocab_size)", None


def _compat(target: ModelSpec, draft: ModelSpec) -> CompatReport:
    # Local folders: compare their real files; catalog names: the catalog's fingerprints (fast, no files).
    if target.local_path or draft.local_path:
        return check_pair(target, draft, use_files=True)
    return catalog_verdict(target, draft)


def vllm_verdict(target: ModelSpec, draft: ModelSpec, tp: int = 1) -> tuple[bool, str, str | None]:
    """(runs, reason, fix) for a pair without a layout: the same rule evaluate_pair applies."""
    return _vllm_verdict(target, draft, _compat(target, draft), tp)


def evaluate_pair(layout: Layout, draft: str | ModelSpec, *, acceptance: AcceptanceEstimate | None = None,
                  k_values=K_VALUES) -> PairEvaluation:
    """Every stage for one drafter on `layout`. `acceptance` overrides the store/prior lookup (a measured run)."""
    target = layout.target
    d = draft if isinstance(draft, ModelSpec) else resolve_model(str(draft))
    compat = _compat(target, d)
    runs, why, vfix = _vllm_verdict(target, d, compat, layout.tp)
    memory, mem_err, mem_fix = None, "", None
    if layout.gpu is not None:
        try:
            memory = plan_memory(target, d, layout.gpu, tp=layout.tp, util=layout.util,
                                 max_model_len=layout.max_model_len, num_speculative_tokens=layout.k or PLAN_K,
                                 quantization=layout.quantization, kv_cache_dtype=layout.kv_cache_dtype,
                                 dtype=layout.dtype, max_num_seqs=layout.max_num_seqs, strict=False)
            if not memory.fits:
                mem_err, mem_fix = memory.reason or "target + draft do not fit", memory.fix
        except DraftfitError as exc:
            mem_err, mem_fix = exc.message, exc.fix
    est = acceptance or prior_acceptance(target, d, layout.workload, layout.temperature)
    if getattr(est, "relation", "") == "incompatible" and runs:
        runs, why = False, "the draft's tokens do not mean what the target's mean (acceptance prior: incompatible)"
        vfix = vfix or "pick a draft of the target's family"
    pred = None
    if runs and layout.gpu is not None:
        ks = (layout.k,) if layout.k else tuple(k_values)
        pred = predict_speedup(target, d, layout.gpu, tp=layout.tp, acceptance=est, batches=layout.batches,
                               k_values=ks, context_len=min(layout.max_model_len, 1024))
    decision = decide(layout, runs, why, vfix, memory, mem_err, mem_fix, pred)
    return PairEvaluation(layout=layout, draft=d, method=method_of(d), compat=compat, vllm_runs=runs, vllm_reason=why,
                          memory=memory, memory_error=mem_err, memory_fix=mem_fix, acceptance=est, speedup=pred,
                          decision=decision)


def decide(layout: Layout, runs: bool, why: str, vfix: str | None, memory: MemoryPlan | None, mem_err: str,
           mem_fix: str | None, pred: SpeedupPrediction | None) -> Decision:
    """The K to serve and whether to speculate at all, from the speedup of every (batch, K).

    With a fixed K (--k) every batch runs it. Otherwise each batch's best K; when those differ the command
    carries vLLM's num_speculative_tokens_per_batch_size schedule and each batch is shown at the K its range
    runs; when they agree, the one K that maximises the mean over the user's batch sizes. Speculate when that
    mean reaches NO_SPECULATION_BELOW."""
    if not runs:
        return Decision(INCOMPATIBLE, why, vfix)
    if mem_err:
        return Decision(NO_FIT, mem_err, mem_fix)
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


def command_for(ev: PairEvaluation, *, force: bool = False, engine: str = "vllm", k: int | None = None,
                **serve_kwargs) -> ServeCommand:
    """The serve command for an evaluation. A pair vLLM refuses or that does not fit never leaves as a runnable
    command: DraftfitError (exit 1) with the reason and the fix, unless `force`, which keeps a warning note."""
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
    if layout.max_num_seqs is not None and engine == "vllm":
        extra += ["--max-num-seqs", str(layout.max_num_seqs)]
    cmd = serve_command(ev.target, ev.draft, k=k_served, tp=layout.tp, engine=engine, vllm_version=layout.vllm_version,
                        k_schedule=None if (k or layout.k) else dec.k_schedule, extra_args=extra or None,
                        **serve_kwargs)
    if warning:
        cmd.notes.insert(0, warning)
    return cmd
