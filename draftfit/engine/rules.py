"""What each modelled vLLM version does, one frozen record per version (VLLM_RULES). Every field is read from that
version's source (unzipped wheels; 0.33 -> 0.34 differences: docs/VLLM_VERSIONS.md, its "Wheel diff 0.33 -> 0.34"
section written by bench/vllm_wheel_diff.py, and the R/M/C rows of the vLLM 0.34 notes); the comment on each field
names the file. memory/plan.py's arithmetic, speedup/'s step costs, compat/'s start-up verdicts and the serve
command all read these records (Layout.engine.rules); none of them compares a version string."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Speculative methods draftfit writes, and the first vLLM release that has each (config/speculative.py
# SpeculativeConfig.method Literal of that release; 0.26 is the oldest draftfit models, so "0.26" means
# "at least as old as draftfit's oldest").
METHOD_SINCE = {"draft_model": "0.26", "eagle": "0.26", "eagle3": "0.26", "mtp": "0.26", "ngram": "0.26",
                "suffix": "0.26"}


@dataclass(frozen=True)
class VllmRules:
    version: str  # the release these facts were read from
    # The key of this version's per-version data on disk: step-cost tables (`__v<key>` file suffix), fitted
    # overheads, draft-loop factors, flag lists (data/vllm_flags/vllm-<key>.json). The modelled major.minor.
    tables_key: str = ""
    # Model runner per speculative method ('v1' | 'v2'). 0.26/0.33: config/vllm.py
    # _get_v2_model_runner_unsupported_features; 0.34: V1 deleted (v1/worker/gpu_model_runner.py gone).
    # A method not listed follows memory/plan.py model_runner (per model kind: MoE, hybrid).
    runner: dict = field(default_factory=dict)
    # Model runner for a mixture-of-experts target (0.26: config/vllm.py _get_v2_model_runner_unsupported_features
    # lists MoE layers; 0.33: V2).
    moe_runner: str = "v2"
    # MoE architectures that take the V2 runner anyway (0.26: config/vllm.py DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES).
    moe_v2_architectures: frozenset = frozenset()
    # Model runner of a hybrid (linear-attention) target: 0.26's _is_default_v2_model_runner_model returns False
    # for is_hybrid; 0.33's V2 lists no hybrid exclusion (only dual batch overlap).
    hybrid_runner: str = "v2"
    # The V2 runner subtracts its CUDA-graph estimate before sizing KV (v1/worker/gpu_worker.py
    # determine_available_memory -> v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory).
    v2_reserves_cudagraph: bool = False
    # `vllm serve` max_num_batched_tokens 16384 on GPUs of at least this much memory (engine/arg_utils.py
    # get_batch_defaults); A100s get the small batch defaults whatever their memory.
    serve_16384_from_gib: float = 160.0
    a100_small_defaults: bool = True
    # A draft_model's shorter max_model_len lowers the target's (config/vllm.py _limit_max_model_len_to_draft, a
    # warning; else refused).
    draft_len_lowers_target: bool = True
    # A draft_model whose layers fall into several KV-cache groups starts (the V2 runner's speculator builds
    # attention per group, init_attn_backend with active_layer_names, from 0.31); on V1
    # (v1/spec_decode/llm_base_proposer.py validate_same_kv_cache_group) it asserts "All drafting layers should
    # belong to the same kv cache group".
    draft_model_multi_group: bool = True
    # Async scheduling (2 batches in flight) per method. 0.26: config/vllm.py "Async scheduling not supported with
    # draft_model-based speculative decoding"; 0.33: V2 methods async, V1 (suffix) not; 0.34: config/vllm.py V1
    # branch of max_concurrent_batches removed, every method async.
    async_scheduling: dict = field(default_factory=dict)
    # The draft_model draft loop runs from CUDA graphs (graph pool of its own). 0.33:
    # v1/worker/gpu/spec_decode/standalone_ar/speculator.py init_cudagraph_manager/capture are `pass` (eager);
    # 0.34: autoregressive/cudagraph_utils.py captures it.
    drafter_cudagraphs: bool = False
    # The first draft pass overlaps the verify (speedup/stepcost.py draft_passes_ms; chosen per version by which
    # fits its H200 tables: 0.26 True, 0.33 False). 0.34 (graphed loop, first pass a K+2-token prefill graph) is
    # not measured: priced as 0.26's graphed loop until its tables say otherwise.
    first_draft_pass_hidden: bool = True
    # Capture sizes: V1 rounds every size up to a multiple of 1+K (config/compilation.py
    # adjust_cudagraph_sizes_for_spec_decode, 0.26); V2 appends n x (1+K) decode sizes (config/vllm.py
    # _set_cudagraph_sizes, 0.33); 0.34 splits prefill token / decode request sizes (config/vllm.py
    # _split_cudagraph_capture_sizes; target graph counts as 0.33's).
    capture_sizes: str = "v1_round_up"
    # --gpu-memory-utilization when the user passes none: config/cache.py gpu_memory_utilization's default; None in
    # 0.34 = vLLM leaves it unset and resolved_gpu_memory_utilization gives 1.0 under the extensible KV cache.
    default_util: float | None = 0.92
    # KV block size in tokens when unset: config/cache.py DEFAULT_BLOCK_SIZE (16; 64 in 0.34).
    default_block_size: int = 16
    # "estimate": KV sized from the profile run minus a CUDA-graph estimate (v1/worker/gpu_worker.py
    # determine_available_memory); "measured": from free memory after warm-up and capture
    # (0.34 v1/worker/extensible_kv_cache.py measure_kv_cache_bytes).
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
    # Which vLLM log lines carry the memory figures (v1/worker/gpu_worker.py, v1/core/kv_cache_utils.py): 0.34's
    # extensible cache prints "Available KV cache memory" as the reserved capacity only, and no "Using V2 Model
    # Runner" line (memory/plan.py parse_vllm_memory_log).
    log_format: str = "estimate"

    def has_method(self, method: str) -> bool:
        return method in self.methods

    # memory/plan.py's names for three facts declared once above (per method, or by capture-size scheme).
    @property
    def draft_model_runner(self) -> str:
        return self.runner.get("draft_model", "v2")

    @property
    def draft_model_async(self) -> bool:
        return bool(self.async_scheduling.get("draft_model", True))

    @property
    def v2_appends_decode_sizes(self) -> bool:
        return self.capture_sizes != "v1_round_up"

    def resolved_util(self, util: float | None) -> float:
        """The gpu_memory_utilization vLLM runs at: `util` when given, else this version's default (0.34: None,
        and config/cache.py resolved_gpu_memory_utilization reads an unset util as 1.0 under its extensible KV
        cache)."""
        if util is not None:
            return util
        return self.default_util if self.default_util is not None else 1.0

    def served_util(self, planned_util: float | None) -> float | None:
        """The --gpu-memory-utilization a serve command carries for memory planned at `planned_util` (None: at
        this version's own default): None (flag left out) only when the plan is what vLLM does with the flag
        unset, so the server sizes its KV cache as the plan that was ranked."""
        if planned_util is None or (self.default_util is not None and math.isclose(planned_util, self.default_util)):
            return None
        return planned_util


VLLM_RULES = {
    "0.26": VllmRules(
        version="0.26.0", tables_key="0.26", runner={"draft_model": "v1", "suffix": "v1"},
        # config/vllm.py _get_v2_model_runner_unsupported_features lists method draft_model and MoE layers ...
        moe_runner="v1", hybrid_runner="v1",
        # ... except these MoE architectures (seen: Qwen1.5-MoE-A2.7B alone logs model_runner.py, Mixtral
        # gpu_model_runner.py, data/calibration/raw/2026-12-01/M1, M2a).
        moe_v2_architectures=frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                                        "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM",
                                        "Qwen2MoeForCausalLM"}),
        # v1/worker/gpu/model_runner.py profile_cudagraph_memory returns 0 (V2 captures after sizing KV).
        v2_reserves_cudagraph=False,
        # engine/arg_utils.py get_batch_defaults: >= 70 GiB -> serve 8192 / LLM 16384, no larger tier. vLLM 0.26
        # also sends A100 names to the small defaults; draftfit's 0.26 model never did (its 0.26 numbers are
        # kept as recorded: no A100 record exists).
        serve_16384_from_gib=math.inf, a100_small_defaults=False,
        # A max_model_len above the draft's positions is refused (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1).
        draft_len_lowers_target=False, draft_model_multi_group=False,
        async_scheduling={m: m != "draft_model" for m in METHOD_SINCE},
        # V1's drafter captures PIECEWISE graphs (v1/spec_decode/llm_base_proposer.py initialize_cudagraph_keys),
        # counted in V1's estimate through the draft's layers (memory/plan.py _cudagraph_bytes).
        drafter_cudagraphs=True, first_draft_pass_hidden=True, capture_sizes="v1_round_up",
        # 0.9: vLLM's default before 0.33's 0.92 (not re-read here: no 0.26 source tree on this machine; every
        # 0.26 record states its util).
        default_util=0.9),
    "0.33": VllmRules(
        # config/vllm.py use_v2_model_runner / _get_v2_model_runner_unsupported_features: only suffix and
        # custom_class methods (and a few parallel features) fall back to V1; the log says `Using V2 Model Runner`.
        version="0.33.0", tables_key="0.33", runner={m: "v1" if m == "suffix" else "v2" for m in METHOD_SINCE},
        # v1/worker/gpu_worker.py determine_available_memory calls v1/worker/gpu/cudagraph_utils.py
        # profile_cudagraph_memory (PIECEWISE measured, FULL extrapolated from 2 samples, floor 1 MiB per graph)
        # and subtracts it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 default, envs.py).
        v2_reserves_cudagraph=True,
        # engine/arg_utils.py get_batch_defaults: >= 160 GiB -> 16384 for both entry points; A100 excluded.
        serve_16384_from_gib=160.0, a100_small_defaults=True,
        # config/vllm.py _limit_max_model_len_to_draft: "reducing max_model_len to <draft's>" (a warning); the
        # draft's own is min(draft, target) (config/speculative.py _maybe_override_draft_max_model_len).
        draft_len_lowers_target=True,
        # config/vllm.py: V2 has no async incompatibility for draft_model; max_concurrent_batches = pp + 1.
        async_scheduling={m: m != "suffix" for m in METHOD_SINCE},
        # config/cache.py: DEFAULT_BLOCK_SIZE 16, gpu_memory_utilization 0.92; the V2 standalone_ar speculator's
        # init_cudagraph_manager/capture are `pass` (the draft loop runs eager).
        drafter_cudagraphs=False, first_draft_pass_hidden=False, capture_sizes="v2_append_decode",
        default_util=0.92),
    # 0.34: standalone_ar/speculator.py on autoregressive/cudagraph_utils.py captures the draft loop again (PIECEWISE/
    # FULL prefill graphs for the first pass, one fused FULL graph for the K-1 decode passes): priced as 0.26's graphed
    # loop (first pass hidden), the assumption the 2026-12-04 pre-registered step costs were made under.
    "0.34": VllmRules(
        # Model Runner V1 is deleted (config/vllm.py: every model and method on v1/worker/gpu/model_runner.py).
        version="0.34.0", tables_key="0.34", runner={m: "v2" for m in METHOD_SINCE},
        # v1/worker/gpu/model_runner.py profile_cudagraph_memory returns 0 under the extensible cache: the real
        # graph pool is inside the measured non-KV memory instead (kv_sizing below).
        v2_reserves_cudagraph=False,
        serve_16384_from_gib=160.0, a100_small_defaults=True,  # engine/arg_utils.py: identical to 0.33's
        draft_len_lowers_target=True,  # config/vllm.py _limit_max_model_len_to_draft, unchanged
        async_scheduling={m: True for m in METHOD_SINCE},  # config/vllm.py: pp + 1 batches for every method
        drafter_cudagraphs=True, first_draft_pass_hidden=True, capture_sizes="v2_split_prefill_decode",
        # config/cache.py enable_extensible_kv_cache (default on CUDA), v1/worker/extensible_kv_cache.py,
        # v1/worker/gpu_worker.py _compile_or_warm_up_model -> measure_kv_cache_blocks; DEFAULT_BLOCK_SIZE 64;
        # gpu_memory_utilization None -> resolved 1.0 (extensible cache).
        default_util=None, default_block_size=64, kv_sizing="measured", log_format="extensible",
        suffix_needs_arctic_inference=False,
        removed_spec_keys=frozenset({"use_heterogeneous_vocab", "disable_padded_drafter_batch"}),
        env_errors={"VLLM_USE_V2_MODEL_RUNNER=0": "Model Runner V1 has been removed (config/vllm.py)"},
        v1_runner_selectable=False),
}
