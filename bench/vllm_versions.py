"""What differs between vLLM 0.26 and 0.33 in draftfit's numbers: the tables of docs/VLLM_VERSIONS.md.

Run: .venv/bin/python bench/vllm_versions.py   (prints markdown; nothing is written)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from draftfit.catalog.specs import GpuSpec, resolve_gpu, resolve_model  # noqa: E402
from draftfit.engine import resolve_target  # noqa: E402
from draftfit.memory.plan import parse_vllm_memory_log, plan_memory  # noqa: E402
from draftfit.paths import PROJECT_ROOT  # noqa: E402
from draftfit.rules import best_k  # noqa: E402
from draftfit.speedup.predict import predict_speedup  # noqa: E402

# The pairs with shipped step-cost tables (draftfit/data/calibration/), on the H200 they were measured on.
SHIPPED = [("Llama-3.1-8B", "Llama-3.2-1B", 1), ("Qwen3-8B", "Qwen3-0.6B", 1), ("Qwen3-32B", "Qwen3-1.7B", 1),
           ("Qwen2.5-Coder-32B", "Qwen2.5-Coder-7B", 1), ("Llama-3.1-70B", "Llama-3.2-1B", 2),
           ("Llama-3.1-70B", "Llama-3.1-8B", 2)]
RAW_033 = PROJECT_ROOT / "data" / "reference" / "memory" / "vllm-0.33" / "raw"


def memory_table(util=0.9, max_model_len=8192) -> str:
    rows = ["| layout (H200, util 0.9, 8192 tokens, `vllm serve` defaults) | runner 0.26 / 0.33 | CUDA graphs "
            "reserved GiB 0.26 / 0.33 | peak activation GiB 0.26 / 0.33 | KV tokens 0.26 | KV tokens 0.33 | change |",
            "|---|---|---|---|---|---|---|"]
    gpu = resolve_gpu("H200")
    for t, d, tp in SHIPPED:
        for draft in (d, None):
            p = [plan_memory(resolve_model(t), resolve_model(draft) if draft else None, gpu, tp=tp, util=util,
                             max_model_len=max_model_len, strict=False, rules=resolve_target(v).rules)
                 for v in ("0.26.0", "0.33.0")]
            name = f"{t}" + (f" + {draft} K=4" if draft else " alone") + (f" TP={tp}" if tp > 1 else "")
            ch = 100 * (p[1].kv_tokens - p[0].kv_tokens) / p[0].kv_tokens if p[0].kv_tokens else float("nan")
            rows.append(f"| {name} | {p[0].model_runner} / {p[1].model_runner} | {p[0].cudagraph_reserved_gib:.2f} / "
                        f"{p[1].cudagraph_reserved_gib:.2f} | {p[0].peak_activation_gib:.2f} / "
                        f"{p[1].peak_activation_gib:.2f} | {p[0].kv_tokens:,} | {p[1].kv_tokens:,} | {ch:+.1f} % |")
    return "\n".join(rows)


class HeldOutStart(NamedTuple):
    """One real vLLM 0.33 engine start and the engine settings draftfit's memory plan needs."""

    name: str
    log_text: str
    target: str
    draft: str | None
    k: int
    util: float
    max_model_len: int
    max_num_seqs: int


def held_out_starts() -> list[HeldOutStart]:
    """Every real 0.33 start: the memory-only starts of 2026-12-01 (named by their settings) and the 2026-12-02
    ones (spec JSON beside each log). tests/test_vllm_versions.py checks the same list."""
    import json

    out = []
    for path in sorted(RAW_033.glob("mem-*.log")) if RAW_033.is_dir() else []:
        m = re.match(r"mem-(.+?)-(?:(Llama-3\.2-1B|Qwen3-0\.6B)-k4|base)-tp1-u([0-9.]+)-L(\d+)$", path.stem)
        if m:
            out.append(HeldOutStart(path.stem, path.read_text(), m.group(1), m.group(2), 4 if m.group(2) else 0,
                                    float(m.group(3)), int(m.group(4)), 128))
    for spec_path in sorted((RAW_033 / "2026-12-02").glob("*.json")) if RAW_033.is_dir() else []:
        rec = json.loads(spec_path.read_text())
        s, k = rec["spec"], int(rec["spec"].get("k") or 0)
        out.append(HeldOutStart(f"2026-12-02/{spec_path.stem}", spec_path.with_suffix(".log").read_text(),
                                s["target"], s["draft"] if k else None, k, s["util"], s["max_model_len"],
                                rec["max_num_seqs"]))
    return out


def plan_for_start(start: HeldOutStart, total_gib: float, vllm_version: str):
    """draftfit's memory plan of a start's engine on its GPU (`total_gib` as its log says) under `vllm_version`."""
    gpu = GpuSpec(name="H200", memory_gib=total_gib, bandwidth_gbps=0, bf16_tflops=0)
    return plan_memory(resolve_model(start.target), resolve_model(start.draft) if start.draft else None, gpu,
                       util=start.util, max_model_len=start.max_model_len, max_num_seqs=start.max_num_seqs,
                       max_num_batched_tokens=16384, entrypoint="llm", num_speculative_tokens=start.k, strict=False,
                       rules=resolve_target(vllm_version).rules)


def held_out_table() -> str:
    rows = ["| vLLM 0.33.0 engine start (H200, LLM class) | max_num_seqs | vLLM KV tokens | draftfit 0.33 model "
            "| error | draftfit 0.26 model | error |", "|---|---|---|---|---|---|---|"]
    for start in held_out_starts():
        log = parse_vllm_memory_log(start.log_text)
        if "kv_tokens" not in log:
            continue
        got = [plan_for_start(start, log["total_gib"], v).kv_tokens for v in ("0.33.0", "0.26.0")]
        err = [100 * (g - log["kv_tokens"]) / log["kv_tokens"] for g in got]
        rows.append(f"| {start.name} | {start.max_num_seqs} | {log['kv_tokens']:,} | {got[0]:,} | {err[0]:+.2f} % | "
                    f"{got[1]:,} | {err[1]:+.2f} % |")
    return "\n".join(rows)


def speedup_table() -> str:
    rows = ["| pair (H200, acceptance 0.8, best K of 1-8) | TP | batch | asked for 0.26: speedup (band), K, step costs "
            "| asked for 0.33 |", "|---|---|---|---|---|"]
    gpu = resolve_gpu("H200")
    for t, d, tp in SHIPPED:
        p = [predict_speedup(resolve_model(t), resolve_model(d), gpu, tp=tp, acceptance=0.8, batches=(1, 32),
                             rules=resolve_target(v).rules) for v in ("0.26.0", "0.33.0")]
        for b in (1, 32):
            cells = []
            for q in p:
                bp = q.batches[b]
                k = best_k({kk: v["speedup"] for kk, v in bp.per_k.items()})
                r = bp.per_k[k]
                basis = "calibrated" if str(bp.source).startswith("calibrated") else "prior"
                cells.append(f"{r['speedup']:.2f}x ({r['low']:.2f}-{r['high']:.2f}), K={k}, {basis} {q.step_cost_vllm}")
            rows.append(f"| {t} + {d} | {tp} | {b} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(memory_table(), "", held_out_table(), "", speedup_table(), sep="\n")
