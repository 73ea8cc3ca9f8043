"""Step-cost model: how long a plain decode step and a speculative step take, per batch size.

Two sources, the better one wins:
- calibrated: a table in draftfit/data/calibration/*.json measured by `draftfit calibrate` / bench/gpu_campaign.py
  for this (target, draft, GPU, TP). Baseline step = measured TPOT; speculative step(K) = measured decode
  time per engine step. Batch sizes in between are interpolated in log(batch); K values not measured come
  from a straight-line fit of step(K) = a + b*K at that batch (one verify + K draft passes: linear in K).
- roofline prior: a forward pass costs max(bytes / bandwidth, FLOPs / throughput) + a per-pass launch
  cost, where bytes = weights per rank + KV cache read, FLOPs = 2 x params x tokens + attention. A plain
  vLLM decode step adds host overhead per step and per sequence (scheduler, sampler; async scheduling hides
  part of it). A speculative step adds its own per step and per sequence (rejection sampler, proposer
  bookkeeping, async scheduling switched off with a draft model); its first draft pass costs its roofline
  (launched while the verify still runs on the GPU; what of its launch time outlasts the verify shows), each of
  the K-1 further passes the larger of its roofline and its host time (a cost per draft layer: the drafter
  replays piecewise CUDA graphs with attention in between, and the GPU runs while the host launches); and when
  batch x (K+1) tokens exceed vLLM's largest captured graph (512) the verify
  and the draft's first pass run eager, each the longer of its GPU work and the host's launch time (measured per
  layer kind, EAGER_HOST_LAYER_MS); an MoE layer adds a cost per token for the B x K
  tokens the step adds (MOE_TOKEN_LAYER_MS). The constants below are priors; `fitted_overheads` refits them
  from the calibration tables (calibration_points is the one loop over measured points that fitting and
  bench/speedup.py share).

c (Leviathan et al. 2023's cost coefficient) = one draft forward / one plain target step, per batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from draftfit.errors import DraftfitError
from draftfit.calibration import drain as _drain_module, tables as _tables_module
from draftfit.calibration.tables import (CALIBRATION_DIR, DEFAULT_TABLE_VLLM, PooledSteps, find_tables, load_tables,
                                         model_spec as resolve, tables_of_version)
from draftfit.paths import cache_dir, read_json, write_json_atomic
from draftfit.catalog.shapes import (expert_coverage, expert_params_per_layer, flops_per_token,  # noqa: F401
                                     kv_bytes_per_token, linear_state_bytes, streamed_weight_bytes_per_rank)
from draftfit.catalog.specs import GpuSpec, resolve_gpu
from draftfit.memory.plan import model_runner
from draftfit.engine.flags import flag_list
from draftfit.speedup.loop_factor import draft_loop_factor
from draftfit.engine import resolve_target
from draftfit.engine.rules import VLLM_RULES, VllmRules
from draftfit.engine.versions import tables_key_of

# Fractions of the data-sheet numbers a decode step reaches. Bandwidth: a device-to-device copy on the lent
# H200 moved ~4.3 TB/s against 4.8 on the sheet (/work/.library/device/KINDS.md); decode GEMVs reach a bit
# less. FLOPs: a large bf16 GEMM ran at ~790 of 989 TFLOP/s there; verify GEMMs are small, hence 0.55.
BANDWIDTH_EFFICIENCY = 0.80
FLOPS_EFFICIENCY = 0.55
# vLLM overheads in ms (priors, replaced by fit_overheads when calibration tables exist).
PLAIN_STEP_OVERHEAD_MS = 0.6  # scheduler + sampler per decode step, CUDA graphs on, async scheduling on
PLAIN_SEQ_MS = 0.01  # per sequence in a plain step (input preparation, sampler), mostly hidden by async
SPEC_STEP_OVERHEAD_MS = 1.6  # rejection sampler, proposer bookkeeping, no async scheduling
# Per sequence in a speculative step: the rejection sampler and the proposer's per-request bookkeeping run
# on the host, and with async scheduling switched off (draft_model) nothing hides them.
SPEC_SEQ_MS = 0.04
FORWARD_LAUNCH_MS = 0.12  # per forward pass replayed from a CUDA graph (each draft pass is one)
ALLREDUCE_US = 9.0  # per all-reduce at TP>1 (two per layer), small messages over NVLink
# vLLM's draft_model proposer launches each draft pass layer by layer from the host (piecewise graphs,
# attention between them: vLLM 0.26 v1/spec_decode/llm_base_proposer.py, initialize_cudagraph_keys gives the
# drafter PIECEWISE graphs only, and its propose() loop rebuilds the attention metadata every pass). The GPU
# works while the host launches, so a pass costs max(roofline, host time) and not their sum: on the H200
# campaign a 28-layer 7B draft pass (3.7 ms of weight streaming) cost ~5.3 ms at batch 1, about what the
# 28-layer 0.6B costs, while a 16-layer 1B cost ~3.5 ms.
# One constant for every TP: at TP > 1 the model runs in worker processes apart from the engine core's scheduler
# loop, but a constant of its own there (draft_layer_mp_ms, fitted on the 70B TP=2 tables) did not predict them
# better held out (docs/benchmarks.md speedup-ablation) and was removed. So was a cost per sequence per draft pass
# (draft_seq_ms: positions, slot mapping, next-token gather on the host), fitted at 0 on vLLM 0.26's tables.
DRAFT_LAYER_MS = 0.21
# ngram and suffix have no model (catalog.specs.method_drafter: zero layers, zero weights): prior_step_cost prices
# their step as the verify plus a plain step's host overhead, the lookup itself not charged (it borrowed the removed
# draft_seq_ms, never measured for them). Where vLLM runs that lookup depends on the version (docs/VLLM_VERSIONS.md
# "n-gram and suffix step path per vLLM version"): on the host after the sampled tokens are copied back on 0.26 (both)
# and 0.33 (suffix; ngram only on the V1 runner), as two Triton kernels on the GPU on 0.34 (both) and 0.33's default
# V2 runner (ngram). Suffix's host tree walk (arctic-inference SuffixDecodingCache add_active_response + speculate,
# 0.26/0.33 v1/spec_decode/suffix_decoding.py propose()) measured 12-21 us per sequence per step on the shipped
# outputs (bench/suffix_replay.py, docs/benchmarks.md suffix-replay, this machine's CPU, not the H200 host): 2.7 ms
# at batch 128 that suffix's step on 0.26/0.33 is priced without.
# A verify of batch x (K+1) tokens above vLLM's largest captured CUDA graph (512 tokens by default with a
# draft) runs without a graph (seen: Llama-3.1-8B K=4 at batch 128). The draft's first pass reads the same
# batch x (K+1) tokens, so it does too.
CUDAGRAPH_MAX_TOKENS = 512
# Without a CUDA graph, torch.compile's code launches every kernel of a layer from Python, and the GPU runs while the
# host launches, so a forward pass over more tokens than CUDAGRAPH_MAX_TOKENS costs max(its GPU time, the host's
# launch time), the larger. The host time per layer, by what the layer's MLP is, on vLLM 0.26's V1 model runner (the one
# draft_model pairs run on) with torch.compile on: measured as a plain decode step at batch 1 with cudagraph_mode NONE
# (every layer launched eagerly), less the graphed step's host overhead (graphed step - its roofline), over the layers
# (one H200 host, phase GX/GX3, data/calibration/raw/2026-12-03/GX*_gpu0.json; bench/eager_launch.py derives them and
# a test holds them to the files). dense: Llama-3.1-8B (32 layers, 18.0 ms a step); moe: Mixtral-8x7B's routed experts
# (37.6 ms); moe_shared: Qwen1.5-MoE-A2.7B, routed experts beside a shared expert (65.6 ms for 24 layers: vLLM's
# FusedMoE runs the shared expert through its own runner). Which of Qwen1.5-MoE's traits (the shared expert, 60
# experts) costs the extra was not separated; the rule goes by the shared expert. Checked pre-registered (phase GX4,
# bench/eager_launch.py): a Qwen3-8B layer launches as a Llama one (+6 % at batch 1), a Qwen2 layer (Qwen1.5-0.5B,
# biased q/k/v) in 0.81 ms, so Qwen2-family models' eager passes are priced about a third low.
EAGER_HOST_LAYER_MS = {"dense": 0.53, "moe": 1.13, "moe_shared": 2.68}
# An MoE layer's work beyond its roofline for every token a speculative step adds to it: the verify runs B x (K+1)
# tokens where the plain step ran B, and so does the draft's first pass. Measured on the H200 (vLLM 0.26, Triton
# fused_moe, bf16): the MoE targets' steps at batch 32-128 rose with B x K far above the roofline of reading the
# covered experts and multiplying by top_k of them (Mixtral-8x7B batch 128 K=3: 82 ms against 62 ms), while the
# dense targets' did not. The likely cause: fused_moe sorts every token's top_k choices by expert, pads each expert's
# rows to the kernel's block, gathers and scatters them, work per token and layer that a FLOPs roofline omits. No
# published figure gives it, so the prior is 0 (the roofline alone) and fitted_overheads learns it from the MoE
# tables; a dense model never exercises it.
MOE_TOKEN_LAYER_MS = 0.0
# Relative bands. Roofline prior: the 80th percentile of its leave-one-configuration-out error on the H200
# tables (bench/speedup.py, 152 points), split by regime, because the two are not alike. Where the GPU work of
# a step exceeds the host launch time of vLLM's draft loop and of layers that miss the CUDA graphs
# (is_host_bound): 16 % (94 points). Where the host sets the step: 46 % (58 points); those steps move with the
# host CPU, between lent machines and engine starts (Qwen3-8B + 0.6B K=4 at batch 1: 29-42 ms over five
# starts, host-trace section of the README). Calibrated: the floor of CalibrationTable.step_band, what two
# engine starts of the quiet 32B pair differed by (at most 6 %); a table whose repeats spread more gets its
# median repeat spread (the host-bound 8B pairs' tables: 17-45 %). All checked against the shipped tables by
# tests/test_speedup.py.
PRIOR_UNCERTAINTY_GPU_BOUND = 0.16
PRIOR_UNCERTAINTY_HOST_BOUND = 0.46
# Step costs asked for a vLLM version that has no step-cost table (calibration.tables keys them by version; every
# shipped table is 0.26's): the band of the other version's tables, or of the roofline prior whose overheads were
# fitted on them, is multiplied by this. A judgement, not a measurement: vLLM 0.33 changes what the host-bound
# steps are made of (draft_model on the V2 runner with its K passes eager, async scheduling on: vLLM's
# v1/worker/gpu/spec_decode/standalone_ar/speculator.py, config/vllm.py), so the 46 % host-bound band may not hold;
# 1.5 is what widens it to about ±70 %. Replace it with the leave-one-out error once 0.33 tables exist.
UNCALIBRATED_VERSION_BAND_FACTOR = 1.5
# What an MoE layout's output says of its step costs (step_cost_model): where they come from and what they assume.
MOE_NOTE = ("MoE: a step reads the experts its tokens route to, E(1-(1-k/E)^T) of E for T tokens under uniform "
            "routing, plus {us:.1f} us per added token per MoE layer (fitted on the Mixtral-8x7B and Qwen1.5-MoE-A2.7B "
            "H200 tables; held-out Qwen3-30B-A3B: docs/benchmarks.md 'Pre-registered'). Those tables were measured "
            "with dummy weights, whose routers spread tokens about uniformly (their plain steps at batch 32-128 match "
            "uniform coverage: docs/benchmarks.md, section bench:speedup); a trained router that sends a batch's "
            "tokens to fewer experts makes the plain step at batch 8-32 cheaper than printed, and speculation's gain "
            "there smaller")
# What the timed head drafters say of the roofline prior for EAGLE/MTP heads (step_cost_model), by the model runner
# vLLM runs the head on (head_on_async_runner). V1 (0.26: MoE and hybrid targets): the prior's overheads are fitted on
# draft_model tables; measured once, pre-registered (bench/preregister_head.py --case mtp; docs/METHODS.md section 3, history in
# docs/archive/GPU_CAMPAIGN.md). V2 (0.26: dense targets): a plain step's host overhead, the verify and the head's passes, no fitted term,
# built on Llama-3.1-8B + an EAGLE-3 head (--case eagle3, thirteenth session) and checked on Qwen3-8B + an EAGLE-3
# head pre-registered with it (--case eagle3-qwen3).
HEAD_PRIOR_MARK = "head drafter timed"  # how rank picks these notes out for the row they concern
HEAD_PRIOR_NOTE = ("{method} drafter on vLLM's V1 model runner: priced as the verify + the draft_model tables' pass costs + "
                   "a plain step's host overhead (vLLM keeps async scheduling on for heads: heads_async_scheduling). The "
                   "one such " + HEAD_PRIOR_MARK + " (Qwen3-Next-80B-A3B's shapes at 24 layers with its MTP layer, H200, "
                   "vLLM 0.26) came out below the measured speedups pre-registered with draft_model's fixed cost, and "
                   "closer with the async rule made after that score, too high at batch 1 and too low at batch 8-128: "
                   "docs/benchmarks.md, section bench:mtp-preregistered")
HEAD_ASYNC_NOTE = ("{method} drafter on vLLM's V2 model runner (async scheduling, the head's passes as CUDA graphs): priced "
                   "as a plain step's host overhead + the verify + the head's K passes, no fitted term; the model was "
                   "built on the first EAGLE-3 " + HEAD_PRIOR_MARK + " (Llama-3.1-8B on one H200, vLLM 0.26; its error: "
                   "docs/benchmarks.md, section bench:eagle3-preregistered; its step of 640 tokens, batch 128 at K=4, ran 1.8x slower than printed: eager "
                   "launch times were probed on the V1 runner only) "
                   "and checked, pre-registered, on a second (Qwen3-8B + an EAGLE-3 head, K 1-4 at batch 1-128; "
                   "its error and best K: docs/benchmarks.md, section bench:eagle3-qwen3-preregistered)")
# GPU catalog name -> the device name vLLM writes into its fused-MoE config file names
# (current_platform.get_device_name() with spaces as underscores; every H200 variant reads NVIDIA_H200:
# model_executor/layers/fused_moe/fused_moe.py get_config_file_name). As the shipped file names spell them.
VLLM_DEVICE_NAMES = {"H200": "NVIDIA_H200", "H100-80GB": "NVIDIA_H100_80GB_HBM3", "H100-PCIe": "NVIDIA_H100_PCIe",
                     "A100-80GB": "NVIDIA_A100-SXM4-80GB", "A100-40GB": "NVIDIA_A100-SXM4-40GB", "B200": "NVIDIA_B200",
                     "L40S": "NVIDIA_L40S", "RTX-4090": "NVIDIA_GeForce_RTX_4090", "MI300X": "AMD_Instinct_MI300X",
                     "L4": "NVIDIA_L4", "A10G": "NVIDIA_A10G"}
UNTUNED_MOE_NOTE = (
    "vLLM {version} ships no tuned fused-MoE kernel config {name} for {target} on {gpu} at TP={tp}: it runs its "
    "default one (its log says 'Using default MoE config. Performance might be sub-optimal!'). The one such "
    "target measured, Qwen1.5-MoE-A2.7B on the H200 (E=60,N=1408; its table: draftfit calibrate --show "
    "Qwen1.5-MoE-A2.7B), ran plain steps of 256-768 tokens close to draftfit's step-cost model, which has no "
    "default-config penalty, while at batch 128 and K 2-3 (384-512 graphed tokens) draftfit's speedups, fitted "
    "without that table, were above the measured ones (docs/benchmarks.md, section bench:speedup); the printed "
    "speedups there may be too high. A config "
    "tuned for the server (vLLM's benchmarks/kernels/benchmark_moe.py --tune, then VLLM_TUNED_CONFIG_FOLDER) removes "
    "the doubt")


def moe_kernel_config(spec, gpu, *, tp: int, rules: VllmRules | None = None) -> tuple[str, bool] | None:
    """(the fused-MoE config file name vLLM looks up for this MoE model's layers, whether `rules`' version (None:
    the engine's default) ships it) or None where it does not apply: a dense model, a GPU whose vLLM device name draftfit does not know, or
    quantized expert weights (vLLM picks among Triton, CUTLASS, DeepGEMM and Marlin kernels for those, so the
    Triton config may not be what runs; only the unquantized Triton path was seen on the H200 logs)."""
    if not getattr(spec, "is_moe", False):
        return None
    device = VLLM_DEVICE_NAMES.get(getattr(gpu, "name", str(gpu)))
    if device is None or getattr(spec, "quantization", ""):
        return None
    n = (spec.moe_intermediate_size or spec.intermediate_size) // tp
    name = f"E={spec.num_experts},N={n},device_name={device}"
    shipped = flag_list((rules or resolve_target().rules).tables_key).get("fused_moe_configs")
    if shipped is None:
        return None
    return name, name in shipped


def untuned_moe_note(spec, gpu, *, tp: int, rules: VllmRules | None = None) -> str | None:
    """UNTUNED_MOE_NOTE for an MoE model whose fused-MoE config `rules`' version does not ship, else None: the one
    statement of it, said by the layout (rank, memory, preflight) and by step_cost_model (speedup)."""
    rules = rules or resolve_target().rules
    kernel = moe_kernel_config(spec, gpu, tp=tp, rules=rules)
    if not kernel or kernel[1]:
        return None
    return UNTUNED_MOE_NOTE.format(version=rules.tables_key, name=kernel[0], target=spec.name,
                                   gpu=getattr(gpu, "name", str(gpu)), tp=tp)


# Targets kept out of every fit (overheads, leave-one-out) even once their table is measured:
# the held-out check of the MoE model, predicted before it ran (draftfit/data/predictions/, issue 16).
HELD_OUT_TARGETS = ("Qwen3-30B-A3B",)

_FALLBACK_GPUS = {  # used only when draftfit/catalogs/gpus.yaml is missing (data-sheet numbers)
    "H200": (139.8, 4800.0, 989.0), "H100-80GB": (79.2, 3350.0, 989.0), "A100-80GB": (79.2, 2039.0, 312.0),
}


def gpu_spec(gpu):
    """A GpuSpec from a name or a GpuSpec."""
    if not isinstance(gpu, str):
        return gpu

    try:
        return resolve_gpu(gpu)
    except (FileNotFoundError, OSError):
        key = next((k for k in _FALLBACK_GPUS if k.lower().replace("-", "") in gpu.lower().replace("-", "")), None)
        if key is None:
            raise DraftfitError(f"unknown GPU {gpu!r} (no GPU catalog here)", fix="use H200, H100-80GB or A100-80GB")
        mem, bw, tf = _FALLBACK_GPUS[key]
        return GpuSpec(name=key, memory_gib=mem, bandwidth_gbps=bw, bf16_tflops=tf, source="data sheet (fallback)")


def model_spec(model):
    if not isinstance(model, str):
        return model

    return resolve(model)


def weight_bytes_per_rank(spec, tp: int, tokens: int = 1) -> float:
    """Bytes a forward pass over `tokens` new tokens streams for the weights on one rank (catalog.shapes, the one
    home the memory plan reads too: every weight of a dense model, an MoE layer's router, shared experts and the
    routed experts its tokens cover), in the checkpoint's (or the layout's --quantization) format."""
    return streamed_weight_bytes_per_rank(spec, tp, tokens)


def kv_bytes_per_token_per_rank(spec, tp: int, kv_dtype_bytes: int = 2) -> float:
    """The memory plan's figure (catalog.shapes.kv_bytes_per_token: MLA latent, replicated KV heads), bf16 KV unless
    `kv_dtype_bytes` says otherwise."""
    return kv_bytes_per_token(spec, tp, kv_dtype_bytes)


def forward_ms(spec, gpu, *, batch: int, tokens_per_seq: int, context_len: int, tp: int = 1,
               kv_dtype_bytes: int = 2) -> float:
    """Roofline time of one forward pass over batch x tokens_per_seq new tokens at this context length. For an
    MoE model the weight bytes follow the experts those tokens cover: a verify of B x (K+1) tokens at batch 1
    reads up to K+1 times the experts of a plain step, at batch 32 of a 128-expert top-8 model about as many."""
    tokens = batch * tokens_per_seq
    bytes_ = weight_bytes_per_rank(spec, tp, tokens) \
        + batch * context_len * kv_bytes_per_token_per_rank(spec, tp, kv_dtype_bytes)
    if spec.linear_attention_layers:
        # Each sequence's recurrent state is read once and written per new token (vLLM keeps one state per
        # speculative position, num_speculative_blocks), whatever the context length.
        bytes_ += batch * spec.linear_attention_layers * (1 + tokens_per_seq) * linear_state_bytes(spec, tp, 2)
    t_mem = bytes_ / (gpu.bandwidth_gbps * 1e9 * BANDWIDTH_EFFICIENCY)
    t_flop = tokens * flops_per_token(spec, context_len, tp) / (gpu.bf16_tflops * 1e12 * FLOPS_EFFICIENCY)
    t_comm = (2 * spec.num_layers * ALLREDUCE_US * 1e-6) if tp > 1 else 0.0
    return 1000 * (max(t_mem, t_flop) + t_comm) + FORWARD_LAUNCH_MS


@dataclass
class StepCost:
    """Step costs at one batch size. spec_step_ms[K] is one speculative engine step (verify + K drafts)."""

    batch: int
    base_step_ms: float
    spec_step_ms: dict  # K -> ms
    draft_forward_ms: float
    c: float  # draft forward / plain target step
    spec_overhead_ms: float  # fixed extra of a speculative step over a plain one (0 drafts)
    source: str
    uncertainty: float  # relative
    verify_ms: dict = field(default_factory=dict)  # K -> target verify of K+1 tokens/seq (prior only)
    uncertainty_by_k: dict = field(default_factory=dict)  # K -> relative band where it differs by K (prior)
    draft_first_ms: dict = field(default_factory=dict)  # K -> the draft's first pass (prior only; eager_forward_ms)
    verify_gpu_ms: dict = field(default_factory=dict)  # K -> the verify's GPU work: roofline + MoE per-token work
    verify_host_ms: dict = field(default_factory=dict)  # K -> the verify's eager launch time, 0 when graphed
    # K -> the speculative step as a named sum {term: {"ms", "source"}} whose ms add up to spec_step_ms[K] (prior
    # only; a calibrated step is one measured number)
    terms: dict = field(default_factory=dict)

    def band(self, k: int) -> float:
        return self.uncertainty_by_k.get(k, self.uncertainty)


@dataclass
class StepCostModel:
    target: str
    draft: str
    gpu: str
    tp: int
    context_len: int
    source: str  # 'calibrated:<file>' or 'roofline prior'
    per_batch: dict  # batch -> StepCost
    notes: list = field(default_factory=list)
    tables: list = field(default_factory=list)  # the calibration tables read (calibrate.find_tables order)
    vllm_version: str = ""  # the modelled vLLM whose tables the step costs come from
    widened_for: str = ""  # the vLLM asked for when it has no tables of its own (band widened), else ""


PRIOR_OVERHEADS = {"plain_ms": PLAIN_STEP_OVERHEAD_MS, "plain_seq_ms": PLAIN_SEQ_MS,
                   "spec_ms": SPEC_STEP_OVERHEAD_MS, "spec_seq_ms": SPEC_SEQ_MS, "draft_layer_ms": DRAFT_LAYER_MS,
                   "moe_token_layer_ms": MOE_TOKEN_LAYER_MS}
# The fitted terms, each one earning its place on tables it was not fitted on (bench/speedup.py --ablate; a term left
# out of a fit, fitted_overheads' `without`, is held at 0). The speculative step's terms that enter linearly, in the
# order of overhead_features(); the per-layer host cost (HOST_TERM) sits inside a max() (draft_pass_ms), which
# _fit_spec_terms handles.
SPEC_TERMS = ("spec_ms", "spec_seq_ms", "moe_token_layer_ms")
PLAIN_TERMS = ("plain_ms", "plain_seq_ms")  # a plain step's host overhead: per step, per sequence
HOST_TERM = "draft_layer_ms"  # per draft layer, at every TP
# A fit needs more speculative samples than the linear unknowns (SPEC_TERMS and HOST_TERM); with fewer, a version's
# speculative terms keep 0.26's (bench/speedup.py --refit says so).
MIN_SPEC_SAMPLES = len(SPEC_TERMS) + 2
ZERO_OVERHEADS = {k: 0.0 for k in PRIOR_OVERHEADS}


def graph_miss(batch: int, k: int) -> bool:
    """Whether a pass over batch x (K+1) tokens (K=0: a plain step or a draft loop pass) runs without CUDA graphs."""
    return batch * (k + 1) > CUDAGRAPH_MAX_TOKENS


def eager_host_ms(spec) -> float:
    """The host's time to launch one forward pass of `spec` without CUDA graphs (EAGER_HOST_LAYER_MS per layer)."""
    moe_kind = "moe_shared" if getattr(spec, "shared_expert_intermediate_size", 0) else "moe"
    moe = spec.moe_layers
    return moe * EAGER_HOST_LAYER_MS[moe_kind] + (spec.num_layers - moe) * EAGER_HOST_LAYER_MS["dense"]


def eager_forward_ms(spec, gpu_ms: float) -> float:
    """A forward pass that misses the CUDA graphs: the GPU runs while the host launches, the longer of the two sets
    it (eager_host_ms)."""
    return max(gpu_ms, eager_host_ms(spec))


def plain_step_ms(spec, gpu, *, batch: int, context_len: int, tp: int = 1, overheads: dict | None = None,
                  kv_dtype_bytes: int = 2,
                  cuda_graphs: bool = True) -> float:
    """A plain decode step of `batch` sequences: the forward pass (eager above CUDAGRAPH_MAX_TOKENS, or everywhere
    with `cuda_graphs` False, vLLM's cudagraph_mode NONE) plus the per-step and per-sequence host overhead."""
    ov = {**PRIOR_OVERHEADS, **(overheads or {})}
    fwd = forward_ms(spec, gpu, batch=batch, tokens_per_seq=1, context_len=context_len, tp=tp,
                     kv_dtype_bytes=kv_dtype_bytes)
    if graph_miss(batch, 0) or not cuda_graphs:
        fwd = eager_forward_ms(spec, fwd)
    return fwd + ov["plain_ms"] + ov["plain_seq_ms"] * batch


def moe_extra_token_layers(target, draft, *, batch: int, k: int) -> float:
    """What MOE_TOKEN_LAYER_MS multiplies: the B x K tokens a speculative step adds to the plain step's B, in the
    target's verify and in the draft's first pass, times their MoE layers (0 for two dense models)."""
    return float(batch * k * (target.moe_layers + draft.moe_layers))


def overhead_features(target, draft, *, batch: int, k: int) -> list[float]:
    """What each SPEC_TERMS coefficient multiplies in a speculative step of K drafts at this batch."""
    return [1.0, float(batch), moe_extra_token_layers(target, draft, batch=batch, k=k)]


def loop_layer_ms(target, draft, overheads: dict, loop_factor: float | None = None) -> float:
    """The host cost per draft layer of `draft`'s passes beside `target`: the fitted draft_layer_ms, times the
    target's measured factor (loop_factor.draft_loop_factor; 1 for a target not measured). `loop_factor` given:
    that factor instead (bench/draft_loop_factor.py measures it against the model without one)."""
    return overheads[HOST_TERM] * _loop_factor(target, draft, overheads, loop_factor)


def _loop_factor(target, draft, overheads: dict, loop_factor: float | None) -> float:
    if loop_factor is not None:
        return loop_factor
    found = draft_loop_factor(target, draft, overheads.get("vllm_version") or DEFAULT_TABLE_VLLM)
    return found.factor if found else 1.0


# Whether the draft's first pass hides under the target's verify, per modelled vLLM. 0.26's V1 proposer launches
# it right behind the verify from CUDA graphs (draft_passes_ms). 0.33's V2 draft_model speculator
# (v1/worker/gpu/spec_decode/standalone_ar/speculator.py: init_cudagraph_manager and capture are `pass`, every
# pass built with CUDAGraphMode.NONE) runs all K passes eagerly, the first a prefill over the verified tokens, so
# each pays its host launch time; its H200 tables fit better with K passes charged than with K-1. 0.34's
# standalone_ar speculator (on autoregressive/cudagraph_utils.py) captures the loop again: PIECEWISE/FULL prefill
# graphs for the first pass and one fused FULL graph for the K-1 decode passes, async scheduling on for every method
# (config/vllm.py); it is priced as 0.26's graphed loop (first pass hidden), never as 0.33's eager one, with the
# overheads fitted on 0.34's own draft_model tables (Llama-3.1-8B + Llama-3.2-1B on an H100 and an H200: the fused
# decode graph costs about 0.09 ms per draft layer against 0.26's 0.21; docs/benchmarks.md section vllm034-refit,
# where the fit on the H100 table predicts the H200 one at 21 % mean error against 42 % for 0.26's fit).
# Declared per version in engine/rules.py (VllmRules.first_draft_pass_hidden); this view keeps the old name.
FIRST_DRAFT_PASS_HIDDEN = {m: r.first_draft_pass_hidden for m, r in VLLM_RULES.items()}


def _fit_rules(overheads: dict | None) -> VllmRules:
    """The rules of the vLLM `overheads` were fitted for (fitted_overheads' `vllm_version`: a tables key)."""
    return VLLM_RULES[tables_key_of((overheads or {}).get("vllm_version"))]


def first_pass_hidden(overheads: dict | None) -> bool:
    """FIRST_DRAFT_PASS_HIDDEN of the vLLM `overheads` were fitted for (fitted_overheads' `vllm_version`)."""
    return FIRST_DRAFT_PASS_HIDDEN.get((overheads or {}).get("vllm_version") or DEFAULT_TABLE_VLLM, True)


def draft_passes_ms(k: int, roofline_ms: float, num_layers: int, layer_ms: float, hidden_first: bool = True,
                    first_ms: float | None = None, verify_ms: float | None = None) -> float:
    """K draft passes (draft_loop_split: what binds each pass)."""
    fixed_ms, host_layers = draft_loop_split(k, roofline_ms, num_layers, layer_ms, hidden_first, first_ms, verify_ms)
    return fixed_ms + host_layers * layer_ms


def draft_loop_split(k: int, roofline_ms: float, num_layers: int, layer_ms: float, hidden_first: bool = True,
                     first_ms: float | None = None, verify_ms: float | None = None) -> tuple[float, float]:
    """The K draft passes' cost as (GPU-bound ms, draft layers whose host launch binds): their cost is
    fixed_ms + host_layers x layer_ms. The one statement of which pass pays what; draft_passes_ms adds it up and
    the overhead fit (_fit_spec_terms) solves for layer_ms with it.

    vLLM launches the first pass (propose(), before its loop) right behind the target's verify, so its host time
    hides under the verify still running on the GPU, as long as the verify runs (`verify_ms`, its GPU time): a
    verify shorter than the draft's launch time leaves the rest showing (an MoE target at batch 1 reads few
    experts, 2-4 ms, while a 24-28-layer draft takes 5-6 ms to launch: Qwen1.5-MoE-A2.7B + Qwen1.5-0.5B K=1 cost
    7 ms over the plain step where the 8B pairs cost 3.6). The K-1 loop passes have nothing to hide behind: each
    costs max(roofline, layers x host cost) (draft_pass_ms). Measured: K=1 adds about the same to an 8B target's
    step with a 16-layer and a 28-layer draft, each further pass about 2x more with the 28-layer one. Where the
    first pass does not hide (hidden_first False: FIRST_DRAFT_PASS_HIDDEN), it costs a loop pass. `first_ms`: the
    first pass's roofline when it differs from the loop passes' (it runs over the verified tokens, B x (K+1):
    first_pass_roofline_ms)."""
    first = roofline_ms if first_ms is None else first_ms
    launch_ms = num_layers * layer_ms
    fixed_ms, host_layers = 0.0, 0.0
    if hidden_first:
        if verify_ms is not None and launch_ms - verify_ms > first:
            fixed_ms, host_layers = -verify_ms, float(num_layers)
        else:
            fixed_ms = first
    elif launch_ms > first:
        host_layers = float(num_layers)
    else:
        fixed_ms = first
    if k > 1:
        if launch_ms > roofline_ms:
            host_layers += (k - 1) * num_layers
        else:
            fixed_ms += (k - 1) * roofline_ms
    return fixed_ms, host_layers


def first_pass_roofline_ms(draft, gpu, *, batch: int, k: int, context_len: int, tp: int,
                           kv_dtype_bytes: int = 2) -> float:
    """The draft's first pass reads every token the target just verified, B x (K+1), not one per sequence: vLLM's
    proposer runs it over the verify step's target_token_ids (0.26 v1/spec_decode/llm_base_proposer.py
    set_inputs_first_pass: num_tokens = target_token_ids.shape[0]; 0.33's V2 speculator likewise prefills the
    expanded tokens). At batch 128 and K=4 that is 640 tokens: Mistral-7B's pass is then compute-bound."""
    return forward_ms(draft, gpu, batch=batch, tokens_per_seq=k + 1, context_len=context_len, tp=tp,
                      kv_dtype_bytes=kv_dtype_bytes)


def draft_pass_ms(roofline_ms: float, num_layers: int, layer_ms: float) -> float:
    """One draft forward pass: the GPU's roofline time or the host's launch time, whichever is longer."""
    return max(roofline_ms, num_layers * layer_ms)


# Drafting methods that run no draft forward pass (catalog.specs.method_drafter: no model): their proposal is a lookup
# (on the host or in a GPU kernel, by vLLM version: see the DRAFT_SEQ_MS comment), priced by prior_step_cost without
# any draft pass or the draft_model tables' fitted fixed cost.
NO_FORWARD_METHODS = ("ngram", "suffix")


def heads_async_scheduling(draft) -> bool:
    """Whether vLLM schedules the next step while this one runs with `draft`: on by default for EAGLE/MTP heads and
    off for draft_model and the n-gram / suffix proposers under 0.26 (config/vllm.py VllmConfig.__post_init__:
    async_scheduling None becomes False for a method outside EagleModelTypes / NgramGPUTypes ("ngram_gpu") / dspark).
    0.33 turns it off only on the V1 runner (same check, draft_model/dflash/dspark exempt; suffix always runs there),
    0.34 for no method. The draft_model tables' fitted fixed cost
    (spec_ms, spec_seq_ms) is what a step pays without it; a head's step pays a plain step's host overhead instead, on
    either runner: on V1, Qwen3-Next's shapes with their MTP layer (phase HS) came 22 % under the measured speedups
    with the fitted cost and 14 % with this rule, which was made after that score (no held-out V1 head exists).
    ngram/suffix do not go through this rule (prior_step_cost: NO_FORWARD_METHODS)."""
    return bool(getattr(draft, "is_eagle", False))


def head_on_async_runner(target, draft, rules: VllmRules | None = None) -> bool:
    """Whether `draft` is an EAGLE/MTP head that vLLM runs on its V2 model runner (memory.plan.model_runner: in
    0.26 a dense target's; MoE and hybrid targets stay on V1 there). The V2 runner keeps the batch on the GPU and
    schedules the next step while this one runs (async scheduling, on for EAGLE/MTP), and replays the head's passes
    as CUDA graphs, so a speculative step pays no more host overhead than a plain one: Llama-3.1-8B + an EAGLE-3
    head on one H200 (vLLM 0.26, phase HE) took 5.4 ms at K=1 and batch 1, 0.5 ms over its plain step, where the
    draft_model tables' fit charges 3.3 ms of fixed speculative overhead; the MTP layer of the hybrid Qwen3-Next
    (V1 runner) paid about that at batch 1 (5.4 ms against a 2.75 ms plain step), not at batch 8-128, where async
    scheduling, on for heads on either runner (heads_async_scheduling), hid it."""
    if not getattr(draft, "is_eagle", False):
        return False
    return model_runner(target, draft, rules or resolve_target().rules) == "v2"


def prior_step_cost(target, draft, gpu, *, batch: int, k_values, tp: int = 1, context_len: int = 1024,
                    overheads: dict | None = None, rules: VllmRules | None = None,
                    loop_factor: float | None = None, kv_dtype_bytes: int = 2) -> StepCost:
    """The roofline prior's step costs. `rules` (default: those of the vLLM `overheads` were fitted for) decide
    which model runner a head drafter runs on (head_on_async_runner); `loop_factor`: loop_layer_ms's."""
    ov = {**PRIOR_OVERHEADS, **(overheads or {})}
    loop_factor = _loop_factor(target, draft, ov, loop_factor)  # looked up once, not per K
    layer_ms = loop_layer_ms(target, draft, ov, loop_factor)
    hidden = first_pass_hidden(overheads)
    async_head = head_on_async_runner(target, draft, rules or _fit_rules(ov))
    kvb = kv_dtype_bytes  # --kv-cache-dtype: vLLM stores the target's and the draft's KV in it
    base = plain_step_ms(target, gpu, batch=batch, context_len=context_len, tp=tp, overheads=ov, kv_dtype_bytes=kvb)
    draft_roof = forward_ms(draft, gpu, batch=batch, tokens_per_seq=1, context_len=context_len, tp=tp,
                            kv_dtype_bytes=kvb)
    if graph_miss(batch, 0):  # the draft's loop passes over B tokens run eagerly too
        draft_roof = eager_forward_ms(draft, draft_roof)
    draft_fwd = draft_pass_ms(draft_roof, draft.num_layers, layer_ms)
    spec, verify, band, first, verify_gpu, verify_host, terms = {}, {}, {}, {}, {}, {}, {}
    # A speculative step's host overhead beyond its passes: a plain step's where vLLM keeps async scheduling on
    # (heads_async_scheduling), else what the draft_model tables fitted (their steps run without it).
    no_forward = getattr(draft, "method", "") in NO_FORWARD_METHODS
    fixed_ms = ov["plain_ms"] + ov["plain_seq_ms"] * batch if heads_async_scheduling(draft) or no_forward \
        else ov["spec_ms"] + ov["spec_seq_ms"] * batch
    for k in k_values:
        verify_roof = forward_ms(target, gpu, batch=batch, tokens_per_seq=k + 1, context_len=context_len, tp=tp,
                                 kv_dtype_bytes=kvb)
        # MoE layers' per-token work is GPU time: it counts with the verify's roofline in the regime test
        # (draft_loop_host_and_gpu_ms); the first pass's launches hide under the roofline alone, as the fit sees
        # them (_fit_spec_terms)
        moe_ms = _moe_ms(target, draft, batch=batch, k=k, overheads=ov)
        verify_gpu[k] = verify[k] = verify_roof + moe_ms
        first[k] = first_pass_roofline_ms(draft, gpu, batch=batch, k=k, context_len=context_len, tp=tp,
                                          kv_dtype_bytes=kvb)
        verify_host[k] = 0.0
        if graph_miss(batch, k):
            # B x (K+1) tokens above the largest CUDA graph: the verify and the draft's first pass over them run
            # eagerly, each the longer of its GPU work and its launch (eager_forward_ms); the first pass then has
            # nothing to hide under, as its launch outlasts the verify's GPU work
            verify_host[k] = eager_host_ms(target)
            verify[k] = eager_forward_ms(target, verify[k])
            first[k] = eager_forward_ms(draft, first[k])
        if no_forward:
            # n-gram / suffix: no draft forward at all, one lookup per sequence (host numba / arctic-inference tree
            # on 0.26 and 0.33's V1 runner, two Triton kernels on the V2 runner: docs/VLLM_VERSIONS.md "n-gram and
            # suffix step path"), so the step is the verify of B x (K+1) tokens plus a plain step's host overhead (the
            # lookup not charged: DRAFT_LAYER_MS's comment). The K+1 width is exact on the V2 runner (fixed-width drafts, a no-match slot filled with
            # the last sampled token) and an upper bound on V1 (a sequence with no match verifies 1 token). Where
            # async scheduling is off (0.26; 0.33 suffix) the plain overhead, fitted with it on, is a floor. It
            # carries none of the draft_model tables' fitted fixed cost (spec_ms, spec_seq_ms): a draft model's.
            spec[k] = verify[k] + fixed_ms
        elif async_head:
            # The head's K passes on the GPU one after another (the first over the B x (K+1) verified tokens), each
            # at most its launch time, and the host overhead of a plain step (head_on_async_runner): no fitted term.
            spec[k] = verify[k] + first[k] + (k - 1) * draft_pass_ms(draft_roof, draft.num_layers,
                                                                     layer_ms) + fixed_ms
        else:
            spec[k] = verify[k] + draft_passes_ms(k, draft_roof, draft.num_layers, layer_ms, hidden,
                                                  first[k], verify_roof) + fixed_ms
        terms[k] = _step_terms(spec[k], verify[k], verify_host[k], fixed_ms, moe_ms, batch=batch, ov=ov,
                               no_forward=no_forward, async_head=async_head)
        host_ms, gpu_ms = draft_loop_host_and_gpu_ms(target, draft, gpu, batch=batch, k=k, tp=tp,
                                                     context_len=context_len, overheads=ov, loop_factor=loop_factor)
        band[k] = PRIOR_UNCERTAINTY_HOST_BOUND if host_ms > gpu_ms else PRIOR_UNCERTAINTY_GPU_BOUND
    # The fixed cost of a speculative step over a plain one: none where async scheduling runs (heads).
    spec_overhead = fixed_ms - ov["plain_ms"] - ov["plain_seq_ms"] * batch
    return StepCost(batch=batch, base_step_ms=base, spec_step_ms=spec, draft_forward_ms=draft_fwd,
                    c=draft_fwd / base, spec_overhead_ms=spec_overhead,
                    source="roofline prior", uncertainty=max(band.values(), default=PRIOR_UNCERTAINTY_GPU_BOUND),
                    verify_ms=verify, uncertainty_by_k=band, draft_first_ms=first, verify_gpu_ms=verify_gpu,
                    verify_host_ms=verify_host, terms=terms)


def _step_terms(spec_ms: float, verify_ms: float, verify_host_ms: float, fixed_ms: float, moe_ms: float, *,
                batch: int, ov: dict, no_forward: bool, async_head: bool) -> dict:
    """prior_step_cost's speculative step as a named sum, each term tagged with its source; the terms add up to the
    step. `ov` says which vLLM tables the fitted terms were fitted on."""
    fit = f"fitted on vLLM {ov.get('vllm_version') or DEFAULT_TABLE_VLLM} draft_model tables"
    out = {"verify": {"ms": verify_ms - moe_ms if verify_host_ms <= verify_ms - moe_ms else verify_ms,
                      "source": "roofline (target weights + KV over bandwidth, FLOPs); eager launch where the "
                                "step misses the CUDA graphs: measured (EAGER_HOST_LAYER_MS)"}}
    if moe_ms and verify_host_ms <= verify_ms - moe_ms:
        out["moe_per_token"] = {"ms": moe_ms, "source": f"{fit} (MoE tables, moe_token_layer_ms)"}
    heads_or_none = async_head or no_forward or fixed_ms == ov["plain_ms"] + ov["plain_seq_ms"] * batch
    if no_forward:  # not measured: no n-gram table exists (issue 37 item 2, the H200 part, is open)
        src = ("a plain step's host overhead, fitted on the tables' baselines (plain_ms, plain_seq_ms): vLLM 0.34 and "
               "0.33's V2 runner (ngram) keep async scheduling on; a floor on 0.26 and for 0.33's suffix, where "
               "config/vllm.py turns it off and the step runs the lookup after the sampled tokens reach the host "
               "(docs/VLLM_VERSIONS.md n-gram and suffix step path); the lookup itself is not charged (not measured)")
    elif heads_or_none:
        src = ("a plain step's host overhead, fitted on the tables' baselines (plain_ms, plain_seq_ms); vLLM source: "
               "async scheduling stays on for EAGLE/MTP heads (heads_async_scheduling)")
    else:
        src = f"{fit} (spec_ms, spec_seq_ms)"
    out["fixed_host"] = {"ms": fixed_ms, "source": src}
    passes = spec_ms - sum(t["ms"] for t in out.values())
    if not no_forward:
        out["draft_passes"] = {"ms": passes, "source": "roofline per pass, or the host launch per draft layer "
                                                       f"{fit} (draft_layer_ms), whichever is longer"}
    return out


def _interp_log_batch(points: dict, batch: int) -> float | None:
    """Interpolate {batch: value} in log(batch); None outside the measured range."""
    xs = sorted(points)
    if not xs:
        return None
    if batch in points:
        return points[batch]
    if batch < xs[0] or batch > xs[-1]:
        return None
    lo = max(x for x in xs if x < batch)
    hi = min(x for x in xs if x > batch)
    w = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return points[lo] * (1 - w) + points[hi] * w


def _linear_fit(ks: list[int], ys: list[float], floor: float | None = None) -> tuple[float, float]:
    """Least-squares line y = a + b K. With `floor` (the plain step at that batch), an intercept below it is
    refitted at it: where all K draft passes are paid, a speculative step with no draft is the verify, at least a
    plain step, and a line that says less has bent to noise (vLLM 0.33's eager draft loop: Llama-3.2-1B's K=1
    steps measured above its K=2 steps at two of four batch sizes, and the free line then put K=1 at half its
    measured cost, advising K=1 at batch 32 for 1.16x where 0.56x was measured)."""
    n = len(ks)
    if n == 1:
        return ys[0], 0.0
    mk, my = sum(ks) / n, sum(ys) / n
    var = sum((k - mk) ** 2 for k in ks)
    b = sum((k - mk) * (y - my) for k, y in zip(ks, ys)) / var if var else 0.0
    a = my - b * mk
    if floor is not None and a < floor:
        a = floor
        b = sum(k * (y - floor) for k, y in zip(ks, ys)) / sum(k * k for k in ks)
    return a, b


def calibrated_step_cost(table, target, draft, gpu, *, batch: int, k_values, tp: int = 1,
                         context_len: int = 1024, overheads: dict | None = None) -> StepCost | None:
    """Step costs from a calibration table; outside its batch range, the measured values at the nearest
    edge are scaled by the roofline's ratio between the two batch sizes. `overheads` (default: fitted on
    the shipped tables) shape the K curve where only one K is measured."""
    base_pts = {int(b): r["step_ms"] for b, r in table.baseline.items() if r.get("step_ms")}
    spec_pts = {int(k): {int(b): table.spec_step_ms(int(k), int(b)) for b, r in rows.items() if r.get("step_ms")}
                for k, rows in table.spec.items()}
    spec_pts = {k: v for k, v in spec_pts.items() if v}
    if not base_pts or not spec_pts:
        return None
    all_b = sorted(base_pts)
    anchor = batch if all_b[0] <= batch <= all_b[-1] else (all_b[0] if batch < all_b[0] else all_b[-1])
    scale = 1.0
    if anchor != batch:  # extrapolate in batch with the roofline's shape
        p_at = prior_step_cost(target, draft, gpu, batch=batch, k_values=[1], tp=tp, context_len=context_len)
        p_an = prior_step_cost(target, draft, gpu, batch=anchor, k_values=[1], tp=tp, context_len=context_len)
        scale = p_at.base_step_ms / p_an.base_step_ms
    base = _interp_log_batch(base_pts, anchor)
    measured = {k: _interp_log_batch(pts, anchor) for k, pts in spec_pts.items()}
    measured = {k: v for k, v in measured.items() if v is not None}
    if base is None or not measured:
        return None
    spec = {}
    if len(measured) >= 2:
        # Where every draft pass is paid (FIRST_DRAFT_PASS_HIDDEN False) a step with no draft is the verify, at least
        # a plain step, so the line's intercept is floored there; where the first pass hides it may lie below.
        floor = None if first_pass_hidden(overheads) else base
        a, b = _linear_fit(sorted(measured), [measured[k] for k in sorted(measured)], floor=floor)
        band = table.step_band
        # With 3+ K the line replaces the measured points too: each K adds one draft pass and one verified
        # token, and on the H200 tables the line through one engine start's K predicts another start's
        # steps better than its raw per-K values (mean error 15.2 % against 17.9 %, 128 points; docs/benchmarks.md).
        # The line is drawn only through the K on the same side of vLLM's CUDA-graph limit as the K asked for
        # (graph_miss): past it the verify runs eagerly and the steps jump, and one line across the jump bends to
        # it (Qwen3-30B-A3B + Qwen3-0.6B at batch 128: K 4-6 eager at 91-187 ms pulled K=1 to 8.5 ms, under the
        # 18.5 ms plain step, where 32.5 ms was measured).
        for k in k_values:
            same = sorted(kk for kk in measured if graph_miss(anchor, kk) == graph_miss(anchor, k))
            if len(same) >= 3 and len(same) < len(measured):
                a_k, b_k = _linear_fit(same, [measured[kk] for kk in same], floor=floor)
            else:
                a_k, b_k = a, b
            line = a_k + b_k * k
            if k in measured:
                # A measured point is never contradicted: the line stays within that point's band.
                line = min(max(line, measured[k] * (1 - band)), measured[k] * (1 + band))
            spec[k] = (line if len(same) >= 3 or k not in measured else measured[k]) * scale
    else:  # one K measured: the prior's step costs over K, scaled to pass through the measured one
        (k0, m0), = measured.items()
        pr = prior_step_cost(target, draft, gpu, batch=anchor, k_values=sorted({k0, k0 + 1, *k_values}), tp=tp,
                             context_len=context_len, overheads=overheads or fitted_overheads())
        f = m0 / pr.spec_step_ms[k0]
        for k in k_values:
            spec[k] = (measured[k] if k in measured else pr.spec_step_ms[k] * f) * scale
        b = (pr.spec_step_ms[k0 + 1] - pr.spec_step_ms[k0]) * f
        a = m0 - b * k0
    base *= scale
    # A speculative step verifies at least the plain step's tokens: it never costs less than a plain step.
    spec = {k: max(v, base) for k, v in spec.items()}
    # b: cost of one more drafted token (a draft pass plus the verify's extra token); a - base: the fixed
    # extra cost of a speculative step over a plain one.
    unc = table.step_band * (1 if anchor == batch else 2)
    return StepCost(batch=batch, base_step_ms=base, spec_step_ms=spec, draft_forward_ms=b * scale,
                    c=(b * scale) / base, spec_overhead_ms=(a * scale) - base,
                    source=f"calibrated:{table.path.split('/')[-1] if table.path else table.target}",
                    uncertainty=unc)


def draft_loop_host_and_gpu_ms(target, draft, gpu, *, batch: int, k: int, tp: int, context_len: int,
                               overheads: dict, loop_factor: float | None = None) -> tuple[float, float]:
    """The host launch time of vLLM's draft loop (K-1 passes of the draft's layers, K where the first pass does
    not hide (_host_launched_passes), plus every layer's launches when batch x (K+1) tokens miss the CUDA graphs)
    and the step's GPU work (the verify of K+1 tokens with the MoE layers' per-token work, the first draft pass
    over the verified tokens and K-1 loop rooflines), in ms: the regime test behind the prior's band."""
    ov = {**PRIOR_OVERHEADS, **(overheads or {})}
    host_ms = _host_launched_passes(k, ov) * draft.num_layers * loop_layer_ms(target, draft, ov, loop_factor) \
        + ((eager_host_ms(target) + eager_host_ms(draft)) if graph_miss(batch, k) else 0.0)
    gpu_ms = forward_ms(target, gpu, batch=batch, tokens_per_seq=k + 1, context_len=context_len, tp=tp) \
        + _moe_ms(target, draft, batch=batch, k=k, overheads=ov) \
        + first_pass_roofline_ms(draft, gpu, batch=batch, k=k, context_len=context_len, tp=tp) \
        + (k - 1) * forward_ms(draft, gpu, batch=batch, tokens_per_seq=1, context_len=context_len, tp=tp)
    return host_ms, gpu_ms


def _moe_ms(target, draft, *, batch: int, k: int, overheads: dict) -> float:
    """The MoE layers' per-token work on the tokens a speculative step adds (0 for two dense models)."""
    return moe_extra_token_layers(target, draft, batch=batch, k=k) * overheads["moe_token_layer_ms"]


def _host_launched_passes(k: int, overheads: dict) -> int:
    """The draft passes the regime test charges host launch time for: the K-1 loop passes, all K where the first
    does not hide (FIRST_DRAFT_PASS_HIDDEN)."""
    return k - 1 if first_pass_hidden(overheads) else k


def is_host_bound(target, draft, gpu, *, batch: int, k: int, tp: int, context_len: int, overheads: dict) -> bool:
    host_ms, gpu_ms = draft_loop_host_and_gpu_ms(target, draft, gpu, batch=batch, k=k, tp=tp,
                                                 context_len=context_len, overheads=overheads)
    return host_ms > gpu_ms


def host_bound_note(target, draft, gpu, *, tp: int, batch: int, context_len: int, overheads: dict,
                    k: int = 4) -> str | None:
    """A note when, at K=4, the host launch time of vLLM's draft loop (K-1 passes) exceeds the GPU work of
    the step (the verify and K draft rooflines). Then the GPU idles between kernels and the engine core's
    one CPU thread sets the step: on the H200 hosts measured, those steps (the 8B pairs) varied up to 1.7x
    between repeats at a steady GPU, while GPU-bound ones (Qwen2.5-Coder-32B + 7B, the 70B pairs at TP=2)
    agreed within a few percent (README, host-trace)."""
    host_ms, gpu_ms = draft_loop_host_and_gpu_ms(target, draft, gpu, batch=batch, k=k, tp=tp,
                                                 context_len=context_len, overheads=overheads)
    if host_ms <= gpu_ms:
        return None
    return (f"host-bound at batch {batch}: at K={k} vLLM's draft loop needs {host_ms:.1f} ms of host launch time "
            f"({_host_launched_passes(k, overheads)} passes x {draft.num_layers} layers of {draft.name}) for "
            f"{gpu_ms:.1f} ms of GPU work, so the "
            "engine core's CPU thread sets the step; such steps varied between runs on the H200 hosts "
            f"measured (docs/benchmarks.md, section bench:host-trace), hence the prior's ±{PRIOR_UNCERTAINTY_HOST_BOUND:.0%} band there: "
            "the host CPU, not only the GPU, sets this speedup (`draftfit calibrate` on the server narrows it)")


GRAPH_LIMIT_MARK = "past vLLM's largest CUDA graph"  # how rank picks this note out for the row it concerns


def graph_limit_note(target, draft, *, batches, k_values) -> str | None:
    """Where the prior prices a verify over more tokens than CUDAGRAPH_MAX_TOKENS (eager_forward_ms), the batch sizes
    and K that do, and the launch times that then bound the verify and the draft's first pass; None where none does."""
    ks = sorted(k_values)
    first_miss = {b: next((k for k in ks if graph_miss(b, k)), None) for b in sorted(batches)}
    where = [f"batch {b} at K >= {k}" if k > ks[0] else f"batch {b}" for b, k in first_miss.items() if k is not None]
    if not where:
        return None
    return (f"{', '.join(where)}: the verify's batch x (K+1) tokens run {GRAPH_LIMIT_MARK} ({CUDAGRAPH_MAX_TOKENS} "
            f"tokens), so it and the draft's first pass run eagerly, each taking at least the host's launch time "
            f"({target.name} {eager_host_ms(target):.0f} ms, {draft.name} {eager_host_ms(draft):.0f} ms, per layer as "
            f"measured on an H200 host with vLLM 0.26: docs/benchmarks.md eager-launch)")


class Predictor(Protocol):
    """What prices a step (issue 37; vidur's execution_time_predictor registry is the model): step costs at one batch
    size for K drafts, as a StepCost whose source says which predictor made them. select_predictor is the one place
    that picks one for a layout; step_cost_model (and through it predict_speedup, rank, the pipeline, `speedup`) only
    calls predict()."""

    name: str

    def predict(self, target, draft, gpu, *, batch: int, k_values, tp: int, context_len: int) -> StepCost:
        ...


@dataclass(frozen=True)
class RooflinePredictor:
    """The roofline prior (prior_step_cost): weights and KV over bandwidth, FLOPs over throughput, vLLM's host terms
    with `overheads` fitted on a version's tables; `rules` (a VllmRules) set the runner rules of head drafters."""

    overheads: dict
    rules: VllmRules | None = None
    kv_dtype_bytes: int = 2
    name: str = "roofline"

    def predict(self, target, draft, gpu, *, batch: int, k_values, tp: int, context_len: int) -> StepCost:
        return prior_step_cost(target, draft, gpu, batch=batch, k_values=k_values, tp=tp, context_len=context_len,
                               overheads=self.overheads, kv_dtype_bytes=self.kv_dtype_bytes,
                               rules=self.rules)


@dataclass(frozen=True)
class CalibratedPredictor:
    """A pair's measured step costs (calibration.tables: calibrated_step_cost's line over K, interpolation in batch,
    the roofline's shape past the measured batches); where the table cannot answer, `fallback`."""

    table: object  # PooledSteps
    overheads: dict
    fallback: RooflinePredictor
    name: str = "calibrated"

    def predict(self, target, draft, gpu, *, batch: int, k_values, tp: int, context_len: int) -> StepCost:
        sc = calibrated_step_cost(self.table, target, draft, gpu, batch=batch, k_values=k_values, tp=tp,
                                  context_len=context_len, overheads=self.overheads)
        if sc is None:
            sc = self.fallback.predict(target, draft, gpu, batch=batch, k_values=k_values, tp=tp,
                                       context_len=context_len)
        return sc


PREDICTORS = {"roofline": RooflinePredictor, "calibrated": CalibratedPredictor}  # the registry, by name


@dataclass(frozen=True)
class PredictorChoice:
    """select_predictor's answer: the predictor and what it was chosen from (step_cost_model's notes read them)."""

    predictor: Predictor
    tables: list  # the calibration tables of the fitted version read (empty: none)
    overheads: dict  # fitted_overheads for the version and method
    measured_method: bool  # the drafter's method is the one the tables measure (draft_model)


def select_predictor(t, d, g, *, tp: int, calibration_dir=None, rules: VllmRules | None = None,
                     kv_dtype_bytes: int = 2, predictor: str | None = None) -> PredictorChoice:
    """The one place a layout's predictor is chosen: the pair's calibration tables of `rules`' version
    (rules.tables_key; 0.26's when None) if there are any (CalibratedPredictor), else the roofline prior with that version's
    fitted overheads. A version with no tables at all, or a drafting method its tables do not measure, gets 0.26's
    tables or overheads (step_cost_model widens the band). `predictor` 'roofline' skips the tables (scoring the prior
    where a table exists: bench/speedup.py); None or 'calibrated' uses them where they exist."""
    if predictor not in (None, *PREDICTORS):
        raise DraftfitError(f"unknown step-cost predictor {predictor!r}", fix="use " + " or ".join(PREDICTORS))
    wanted = rules.tables_key if rules is not None else None
    tables = find_tables(t.name, d.name, g.name, tp, calibration_dir, tables_key=wanted)
    # The 0.33 tables measure draft_model, whose V2 speculator runs eagerly; EAGLE-3/MTP heads there run the
    # CUDA-graphed target-dependent speculator and ngram/suffix no model at all, so those keep 0.26's overheads
    # and are treated as uncalibrated for the later version (band widened below).
    measured_method = d.method == "draft_model"
    ov = fitted_overheads(calibration_dir, tables_key=wanted if measured_method else None)
    fit_version = ov.get("vllm_version", DEFAULT_TABLE_VLLM)
    own = tables_of_version(tables, fit_version)
    if own or (wanted and fit_version == wanted):
        # The version the overheads are fitted for has tables: another version's table of this pair is not used
        # for it. On the H200 the 0.26 table of Llama-3.1-8B + 3.2-1B says 18 ms for a K=4 step at batch 1,
        # vLLM 0.33 took 47; the 0.33 prior, fitted without that pair, is within 25 % on average
        # (bench/speedup.py). Otherwise another version's table stands in and the band is widened below.
        tables = own
    if predictor == "roofline":
        tables = []
    # Which vLLM's runner rules a head drafter follows (head_on_async_runner): the one asked for, else the overheads'.
    roofline = RooflinePredictor(overheads=ov, rules=rules or _fit_rules(ov), kv_dtype_bytes=kv_dtype_bytes)
    chosen = CalibratedPredictor(PooledSteps(tables), ov, roofline) if tables else roofline
    return PredictorChoice(predictor=chosen, tables=tables, overheads=ov, measured_method=measured_method)


def step_cost_model(target, draft, gpu, *, batches=(1,), k_values=range(1, 9), tp: int = 1,
                    context_len: int = 1024, calibration_dir=None, rules: VllmRules | None = None,
                    kv_dtype_bytes: int = 2, predictor: str | None = None) -> StepCostModel:
    """Step costs per batch from the layout's predictor (select_predictor: the calibration tables of `rules`' version,
    rules.tables_key, 0.26's when None, else the roofline prior), with the notes that say what they rest on. A version
    with no tables at all, or a drafting method its tables do not measure, gets 0.26's tables or overheads with the
    band widened."""
    t, d, g = model_spec(target), model_spec(draft), gpu_spec(gpu)
    ks = list(k_values)
    choice = select_predictor(t, d, g, tp=tp, calibration_dir=calibration_dir, rules=rules,
                              kv_dtype_bytes=kv_dtype_bytes, predictor=predictor)
    tables, ov, measured_method = choice.tables, choice.overheads, choice.measured_method
    table = choice.predictor.table if isinstance(choice.predictor, CalibratedPredictor) else None
    wanted = rules.tables_key if rules is not None else None
    fit_version = ov.get("vllm_version", DEFAULT_TABLE_VLLM)
    runner_rules = rules or _fit_rules(ov)  # head drafters' runner rules: the ones asked for, else the overheads'
    per_batch, notes = {}, []
    for b in batches:
        per_batch[b] = choice.predictor.predict(t, d, g, batch=b, k_values=ks, tp=tp, context_len=context_len)
    sources = {sc.source for sc in per_batch.values()}
    if table is None:
        fitted = (f"overheads fitted on {ov['n_spec']} calibrated vLLM {ov.get('vllm_version', DEFAULT_TABLE_VLLM)} "
                  f"points" if ov.get("n_spec") else "prior overheads")
        notes.append(f"no calibration table for {t.name} + {d.name} on {g.name} TP={tp}: roofline prior with "
                     f"{fitted} (±{PRIOR_UNCERTAINTY_GPU_BOUND:.0%} where the GPU sets the step, "
                     f"±{PRIOR_UNCERTAINTY_HOST_BOUND:.0%} where the host does)")
        if tp > 1 and ov.get("tp1_only"):
            notes.append(f"no vLLM {ov['vllm_version']} table at TP>1: its per-layer draft host cost at TP={tp} is the "
                         f"one fitted at TP=1 ({ov[HOST_TERM]:.2f} ms; on vLLM 0.26 one constant for every TP predicted "
                         f"the TP=2 tables held out as well as one per TP: docs/benchmarks.md speedup-ablation), not "
                         f"measured")
    if table is None and d.is_eagle:  # EAGLE heads and MTP layers
        note = HEAD_ASYNC_NOTE if head_on_async_runner(t, d, runner_rules) else HEAD_PRIOR_NOTE
        notes.append(note.format(method=d.method))
    if t.is_moe or d.is_moe:
        notes.append(MOE_NOTE.format(us=1000 * ov.get("moe_token_layer_ms", MOE_TOKEN_LAYER_MS)))
    untuned = untuned_moe_note(t, g, tp=tp, rules=rules)
    if untuned:
        notes.append(untuned)
    loop = draft_loop_factor(t, d, fit_version) if table is None else None
    if loop:
        notes.append(loop.note())
    host_note = host_bound_note(t, d, g, tp=tp, batch=min(batches), context_len=context_len, overheads=ov)
    if host_note:
        notes.append(host_note)
    limit_note = graph_limit_note(t, d, batches=batches, k_values=ks) if table is None else None
    if limit_note:
        notes.append(limit_note)
    if measured_method and not first_pass_hidden(ov):
        notes.append(f"vLLM {ov['vllm_version']} runs draft_model on its V2 model runner, whose draft passes run "
                     f"without CUDA graphs ({ov.get('draft_layer_ms', 0):.2f} ms of host time per draft layer fitted, "
                     f"0.26: {fitted_overheads(calibration_dir)['draft_layer_ms']:.2f}); on one H200 Llama-3.1-8B + "
                     f"Llama-3.2-1B and Qwen3-8B + Qwen3-0.6B lost at every batch and K measured (0.16-0.85x)."
                     + (f" VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner (0.26's CUDA-graphed draft loop); draftfit "
                        f"has not measured that under vLLM {ov['vllm_version']}"
                        # 0.34 removed V1: the setting is a start-up error there (engine/rules.py env_errors).
                        if (rules or _fit_rules(ov)).v1_runner_selectable
                        else ""))
    # Which vLLM the step costs stand for: the tables read, or those the prior's overheads were fitted on.
    versions = sorted({x.modelled_vllm for x in tables} if tables else {ov.get("vllm_version", DEFAULT_TABLE_VLLM)})
    used = ", ".join(versions)
    widened = ""
    if wanted:
        if wanted not in versions:
            widened = wanted
            f = UNCALIBRATED_VERSION_BAND_FACTOR
            per_batch = {b: replace(sc, uncertainty=sc.uncertainty * f,
                                    uncertainty_by_k={k: u * f for k, u in sc.uncertainty_by_k.items()})
                         for b, sc in per_batch.items()}
            what = ("no step-cost table" if measured_method else
                    f"no step-cost table for method {d.method} (its tables measure draft_model)")
            notes.append(f"step costs from vLLM {used} tables: vLLM {wanted} has {what}, so the band is "
                         f"widened x{f:g} (speedup.stepcost UNCALIBRATED_VERSION_BAND_FACTOR)")
        else:
            notes.append(f"step costs from vLLM {wanted} tables")
    return StepCostModel(target=t.name, draft=d.name, gpu=g.name, tp=tp, context_len=context_len,
                         source=sources.pop() if len(sources) == 1 else "mixed: " + ", ".join(sorted(sources)),
                         per_batch=per_batch, notes=notes, tables=tables, vllm_version=used, widened_for=widened)


@dataclass
class CalibrationPoint:
    """One measured (configuration, batch, K) of a calibration table, with the roofline prior there."""

    table: object  # calibrate.CalibrationTable
    group: str  # configuration id
    target: object  # ModelSpec
    draft: object
    gpu: object  # GpuSpec
    batch: int
    k: int
    context_len: int
    row: dict  # the table's spec row
    base_row: dict  # the table's baseline row at this batch
    measured: float  # steady-state TPOT speedup at the table's synthetic acceptance (CalibrationTable.speedup)
    step_ms: float  # steady-state speculative step (CalibrationTable.spec_step_ms)
    prior: StepCost  # roofline with `overheads` (all zero when overheads == ZERO_OVERHEADS)


def calibration_points(tables, *, overheads: dict | None = None, include_held_out: bool = False):
    """Every measured (table, batch, K) usable for fitting or scoring, with its prior step cost.

    Skips tables of real (non-synthetic) rejection, whose acceptance is not the nominal one, tables of
    HELD_OUT_TARGETS (unless `include_held_out`: scoring them, never fitting), tables of models or GPUs outside
    the catalog (e.g. a CPU test run) and tables of a drafter that is not a draft model (an EAGLE/MTP head, n-gram:
    vLLM 0.34's lease stored them beside the draft_model tables so that their layouts rest on them, but the fitted
    terms are draft_model's). The one loop that fitting and the leave-one-out benchmark share."""
    for t in tables:
        if not t.provenance.get("synthetic", True) or (t.target in HELD_OUT_TARGETS and not include_held_out):
            continue
        if _norm_method_name(t.draft) in NO_FORWARD_METHODS:
            continue
        try:
            target, draft, gpu = model_spec(t.target), model_spec(t.draft), gpu_spec(t.gpu)
        except DraftfitError:
            continue
        if getattr(draft, "method", "draft_model") != "draft_model":
            continue
        group = t.configuration
        for b in t.batches:
            for k in t.ks:
                measured, step = t.speedup(k, b), t.spec_step_ms(k, b)
                row = t.spec[str(k)].get(str(b), {})
                if not measured or not step:
                    continue
                ctx = row_context_len(row)
                prior = prior_step_cost(target, draft, gpu, batch=b, k_values=[k], tp=t.tp, context_len=ctx,
                                        overheads=overheads)
                yield CalibrationPoint(table=t, group=group, target=target, draft=draft, gpu=gpu, batch=b, k=k,
                                       context_len=ctx, row=row, base_row=t.baseline[str(b)], measured=measured,
                                       step_ms=step, prior=prior)


def _norm_method_name(name: str) -> str:
    return str(name).strip().lower().replace("-", "_")


_FITTED: dict = {}  # modelled vLLM -> the fit on the shipped tables


_FITTED_BY_TABLES: dict = {}


def fitted_overheads(calibration_dir=None, tables=None, tables_key: str | None = None, without=()) -> dict:
    """The prior's overhead constants refitted on calibration tables (all of them, or `tables`) of one modelled
    vLLM, by least squares on measured minus roofline step costs, relative to the measured step (the error that
    matters is relative):
      plain step:       gap = plain_ms + batch x plain_seq_ms
      speculative step: step - verify = first-pass roofline (over the B x (K+1) verified tokens; in a version
                                where it does not hide, the max() below)
                              + (K - 1) x max(draft roofline, draft layers x draft_layer_ms)
                              + spec_ms + batch x spec_seq_ms (+ the MoE layers' per-token work)
      where B x (K+1) tokens miss the CUDA graphs, the verify is max(its roofline + MoE work, its launch time)
      and the first pass max(its roofline, its launch time) (eager_forward_ms; measured, not fitted)
    All coefficients are kept non-negative; the max() makes the fit piecewise linear (_fit_spec_terms).
    Speculative step costs are the steady-state ones (CalibrationTable.spec_step_ms: medians of repeats, the
    offline run's batch drain taken out, draftfit/drain.py).

    Versions: the overheads are what changed most between vLLM 0.26 and 0.33 (0.33 runs draft_model's K passes
    without CUDA graphs, with async scheduling on), so each modelled version is fitted on its own tables only.
    vLLM 0.26's fit starts from the priors; a later version's starts from 0.26's fit, which stands in for a term
    none of its tables exercises (`tp1_only` says when its tables hold no TP>1 pair). A version with no table of
    its own gets 0.26's fit (and step_cost_model widens the band). `tables_key` (VllmRules.tables_key) None is 0.26.
    `without`: fitted terms left out of both fits (0.26's and the version's), each held at 0: the ablation of
    bench/speedup.py --ablate; such a fit is not cached."""
    wanted = tables_key_of(tables_key)
    without = tuple(sorted(without))
    default = calibration_dir is None and tables is None and not without
    if default and wanted in _FITTED:
        return _FITTED[wanted]
    disk_key = _disk_key(calibration_dir, wanted) if tables is None and not without else None
    if disk_key is not None:
        cached = _read_disk_fit(disk_key)
        if cached is not None:
            if default:
                _FITTED[wanted] = cached
            return cached
    if tables is None:
        tables = load_tables(calibration_dir)
    out = _fit_overheads(tables_of_version(tables, None), PRIOR_OVERHEADS, without)
    out["vllm_version"] = DEFAULT_TABLE_VLLM
    own = tables_of_version(tables, wanted) if wanted != DEFAULT_TABLE_VLLM else []
    if own:
        prior = dict({k: out[k] for k in PRIOR_OVERHEADS}, vllm_version=wanted)
        out = _fit_overheads(own, prior, without)
        if all(t.tp == 1 for t in own):
            out["tp1_only"] = 1.0  # said by step_cost_model at TP>1
    elif wanted != DEFAULT_TABLE_VLLM:
        out["stands_in_for"] = wanted  # no table of the wanted version: 0.26's constants stand in
    if default:
        _FITTED[wanted] = out
    if disk_key is not None:
        _write_disk_fit(disk_key, out)
    return out


def _fit_overheads(tables, prior: dict, without=()) -> dict:
    """fitted_overheads' least squares over `tables` (one modelled vLLM), starting from `prior`, with the terms in
    `without` left out (held at 0)."""
    unknown = set(without) - set(PRIOR_OVERHEADS)
    if unknown:
        raise ValueError(f"not fitted terms: {sorted(unknown)} (fitted: {list(PRIOR_OVERHEADS)})")
    prior = dict(prior, **{t: 0.0 for t in without})
    # load_tables keeps the parsed tables while their files are unchanged, so their identities key the fit: rank
    # asks once per candidate and must not refit 150 points each time.
    tables_key = (tuple(id(t) for t in tables), tuple(sorted(prior.items())), tuple(sorted(without)))
    if tables_key in _FITTED_BY_TABLES:
        return dict(_FITTED_BY_TABLES[tables_key][1])
    plain_rows, plain_gaps, samples = [], [], []
    seen_base = set()
    hidden = first_pass_hidden(prior)
    for pt in calibration_points(tables, overheads=ZERO_OVERHEADS):
        key = (pt.table.target, pt.table.gpu, pt.table.tp, pt.batch)
        base_ms = pt.base_row.get("step_ms")
        if base_ms and key not in seen_base:  # a baseline shared by two tables counts once
            seen_base.add(key)
            w = 1.0 / base_ms
            plain_rows.append([w, pt.batch * w])
            plain_gaps.append((base_ms - pt.prior.base_step_ms) * w)
        # With every overhead zero the prior's draft pass is the draft's roofline and its verify the target's.
        samples.append(_SpecSample(
            w=1.0 / pt.step_ms, step_ms=pt.step_ms, k=pt.k, layers=pt.draft.num_layers, draft_roofline_ms=pt.prior.draft_forward_ms, verify_ms=pt.prior.verify_gpu_ms[pt.k],
            verify_host_ms=pt.prior.verify_host_ms[pt.k],
            first_roofline_ms=pt.prior.draft_first_ms.get(pt.k, pt.prior.draft_forward_ms),
            features=overhead_features(pt.target, pt.draft, batch=pt.batch, k=pt.k), hidden_first=hidden))
    out = dict(prior, n_plain=len(plain_gaps), n_spec=len(samples))
    plain_terms = [j for j, t in enumerate(PLAIN_TERMS) if t not in without]
    if len(plain_gaps) >= 2 and plain_terms:
        coef = _nonneg_lstsq([[r[j] for j in plain_terms] for r in plain_rows], plain_gaps)
        out.update({PLAIN_TERMS[j]: c for j, c in zip(plain_terms, coef)})
    if len(samples) >= MIN_SPEC_SAMPLES:
        out.update(_fit_spec_terms(samples, out[HOST_TERM], without))
    _FITTED_BY_TABLES[tables_key] = (list(tables), out)  # the tables are held so their ids stay theirs
    return dict(out)


def _disk_key(calibration_dir, tables_key: str = DEFAULT_TABLE_VLLM) -> str | None:
    """A fingerprint of everything the fit reads: the table files (name, size, mtime) and the code that turns
    them into points (this module, the table reader, the drain correction). Every fresh process (each `draftfit
    rank`) would otherwise refit ~150 points, about 0.1 s of its 0.5 s budget."""
    try:
        folder = Path(calibration_dir or CALIBRATION_DIR)
        files = [(p.name, st.st_size, st.st_mtime_ns) for p in sorted(folder.glob("*.json")) for st in [p.stat()]]
        code = [(Path(f).name, st.st_size, st.st_mtime_ns)
                for f in (__file__, _tables_module.__file__, _drain_module.__file__) for st in [os.stat(f)]]
    except OSError:
        return None
    # the fitted terms too: a fit cached under another term list is never read back (PRIOR_OVERHEADS names them)
    terms = list(PRIOR_OVERHEADS)
    return hashlib.sha256(json.dumps([str(folder.resolve()), files, code, tables_key, terms]).encode()).hexdigest()[:20]


def _fit_cache_path(key: str) -> Path:
    return cache_dir() / "fitted-overheads" / f"{key}.json"


def _read_disk_fit(key: str) -> dict | None:
    data = read_json(_fit_cache_path(key))  # None: none yet, or unreadable: refit
    # exactly today's fitted terms: a fit of another term list (a removed term, draft_seq_ms, ...) is refitted
    ok = isinstance(data, dict) and all(isinstance(data.get(k), (int, float)) for k in PRIOR_OVERHEADS) \
        and {k for k in data if k.endswith("_ms")} == set(PRIOR_OVERHEADS)
    return data if ok else None


def _write_disk_fit(key: str, fit: dict) -> None:
    write_json_atomic(_fit_cache_path(key), fit)  # a read-only cache only costs the refit


@dataclass
class _SpecSample:
    """One measured speculative step, reduced to what fitting the overheads needs."""

    w: float  # 1 / measured step (relative errors)
    step_ms: float
    k: int
    layers: int
    draft_roofline_ms: float  # a loop pass (one token per sequence)
    first_roofline_ms: float  # the first pass, over the verified tokens (first_pass_roofline_ms)
    verify_ms: float  # roofline of the target's verify pass
    features: list  # overhead_features()
    hidden_first: bool = True  # FIRST_DRAFT_PASS_HIDDEN of the version fitted
    verify_host_ms: float = 0.0  # the verify's eager launch time where it misses the CUDA graphs (eager_forward_ms)

    def verify_and_features(self, moe_ms_per_unit: float) -> tuple[float, list]:
        """The verify's cost and the linear features left, given the MoE per-token coefficient: an eager verify
        whose launch outlasts its GPU work (roofline + MoE work) costs its launch time, and the MoE work hides."""
        feats = list(self.features)
        if self.verify_host_ms > self.verify_ms + moe_ms_per_unit * feats[_MOE_FEATURE]:
            feats[_MOE_FEATURE] = 0.0
            return self.verify_host_ms, feats
        return self.verify_ms, feats


_MOE_FEATURE = SPEC_TERMS.index("moe_token_layer_ms")


def _fit_spec_terms(samples: list, layer_ms: float, without=()) -> dict:
    """SPEC_TERMS and the per-layer host cost (HOST_TERM, starting from `layer_ms`) by non-negative least squares. A
    draft loop pass is max(roofline, layers x host cost) (draft_passes_ms): linear in the host cost where the host
    binds, so alternate between choosing the binding side per sample and solving the linear problem until the choice
    is stable (from the prior and two other starts; the smallest squared relative error wins). A term that no sample
    exercises keeps its prior (left out of the fit), and so does one in `without` (held at its prior, which
    _fit_overheads set to 0)."""
    terms = list(SPEC_TERMS) + ([] if HOST_TERM in without else [HOST_TERM])
    kept = [0.0 if t in without else 1.0 for t in SPEC_TERMS]  # an absent term's column is zero: never fitted

    moe_term = SPEC_TERMS[_MOE_FEATURE]

    def solve(h: dict):
        rows, gaps = [], []
        for s in samples:
            fixed_ms, host_layers = draft_loop_split(s.k, s.draft_roofline_ms, s.layers, h[HOST_TERM], s.hidden_first,
                                                     s.first_roofline_ms, s.verify_ms)
            verify_ms, feats = s.verify_and_features(h[moe_term])
            feats = [f * m for f, m in zip(feats, kept)]
            fixed = verify_ms + fixed_ms
            host_col = [] if HOST_TERM in without else [host_layers]
            rows.append([f * s.w for f in feats + host_col])
            gaps.append((s.step_ms - fixed) * s.w)
        used = [j for j in range(len(terms)) if any(r[j] for r in rows)]
        coef = dict(zip((terms[j] for j in used), _nonneg_lstsq([[r[j] for j in used] for r in rows], gaps)))
        return coef, {HOST_TERM: coef.get(HOST_TERM, h[HOST_TERM]), moe_term: coef.get(moe_term, 0.0)}

    def sse(coef: dict, h: dict) -> float:
        total = 0.0
        for s in samples:
            verify_ms, feats = s.verify_and_features(coef.get(moe_term, 0.0))
            pred = verify_ms + draft_passes_ms(s.k, s.draft_roofline_ms, s.layers, h[HOST_TERM], s.hidden_first,
                                               s.first_roofline_ms, s.verify_ms) \
                + sum(coef.get(t, 0.0) * f for t, f in zip(SPEC_TERMS, feats))
            total += ((s.step_ms - pred) * s.w) ** 2
        return total

    # The binding side of each max() (a draft loop pass's roofline or launch, an eager verify's GPU work or
    # launch) depends on the coefficients: alternate until the choices are stable.
    alternated = [HOST_TERM, moe_term]
    best = None
    for start in (layer_ms, 0.05, 0.4):
        h = {HOST_TERM: 0.0 if HOST_TERM in without else start, moe_term: 0.0}
        for _ in range(20):
            coef, new_h = solve(h)
            if all(abs(new_h[t] - h[t]) < 1e-12 for t in alternated):
                break
            h = new_h
        err = sse(coef, new_h)
        if best is None or err < best[0]:
            best = (err, coef, new_h)
    _, coef, h = best
    out = {t: coef[t] for t in SPEC_TERMS if t in coef}
    if HOST_TERM not in without:
        out[HOST_TERM] = h[HOST_TERM]
    return out


def _nonneg_lstsq(rows, ys) -> list[float]:
    """Least squares with every coefficient >= 0 (solve; drop the most negative column; repeat), in plain
    Python: the base install (catalog ranking) has no numpy."""
    n = len(rows[0])
    coef = [0.0] * n
    active = list(range(n))
    while active:
        sol = _solve_normal([[r[j] for j in active] for r in rows], ys)
        if sol is None:
            active.pop()
            continue
        if all(v >= 0 for v in sol):
            for j, v in zip(active, sol):
                coef[j] = v
            break
        active.pop(min(range(len(sol)), key=lambda i: sol[i]))
    return coef


def _solve_normal(A, y):
    """(A^T A) x = A^T y by Gaussian elimination with partial pivoting; None when singular."""
    m = len(A[0])
    M = [[sum(r[i] * r[j] for r in A) for j in range(m)] + [sum(r[i] * v for r, v in zip(A, y))] for i in range(m)]
    for c in range(m):
        p = max(range(c, m), key=lambda r: abs(M[r][c]))
        if abs(M[p][c]) < 1e-12:
            return None
        M[c], M[p] = M[p], M[c]
        for r in range(m):
            if r != c:
                f = M[r][c] / M[c][c]
                M[r] = [a - f * b for a, b in zip(M[r], M[c])]
    return [M[i][m] / M[i][i] for i in range(m)]


def row_context_len(row: dict) -> int:
    """Mean context of a calibration row's timed decode: the prompt plus half the generated tokens."""
    return int(row.get("prompt_len", 64) + row.get("max_tokens", 96) / 2)
