"""What each modelled vLLM version does, one frozen record per version (VLLM_RULES). Every field is read from that
version's source (unzipped wheels; 0.33 -> 0.34 differences: docs/VLLM_VERSIONS.md and the R/M/C rows of the
vLLM 0.34 notes); the comment on each field names the file. Memory-only facts that plan_memory's arithmetic reads
(runner per model kind, capture-size rounding, batch defaults) keep their home in memory/plan.py's GpuAccounting
until they move here; the four shared fields below use GpuAccounting's names and meanings so the two merge."""

from __future__ import annotations

from dataclasses import dataclass, field

# Speculative methods draftfit writes, and the first vLLM release that has each (config/speculative.py
# SpeculativeConfig.method Literal of that release; 0.26 is the oldest draftfit models, so "0.26" means
# "at least as old as draftfit's oldest").
METHOD_SINCE = {"draft_model": "0.26", "eagle": "0.26", "eagle3": "0.26", "mtp": "0.26", "ngram": "0.26",
                "suffix": "0.26"}


@dataclass(frozen=True)
class VllmRules:
    version: str  # the release these facts were read from
    # Model runner per speculative method ('v1' | 'v2'). 0.26/0.33: config/vllm.py
    # _get_v2_model_runner_unsupported_features; 0.34: V1 deleted (v1/worker/gpu_model_runner.py gone).
    # A method not listed follows memory/plan.py model_runner (per model kind: MoE, hybrid).
    runner: dict = field(default_factory=dict)
    # Async scheduling (2 batches in flight) per method. 0.26: config/vllm.py "Async scheduling not supported with
    # draft_model-based speculative decoding"; 0.33: V2 methods async, V1 (suffix) not; 0.34: config/vllm.py V1
    # branch of max_concurrent_batches removed, every method async.
    async_scheduling: dict = field(default_factory=dict)
    # The draft_model draft loop runs from CUDA graphs. 0.33: v1/worker/gpu/spec_decode/standalone_ar/speculator.py
    # init_cudagraph_manager/capture are `pass` (eager); 0.34: autoregressive/cudagraph_utils.py captures it.
    # Same name and meaning as memory/plan.py GpuAccounting.drafter_cudagraphs.
    drafter_cudagraphs: bool = False
    # The first draft pass overlaps the verify (speedup/stepcost.py draft_passes_ms; chosen per version by which
    # fits its H200 tables: 0.26 True, 0.33 False). 0.34 (graphed loop, first pass a K+2-token prefill graph) is
    # not measured: False, every pass charged, until its tables say otherwise.
    first_draft_pass_hidden: bool = True
    # Capture sizes: V1 rounds every size up to a multiple of 1+K (config/compilation.py
    # adjust_cudagraph_sizes_for_spec_decode, 0.26); V2 appends n x (1+K) decode sizes (config/vllm.py
    # _set_cudagraph_sizes, 0.33); 0.34 splits prefill token / decode request sizes (config/vllm.py
    # _split_cudagraph_capture_sizes).
    capture_sizes: str = "v1_round_up"
    # --gpu-memory-utilization when the user passes none: 0.92 (config/cache.py DEFAULT_GPU_MEMORY_UTILIZATION);
    # None in 0.34 = vLLM leaves it unset and resolved_gpu_memory_utilization gives 1.0 under the extensible KV
    # cache. Same name and meaning as GpuAccounting.default_util.
    default_util: float | None = 0.92
    # KV block size in tokens when unset: config/cache.py DEFAULT_BLOCK_SIZE (16; 64 in 0.34).
    default_block_size: int = 16
    # "estimate": KV sized from the profile run minus a CUDA-graph estimate (v1/worker/gpu_worker.py
    # determine_available_memory); "measured": from free memory after warm-up and capture
    # (0.34 v1/worker/extensible_kv_cache.py measure_kv_cache_bytes). Same name as GpuAccounting.kv_sizing.
    kv_sizing: str = "estimate"
    # Speculative methods this version has (config/speculative.py SpeculativeConfig.method).
    methods: frozenset = frozenset(METHOD_SINCE)
    # Suffix decoding needs the arctic-inference package (0.26/0.33 config/speculative.py _validate_suffix_decoding
    # has_arctic_inference; 0.34: a native GPU speculator, v1/worker/gpu/spec_decode/suffix/speculator.py).
    suffix_needs_arctic_inference: bool = True
    # A draft_model whose vocab_size differs from the target's is refused at start-up (config/speculative.py, the
    # "vocab_size" check; 0.34 keys it on speculator_config.draft_has_own_vocab, same message).
    refuses_vocab_mismatch: bool = True
    # speculative_config keys this version rejects (config/utils.py ConfigDict(extra="forbid")): removed in 0.34.
    removed_spec_keys: frozenset = frozenset()
    # Environment settings that stop the server at start-up (envs.py; 0.34 config/vllm.py raises
    # "VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported").
    env_errors: dict = field(default_factory=dict)
    # VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner (advice draftfit may give); False where it is an error.
    v1_runner_selectable: bool = True

    def has_method(self, method: str) -> bool:
        return method in self.methods


VLLM_RULES = {
    "0.26": VllmRules(
        version="0.26.0", runner={"draft_model": "v1", "suffix": "v1"},
        async_scheduling={m: m != "draft_model" for m in METHOD_SINCE},
        drafter_cudagraphs=True, first_draft_pass_hidden=True, capture_sizes="v1_round_up"),
    "0.33": VllmRules(
        version="0.33.0", runner={m: "v1" if m == "suffix" else "v2" for m in METHOD_SINCE},
        async_scheduling={m: m != "suffix" for m in METHOD_SINCE},
        drafter_cudagraphs=False, first_draft_pass_hidden=False, capture_sizes="v2_append_decode"),
    # 0.34: standalone_ar/speculator.py on autoregressive/cudagraph_utils.py captures the draft loop again (PIECEWISE/
    # FULL prefill graphs for the first pass, one fused FULL graph for the K-1 decode passes): priced as 0.26's graphed
    # loop (first pass hidden), the assumption the 2026-12-04 pre-registered step costs were made under.
    "0.34": VllmRules(
        version="0.34.0", runner={m: "v2" for m in METHOD_SINCE},
        async_scheduling={m: True for m in METHOD_SINCE},
        drafter_cudagraphs=True, first_draft_pass_hidden=True, capture_sizes="v2_split_prefill_decode",
        default_util=None, default_block_size=64, kv_sizing="measured", suffix_needs_arctic_inference=False,
        removed_spec_keys=frozenset({"use_heterogeneous_vocab", "disable_padded_drafter_batch"}),
        env_errors={"VLLM_USE_V2_MODEL_RUNNER=0": "Model Runner V1 has been removed (config/vllm.py)"},
        v1_runner_selectable=False),
}
