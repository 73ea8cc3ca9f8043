"""Shapes of a model that both the memory plan and the speedup model read: one home for each (issue 37).

So far: KV cache bytes per token per rank (MLA latent, grouped KV heads replicated past TP, linear-attention layers
keeping none). Weights, streamed bytes, FLOPs and dtype sizes still live in memory/plan.py and speedup/stepcost.py
and are to move here next (docs: issue 37, item 5). Imports nothing of draftfit's above the catalog.
"""

from __future__ import annotations


def _spec_get(spec, name, default=0):
    return getattr(spec, name, default) if not isinstance(spec, dict) else spec.get(name, default)


def kv_heads_per_rank(spec, tp: int) -> int:
    # QKVParallelLinear: with fewer KV heads than ranks, each rank holds one replicated KV head.
    return max(1, spec.num_kv_heads // tp)


def kv_bytes_per_token(spec, tp: int, kv_dtype_bytes: int) -> int:
    if _spec_get(spec, "kv_lora_rank", 0):
        # MLA (vLLM MLAAttentionSpec): one latent of kv_lora_rank + qk_rope_head_dim per token and layer, no
        # separate V, replicated on every TP rank.
        return spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_dtype_bytes
    # Linear-attention (gated-DeltaNet) layers keep a state per sequence, not KV per token (linear_state_bytes).
    layers = _spec_get(spec, "attention_layers", spec.num_layers)
    return layers * 2 * kv_heads_per_rank(spec, tp) * spec.head_dim * kv_dtype_bytes
