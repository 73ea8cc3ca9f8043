"""Internal consistency of draftfit/catalogs/models.yaml and draftfit/catalogs/gpus.yaml (the facts, not the loader)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from draftfit.catalog.specs import _normalize, _strip_variant, load_gpus, load_models, resolve_gpu, resolve_model

MODELS = load_models()
GPUS = load_gpus()
BY_NAME = {m.name: m for m in MODELS}

TOKENIZER_FAMILIES = {
    "llama-3.0", "llama-3.1", "llama-3.2-vision", "qwen2.5", "qwen3", "qwen3.5", "deepseek-r1-distill-qwen",
    "deepseek-r1-distill-llama", "mistral-v1", "mistral-v3", "mistral-large-2411", "qwen1.5", "gemma2", "gemma3", "deepseek-v3", "deepseek-v4",
}
REQUIRED_MODELS = [
    "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-3.2-1B", "Llama-3.2-3B", "Llama-3.3-70B",
    *(f"Qwen2.5-{s}" for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")),
    *(f"Qwen2.5-Coder-{s}" for s in ("0.5B", "1.5B", "7B", "32B")),
    *(f"Qwen3-{s}" for s in ("0.6B", "1.7B", "4B", "8B", "14B", "32B", "30B-A3B")),
    "Mistral-7B-v0.3", "Mistral-Large-2411", "Gemma-2-2b", "Gemma-2-9b", "Gemma-2-27b",
    *(f"Gemma-3-{s}" for s in ("270m", "1b", "4b", "12b", "27b")),
    *(f"DeepSeek-R1-Distill-Qwen-{s}" for s in ("1.5B", "7B", "14B", "32B")),
    "DeepSeek-R1-Distill-Llama-8B", "DeepSeek-R1-Distill-Llama-70B",
]
REQUIRED_GPUS = ["A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H100-PCIe", "H200", "B200", "MI300X",
                 "RTX-4090"]
# Configs that set head_dim explicitly to something other than hidden/heads.
EXPLICIT_HEAD_DIM_FAMILIES = {"qwen3", "gemma2", "gemma3", "deepseek_v3", "eagle3", "qwen3_next", "qwen3_5_moe"}  # DeepSeek: v_head_dim 128 (MLA); Qwen3 heads copy head_dim 128
# The SigLIP vision tower (+ projector) that Gemma-3 4b/12b/27b checkpoints carry beside the text model.
GEMMA3_VISION_B = 0.42


def test_required_models_and_size():
    missing = [n for n in REQUIRED_MODELS if n not in BY_NAME]
    assert not missing
    assert len(MODELS) >= 40
    assert len(BY_NAME) == len(MODELS), "duplicate model names"


def test_every_lookup_key_names_one_model():
    owners: dict[str, set[str]] = defaultdict(set)
    for m in MODELS:
        keys = [m.name, *m.aliases, m.hub_id, m.hub_id.split("/")[-1]]
        for key in keys:
            norm = _normalize(key)
            owners[norm].add(m.name)
            owners[_strip_variant(norm)].add(m.name)
    clashes = {k: v for k, v in owners.items() if len(v) > 1}
    assert not clashes


@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_shapes_are_consistent(m):
    assert m.tokenizer in TOKENIZER_FAMILIES
    assert m.num_attention_heads % m.num_kv_heads == 0
    assert m.head_dim in (64, 128, 256)
    if m.family not in EXPLICIT_HEAD_DIM_FAMILIES:
        assert m.hidden_size == m.num_attention_heads * m.head_dim
    assert m.vocab_size % 64 == 0  # Gemma-3 4b+: 262208 = 262144 + 64 image tokens, still a multiple of 64
    assert m.max_position_embeddings >= 2048
    assert m.dtype in ("bfloat16", "float16")
    # The model's own config.json, or (no hub here) its publisher's copy in a pinned commit that names it.
    hf = f"https://huggingface.co/{m.hub_id}/blob/main/config.json"
    assert m.source.startswith(hf) or (
        re.match(r"https://github\.com/alibaba/InferSim/blob/[0-9a-f]{40}/hf_configs/\S+_config\.json ", m.source)
        and hf in m.source)
    if m.linear_attention_layers:  # gated-DeltaNet hybrids: 3 linear layers per full one, MTP shipped
        assert m.family in ("qwen3_next", "qwen3_5_moe") and m.layer_types.startswith("LLLF")
        assert m.attn_output_gate and m.num_nextn_predict_layers == 1
    if m.sliding_window:  # Gemma's alternating layers; Mistral-7B-v0.1 slides every layer (4096)
        assert m.family in ("gemma2", "gemma3", "mistral")
    if m.is_moe:
        assert m.moe_intermediate_size > 0 and 0 < m.num_experts_per_tok <= m.num_experts
    else:
        assert m.moe_intermediate_size == 0 and m.num_experts_per_tok == 0


def _shape_params_b(m) -> float:
    h, layers, d = m.hidden_size, m.num_layers, m.head_dim
    q, kv = m.num_attention_heads * d, m.num_kv_heads * d
    if m.is_eagle:
        # One layer whose q/k/v read [embedding, fused hidden] (2h), the fc that fuses three target layers
        # (3h -> h), the MLP and the 32000-row draft lm_head; the embedding is the target's.
        target_h = m.target_hidden_size or h
        return (2 * h * (q + 2 * kv) + q * h + 3 * h * m.intermediate_size + 3 * target_h * h
                + h * (m.draft_vocab_size or 32000)) / 1e9
    if m.kv_lora_rank:
        # MLA (DeepSeek): low-rank q/kv projections and 3 dense layers the shape fields do not describe; the
        # catalog keeps the model card's count (671B without the 14B MTP module).
        return m.params_b
    mlp = 3 * h * (m.moe_intermediate_size or m.intermediate_size) * max(m.num_experts, 1) + h * m.num_experts \
        + 3 * h * m.shared_expert_intermediate_size  # Qwen1.5-MoE's always-active shared expert
    # Gated-DeltaNet layers (Qwen3-Next, Qwen3.5): in_proj_qkvz + out_proj dominate; attention q_proj is doubled
    # by its output gate.
    lin = m.linear_attention_layers
    key, value = m.linear_num_key_heads * m.linear_key_head_dim, m.linear_num_value_heads * m.linear_value_head_dim
    gdn = h * (2 * key + 2 * value) + value * h
    body = (layers - lin) * ((3 if m.attn_output_gate else 2) * h * q + 2 * h * kv) + lin * gdn + layers * mlp
    embeddings = m.vocab_size * h * (1 if m.tie_word_embeddings else 2)
    extra = GEMMA3_VISION_B if m.architecture == "Gemma3ForConditionalGeneration" else m.vision_params_b
    return (body + embeddings) / 1e9 + extra


@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_params_match_shapes(m):
    assert m.params_b == pytest.approx(_shape_params_b(m), rel=0.03)


def test_known_vocab_and_tying_facts():
    # Qwen2.5 pads the embedding to 152064 rows from 7B up and ties it below.
    for m in MODELS:
        if m.family == "qwen2.5":
            small = m.params_b < 4
            assert m.vocab_size == (151936 if small else 152064), m.name
            assert m.tie_word_embeddings == small, m.name
        if m.tokenizer in ("llama-3.1", "deepseek-r1-distill-llama"):
            assert m.vocab_size == 128256, m.name
        if m.family in ("gemma2", "gemma3"):
            assert m.tie_word_embeddings, m.name
    # R1-Distill-Qwen-1.5B unties what Qwen2.5-1.5B ties: same shapes, ~0.23B more weights.
    assert not BY_NAME["DeepSeek-R1-Distill-Qwen-1.5B"].tie_word_embeddings
    assert BY_NAME["Qwen3-30B-A3B"].num_experts == 128
    # The MoE campaign pairs share their draft's vocabulary (vLLM's draft_model rule).
    assert BY_NAME["Mixtral-8x7B"].vocab_size == BY_NAME["Mistral-7B-v0.1"].vocab_size == 32000
    assert BY_NAME["Qwen1.5-MoE-A2.7B"].vocab_size == BY_NAME["Qwen1.5-0.5B"].vocab_size == 151936


def test_one_tokenizer_family_means_one_vocabulary_up_to_padding():
    sizes = defaultdict(set)
    for m in MODELS:
        sizes[m.tokenizer].add(m.vocab_size)
    for tokenizer, rows in sizes.items():
        assert max(rows) - min(rows) <= 256, (tokenizer, rows)


def test_eagle_heads_point_at_their_targets():
    heads = [m for m in MODELS if m.is_eagle]
    assert len(heads) >= 2
    for head in heads:
        assert head.method == "eagle3" and head.num_layers == 1 and head.draft_for
        for target_name in head.draft_for:
            target = BY_NAME[target_name]
            assert not target.is_eagle
            # fc fuses the target's hidden states; the head itself may be narrower (target_hidden_size)
            assert (head.target_hidden_size or head.hidden_size) == target.hidden_size
            assert head.vocab_size == target.vocab_size
            assert head.tokenizer == target.tokenizer
    for m in MODELS:
        if not m.is_eagle:
            assert m.method == "draft_model" and not m.draft_for


def test_loose_names_resolve():
    assert resolve_model("llama3.1-70b").name == "Llama-3.1-70B"
    assert resolve_model("meta-llama/Llama-3.1-70B-Instruct").name == "Llama-3.1-70B"
    assert resolve_model("meta-llama/Meta-Llama-3.1-8B").name == "Llama-3.1-8B"
    assert resolve_model("Qwen2.5-Coder-0.5B-Instruct").name == "Qwen2.5-Coder-0.5B"
    assert resolve_model("Qwen/Qwen3-8B-Base").name == "Qwen3-8B"
    assert resolve_model("google/gemma-3-4b-it").name == "Gemma-3-4b"


def test_gpus():
    names = {g.name for g in GPUS}
    assert set(REQUIRED_GPUS) <= names
    owners: dict[str, set[str]] = defaultdict(set)
    for g in GPUS:
        for key in (g.name, *g.aliases):
            owners[_normalize(key)].add(g.name)
        assert g.vendor in ("nvidia", "amd")
        assert g.source.startswith("https://")
        assert 10 < g.memory_gib < 200 and 200 <= g.bandwidth_gbps <= 10000 and 50 <= g.bf16_tflops <= 5000
    assert not {k: v for k, v in owners.items() if len(v) > 1}
    # What torch reports is below the nominal size: 80 GB cards report ~79 GiB, H200 (141 GB) ~139.8 GiB.
    assert 78.5 < resolve_gpu("H100").memory_gib < 80
    assert resolve_gpu("H200").memory_gib < 143771 / 1024
    assert resolve_gpu("H100-PCIe").bandwidth_gbps < resolve_gpu("H100").bandwidth_gbps
