"""catalog.shapes is the one home of a model's shapes (issue 37, item 5): the memory plan and the speedup model read
the same weights, KV bytes per token and dtype sizes for every catalog model, TP, weight format and KV dtype."""

from __future__ import annotations

import pytest

from draftfit.catalog import shapes
from draftfit.catalog.specs import load_models, mtp_drafter, resolve_gpu
from draftfit.errors import DraftfitError
from draftfit.layout import check_quantization
from draftfit.memory.plan import GIB, check_tp, plan_memory
from draftfit.speedup.stepcost import kv_bytes_per_token_per_rank, weight_bytes_per_rank

H200 = resolve_gpu("H200")


def _targets():
    return [m for m in load_models() if not m.is_eagle]


def _layouts():
    """(model, tp, the weight format check_quantization gives) for every catalog target: its own weights, fp8 and
    4-bit (awq) where vLLM accepts them on that checkpoint (not over another quantization)."""
    for m in _targets():
        for tp in (1, 2, 8):
            try:
                check_tp(m, tp)
            except DraftfitError:
                continue
            for asked in ("auto", "fp8", "awq"):
                try:
                    yield m, tp, check_quantization(m, asked)
                except DraftfitError:
                    continue


def test_memory_and_speedup_weights_agree_for_every_catalog_model():
    """What the memory plan loads (its target weights) and what the speedup roofline streams at full expert coverage
    differ by exactly what a decode pass does not read or reads without holding (streamed_minus_allocated_bytes: the
    gathered embedding, the rotary cache, a vision tower; a tied LM head), for every weight format."""
    n = 0
    for m, tp, quant in _layouts():
        plan = plan_memory(m, None, H200, tp=tp, quantization=quant, strict=False)
        served = shapes.as_served(m, quant)
        act = shapes.act_dtype(None, m)[1]
        streamed = weight_bytes_per_rank(served, tp, tokens=10**9)  # every expert covered
        allocated = streamed - shapes.streamed_minus_allocated_bytes(m, tp, act, quant)
        # target_weights_gib is rounded to 1 MiB; the rest agrees to the byte.
        assert abs(plan.target_weights_gib * GIB - allocated) <= 0.6e-3 * GIB, (m.name, tp, quant)
        n += 1
    assert n > 150


def test_quantized_weights_shrink_both_alike():
    """fp8 and awq shrink the memory plan's linear layers and the roofline's streamed bytes by the same bytes."""
    m = next(x for x in _targets() if x.name == "Llama-3.1-70B")
    for quant, most in (("fp8", 0.52), ("awq", 0.29)):
        w_bf16 = shapes.weights_bytes_per_rank(m, 2, 2)
        w_q = shapes.weights_bytes_per_rank(m, 2, 2, quant)
        s_bf16 = weight_bytes_per_rank(m, 2)
        s_q = weight_bytes_per_rank(shapes.as_served(m, quant), 2)
        assert w_bf16["total"] - w_q["total"] == pytest.approx(s_bf16 - s_q, rel=1e-9)
        assert w_q["linear"] < most * w_bf16["linear"]


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_memory_and_speedup_kv_bytes_agree_for_every_catalog_model(kv):
    """KV bytes per token per rank: the memory plan's (MLA latent, KV heads replicated past TP, linear-attention layers
    none) is the speedup roofline's, at the KV dtype --kv-cache-dtype gives both."""
    for m, tp, quant in _layouts():
        if quant != check_quantization(m, "auto"):
            continue
        plan = plan_memory(m, None, H200, tp=tp, kv_cache_dtype=kv, strict=False)
        kvb = shapes.kv_dtype_bytes(kv, shapes.act_dtype(None, m)[1])
        assert plan.target_kv_bytes_per_token == kv_bytes_per_token_per_rank(m, tp, kvb), (m.name, tp, kv)


def test_moe_streamed_bytes_follow_the_experts_touched():
    """Dense: all weights whatever the tokens; MoE: top_k experts for one token, the covered set at batch b, all of
    them at full coverage, never more than the allocated experts."""
    for m in _targets():
        one, many = weight_bytes_per_rank(m, 1, 1), weight_bytes_per_rank(m, 1, 10**9)
        if not m.is_moe:
            assert one == many, m.name
            continue
        per_expert = shapes.expert_params_per_rank(m, 1) * shapes.linear_bytes_per_param(m, 2) * m.moe_layers
        b32 = weight_bytes_per_rank(m, 1, 32)
        assert one < b32 <= many, m.name
        assert many - one == pytest.approx(per_expert * (m.num_experts - m.num_experts_per_tok), rel=1e-9), m.name


def test_mla_attention_is_the_published_shapes():
    """DeepSeek-V3's layers from its MLA shapes (q_lora_rank 1536, kv_lora_rank 512, 128 heads of 128 + 64 rope): the
    parameter count comes to the published 671B (the MTP layer aside), where an MHA count of its heads said 688B."""
    ds = next(x for x in _targets() if x.name == "DeepSeek-V3")
    import dataclasses
    w = shapes.weights_bytes_per_rank(dataclasses.replace(ds, quantization=""), 1, 2)  # bf16: 2 bytes a parameter
    params = (w["total"] - w["rotary_cache"]) / 2
    assert params == pytest.approx(671e9, rel=0.005)
    mtp = mtp_drafter(ds)
    assert mtp.params_b == pytest.approx(11.6, rel=0.02)  # one MoE layer with MLA + eh_proj


def test_act_dtype_and_kv_dtype():
    m = next(x for x in _targets() if x.name == "Llama-3.1-8B")
    assert shapes.act_dtype(None, m) == ("bfloat16", 2)
    import dataclasses
    f32 = dataclasses.replace(m, dtype="float32")
    assert shapes.act_dtype(None, f32, "gpu") == ("bfloat16", 2)  # vLLM runs float32 checkpoints in bf16 on GPU
    assert shapes.act_dtype(None, f32, "cpu") == ("float32", 4)
    assert shapes.kv_dtype_bytes("fp8", 2) == 1 and shapes.kv_dtype_bytes("auto", 2) == 2
    with pytest.raises(DraftfitError, match="KV cache dtype"):
        shapes.kv_dtype_bytes("int3", 2)


def test_shapes_imports_nothing_above_the_catalog():
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(shapes))
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= {"__future__", "draftfit.errors"}, mods


def test_rank_prices_the_kv_dtype_the_memory_plan_sizes():
    """--kv-cache-dtype fp8 reaches the speedup model through the pipeline (rank, preflight), not only `speedup`: the
    roofline's plain step reads half the KV bytes, as the memory plan stores them. (Qwen3-8B: Llama-3.1-8B's n-gram
    layout on the H100 rests on its measured vLLM 0.34 table, which no KV dtype changes.)"""
    from draftfit.layout import build_layout
    from draftfit.pipeline import evaluate_pair
    steps = {}
    for kv in ("auto", "fp8"):
        layout = build_layout("Qwen3-8B", gpu="H100-80GB", max_model_len=8192, batches=(64,), kv_cache_dtype=kv)
        ev = evaluate_pair(layout, "ngram")
        steps[kv] = ev.speedup.batches[64].base_step_ms
        assert ev.memory.target_kv_bytes_per_token == kv_bytes_per_token_per_rank(
            layout.target, 1, shapes.kv_dtype_bytes(kv, 2))
    assert steps["fp8"] < steps["auto"] * 0.95
