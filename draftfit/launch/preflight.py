"""Stage: preflight — every check for one (target, draft, layout) before anyone launches a server.

Each check is pass / warn / fail with a fix; the exit code is 0 (all pass), 1 (warnings), 2 (a blocker).
CI runs `draftfit preflight ... || exit` before deploying; the launch script runs it before starting vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftfit.errors import DraftfitError
from draftfit.acceptance.prior import prior_acceptance
from draftfit.catalog.specs import resolve_gpu, resolve_model
from draftfit.compat import tokenizers as compat
from draftfit.launch.serve import V1_DRAFT_MODEL_SINCE, installed_vllm_version, parse_version
from draftfit.memory import plan as memory
from draftfit.rank import predict_pair_speedup

PASS, WARN, FAIL = "pass", "warn", "fail"
MIN_SPEEDUP = 1.05
HEADROOM_WARN_GIB = 1.0


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None


@dataclass
class PreflightReport:
    target: str
    draft: str
    gpu: str | None
    tp: int
    k: int
    checks: list[Check] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        statuses = {c.status for c in self.checks}
        return 2 if FAIL in statuses else (1 if WARN in statuses else 0)

    @property
    def summary(self) -> str:
        n = {s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL)}
        return f"{n[PASS]} pass, {n[WARN]} warn, {n[FAIL]} fail"

    def to_json(self) -> dict:
        return {"target": self.target, "draft": self.draft, "gpu": self.gpu, "tp": self.tp, "k": self.k,
                "exit_code": self.exit_code, "summary": self.summary,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in self.checks]}


def preflight(target_name: str, draft_name: str, *, gpu_name: str | None = None, tp: int = 1, k: int = 4,
              max_model_len: int | None = None, util: float = 0.9, batch: int = 1, workload: str = "chat",
              temperature: float = 0.0, vllm_version: str | None = None) -> PreflightReport:

    report = PreflightReport(target=target_name, draft=draft_name, gpu=gpu_name, tp=tp, k=k)
    add = report.checks.append

    # 1. resolution
    specs = {}
    for role, name in (("target", target_name), ("draft", draft_name)):
        try:
            specs[role] = resolve_model(name)
            s = specs[role]
            add(Check(f"resolve {role}", PASS, f"{name} -> {s.name} ({s.local_path or s.hub_id}, {s.params_b:g}B)"))
        except DraftfitError as exc:
            add(Check(f"resolve {role}", FAIL, exc.message, exc.fix))
    gpu = None
    if gpu_name:
        try:
            gpu = resolve_gpu(gpu_name)
            add(Check("resolve gpu", PASS, f"{gpu.name}: {gpu.memory_gib:g} GiB, {gpu.bandwidth_gbps:g} GB/s"))
        except DraftfitError as exc:
            add(Check("resolve gpu", FAIL, exc.message, exc.fix))
    if len(specs) < 2:
        return report
    target, draft = specs["target"], specs["draft"]
    if k < 1:
        add(Check("K", FAIL, f"K={k}", "pass --k 1..8"))

    # 2-3. tokenizer and vLLM's vocab rule
    try:
        local = bool(target.local_path or draft.local_path)
        rep = compat.check_pair(target, draft, use_files=True) if local else compat.catalog_verdict(target, draft)
    except DraftfitError as exc:
        rep = None
        add(Check("tokenizer", WARN, f"could not compare tokenizers: {exc.message}", exc.fix))
    if rep is not None:
        first = "; ".join(n for n in rep.notes[:3])
        if rep.verdict == "identical":
            add(Check("tokenizer", PASS, f"identical ({rep.source})"))
        elif rep.verdict == "compatible":
            add(Check("tokenizer", WARN, f"compatible, not identical ({rep.source}): {first}",
                      rep.fix or "check BOS/EOS and chat template: the target's are used"))
        else:
            add(Check("tokenizer", FAIL, f"incompatible ({rep.source}): {first}",
                      rep.fix or "pick a draft with the target's tokenizer"))
        if rep.vllm_accepts:
            add(Check("vLLM vocab rule", PASS, "vLLM accepts the pair (config vocab_size equal, or an EAGLE head)"))
        else:
            add(Check("vLLM vocab rule", FAIL,
                      f"vLLM refuses the pair: vocab_size {target.vocab_size} vs {draft.vocab_size}",
                      rep.fix or "pick a draft with the same vocab_size, or pad the draft's embeddings"))

    # 4-5. tensor parallelism
    bad = [f"{role} {s.name} ({s.num_attention_heads} heads)" for role, s in (("target", target), ("draft", draft))
           if s.num_attention_heads % tp and not (role == "draft" and draft.is_eagle)]
    if tp < 1:
        add(Check("TP divisibility", FAIL, f"TP={tp}", "pass --tp 1, 2, 4 or 8"))
    elif bad:
        ok = [t for t in (1, 2, 4, 8) if target.num_attention_heads % t == 0 and
              (draft.is_eagle or draft.num_attention_heads % t == 0)]
        add(Check("TP divisibility", FAIL, f"attention heads not divisible by TP={tp}: {', '.join(bad)}",
                  f"use --tp in {ok}" + (" or a draft whose heads divide" if ok else "")))
    else:
        add(Check("TP divisibility", PASS, f"TP={tp} divides {target.num_attention_heads} target heads"
                  + ("" if draft.is_eagle else f" and {draft.num_attention_heads} draft heads")))
        if tp > 1:
            add(Check("draft TP", PASS, f"draft_tensor_parallel_size={tp} (equal to the target's; draftfit's serve "
                      "command sets it), so the draft's shards sit beside the target's"))
        else:
            add(Check("draft TP", PASS, "TP=1: the draft runs on the target's GPU"))

    # 6. memory

    if gpu is None:
        if gpu_name is None:
            add(Check("memory", WARN, "no --gpu: memory fit not checked", "pass --gpu, e.g. --gpu H100-80GB"))
    else:
        try:
            plan = memory.plan_memory(target, draft, gpu, tp=tp, util=util, max_model_len=max_model_len,
                                      num_speculative_tokens=k)
            detail = (f"weights {plan.weights_gib:.1f} GiB/rank (draft {plan.draft_weights_gib:.2f}), KV {plan.kv_tokens:,} "
                      f"tokens (draft takes {plan.draft_pool_share * 100:.0f}%), max concurrency "
                      f"{plan.max_concurrency:.1f} at {plan.max_model_len} tokens, headroom {plan.headroom_gib:.1f} GiB")
            if not plan.fits:
                add(Check("memory fit", FAIL, f"does not fit: {plan.reason}", plan.fix))
            elif plan.headroom_gib < HEADROOM_WARN_GIB:
                add(Check("memory fit", WARN, f"fits with little headroom: {detail}", plan.fix or
                          "lower --max-model-len or raise --util"))
            else:
                add(Check("memory fit", PASS, detail))
        except DraftfitError as exc:
            add(Check("memory fit", FAIL, exc.message, exc.fix))

    # 7. context length
    mml = max_model_len or target.max_position_embeddings
    if max_model_len and target.max_position_embeddings and max_model_len > target.max_position_embeddings:
        add(Check("max_model_len", FAIL, f"{max_model_len} > target max_position_embeddings "
                  f"{target.max_position_embeddings}", f"--max-model-len {target.max_position_embeddings}"))
    elif draft.max_position_embeddings and not draft.is_eagle and mml > draft.max_position_embeddings:
        add(Check("max_model_len", WARN if not max_model_len else FAIL,
                  f"{mml} > draft max_position_embeddings {draft.max_position_embeddings}: vLLM cannot draft past the "
                  "draft's context", f"--max-model-len {draft.max_position_embeddings}"))
    else:
        add(Check("max_model_len", PASS, f"{mml} within both models' max_position_embeddings"))

    # 8. predicted speedup
    if gpu is None:
        add(Check("predicted speedup", WARN, "no GPU given: speedup not predicted", "pass --gpu"))
    else:

        try:
            est = prior_acceptance(target, draft, workload, temperature)
            pred = predict_pair_speedup(target, draft, gpu, tp=tp, est=est, batches=(batch,))
            row = pred.batches[batch]
            best_k, best_s = row.best_k, row.speedup
            at_k = row.per_k.get(k)
            if at_k is None:
                s, note_k = best_s, f"best K={best_k}"
            else:
                s, note_k = at_k["speedup"], f"K={k} (best K={best_k}: {best_s:.2f}x)"
            src = f"acceptance {est.alpha:.2f} ({est.source}), step costs {pred.source}"
            if s >= MIN_SPEEDUP:
                add(Check("predicted speedup", PASS, f"{s:.2f}x at batch {batch}, {note_k}; {src}"))
            else:
                add(Check("predicted speedup", WARN, f"only {s:.2f}x at batch {batch}, {note_k}; {src}",
                          f"use K={best_k}" if best_k and best_k != k and (best_s or 0) >= MIN_SPEEDUP
                          else "serve without speculation, or pick a better-accepted draft"))
        except DraftfitError as exc:
            add(Check("predicted speedup", WARN, exc.message, exc.fix))

    # 9. installed vLLM

    version = vllm_version or installed_vllm_version()
    where = "requested" if vllm_version else "installed"
    if not version:
        add(Check("vLLM version", WARN, "vLLM is not installed here", "install vLLM >= 0.15 where you serve"))
    else:
        v = parse_version(version)
        if draft.is_eagle:
            ok = v >= (0, 9)
            add(Check("vLLM version", PASS if ok else WARN, f"vLLM {version} ({where}); EAGLE-3 heads need >= 0.9",
                      None if ok else "upgrade vLLM"))
        elif v >= V1_DRAFT_MODEL_SINCE:
            add(Check("vLLM version", PASS, f"vLLM {version} ({where}) runs method draft_model on the V1 engine"))
        elif v >= (0, 8):
            add(Check("vLLM version", WARN, f"vLLM {version} ({where}): V1 runs draft models only from 0.15",
                      "set VLLM_USE_V1=0 (the serve command does) or upgrade to >= 0.15"))
        else:
            add(Check("vLLM version", WARN, f"vLLM {version} ({where}) < 0.8: legacy --speculative-model flags",
                      "draftfit serve-cmd --vllm-version emits them; upgrading is better"))
    return report
