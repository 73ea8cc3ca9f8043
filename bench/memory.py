"""KV-cache tokens: vLLM's own number vs draftfit's prediction vs a weights-only calculator.

Reads every data/reference/memory/*.json and writes the README section `memory`.
Run: .venv/bin/python bench/memory.py

Record format (one JSON object per file; CPU records are written by `python -m draftfit.memory --record-cpu`,
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
    .venv/bin/python -m draftfit.memory --parse-log engine.log   # -> the "log" object
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._readme import markdown_table, write_section  # noqa: E402
from draftfit.memory import GIB, kv_bytes_per_token, predict_record, spec_from_record  # noqa: E402
from draftfit.paths import DATA_DIR  # noqa: E402

RECORDS = DATA_DIR / "reference" / "memory"


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
                 else f"{rec['gpu']}, util {rec.get('util', 0.9)}")
        out.append([
            rec["case"], f"{rec['target']}" + (f" + {rec['draft']}" if rec.get("draft") else ""), where, layout,
            f"{vllm:,}", f"{plan.kv_tokens:,}", f"{err:+.2f}%", f"{naive:,} ({naive_err:+.1f}%)",
            f"vLLM {rec.get('vllm_version', '?')}",
        ])
    return out


def main() -> None:
    body = ("KV cache tokens as vLLM logs them (`KV cache size: N tokens`) against draftfit's prediction "
            "(`draftfit memory`), and against a weights-only calculator (util x memory - weights, divided by "
            "the target's KV bytes per token, ignoring the draft's KV, activations, graphs and block rounding).\n\n"
            + markdown_table(["case", "models", "where", "layout", "vLLM KV tokens", "draftfit", "error",
                              "weights-only (error)", "source"], rows()))
    write_section("memory", body, command="python bench/memory.py")
    print(body)


if __name__ == "__main__":
    main()
