#!/usr/bin/env python3
"""vLLM 0.34's KV reserve: torch's reservation growth over a sizing step, fitted on one lease, scored on another.

    .venv/bin/python bench/memory034.py            # writes docs/benchmarks.md section vllm034-memory-reserve
    .venv/bin/python bench/memory034.py --no-readme

vLLM 0.34 sizes the KV cache from memory measured after warm-up (v1/worker/extensible_kv_cache.py
measure_kv_cache_bytes): it keeps free the larger of the allocated transient peak and *torch's reservation growth over
a sizing step* (fragmentation the allocated peak does not show; warmup.py). That growth cannot be read off the source;
every 0.34 start logs it ("Memory after warmup: ... (P GiB allocated at peak, G GiB of torch reservation growth)").
The pre-registered model kept the profiled peak alone (memory.plan.SIZING_PEAK_FACTOR 1.0), and every 0.34 record
came out positive (+0.41..+1.78 %). Here the factor G / (the model's peak) is fitted on one lease's engines and the KV
tokens of the other lease's engines are predicted with it, both ways; the factor stays only if that lowers the error
on the lease it was not fitted on. Records: every vLLM 0.34 engine start stored as raw lane files
(data/reference/memory/vllm-0.34/raw/, data/calibration/raw/vllm-0.34/), one record per (lease, engine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RAW_GLOBS = ("data/reference/memory/vllm-0.34/raw/*/*_gpu0*.json", "data/calibration/raw/vllm-0.34/*/*_gpu0*.json")
SECTION = "vllm034-memory-reserve"
COMMAND = ".venv/bin/python bench/memory034.py"


def records() -> list[dict]:
    """One record per (lease date, engine id) that started and logged its KV size, with the lease's GPU."""
    from bench.memory import record_from_engine

    seen, out = set(), []
    for pattern in RAW_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            lease = path.parent.name
            for entry in json.loads(path.read_text()).get("configs", []):
                rec = record_from_engine(entry, path.name)
                if rec is None or (lease, entry["id"]) in seen:
                    continue
                seen.add((lease, entry["id"]))
                gpu = ((entry.get("result") or {}).get("gpu_name") or "").replace("NVIDIA ", "")
                rec["lease"], rec["gpu_label"] = lease, gpu or "H200"
                out.append(rec)
    return out


def predict(rec: dict, factor: float):
    """draftfit's plan of `rec` with the reservation-growth factor `factor` (memory.plan.SIZING_PEAK_FACTOR)."""
    from draftfit.memory import plan as mp

    saved = mp.SIZING_PEAK_FACTOR
    mp.SIZING_PEAK_FACTOR = factor
    try:
        return mp.predict_record(rec)
    finally:
        mp.SIZING_PEAK_FACTOR = saved


def growth_ratio(rec: dict) -> float:
    """Logged torch reservation growth over the model's peak (factor 1.0) for one record."""
    growth = rec["log"]["memory_after_warmup"]["torch_reserve_growth_gib"]
    return max(1.0, growth / predict(rec, 1.0).peak_activation_gib)


def fit(recs: list[dict]) -> float:
    return round(statistics.median(growth_ratio(r) for r in recs), 3)


def errors(recs: list[dict], factor: float) -> list[float]:
    return [predict(r, factor).kv_tokens / r["kv_tokens"] - 1 for r in recs]


def _summary(errs: list[float]) -> str:
    if not errs:
        return "-"
    return (f"{statistics.mean(map(abs, errs)):.2%} mean abs, {sum(abs(e) <= 0.01 for e in errs)}/{len(errs)} within "
            f"1 % ({min(errs):+.2%}..{max(errs):+.2%})")


def report() -> str:
    from bench._readme import markdown_table

    recs = records()
    leases = sorted({r["lease"] for r in recs})
    rows, split_rows = [], []
    for r in recs:
        maw = r["log"]["memory_after_warmup"]
        p1 = predict(r, 1.0)
        rows.append([r["lease"], r["gpu_label"], r["raw_source"]["engine"], f"{r['kv_tokens']:,}",
                     f"{maw['transient_peak_gib']:.2f} / {maw['torch_reserve_growth_gib']:.2f} / {p1.peak_activation_gib:.2f}",
                     f"{growth_ratio(r):.2f}"])
    for fit_on in leases:
        train = [r for r in recs if r["lease"] == fit_on]
        test = [r for r in recs if r["lease"] != fit_on]
        f = fit(train)
        split_rows.append([f"fit on {fit_on} ({len(train)} engines, {train[0]['gpu_label']})",
                           f"the other leases ({len(test)} engines)", f"{f:.3f}",
                           _summary(errors(test, 1.0)), _summary(errors(test, f))])
    f_all = fit(recs)
    split_rows.append([f"all leases ({len(recs)} engines), in sample", "the same", f"{f_all:.3f}",
                       _summary(errors(recs, 1.0)), _summary(errors(recs, f_all))])
    from draftfit.memory import plan as mp

    shipped = mp.SIZING_PEAK_FACTOR
    text = (
        "vLLM 0.34 keeps free the larger of the allocated transient peak and torch's reservation growth over a sizing "
        "step (v1/worker/extensible_kv_cache.py measure_kv_cache_bytes; the margin scales with the allocated peak "
        "only). The growth is fragmentation: it is logged, not derivable from the source. Factor = logged growth / "
        "draftfit's modelled peak, median over the engines fitted on; error = predicted / logged `GPU KV cache size` "
        f"- 1. Shipped: `memory.plan.SIZING_PEAK_FACTOR = {shipped}`.\n\n"
        + markdown_table(["split", "predicted", "factor", "factor 1.0 (pre-registered rule)", "fitted factor"],
                         split_rows)
        + "\n\nEngines (allocated peak / reservation growth as logged / modelled peak, GiB):\n\n"
        + markdown_table(["lease", "GPU", "engine", "vLLM KV tokens", "alloc / growth / model peak",
                          "growth / model peak"], rows))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-readme", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args(argv)
    text = report()
    print(text)
    if not args.no_readme:
        from bench._readme import write_section

        write_section(SECTION, text, command=COMMAND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
