#!/usr/bin/env python3
"""vLLM 0.34 on one H200 (issue 38): draftfit's predictions for every engine of phases M034 and S034, written before
any of them ran, and their score once the raw files are home.

    .venv/bin/python bench/preregister_v034.py --write          # once, before the lease (never rewritten)
    .venv/bin/python bench/preregister_v034.py --score RAW...   # after: the lane files of M034/S034 (writes the
                                                                # docs/benchmarks.md section vllm034-preregistered)

Memory: memory.plan.predict_record on the record bench/memory.py will write for each engine (vLLM 0.34 rules:
extensible KV sizing, block 64, util unset -> 1.0), KV tokens with band; goal: within 1 % of `GPU KV cache size`.
Step costs: speedup.predict.predict_speedup at vLLM 0.34 (no 0.34 table: 0.26's tables / overheads stand in for the
CUDA-graphed draft loop, band widened x1.5), per (K, batch); n-gram's comparable quantity is its step time (its
acceptance is not imposed: placeholders of unmatched lookups are always rejected).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gpu_campaign  # noqa: E402

PREDICTIONS = ROOT / "draftfit" / "data" / "predictions"
MEMORY_OUT = PREDICTIONS / "2026-12-04_vllm034_memory__H200.json"
STEP_OUT = PREDICTIONS / "2026-12-04_vllm034_stepcost__H200__tp1__a0.8.json"
VLLM = "0.34.0"
GPU_TOTAL_GIB = 139.81  # one H200 as torch reports it (the 0.26/0.33 records' total_gib)
CONTEXT_LEN = 112  # prompt 64 + half of 96 decoded tokens: the timed engines' mean context (preregister_head.py)
COMMAND = ".venv/bin/python bench/preregister_v034.py --write"
GPU = "H200"
# --gpu H100-80GB (2026-12-05: the lent kind moved to H100 while H200s were refused): the same engines predicted for
# an H100, a GPU no 0.34 (or any) table was measured on, written to their own files before anything ran there.
OTHER_GPUS = {"H100-80GB": ("2026-12-05", 79.19)}  # torch total_memory 81082-81090 MiB (catalogs/gpus.yaml)


# --round 2 (2026-12-05, before the third 0.34 lease): the model after the first two leases were ingested and refit
# (the 0.34 draft_model overheads, bench/speedup.py --refit 0.34; the KV reserve's reservation growth,
# bench/memory034.py), predicted again for every engine, on either GPU, into files of their own. Round 1's files stay
# as they were and are scored as they were.
ROUNDS = {2: "2026-12-05-r2"}
ROUND = 1
STEP_MODEL = {
    1: "speedup.predict.predict_speedup at vllm_version 0.34.0: no 0.34 table, so 0.26's tables and fitted overheads "
       "(a CUDA-graphed draft loop, FIRST_DRAFT_PASS_HIDDEN['0.34']) with the band widened x1.5 "
       "(UNCALIBRATED_VERSION_BAND_FACTOR)",
    2: "speedup.predict.predict_speedup at vllm_version 0.34.0 after the first two leases: the pair's own 0.34 table "
       "where one exists for this GPU (Llama-3.1-8B + Llama-3.2-1B: H200 K4, H100 K1/2/3/6; Llama-3.1-8B n-gram and "
       "EAGLE-3 K3: H100 only), else the 0.34 draft_model overheads refit on those two Llama tables "
       "(stepcost.fitted_overheads(tables_key='0.34')); heads and n-gram by their method's step path"}
MEMORY_MODEL_R2 = ("; round 2: the KV reserve takes torch's reservation growth (memory.plan.SIZING_PEAK_FACTOR "
                   "1.32, bench/memory034.py) and the margin scales with the allocated peak")


def use_gpu(name: str, rnd: int = 1) -> None:
    """Point the module at `name`'s prediction files of round `rnd` and its memory total (round 1, H200: the
    2026-12-04 files)."""
    global GPU, GPU_TOTAL_GIB, MEMORY_OUT, STEP_OUT, COMMAND, ROUND
    ROUND = rnd
    if name != "H200":
        GPU_TOTAL_GIB = OTHER_GPUS[name][1]
    GPU = name
    if rnd == 1 and name == "H200":
        return
    date = ROUNDS[rnd] if rnd != 1 else OTHER_GPUS[name][0]
    MEMORY_OUT = PREDICTIONS / f"{date}_vllm034_memory__{name}.json"
    STEP_OUT = PREDICTIONS / f"{date}_vllm034_stepcost__{name}__tp1__a0.8.json"
    COMMAND = f".venv/bin/python bench/preregister_v034.py --gpu {name}" + (f" --round {rnd}" if rnd != 1 else "") \
        + " --write"


def engines() -> list[dict]:
    """Every engine of M034 and S034 in run order (S034's list holds S034-first's)."""
    table = gpu_campaign.phases034()
    return [c for ph in ("M034", "S034") for _, _, _, lane in table[ph] for c in lane]


def memory_record(spec: dict) -> dict:
    """The record bench/memory.py record_from_engine writes for `spec`, less what the log adds."""
    cfg = lambda d: json.loads((Path(d) / "config.json").read_text()) if d else None  # noqa: E731
    method = spec.get("method") or "draft_model"
    has_folder = bool(spec.get("k")) and method not in ("ngram", "mtp")
    return {"backend": "gpu", "target": spec["target"], "target_config": cfg(spec["target_dir"]),
            "draft": spec["draft"] if has_folder else None,
            "draft_config": cfg(spec["draft_dir"]) if has_folder else None,
            "speculative_method": method if spec.get("k") else None,
            "num_speculative_tokens": int(spec.get("k") or 0) if has_folder else 0, "gpu": GPU,
            "gpu_total_gib": GPU_TOTAL_GIB, "tp": spec.get("tp", 1), "util": spec.get("util"),
            "max_model_len": spec["max_model_len"], "max_num_seqs": spec.get("max_num_seqs"),
            "max_num_batched_tokens": None, "entrypoint": "llm", "vllm_version": VLLM, "load_format": "dummy",
            "disable_hybrid_kv_cache_manager": bool((spec.get("engine_kwargs") or {}).get(
                "disable_hybrid_kv_cache_manager"))}


def predict_memory(spec: dict) -> dict:
    from draftfit.memory.plan import predict_record

    plan = predict_record(memory_record(spec))
    return {"id": spec["id"], "target": spec["target"], "draft": spec.get("draft") if spec.get("k") else None,
            "method": (spec.get("method") or "draft_model") if spec.get("k") else None, "k": spec.get("k", 0),
            "util": spec.get("util"), "max_model_len": plan.max_model_len, "max_num_seqs": plan.max_num_seqs,
            "kv_tokens": plan.kv_tokens, "kv_tokens_band": [plan.kv_tokens_low, plan.kv_tokens_high],
            "kv_blocks": plan.kv_blocks, "block_size": plan.block_size, "kv_cache_groups": plan.kv_cache_groups,
            "weights_gib": plan.weights_gib, "peak_activation_gib": plan.peak_activation_gib,
            "cudagraph_pool_gib": plan.cudagraph_gib, "kv_pool_gib": plan.kv_pool_gib,
            "requested_gib": plan.requested_gib,
            "note": next((n for n in plan.notes if "extensible" in n), "")}


def _drafter(spec: dict):
    from draftfit.catalog.specs import method_drafter, resolve_model

    target = resolve_model(spec["target_dir"], allow_hub=False)
    if spec.get("method") == "ngram":
        return target, method_drafter("ngram", target)
    return target, resolve_model(spec["draft_dir"], allow_hub=False)


def predict_steps() -> list[dict]:
    """One prediction per (target, drafter) of S034, over the K it measures and the batch sizes."""
    from draftfit.catalog.specs import resolve_gpu
    from draftfit.engine import resolve_target
    from draftfit.speedup.predict import predict_speedup

    groups: dict = {}
    for spec in gpu_campaign.phases034()["S034"][0][3]:
        if spec.get("k"):
            key = (spec["target"], spec.get("draft"), spec.get("method") or "draft_model")
            groups.setdefault(key, {"spec": spec, "ks": set()})["ks"].add(int(spec["k"]))
    out = []
    for (target_name, draft_name, method), g in groups.items():
        target, draft = _drafter(g["spec"])
        batches = tuple(g["spec"]["batches"])
        pred = predict_speedup(target, draft, resolve_gpu(GPU), tp=1, acceptance=g["spec"]["acceptance"],
                               batches=batches, k_values=sorted(g["ks"]), context_len=CONTEXT_LEN,
                               rules=resolve_target(VLLM).rules)
        out.append({"target": target_name, "draft": draft_name, "method": method, "ks": sorted(g["ks"]),
                    "alpha": g["spec"]["acceptance"], "source": pred.source,
                    "batches": {str(b): {"base_step_ms": round(bp.base_step_ms, 4), "best_k": bp.best_k,
                                         "per_k": {str(k): {"speedup": round(v["speedup"], 4),
                                                            "low": round(v["low"], 4), "high": round(v["high"], 4),
                                                            "spec_step_ms": round(v["spec_step_ms"], 4)}
                                                   for k, v in bp.per_k.items()}}
                                for b, bp in pred.batches.items()},
                    "notes": pred.notes})
    return out


def _stamp() -> dict:
    import subprocess

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"command": COMMAND, "created_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "draftfit_parent_commit": head}


def write() -> int:
    for path in (MEMORY_OUT, STEP_OUT):
        if path.exists():
            print(f"{path.relative_to(ROOT)} exists: a pre-registration is written once", file=sys.stderr)
            return 1
    mem = {"what": f"draftfit's pre-registered KV tokens of every engine of phases M034 and S034 (vLLM 0.34.0, one "
                   "{GPU}, dummy weights), written before any ran; nothing of them is fitted. Score: `GPU KV cache "
                   "size: N tokens` of each engine's log against kv_tokens, goal within 1 %; the band is the model's "
                   "own (peak, non-torch, graph pool, sizing-step reservation growth). Do not "
                   "regenerate.",
           "measured_by": "python3 bench/gpu_campaign.py --phase M034 then --phase S034 (resume with --skip)",
           "model": "draftfit/memory/plan.py kv_budget, engine/rules.py VLLM_RULES['0.34'] (kv_sizing measured: "
                    "v1/worker/extensible_kv_cache.py measure_kv_cache_bytes; block 64; util None -> 1.0; "
                    "drafter CUDA graphs projected with the V2 per-graph constant)"
                    + (MEMORY_MODEL_R2 if ROUND == 2 else ""),
           **_stamp(), "predictions": [predict_memory(s) for s in engines()]}
    steps = {"what": "draftfit's pre-registered step costs and speedups of phase S034's engines (vLLM 0.34.0, one "
                     f"{GPU}, synthetic acceptance 0.8, batches 1-128), written before any ran. Score: steady-state "
                     "TPOT speedup and spec step ms per (K, batch) of the ingested 0.34 tables, goal within 15 %, best "
                     "K right; n-gram: spec_step_ms only (its acceptance is measured, not imposed). Do not "
                     "regenerate.",
             "measured_by": "python3 bench/gpu_campaign.py --phase S034",
             "model": STEP_MODEL[ROUND],
             "context_len": CONTEXT_LEN, **_stamp(), "predictions": predict_steps()}
    MEMORY_OUT.write_text(json.dumps(mem, indent=1) + "\n")
    STEP_OUT.write_text(json.dumps(steps, indent=1) + "\n")
    print(f"wrote {MEMORY_OUT.relative_to(ROOT)} ({len(mem['predictions'])} engines), "
          f"{STEP_OUT.relative_to(ROOT)} ({len(steps['predictions'])} drafters)")
    return 0


def score_memory(raw_paths: list[Path]) -> tuple[list, list]:
    """Each engine's `GPU KV cache size` (bench.memory.record_from_engine on the lane files) against the committed
    prediction of its id: rows and relative errors. Engines not pre-registered are left out."""
    from bench.memory import record_from_engine

    committed = {p["id"]: p for p in json.loads(MEMORY_OUT.read_text())["predictions"]}
    rows, errors = [], []
    for path in raw_paths:
        for entry in json.loads(Path(path).read_text()).get("configs", []):
            pk = committed.get(entry.get("id"))
            rec = record_from_engine(entry, Path(path).name) if pk else None
            if rec is None:
                continue
            err = pk["kv_tokens"] / rec["kv_tokens"] - 1
            lo, hi = pk["kv_tokens_band"]
            errors.append(err)
            rows.append([entry["id"], f"{pk['kv_tokens']:,} [{lo:,}-{hi:,}]", f"{rec['kv_tokens']:,}", f"{err:+.2%}",
                         "yes" if lo <= rec["kv_tokens"] <= hi else "no"])
    return rows, errors


def score_steps(raw_paths: list[Path]) -> tuple[list, list]:
    """The committed speedups and step times against the tables the S034 lane files make (calibration.tables
    tables_from_results): rows and relative speedup errors (n-gram: step-time errors, its acceptance not imposed)."""
    from draftfit.calibration.tables import engine_results_from_campaign, tables_from_results

    results = []
    for path in raw_paths:
        results += engine_results_from_campaign(Path(path))
    tables = {(t.target, t.draft): t for t in tables_from_results(results)}
    rows, errors = [], []
    for pred in json.loads(STEP_OUT.read_text())["predictions"]:
        table = tables.get((pred["target"], pred["draft"]))
        if table is None:
            continue
        for b, row in pred["batches"].items():
            for k, pk in row["per_k"].items():
                measured, step = table.speedup(int(k), int(b)), table.spec_step_ms(int(k), int(b))
                if measured is None or step is None:
                    continue
                err = (pk["spec_step_ms"] / step - 1) if pred["method"] == "ngram" else (pk["speedup"] / measured - 1)
                errors.append(err)
                rows.append([f"{pred['target']} + {pred['draft']}", b, k,
                             f"{pk['speedup']:.2f} [{pk['low']:.2f}-{pk['high']:.2f}]", f"{measured:.2f}",
                             f"{pk['spec_step_ms']:.1f} / {step:.1f}", f"{err:+.0%}"])
    return rows, errors


def score(raw_paths: list[Path]) -> str:
    from bench._readme import markdown_table

    mem_rows, mem_err = score_memory(raw_paths)
    step_rows, step_err = score_steps(raw_paths)
    created = json.loads(MEMORY_OUT.read_text())["created_utc"]
    text = (f"vLLM 0.34.0 on one {GPU}, scored against the predictions committed in "
            f"`{MEMORY_OUT.relative_to(ROOT)}` and `{STEP_OUT.relative_to(ROOT)}` ({created} UTC, `{COMMAND}`). "
            f"KV tokens: {sum(abs(e) <= 0.01 for e in mem_err)} of {len(mem_err)} engines within 1 %"
            + (f", mean abs error {sum(map(abs, mem_err)) / len(mem_err):.2%}" if mem_err else "")
            + f". Speedup (n-gram: step time): {sum(abs(e) <= 0.15 for e in step_err)} of {len(step_err)} points "
            f"within 15 %" + (f", mean abs error {sum(map(abs, step_err)) / len(step_err):.0%}" if step_err else "")
            + ". Nothing was fitted on these engines.\n\n"
            + markdown_table(["engine", "predicted KV tokens [band]", "vLLM", "error", "in band"], mem_rows)
            + ("\n\n" + markdown_table(["pair", "batch", "K", "predicted speedup [band]", "measured",
                                          "spec step ms predicted / measured", "error"], step_rows)
               if step_rows else ""))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write both prediction files (never over existing ones)")
    ap.add_argument("--show", action="store_true", help="print the predictions without writing")
    ap.add_argument("--score", nargs="+", type=Path, metavar="RAW", help="score against M034/S034 lane files")
    ap.add_argument("--no-readme", action="store_true", help="with --score: print only")
    ap.add_argument("--gpu", default="H200", choices=["H200", *OTHER_GPUS],
                    help="whose prediction files (round 1: H200 2026-12-04, H100-80GB 2026-12-05)")
    ap.add_argument("--round", type=int, default=1, choices=[1, *ROUNDS],
                    help="which pre-registration: 1 (before the first leases) or 2 (after their refit, 2026-12-05)")
    args = ap.parse_args(argv)
    use_gpu(args.gpu, args.round)
    section_suffix = ("" if GPU == "H200" else f"-{GPU}") + ("" if args.round == 1 else f"-r{args.round}")
    if args.write:
        return write()
    if args.score:
        missing = [p for p in args.score if not p.is_file()]
        if missing:
            ap.error(f"{missing[0]} is not a file: pass the M034_*/S034_* lane files (data/calibration/raw/...)")
        text = score(args.score)
        print(text)
        if not args.no_readme:
            from bench._readme import write_section
            write_section("vllm034-preregistered" + section_suffix, text,
                          command=f".venv/bin/python bench/preregister_v034.py --gpu {GPU} --round {args.round} "
                          "--score " + " ".join(str(p) for p in args.score))
        return 0
    if args.show:
        for p in (predict_memory(s) for s in engines()):
            print(f"{p['id']:58s} {p['kv_tokens']:>9,} [{p['kv_tokens_band'][0]:,}, {p['kv_tokens_band'][1]:,}]")
        return 0
    ap.error("give --write or --show")
    return 2


if __name__ == "__main__":
    sys.exit(main())
