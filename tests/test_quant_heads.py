"""Quantized weights, heads sized at the user's context, and MTP drafters (issue 16, deliverables 4 and 5)."""

from __future__ import annotations

import json

import pytest

from draftfit.catalog.specs import resolve_model, spec_from_folder
from draftfit.layout import build_layout
from draftfit.memory.plan import plan_memory
from draftfit.pipeline import command_for, evaluate_pair
from draftfit.rank import rank
from draftfit.catalog.specs import resolve_gpu

# Llama-3.1-70B-Instruct's config.json (https://huggingface.co/meta-llama/Llama-3.1-70B-Instruct/blob/main/config.json)
# with the quantization_config of its FP8 copy
# (https://huggingface.co/RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8/blob/main/config.json): compressed-tensors,
# 8-bit float weights per channel, lm_head left out.
LLAMA_70B_FP8 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "config_groups": {"group_0": {
            "input_activations": {"dynamic": True, "num_bits": 8, "strategy": "token", "symmetric": True,
                                  "type": "float"},
            "targets": ["Linear"],
            "weights": {"dynamic": False, "num_bits": 8, "strategy": "channel", "symmetric": True, "type": "float"}}},
        "format": "float-quantized", "ignore": ["lm_head"], "quant_method": "compressed-tensors"},
}


def _folder(tmp_path, config, name="Meta-Llama-3.1-70B-Instruct-FP8"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_fp8_folder_is_sized_as_fp8(tmp_path):
    spec = spec_from_folder(_folder(tmp_path, LLAMA_70B_FP8))
    assert spec.quantization == "fp8" and spec.name.startswith("Llama-3.1-70B")  # matched to its catalog entry
    bf16 = {k: v for k, v in LLAMA_70B_FP8.items() if k != "quantization_config"}
    plain = spec_from_folder(_folder(tmp_path, bf16, "Meta-Llama-3.1-70B-Instruct"))
    assert plain.quantization == ""
    gpu = resolve_gpu("H100-80GB")
    p8 = plan_memory(spec, None, gpu, tp=2, max_model_len=8192, strict=False)
    p16 = plan_memory(plain, None, gpu, tp=2, max_model_len=8192, strict=False)
    # 65.7 GiB per GPU in bf16 (the figure); FP8 linear layers halve all but embedding and lm_head.
    assert p16.target_weights_gib == pytest.approx(65.7, abs=0.3)
    assert 0.5 < p8.target_weights_gib / p16.target_weights_gib < 0.56
    assert p8.kv_tokens > 2 * p16.kv_tokens
    # The roofline streams the same quantized bytes (one home: memory.plan.linear_bytes_per_param).
    from draftfit.speedup.stepcost import weight_bytes_per_rank
    assert weight_bytes_per_rank(spec, 2) < 0.56 * weight_bytes_per_rank(plain, 2)


def test_rank_accepts_its_own_quantization_fix():
    base = rank("Llama-3.1-70B", gpu_name="H100-80GB", tp=2, max_model_len=131072)
    fixes = [c.memory_fix for c in base.candidates if c.decision == "does not fit" and c.memory_fix]
    assert fixes and all("--tensor-parallel-size" not in f.split(" (vLLM")[0] for f in fixes)
    q = rank("Llama-3.1-70B", gpu_name="H100-80GB", tp=2, max_model_len=131072, quantization="fp8")
    assert q.layout.quantization == "fp8" and q.layout.max_model_len == 131072  # no context cut needed
    assert q.winner and "--quantization fp8" in q.serve_command
    assert max(c.kv_tokens or 0 for c in q.candidates) > max(c.kv_tokens or 0 for c in base.candidates)


def test_a_quantized_checkpoint_refuses_another_method():
    from draftfit.errors import DraftfitError
    with pytest.raises(DraftfitError) as e:
        build_layout("DeepSeek-V3", gpu="H200", tp=8, quantization="awq")
    assert e.value.message.startswith("--quantization awq")


def test_heads_are_sized_at_the_users_context():
    layout = build_layout("Llama-3.1-8B", gpu="H100-80GB", tp=1, max_model_len=32768)
    ev = evaluate_pair(layout, "EAGLE3-Llama-3.1-8B")
    assert ev.memory.max_model_len == 32768  # not the head's 2048 positions
    default = plan_memory(resolve_model("Llama-3.1-8B"), resolve_model("EAGLE3-Llama-3.1-8B"), resolve_gpu("H200"))
    assert default.max_model_len == 131072
    # One decoder layer of KV per token beside the target's 32; its own lm_head is the 32000-row draft vocab,
    # the embedding is the target's: well under the 1.9 GiB a full 128256-row embedding + lm_head would take.
    assert ev.memory.draft_kv_bytes_per_token * 32 == ev.memory.target_kv_bytes_per_token
    assert 0.3 < ev.memory.draft_weights_gib < 0.9


def test_wrong_target_head_still_refused():
    layout = build_layout("Llama-3.1-70B", gpu="H200", tp=2)
    ev = evaluate_pair(layout, "EAGLE3-Llama-3.3-70B-SpecForge")
    assert not ev.vllm_runs and "Llama-3.3-70B" in ev.vllm_reason


def test_mtp_row_for_deepseek_v3_and_a_config_vllm_accepts():
    r = rank("DeepSeek-V3", gpu_name="H200", tp=8, max_model_len=32768, batches=(1,))
    row = next(c for c in r.candidates if c.method == "mtp")
    assert row.draft == "DeepSeek-V3-MTP" and row.fits and row.acceptance_source == "prior:mtp"
    assert 0.85 <= row.acceptance <= 0.90
    layout = build_layout("DeepSeek-V3", gpu="H200", tp=8, max_model_len=32768, k=2)
    ev = evaluate_pair(layout, "DeepSeek-V3-MTP")
    assert ev.memory.draft_kv_bytes_per_token == 576 * 2  # one MLA layer: kv_lora_rank 512 + rope 64, bf16
    cmd = command_for(ev)
    assert "model" not in cmd.speculative_config and cmd.speculative_config["method"] == "mtp"
    from vllm.config.speculative import SpeculativeConfig
    fields = set(SpeculativeConfig.__dataclass_fields__)
    assert set(cmd.speculative_config) <= fields
    assert "mtp" in str(SpeculativeConfig.__dataclass_fields__["method"].type)


# openai/gpt-oss-120b's config.json fields (https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json, as quoted
# by public test fixtures; docs/DEVELOPING.md "Catalog entries waiting for a source"): mxfp4 experts, attention,
# router, embedding and lm_head left unconverted.
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 36,
    "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "vocab_size": 201088,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": True,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
}


@pytest.mark.parametrize("qc, left_out", [
    (GPT_OSS_120B["quantization_config"], True),
    ({"quant_method": "compressed-tensors", "ignore": ["lm_head"]}, False),
    ({"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn.*"]}, True),
    ({"quant_method": "awq", "modules_to_not_convert": None}, False),
    ({"quant_method": "modelopt", "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]}, True),
    ({"quant_method": "awq", "modules_to_not_convert": "self_attn"}, False),  # not a list: nothing read from it
])
def test_attention_left_out_of_the_quantized_format(qc, left_out):
    from draftfit.catalog.specs import attention_left_unquantized

    assert attention_left_unquantized({"quantization_config": qc}) is left_out


def test_mxfp4_experts_with_bf16_attention_are_sized_part_by_part(tmp_path):
    """gpt-oss-120b: only the experts are mxfp4 (4.25 bits); its 36 layers' attention projections stay bf16, in the
    memory plan and in the roofline's weight traffic alike; at TP=2 both halves split."""
    from draftfit.memory.plan import QUANT_BYTES_PER_PARAM
    from draftfit.speedup.stepcost import weight_bytes_per_rank

    spec = spec_from_folder(_folder(tmp_path, GPT_OSS_120B, "gpt-oss-120b"))
    assert (spec.quantization, spec.unquantized_attention, spec.layer_types) == ("mxfp4", True, "SF*18")
    qc = dict(GPT_OSS_120B["quantization_config"], modules_to_not_convert=["lm_head"])
    all4 = spec_from_folder(_folder(tmp_path, dict(GPT_OSS_120B, quantization_config=qc), "all-mxfp4"))
    assert not all4.unquantized_attention
    gpu = resolve_gpu("H200")
    attn_params = 36 * (2880 * 64 * 64 * 2 + 2880 * 8 * 64 * 2)
    extra_gib = attn_params * (2 - QUANT_BYTES_PER_PARAM["mxfp4"]) / 2**30
    for tp in (1, 2):
        a = plan_memory(spec, None, gpu, tp=tp, max_model_len=8192, strict=False).target_weights_gib
        b = plan_memory(all4, None, gpu, tp=tp, max_model_len=8192, strict=False).target_weights_gib
        assert a - b == pytest.approx(extra_gib / tp, abs=0.01)
    assert weight_bytes_per_rank(spec, 1) - weight_bytes_per_rank(all4, 1) == pytest.approx(
        attn_params * (2 - QUANT_BYTES_PER_PARAM["mxfp4"]), rel=1e-6)
    # --quantization on the command line converts every linear layer (vLLM's online fp8), attention included
    f8 = plan_memory(spec, None, gpu, tp=1, max_model_len=8192, strict=False, quantization="fp8")
    assert f8.target_weights_gib > plan_memory(spec, None, gpu, tp=1, max_model_len=8192,
                                               strict=False).target_weights_gib


def test_dense_mlp_layers_are_sized_dense_in_the_memory_plan(tmp_path):
    """A Qwen2-MoE-shaped folder whose first four layers are mlp_only_layers: those hold one dense MLP and no router."""
    base = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
            "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
            "moe_intermediate_size": 1408, "num_experts": 60, "num_experts_per_tok": 4,
            "shared_expert_intermediate_size": 5632, "vocab_size": 100000, "max_position_embeddings": 8192}
    a = spec_from_folder(_folder(tmp_path, base, "moe-all"))
    b = spec_from_folder(_folder(tmp_path, dict(base, mlp_only_layers=[0, 1, 2, 3]), "moe-4-dense"))
    gpu = resolve_gpu("H200")
    pa = plan_memory(a, None, gpu, tp=1, max_model_len=4096, strict=False).target_weights_gib
    pb = plan_memory(b, None, gpu, tp=1, max_model_len=4096, strict=False).target_weights_gib
    h = 2048
    moe_layer = 3 * h * 1408 * 60 + 3 * h * 5632 + h * 60 + h  # experts, shared expert, router, shared gate
    assert pa - pb == pytest.approx(4 * (moe_layer - 3 * h * 5632) * 2 / 2**30, abs=0.005)
