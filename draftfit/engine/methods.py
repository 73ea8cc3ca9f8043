"""The speculative method a drafter runs as, and the --speculative-config dict: one construction that serve-cmd
(engine/command.py) and measure (acceptance/measure/vllm.py) both send, so a measured run is the command served."""

from __future__ import annotations

from draftfit.catalog.specs import NO_MODEL_METHODS, ModelSpec

# (prompt_lookup_min, prompt_lookup_max) draftfit serves, measures and replays n-gram with: min 2 catches short
# repeats (identifiers, numbers), max 5 prefers longer, safer matches when they exist. vLLM's default when none is
# given is 5/5 (config/speculative.py).
NGRAM_LOOKUP = (2, 5)


def speculative_method(draft: ModelSpec) -> str:
    """vLLM's `method` for a drafter (config/speculative.py SpeculativeConfig.method)."""
    if draft.method in NO_MODEL_METHODS:
        return draft.method
    if draft.is_mtp:
        return "mtp"
    return "eagle3" if draft.method.startswith("eagle3") else ("eagle" if draft.is_eagle else "draft_model")


def speculative_config(method: str, k: int, *, model: str | None = None, tp: int = 1,
                       ngram_lookup: tuple[int, int] | None = None, k_schedule=None) -> dict:
    """The --speculative-config dict. `model`: the draft's reference (none for model-free methods and MTP, whose
    layers are in the target's checkpoint: vLLM's SpeculativeConfig takes the target then, method "mtp");
    `ngram_lookup`: (prompt_lookup_min, prompt_lookup_max) draftfit predicted with; `k_schedule`: rows of
    num_speculative_tokens_per_batch_size."""
    cfg = ({"method": method, "num_speculative_tokens": k} if method in ("mtp", *NO_MODEL_METHODS) or not model else
           {"method": method, "model": model, "num_speculative_tokens": k})
    if method == "ngram" and ngram_lookup:
        cfg["prompt_lookup_min"], cfg["prompt_lookup_max"] = ngram_lookup
    if tp > 1 and method not in NO_MODEL_METHODS:
        # vLLM accepts 1 or the target's TP; equal TP keeps the draft's shards beside the target's.
        cfg["draft_tensor_parallel_size"] = tp
    if k_schedule:
        cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in k_schedule]
    return cfg
