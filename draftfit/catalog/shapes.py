"""Shapes of a model that both the memory plan and the speedup model read: the one home of each (issue 37, item 5).

- dtype bytes: DTYPE_BYTES, act_dtype (the dtype vLLM runs a checkpoint in), kv_dtype_bytes (--kv-cache-dtype);
- weight bytes by format: QUANT_BYTES_PER_PARAM, linear_bytes_per_param, attention_bytes_per_param (bf16/fp16,
  fp8, fp8-block, int8, awq, gptq, w4a16, bitsandbytes, mxfp4);
- parameter counts per layer and per TP rank, as vLLM shards them: attention (grouped KV heads replicated past TP,
  MLA's replicated down-projections), gated-DeltaNet, dense MLP, one routed expert, shared experts and router;
- weights_bytes_per_rank: what vLLM allocates (the memory plan's `Model loading took` figure);
- streamed_weight_bytes_per_rank: what one forward pass over T tokens reads from HBM (the speedup roofline): every
  weight of a dense model, for an MoE layer its router, shared experts and the routed experts its tokens cover
  (expert_coverage: top_k of them for one token, nearly all at batch 32+), never the gathered embedding rows;
- kv_bytes_per_token (MLA latent, sliding window layers keep KV per token too, linear-attention layers none; any KV
  dtype) and linear_state_bytes (a gated-DeltaNet layer's state per sequence);
- flops_per_token.

Streamed and allocated bytes come from the same parameter counts, so they differ only by what a pass does not read
(the embedding rows it gathers, the rotary cache, a vision tower) or reads without holding (a tied lm_head is the
embedding; an MTP layer or EAGLE head under dummy weights uses the target's): tests/test_shapes.py holds the two to
that identity for every catalog model. Imports nothing of draftfit's but errors: the catalog, the memory plan and the
speedup model all read it.
"""

from __future__ import annotations

import functools

from draftfit.errors import DraftfitError

# ----------------------------------------------------------------------------------------------- dtype bytes

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "int8": 1}
# Bytes per parameter of the linear layers (embedding, lm_head and norms stay in the activation dtype: vLLM's
# quantization methods leave them alone). Keys are weight formats; catalog.specs.quantization_of maps a
# config.json's quantization_config onto them, layout.QUANTIZATIONS are the ones a user may ask for.
QUANT_BYTES_PER_PARAM = {
    "none": None,  # the activation dtype
    "fp8": 1.0 + 4 / 4096,  # 1 byte + a float32 scale per output channel of a 4096-wide layer
    "fp8-block": 1.0 + 4 / (128 * 128),  # DeepSeek-V3's weight_block_size [128, 128]: a float32 scale per block
    "int8": 1.0 + 4 / 4096,  # W8A8 int8 (compressed-tensors): a float32 scale per output channel
    # 4-bit weights + a fp16 scale and a 4-bit zero point per group of 128 inputs
    "awq": 0.5 + 2 / 128 + 0.5 / 128,
    "gptq": 0.5 + 2 / 128 + 0.5 / 128 + 4 / 4096,  # + g_idx (int32 per input row), amortised
    "gptq-8bit": 1.0 + 2 / 128 + 1.0 / 128 + 4 / 4096,
    "w4a16": 0.5 + 2 / 128,  # compressed-tensors pack-quantized int4, symmetric: a bf16 scale per group of 128
    # bitsandbytes nf4 with double quantization: 4 bits + an 8-bit absmax per 64 + a float32 per 256 absmaxes
    "bitsandbytes": 0.5 + 1 / 64 + 4 / (64 * 256),
    "bitsandbytes-8bit": 1.0 + 4 / 4096,  # LLM.int8(): int8 rows + a float32 scale per row
    "mxfp4": 0.5 + 1 / 32,  # gpt-oss experts: 4-bit e2m1 + an e8m0 scale per 32 values
}
VOCAB_PADDING = 64  # vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE


def _spec_get(spec, name, default=0):
    return getattr(spec, name, default) if not isinstance(spec, dict) else spec.get(name, default)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def padded_vocab(vocab_size: int, pad_to: int = VOCAB_PADDING) -> int:
    return cdiv(vocab_size, pad_to) * pad_to


def act_dtype(dtype: str | None, spec, backend: str = "gpu") -> tuple[str, int]:
    """(the dtype vLLM runs `spec` in, its bytes) for --dtype `dtype`: 'auto' keeps a float16/bfloat16 checkpoint's
    dtype; a float32 checkpoint runs in bf16 on GPU (config/model.py _get_and_verify_dtype), float32 on CPU."""
    if dtype in (None, "", "auto"):
        dt = (_spec_get(spec, "dtype", "") or "bfloat16").replace("torch.", "")
        if dt in ("float32", "float") and backend == "gpu":
            dt = "bfloat16"
    else:
        dt = dtype
    if dt not in DTYPE_BYTES:
        raise DraftfitError(f"unknown dtype {dtype!r}", fix="use auto, bfloat16, float16 or float32")
    return dt, DTYPE_BYTES[dt]


def kv_dtype_bytes(kv_cache_dtype: str | None, act_bytes: int) -> int:
    """Bytes per KV element for --kv-cache-dtype: 'auto' stores KV in the activation dtype, fp8 in one byte."""
    if kv_cache_dtype in (None, "", "auto"):
        return act_bytes
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if kv_cache_dtype in DTYPE_BYTES:
        return DTYPE_BYTES[kv_cache_dtype]
    raise DraftfitError(f"unknown KV cache dtype {kv_cache_dtype!r}", fix="use auto or fp8")


def _asked(quantization) -> bool:
    return quantization not in (None, "", "none", "auto")


def linear_bytes_per_param(spec, act_bytes: float, quantization: str = "none") -> float:
    """Bytes one linear-layer parameter of `spec` takes on the GPU: the quantization asked for, else the
    checkpoint's own (spec.quantization, from its quantization_config), else the activation dtype."""
    fmt = quantization if _asked(quantization) else (_spec_get(spec, "quantization", "") or "none")
    if fmt not in QUANT_BYTES_PER_PARAM:
        raise DraftfitError(f"unknown quantization {fmt!r}", fix="use " + ", ".join(QUANT_BYTES_PER_PARAM))
    return QUANT_BYTES_PER_PARAM[fmt] or act_bytes


def attention_bytes_per_param(spec, act_bytes: float, quantization: str = "none") -> float:
    """Bytes one attention-projection parameter takes: linear_bytes_per_param, except where the checkpoint's own
    quantization_config leaves attention unconverted (spec.unquantized_attention: gpt-oss's mxfp4 converts the
    experts only, `modules_to_not_convert: model.layers.*.self_attn`): then the activation dtype. A quantization
    asked for on the command line converts every linear layer, as vLLM's online fp8 does."""
    own = quantization == (_spec_get(spec, "quantization", "") or "none")  # the layout's default: the checkpoint's
    if _spec_get(spec, "unquantized_attention", False) and (own or not _asked(quantization)):
        return act_bytes
    return linear_bytes_per_param(spec, act_bytes, quantization)


def as_served(spec, quantization: str | None):
    """`spec` with the weight format it is served in (layout.check_quantization's answer), for a reader that takes
    the format from the spec (the speedup roofline): a format asked for that is not the checkpoint's own converts
    every linear layer, attention included, as attention_bytes_per_param says for the memory plan."""
    import dataclasses

    if not _asked(quantization) or quantization == (_spec_get(spec, "quantization", "") or "none"):
        return spec
    return dataclasses.replace(spec, quantization=quantization, unquantized_attention=False)


# ----------------------------------------------------------------------------------------------- parameter counts

def attention_layer_params(hidden: int, heads: int, kv_heads: int, head_dim: int, gate: bool = False) -> int:
    """One attention layer's projections, q, k, v and o: hidden x heads x head_dim for q and o, hidden x kv_heads x
    head_dim for k and v; a gated q_proj (Qwen3-Next/3.5 attn_output_gate) emits the gate too, another q."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return hidden * q * (3 if gate else 2) + hidden * kv * 2


def mla_attention_params(spec, tp: int = 1) -> int:
    """One multi-head latent attention layer (DeepSeek-V2/V3) on one TP rank, as vLLM's DeepseekV2MLAAttention
    builds it (model_executor/models/deepseek_v2.py): q_a_proj (hidden -> q_lora_rank) and kv_a_proj_with_mqa
    (hidden -> kv_lora_rank + qk_rope_head_dim) replicated on every rank (fused_qkv_a_proj, disable_tp), q_b_proj
    (q_lora_rank -> heads x (qk_nope + qk_rope); hidden -> that with no q_lora_rank), kv_b_proj (kv_lora_rank ->
    heads x (qk_nope + v_head_dim)) and o_proj (heads x v_head_dim -> hidden) split by heads."""
    h, heads = _spec_get(spec, "hidden_size"), _spec_get(spec, "num_attention_heads") // tp
    rope = _spec_get(spec, "qk_rope_head_dim", 0)
    nope = _spec_get(spec, "qk_nope_head_dim", 0) or _spec_get(spec, "head_dim")
    v = _spec_get(spec, "v_head_dim", 0) or _spec_get(spec, "head_dim")
    q_lora, kv_lora = _spec_get(spec, "q_lora_rank", 0), _spec_get(spec, "kv_lora_rank", 0)
    q = (h * q_lora + q_lora * heads * (nope + rope)) if q_lora else h * heads * (nope + rope)
    return q + h * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * h


def linear_layer_params(hidden: int, *, linear_num_key_heads: int, linear_num_value_heads: int,
                        linear_key_head_dim: int, linear_value_head_dim: int, linear_conv_kernel_dim: int) -> int:
    """Parameters of one gated-DeltaNet layer as vLLM builds it (layers/mamba/gdn/qwen_gdn_linear_attn.py):
    in_proj_qkvz (hidden -> 2 key_dim + 2 value_dim), in_proj_ba (hidden -> 2 value heads), the depthwise conv1d over
    q, k, v (conv_kernel per channel), dt_bias and A_log per value head, the gated norm (one head's width) and
    out_proj (value_dim -> hidden)."""
    key_dim = linear_num_key_heads * linear_key_head_dim
    value_dim = linear_num_value_heads * linear_value_head_dim
    conv_dim = 2 * key_dim + value_dim
    return (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * linear_num_value_heads
            + conv_dim * linear_conv_kernel_dim + 2 * linear_num_value_heads + linear_value_head_dim
            + value_dim * hidden)


MLA_SHAPE_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "q_lora_rank", "qk_nope_head_dim", "v_head_dim")
LINEAR_SHAPE_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                       "linear_value_head_dim", "linear_conv_kernel_dim")


def linear_layer_params_of(spec) -> int:
    """linear_layer_params for a spec's own gated-DeltaNet shapes (0 shapes give the hidden-only terms)."""
    return linear_layer_params(spec.hidden_size, **{k: _spec_get(spec, k, 0) or 0 for k in LINEAR_SHAPE_FIELDS})


def kv_heads_per_rank(spec, tp: int) -> int:
    # QKVParallelLinear: with fewer KV heads than ranks, each rank holds one replicated KV head.
    return max(1, spec.num_kv_heads // tp)


def attention_params_per_rank(spec, tp: int) -> int:
    """One attention layer's projections on one TP rank (MLA's, or q/k/v/o with grouped KV heads replicated past
    TP and a gated q_proj's gate)."""
    if _spec_get(spec, "kv_lora_rank", 0):
        return mla_attention_params(spec, tp)
    h, hd = spec.hidden_size, spec.head_dim
    q_rank = spec.num_attention_heads // tp * hd
    kv_rank = kv_heads_per_rank(spec, tp) * hd
    gate = q_rank if _spec_get(spec, "attn_output_gate", False) else 0
    return h * (q_rank + gate + 2 * kv_rank) + q_rank * h


def _family(spec) -> str:
    return (_spec_get(spec, "family", "") or _spec_get(spec, "architecture", "") or "").lower()


def expert_params_per_rank(spec, tp: int = 1) -> int:
    """One routed expert of one layer on one rank: gate, up and down projections (3 x hidden x
    moe_intermediate_size / TP)."""
    return 3 * spec.hidden_size * ((_spec_get(spec, "moe_intermediate_size", 0) or spec.intermediate_size) // tp)


def expert_params_per_layer(spec) -> int:
    """One routed expert of one layer, whole (expert_params_per_rank at TP=1)."""
    return expert_params_per_rank(spec, 1)


def shared_expert_params_per_rank(spec, tp: int = 1) -> int:
    """An MoE layer's always-active shared expert(s), one gated MLP sharded like a dense one (Qwen2-MoE's
    shared_expert_intermediate_size, DeepSeek's n_shared_experts x moe_intermediate_size); 0 when none."""
    if not _spec_get(spec, "num_experts", 0):
        return 0
    return 3 * spec.hidden_size * ((_spec_get(spec, "shared_expert_intermediate_size", 0) or 0) // tp)


def router_params(spec) -> int:
    """An MoE layer's router (hidden x experts, replicated, kept in the activation dtype by vLLM's quantization
    methods), plus the 1-wide shared_expert_gate of Qwen2-MoE and Qwen3-Next/3.5."""
    experts = _spec_get(spec, "num_experts", 0) or 0
    if not experts:
        return 0
    h = spec.hidden_size
    gated_shared = _spec_get(spec, "shared_expert_intermediate_size", 0) and any(
        f in _family(spec) for f in ("qwen2", "qwen3_next", "qwen3next", "qwen3_5"))
    return h * experts + (h if gated_shared else 0)


def dense_mlp_params_per_rank(spec, tp: int = 1) -> int:
    return 3 * spec.hidden_size * (spec.intermediate_size // tp)


def moe_layer_count(spec) -> int:
    """Layers whose MLP routes to experts (ModelSpec.moe_layers; 0 for a dense model)."""
    if not _spec_get(spec, "num_experts", 0):
        return 0
    return _spec_get(spec, "moe_layers", spec.num_layers)


def expert_coverage(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct experts that `tokens` tokens route to, each choosing top_k of num_experts
    (uniform, independent routing): E(1 - (1 - k/E)^T). One token reads exactly k; a step of many tokens
    reads nearly all E. A decode step streams each routed expert's weights once (vLLM's fused_moe groups the
    step's tokens by expert), so this, not top_k, sets an MoE layer's weight traffic."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    k = min(max(top_k, 1), num_experts)
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


def _norm_and_bias_params(spec, tp: int) -> int:
    """Norms (two per layer, the final one, Qwen3's q/k norms, MLA's latent norms) and Qwen2's q/k/v biases."""
    h, hd, L = spec.hidden_size, spec.head_dim, spec.num_layers
    attn_layers = _spec_get(spec, "attention_layers", L)
    fam = _family(spec)
    qkv_bias = L * (spec.num_attention_heads // tp * hd + 2 * kv_heads_per_rank(spec, tp) * hd) \
        if "qwen2" in fam else 0
    qk_norm = attn_layers * 2 * hd if "qwen3" in fam else 0
    mla_norm = L * (_spec_get(spec, "q_lora_rank", 0) + spec.kv_lora_rank) if _spec_get(spec, "kv_lora_rank", 0) \
        else 0
    return L * 2 * h + h + qk_norm + qkv_bias + mla_norm


# ----------------------------------------------------------------------------------------------- weights

def rotary_buffer_bytes(spec, act_bytes: int, max_position: int | None = None) -> int:
    # RotaryEmbedding.cos_sin_cache: max_position x rotary_dim in the model dtype (a buffer, loaded
    # with the weights). One per model (get_rope caches by parameters; target and draft rarely match).
    positions = max_position or spec.max_position_embeddings or 0
    factor = _spec_get(spec, "rope_scaling_factor", 0.0) or 1.0
    # Partial rotary (Qwen3-Next's 0.25): the cache spans the rotated dimensions only.
    rotary_dim = int(spec.head_dim * (_spec_get(spec, "partial_rotary_factor", 0.0) or 1.0))
    cache = int(positions * factor) * rotary_dim * act_bytes
    # Gemma-3: the sliding layers' own rope (rope_local_base_freq), unscaled, is a second buffer.
    local = positions * spec.head_dim * act_bytes if _spec_get(spec, "rope_local_base_freq", 0.0) else 0
    return cache + local


def _layer_params(spec, tp: int, experts_read: float) -> tuple[float, float]:
    """(attention-projection parameters, other linear parameters) of all layers on one rank, with `experts_read`
    routed experts per MoE layer (all of them for what is allocated, expert_coverage for what a pass reads)."""
    L = spec.num_layers
    attn_layers = _spec_get(spec, "attention_layers", L)
    attn = attn_layers * attention_params_per_rank(spec, tp)
    gdn = (L - attn_layers) * linear_layer_params_of(spec) // tp  # gated-DeltaNet layers (linear attention)
    moe = moe_layer_count(spec)
    if moe:
        mlp = moe * (expert_params_per_rank(spec, tp) * experts_read + shared_expert_params_per_rank(spec, tp)) \
            + (L - moe) * dense_mlp_params_per_rank(spec, tp)  # dense_mlp_layers keep one dense MLP
    else:
        mlp = L * dense_mlp_params_per_rank(spec, tp)
    return attn, mlp + gdn


def weights_bytes_per_rank(spec, tp: int, act_bytes: int, quantization: str = "none",
                           max_position: int | None = None, load_format: str = "auto") -> dict:
    """Bytes of parameters (and load-time buffers) on one TP rank, as vLLM allocates them. `load_format` matters
    for an EAGLE head only (_head_weights_bytes_per_rank: dummy weights share the target's lm_head)."""
    linear_bpp = linear_bytes_per_param(spec, act_bytes, quantization)
    attn_bpp = attention_bytes_per_param(spec, act_bytes, quantization)
    if _spec_get(spec, "is_eagle", False):
        return _head_weights_bytes_per_rank(spec, tp, act_bytes, linear_bpp, max_position,
                                            own_lm_head=load_format != "dummy")
    h = spec.hidden_size
    attn, other = _layer_params(spec, tp, _spec_get(spec, "num_experts", 0) or 0)
    vocab_rank = padded_vocab(spec.vocab_size) // tp
    # A vision tower (Qwen3.5) loads with the model unless --language-model-only; vLLM keeps it in the model
    # dtype under weight quantization (its quantization_config ignores it), so it is sized at act_bytes.
    vision = int(_spec_get(spec, "vision_params_b", 0.0) * 1e9 / tp) * act_bytes
    out = {
        "linear": int(attn * attn_bpp + other * linear_bpp),
        "vision": vision,
        "embedding": vocab_rank * h * act_bytes,
        "lm_head": 0 if spec.tie_word_embeddings else vocab_rank * h * act_bytes,
        "norms_bias_router": (_norm_and_bias_params(spec, tp) + moe_layer_count(spec) * router_params(spec))
        * act_bytes,
        "rotary_cache": rotary_buffer_bytes(spec, act_bytes, max_position),
    }
    out["total"] = sum(out.values())
    return out


def _head_weights_bytes_per_rank(spec, tp: int, act_bytes: int, linear_bpp: float, max_position,
                                 own_lm_head: bool = True) -> dict:
    """A head that drafts from the target's hidden states, as vLLM builds it.

    EAGLE-3 (model_executor/models/llama_eagle3.py): the first decoder layer's qkv_proj reads the embedding
    and the fused hidden state side by side (2 x hidden inputs); `fc` fuses three target hidden states
    (3 x target_hidden_size -> hidden, a ReplicatedLinear: whole on every rank); lm_head has draft_vocab_size
    rows, with d2t (int64) and t2d (bool) maps. The proposer shares the target's embedding when the widths
    match (v1/spec_decode/llm_base_proposer.py _maybe_share_embeddings) and frees the head's own; a narrower
    head keeps its own. The lm_head stays the head's own only when its checkpoint loads one: the proposer
    (_maybe_share_lm_head) keeps it where load_weights saw an lm_head (models/utils.py process_eagle_weight sets
    has_own_lm_head), so under load_format=dummy, which loads nothing, the head drafts with the target's lm_head
    (its logits cut to draft_vocab_size columns) and holds none of its own (`own_lm_head` False): Llama-3.1-8B + an
    EAGLE-3 head loaded 15.55 GiB under dummy weights, 0.24 GiB (its 32000 x 4096 lm_head) under its layers' size.
    MTP (method mtp): the target's own next-token layers, one decoder layer each plus eh_proj (2 x hidden ->
    hidden); embedding and lm_head are shared with the target."""
    h, L = spec.hidden_size, spec.num_layers
    out = {"linear": 0, "embedding": 0, "lm_head": 0, "norms_bias_router": 0,
           "rotary_cache": rotary_buffer_bytes(spec, act_bytes, max_position)}
    if _spec_get(spec, "method", "") == "mtp":
        # params_b of an MTP drafter counts its layers and eh_proj only (catalog.specs.mtp_drafter).
        out["linear"] = int(spec.params_b * 1e9 * linear_bpp / tp)
        out["norms_bias_router"] = L * 4 * h * act_bytes
    else:
        q_rank = spec.num_attention_heads // tp * spec.head_dim
        kv_rank = kv_heads_per_rank(spec, tp) * spec.head_dim
        first = 2 * h * (q_rank + 2 * kv_rank) + q_rank * h + 3 * h * (spec.intermediate_size // tp)
        rest = h * (q_rank + 2 * kv_rank) + q_rank * h + 3 * h * (spec.intermediate_size // tp)
        out["linear"] = int((first + (L - 1) * rest) * linear_bpp)
        target_h = _spec_get(spec, "target_hidden_size", 0) or h
        fc = 3 * target_h * h
        draft_vocab = _spec_get(spec, "draft_vocab_size", 0) or spec.vocab_size
        out["lm_head"] = padded_vocab(draft_vocab) // tp * h * act_bytes if own_lm_head else 0
        # Own embedding only when it cannot be the target's (another width).
        out["embedding"] = (padded_vocab(spec.vocab_size) // tp * h * act_bytes) if target_h != h else 0
        maps = draft_vocab * 8 + spec.vocab_size  # d2t int64, t2d bool
        out["norms_bias_router"] = (fc + L * 3 * h + h) * act_bytes + maps
    out["total"] = sum(out.values())
    return out


def streamed_weight_bytes_per_rank(spec, tp: int, tokens: float = 1, act_bytes: int | None = None,
                                   quantization: str = "none") -> float:
    """_streamed_weight_bytes, remembered per (spec, TP, tokens, dtype, format): the roofline asks it for the same
    few shapes thousands of times in a ranking or a property test (a ModelSpec is frozen, hence hashable)."""
    try:
        return _streamed_cached(spec, tp, tokens, act_bytes, quantization)
    except TypeError:  # an unhashable spec (a dict): computed each time
        return _streamed_weight_bytes(spec, tp, tokens, act_bytes, quantization)


@functools.lru_cache(maxsize=4096)
def _streamed_cached(spec, tp, tokens, act_bytes, quantization) -> float:
    return _streamed_weight_bytes(spec, tp, tokens, act_bytes, quantization)


def _streamed_weight_bytes(spec, tp: int, tokens: float = 1, act_bytes: int | None = None,
                           quantization: str = "none") -> float:
    """Bytes a forward pass over `tokens` new tokens streams from HBM for the weights, on one TP rank: every layer
    and the LM head, not the embedding (its rows are gathered). A dense model reads every weight whatever the
    token count; an MoE layer reads its attention, router and shared experts, and the routed experts the step's
    tokens cover (expert_coverage): top_k of them for one token, up to all. An LM head is read even where it is
    not held (tied to the embedding; an MTP layer's is the target's). The same parameter counts as
    weights_bytes_per_rank: at full expert coverage the two differ only by streamed_minus_allocated_bytes."""
    act = act_bytes if act_bytes is not None else act_dtype(None, spec)[1]
    h = spec.hidden_size
    if _spec_get(spec, "is_eagle", False) and _spec_get(spec, "method", "") != "mtp":
        # An EAGLE head (fc fusion, its own narrow lm_head, maybe its own embedding): a pass streams all of it but
        # the embedding rows, which are gathered.
        w = weights_bytes_per_rank(spec, tp, act, quantization)
        return float(w["total"] - w["embedding"] - w["rotary_cache"])
    linear_bpp = linear_bytes_per_param(spec, act, quantization)
    attn_bpp = attention_bytes_per_param(spec, act, quantization)
    experts = _spec_get(spec, "num_experts", 0) or 0
    read = expert_coverage(experts, _spec_get(spec, "num_experts_per_tok", 0), tokens) if experts else 0.0
    lm_head = padded_vocab(spec.vocab_size) // tp * h * act
    if _spec_get(spec, "method", "") == "mtp":
        # The MTP layers (params_b: their layers and eh_proj, all experts) with only the covered experts read, the
        # norms, and the target's LM head, which every MTP pass multiplies by.
        all_experts = moe_layer_count(spec) * expert_params_per_rank(spec, tp) * experts
        covered = moe_layer_count(spec) * expert_params_per_rank(spec, tp) * read
        return spec.params_b * 1e9 * linear_bpp / tp - (all_experts - covered) * linear_bpp \
            + spec.num_layers * 4 * h * act + lm_head
    attn, other = _layer_params(spec, tp, read)
    small = (_norm_and_bias_params(spec, tp) + moe_layer_count(spec) * router_params(spec)) * act
    return attn * attn_bpp + other * linear_bpp + small + lm_head


def streamed_minus_allocated_bytes(spec, tp: int, act_bytes: int, quantization: str = "none") -> float:
    """What a pass at full expert coverage streams beyond (or short of) what is allocated on the rank: minus the
    gathered embedding, the rotary cache and a vision tower; plus an LM head read but not held (a tied one is the
    embedding; an MTP layer multiplies by the target's); the `linear` int() rounding aside."""
    w = weights_bytes_per_rank(spec, tp, act_bytes, quantization)
    if _spec_get(spec, "is_eagle", False) and _spec_get(spec, "method", "") != "mtp":
        return -(w["embedding"] + w["rotary_cache"])
    lm_head = padded_vocab(spec.vocab_size) // tp * spec.hidden_size * act_bytes
    return -(w["embedding"] + w["rotary_cache"] + w.get("vision", 0)) + (lm_head - w["lm_head"])


# ----------------------------------------------------------------------------------------------- KV and state

def kv_bytes_per_token(spec, tp: int, kv_dtype_bytes: int) -> int:
    """KV cache bytes one token takes on one TP rank, over the layers that keep KV per token (full and sliding
    attention; a sliding layer's cap on tokens is the memory plan's KV-group business, not a per-token figure)."""
    if _spec_get(spec, "kv_lora_rank", 0):
        # MLA (vLLM MLAAttentionSpec): one latent of kv_lora_rank + qk_rope_head_dim per token and layer, no
        # separate V, replicated on every TP rank.
        return spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_dtype_bytes
    # Linear-attention (gated-DeltaNet) layers keep a state per sequence, not KV per token (linear_state_bytes).
    layers = _spec_get(spec, "attention_layers", spec.num_layers)
    return layers * 2 * kv_heads_per_rank(spec, tp) * spec.head_dim * kv_dtype_bytes


def linear_state_bytes(spec, tp: int, act_bytes: int, num_speculative_tokens: int = 0) -> int:
    """One gated-DeltaNet layer's recurrent state for one sequence on one TP rank, as vLLM 0.26 sizes it
    (MambaSpec.page_size_bytes before padding): the causal-conv window, (conv_kernel - 1 + K) rows of the q/k/v
    channels (mamba_utils.py gated_delta_net_state_shape: K = num_speculative_tokens with any drafter), in the
    model dtype (mamba_cache_dtype auto), and the temporal state, value heads x value dim x key dim, in
    mamba_ssm_cache_dtype (auto = the model dtype; Qwen3.5 configs name float32)."""
    nk, nv = _spec_get(spec, "linear_num_key_heads", 0), _spec_get(spec, "linear_num_value_heads", 0)
    dk, dv = _spec_get(spec, "linear_key_head_dim", 0), _spec_get(spec, "linear_value_head_dim", 0)
    conv_dim = (2 * nk * dk + nv * dv) // tp
    conv = (_spec_get(spec, "linear_conv_kernel_dim", 0) - 1 + num_speculative_tokens) * conv_dim * act_bytes
    state_dtype = _spec_get(spec, "linear_state_dtype", "") or ""
    ssm_bytes = DTYPE_BYTES.get(state_dtype, act_bytes) if state_dtype else act_bytes
    return conv + (nv // tp) * dv * dk * ssm_bytes


# ----------------------------------------------------------------------------------------------- FLOPs

def flops_per_token(spec, context_len: int, tp: int) -> float:
    """FLOPs of one new token's forward pass on one rank: 2 per multiplied weight (attention projections, the
    gated-DeltaNet projections, the MLP, for an MoE layer its top_k experts, router and shared experts, the LM
    head), QK^T and PV over the context in the layers that keep KV, a gated-DeltaNet layer's state update."""
    L = spec.num_layers
    attn_layers = _spec_get(spec, "attention_layers", L)
    if _spec_get(spec, "kv_lora_rank", 0):
        mixer = attn_layers * mla_attention_params(spec, 1)
    else:
        mixer = attn_layers * attention_layer_params(spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads,
                                                     spec.head_dim, _spec_get(spec, "attn_output_gate", False))
    mixer += (L - attn_layers) * linear_layer_params_of(spec)
    moe = moe_layer_count(spec)
    if moe:  # each token multiplies by its top_k experts, the router and the shared experts
        routed = expert_params_per_rank(spec, 1) * max(spec.num_experts_per_tok, 1) \
            + shared_expert_params_per_rank(spec, 1) + router_params(spec)
        mlp = moe * routed + (L - moe) * dense_mlp_params_per_rank(spec, 1)
    else:
        mlp = L * dense_mlp_params_per_rank(spec, 1)
    dense = mixer + mlp + spec.vocab_size * spec.hidden_size
    q = spec.num_attention_heads * spec.head_dim
    attn = attn_layers * 4 * q * context_len  # QK^T and PV, in the layers that keep KV
    # A gated-DeltaNet layer updates and reads its value x key state per token and value head (~4 flops each).
    state = (L - attn_layers) * 4 * _spec_get(spec, "linear_num_value_heads", 0) \
        * _spec_get(spec, "linear_value_head_dim", 0) * _spec_get(spec, "linear_key_head_dim", 0)
    return (2 * dense + attn + state) / tp
