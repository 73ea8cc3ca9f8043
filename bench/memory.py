"""KV-cache tokens: vLLM's own number vs draftfit's prediction vs a weights-only calculator.

Reads every draftfit/data/reference/memory/*.json and writes the README section `memory`.
Run: .venv/bin/python bench/memory.py

Record format (one JSON object per file; CPU records are written by `python -m draftfit.memory.plan --record-cpu`,
GPU records by the lead from GPU runs). Required unless marked optional:

    {
      "case":        "gpu_h200_llama3.1-8b+llama3.2-1b",  # unique, also the file stem
      "backend":     "gpu",                  # or "cpu"
      "target":      "Llama-3.1-8B",         # catalog name (or any label when target_config is given)
      "target_config": {...},                # optional: the config.json used (load_format=dummy folders);
                                             #   wins over the catalog when present
      "draft":       "Llama-3.2-1B",         # null for target alone
      "draft_config": {...},                 # optional, as target_config
      "num_speculative_tokens": 4,           # K of the speculative_config (0 without a draft)
      "gpu":         "H200",                 # catalog GPU name
      "gpu_total_gib": 139.81,               # optional: torch total memory; else taken from log.total_gib,
                                             #   else from the catalog
      "tp": 1, "util": 0.9, "max_model_len": 8192,
      "max_num_seqs": 1024,                  # what the engine ran with (LLM class defaults on >=70 GiB GPUs:
      "max_num_batched_tokens": 16384,       #   1024 / 16384; `vllm serve`: 1024 / 8192)
      "entrypoint": "llm",                   # "llm" (offline LLM class) or "serve": picks defaults when the
                                             #   two fields above are absent
      "dtype": "bfloat16", "kv_cache_dtype": "auto", "quantization": "none",
      "enforce_eager": false,
      "vllm_version": "0.26.0",
      "command": "python -c ... LLM(model=..., speculative_config=...)",
      "kv_tokens": 679984,                   # vLLM's "GPU KV cache size: N tokens"
      "log": {...},                          # parse_vllm_memory_log(log_text) minus "lines": model_loading_gib,
                                             #   available_kv_gib, kv_tokens, total_gib, free_gib,
                                             #   actual_usage{weights_gib, peak_activation_gib, non_torch_gib,
                                             #   cudagraph_gib}, cudagraph_estimated_gib, model_runner, ...
      "log_lines": ["...", "..."]            # the raw matching lines, as evidence
    }
    CPU records add: "kvcache_space_gib" (VLLM_CPU_KVCACHE_SPACE), "block_size" (128), "load_format".

A GPU record can be made from a saved log with:
    .venv/bin/python -m draftfit.memory.plan --parse-log engine.log   # -> the "log" object
GPU records from the campaign files (data/calibration/raw/<date>/*.json, one record per engine start) with:
    .venv/bin/python bench/memory.py --ingest data/calibration/raw/2026-11-30/*.json
Those add "vllm_scheduler" ({max_num_batched_tokens, max_num_seqs} the engine actually ran with, from its
log and vllm_config; the two top-level fields stay null where the engine used vLLM's defaults) and
"raw_source" (file and engine id).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import gpu_campaign  # noqa: E402
from bench._readme import markdown_table, write_section  # noqa: E402
from draftfit.memory.plan import GIB, kv_bytes_per_token, predict_record, spec_from_record  # noqa: E402
from draftfit.paths import DATA_DIR  # noqa: E402

RECORDS = DATA_DIR / "reference" / "memory"
CONFIGS = DATA_DIR / "calibration" / "configs"


def _case_name(spec: dict, seqs: int, kwargs: dict | None = None) -> str:
    models = spec["target"] + (f"+{spec['draft']}_k{spec['k']}" if spec.get("draft") else "")
    # One KV-cache group instead of vLLM's hybrid groups is another layout of the same engine: its own case.
    nohma = "_nohma" if (kwargs or {}).get("disable_hybrid_kv_cache_manager") else ""
    kv = (kwargs or {}).get("kv_cache_dtype", "auto")
    kv = f"_kv{kv}" if kv != "auto" else ""
    util = "def" if spec.get("util") is None else spec["util"]  # None: left unset (vLLM 0.34's default)
    return (f"gpu_h200_{models}_tp{spec.get('tp', 1)}_u{util}_L{spec['max_model_len']}_s{seqs}"
            f"{nohma}{kv}").lower()


def record_from_engine(entry: dict, raw_name: str) -> dict | None:
    """One GPU record from one engine of a campaign file (bench/gpu_campaign.py); None if it did not start."""
    from draftfit.memory.plan import OLDEST_RULES, parse_vllm_memory_log

    log = entry.get("log") or ""
    if isinstance(log, list):
        log = "\n".join(log)
    parsed = parse_vllm_memory_log(log)
    if entry.get("status") != "ok" or "kv_tokens" not in parsed or "actual_usage" not in parsed:
        return None
    spec, result = entry["spec"], entry.get("result") or {}
    kwargs = result.get("engine_kwargs") or {}
    m = re.search(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)", log)
    ran_tokens = int(m.group(1)) if m else None
    ran_seqs = result.get("max_num_seqs") or spec.get("max_num_seqs")
    draft = spec.get("draft")
    if spec.get("method") == "ngram":
        draft = None  # n-gram lookup: no drafter model and no KV layers; the engine is the target's memory record
    rec = {
        "case": _case_name(spec, ran_seqs, kwargs), "backend": "gpu",
        "target": spec["target"], "target_config": json.loads((CONFIGS / spec["target"] / "config.json").read_text()),
        "draft": draft,
        # Method mtp drafts with the target's own layers: no draft folder, the drafter is built from the target.
        "draft_config": gpu_campaign.draft_config(spec) if draft and spec.get("method") != "mtp" else None,
        "speculative_method": spec.get("method", "draft_model") if draft else None,
        "num_speculative_tokens": int(spec.get("k") or 0) if draft else 0,
        "gpu": "H200", "gpu_total_gib": parsed.get("total_gib"), "tp": int(spec.get("tp", 1)),
        # null: gpu_memory_utilization left unset (vLLM 0.34's default, 1.0 under its extensible KV cache)
        "util": None if spec.get("util") is None else float(spec["util"]), "max_model_len": int(spec["max_model_len"]),
        # What the user set (null: vLLM's LLM-class default), and what the engine ran with.
        "max_num_seqs": kwargs.get("max_num_seqs", spec.get("max_num_seqs")),
        "max_num_batched_tokens": kwargs.get("max_num_batched_tokens"),
        "vllm_scheduler": {"max_num_batched_tokens": ran_tokens, "max_num_seqs": ran_seqs,
                           "num_gpu_blocks": result.get("num_gpu_blocks"), "block_size": result.get("block_size"),
                           "cudagraph_capture_sizes_max": max(result.get("cudagraph_capture_sizes") or [0]) or None},
        "entrypoint": "llm", "dtype": "auto", "kv_cache_dtype": kwargs.get("kv_cache_dtype", "auto"),
        "quantization": "none",
        "enforce_eager": bool(kwargs.get("enforce_eager", False)), "load_format": kwargs.get("load_format", "dummy"),
        "disable_hybrid_kv_cache_manager": bool(kwargs.get("disable_hybrid_kv_cache_manager", False)),
        "vllm_version": parsed.get("vllm_version") or result.get("vllm_version") or OLDEST_RULES.version,
        "command": "LLM(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")",
        "kv_tokens": parsed["kv_tokens"],
        "log": {k: v for k, v in parsed.items() if k != "lines"},
        "log_lines": [ln if len(ln) < 600 else ln[:600] + " ..." for ln in parsed["lines"]],
        "raw_source": {"file": f"data/calibration/raw/{raw_name}", "engine": entry.get("id"),
                       "gpu_name": result.get("gpu_name")},
    }
    prof = re.search(r"Profiling CUDA graph memory: (.*)", log)
    if prof:
        rec["log"]["cudagraph_profile"] = prof.group(1).strip()
    return rec


def ingest(paths: list[str]) -> list[Path]:
    """Write draftfit/data/reference/memory/gpu_*.json from campaign files. A case keeps its first engine start: one
    already on file is never rewritten (records fitted the memory constants; a later start of the same engine, e.g.
    a timed phase's baseline, would move them under the fit), nor by a second start in the same files."""
    written = []
    for raw in paths:
        doc = json.loads(Path(raw).read_text())
        for entry in doc.get("configs", []):
            # The campaign folder's dated subfolder stays in the reference (raw/<date>/<lane>.json).
            rel = Path(raw).resolve()
            raw_name = "/".join(rel.parts[-2:]) if rel.parent.name != "raw" else rel.name
            if rel.parent.parent.name.startswith("vllm-"):  # raw/vllm-0.34/<date>/<lane>.json
                raw_name = "/".join(rel.parts[-3:])
            rec = record_from_engine(entry, raw_name)
            if rec is None:
                continue
            out = RECORDS / f"{rec['case']}.json"
            if out in written or out.exists():
                continue
            out.write_text(json.dumps(rec, indent=1) + "\n")
            written.append(out)
    return written


def weights_only_tokens(rec: dict, plan) -> int:
    """What a generic calculator says: (util x memory - weights) / target-only KV bytes per token."""
    target = spec_from_record(rec, "target")
    kv_b = 1 if str(rec.get("kv_cache_dtype", "auto")).startswith("fp8") else (4 if plan.dtype == "float32" else 2)
    per_token = kv_bytes_per_token(target, rec.get("tp", 1), kv_b)
    if rec.get("backend") == "cpu":
        pool = rec["kvcache_space_gib"] * GIB
    else:
        pool = plan.requested_gib * GIB - plan.weights_gib * GIB
    return max(0, int(pool // per_token))


def rows() -> list[list]:
    out = []
    for path in sorted(RECORDS.glob("*.json")):
        rec = json.loads(path.read_text())
        plan = predict_record(rec)
        vllm = rec["kv_tokens"]
        naive = weights_only_tokens(rec, plan)
        err = 100 * (plan.kv_tokens - vllm) / vllm if vllm else float("nan")
        naive_err = 100 * (naive - vllm) / vllm if vllm else float("nan")
        layout = f"TP={rec.get('tp', 1)}, len {rec['max_model_len']}"
        where = (f"CPU, {rec['kvcache_space_gib']} GiB pool" if rec.get("backend") == "cpu"
                 else f"{rec['gpu']}, util " + ("unset" if rec.get("util", 0.9) is None else f"{rec.get('util', 0.9)}"))
        out.append([
            rec["case"], f"{rec['target']}" + (f" + {rec['draft']}" if rec.get("draft") else ""), where, layout,
            f"{vllm:,}", f"{plan.kv_tokens:,}", f"{err:+.2f}%", f"{naive:,} ({naive_err:+.1f}%)",
            f"vLLM {rec.get('vllm_version', '?')}",
        ])
    return out


def term_rows() -> list[list]:
    """GPU records: each modelled term against vLLM's `Actual usage is ...` line (GiB, draftfit / vLLM)."""
    out = []
    for path in sorted(RECORDS.glob("gpu_*.json")):
        rec = json.loads(path.read_text())
        plan = predict_record(rec)
        au, log = rec["log"]["actual_usage"], rec["log"]
        est = log.get("cudagraph_estimated_gib")
        out.append([
            rec["case"].removeprefix("gpu_h200_"), plan.model_runner,
            f"{plan.weights_gib:.2f} / {au['weights_gib']:.2f}",
            f"{plan.peak_activation_gib:.2f} / {au['peak_activation_gib']:.2f}",
            f"{plan.non_torch_gib:.2f} / {au['non_torch_gib']:.2f}",
            (f"{plan.cudagraph_reserved_gib:.2f} / " + (f"{est:.2f}" if est is not None else "not logged")
             if plan.model_runner == "v1" or plan.cudagraph_reserved_gib
             else "0 / 0 (V2)"),  # 0.33's V2 reserves its estimate too (docs/VLLM_VERSIONS.md)
            f"{plan.cudagraph_gib:.2f} / {au['cudagraph_gib']:.2f}",
            # 0.34's `Available KV cache memory` is only the reservation: the committed pool is `Extended KV cache`.
            f"{plan.kv_pool_gib:.2f} / {log.get('kv_gib_final', log['available_kv_gib']):.2f}",
        ])
    return out


def main() -> None:
    body = ("KV cache tokens as vLLM logs them (`KV cache size: N tokens`) against draftfit's prediction "
            "(`draftfit memory`), and against a weights-only calculator (util x memory - weights, divided by "
            "the target's KV bytes per token, ignoring the draft's KV, activations, graphs and block rounding). "
            "GPU records: vLLM 0.26.0 on one or two H200 (139.8 GiB), dummy weights, one engine start each "
            "(data/calibration/raw/, `python bench/memory.py --ingest`); the modelled terms use only shapes "
            "and engine arguments, with constants fitted once over the 22 records of 2026-11-30 "
            "(draftfit/memory.py MODEL_CONSTANTS); the 7 Qwen2.5-Coder-32B records at util 0.85, len 2048 "
            "(2026-12-01) came later and were not fitted, nor were the MoE (Qwen1.5-MoE-A2.7B, Mixtral-8x7B, their "
            "drafts) and sliding-window (Gemma-2, Gemma-3) records of the seventh session (issue 16): their MoE "
            "terms (expert workspace, shared experts) are read off vLLM 0.26's source, not fitted. Two "
            "exceptions: the attention phase of an MoE layer (MODEL_CONSTANTS fwd_attn_q_copies) is fitted on "
            "Mixtral-8x7B alone at 2048 tokens (Qwen3-30B-A3B alone shows it too but is issue 16's held-out "
            "model, in no fit); the 8192-token MoE records (pre-registered in draftfit/data/predictions/"
            "2026-12-02_moe_memory_8192__H200.json) were measured after that prediction and are not fitted. The "
            "gated-DeltaNet records (Qwen3-Next-80B-A3B's shapes at 24 of its 48 layers, alone and with its MTP "
            "layer; eleventh session) were pre-registered in 2026-12-02_hybrid_gdn_memory__H200.json from vLLM "
            "0.26's source (state size, attention block alignment, mamba groups); that prediction was +1.33 % "
            "alone and +0.74 % with MTP, and one record, alone at 8192 tokens, then fitted the CUDA-graph term "
            "of a linear-attention layer (cg_per_graph_mib_per_linear_layer); the fp8-KV record was "
            "pre-registered after that (2026-12-02_hybrid_gdn_memory_kvfp8__H200.json: +0.60 %). The same shapes' timed "
            "engines of the twelfth session (phase HS: alone and with MTP K 1-4 at 2048 tokens, 128 sequences) "
            "are records too, fitted on nothing. So are the EAGLE-3 head records of the thirteenth session "
            "(Llama-3.1-8B + a head of yuhuili's shapes K 1-5, Qwen3-8B + a head of AngelSlim's shapes K 3; phases HE "
            "and HQ), pre-registered with their speedups (draftfit/data/predictions/2026-12-02_*__EAGLE3__*.json; "
            "scored there: 12 of 12 within 1 %); after they were seen two terms were added, both read off vLLM "
            "0.26's source with no constant fitted: under dummy weights a head drafts with the target's lm_head, and "
            "an EAGLE-3 head's dummy run keeps the three target hidden states it fuses. The Qwen3-8B head's K 1, 2 "
            "and 4 records (fourteenth session, the rest of phase HQ) came after both terms and are fitted on "
            "nothing. Nor are the cross-family pairs of the eighteenth session (phase X2: Qwen3-8B + Qwen1.5-0.5B, "
            "and Qwen1.5-MoE-A2.7B + Qwen3-0.6B, whose draft's KV page is half its target's, so vLLM doubles the "
            "draft's block size; and Qwen3-8B + Qwen3-0.6B at K=6), taken from timed engines with no prediction "
            "written first: within 0.21 %. The nineteenth session's diagnostic engines (phases PG1, PG2: "
            "Qwen1.5-MoE-A2.7B with a 16-KV-head Qwen3-0.6B, Mixtral-8x7B with TinyLlama-1.1B's shapes at 4 and 16 "
            "KV heads, Mistral-7B-v0.1 with the first) are records too, fitted on nothing; one of them set a rule: "
            "Mistral-7B-v0.1 + TinyLlama-1.1B was -5.96 % with the draft's layers in a full-attention group of "
            "their own, and vLLM 0.26 gives a draft the target's model-level sliding window (CacheConfig."
            "sliding_window; memory.plan.cache_sliding_window), one group of 54 sliding layers: +0.15 % with that "
            "rule, read off vLLM's source after the record was seen (no constant changed, no other record moved).\n\n"
            + markdown_table(["case", "models", "where", "layout", "vLLM KV tokens", "draftfit", "error",
                              "weights-only (error)", "source"], rows())
            + "\n\nPer term on the GPU records, GiB, draftfit / vLLM (`Actual usage is W for weight, A for peak "
            "activation, B for non-torch memory, and C for CUDAGraph memory`; the CUDA-graph estimate is "
            "`Estimated CUDA graph memory`, subtracted before sizing KV only by the V1 runner, which vLLM 0.26 "
            "uses for `draft_model`; the V2 runner of the target alone subtracts none):\n\n"
            + markdown_table(["case", "runner", "weights", "peak activation", "non-torch", "CUDA-graph estimate",
                              "CUDA-graph actual", "KV pool"], term_rows()))
    write_section("memory", body, command="python bench/memory.py")
    print(body)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--ingest":
        for path in ingest(sys.argv[2:]):
            print(path.relative_to(DATA_DIR.parent))
    else:
        main()
