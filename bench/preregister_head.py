"""Pre-register the speedup (and, for EAGLE-3, the KV cache) draftfit predicts for a head drafter before any engine of
it is timed, then score the committed prediction against the engines (issue 16). One case per head timed:

  mtp     Qwen3-Next-80B-A3B's shapes at 24 of its 48 layers (draftfit/data/calibration/configs/
          Qwen3-Next-80B-A3B-24L) drafting with its one MTP layer (catalog.specs.mtp_drafter), K 1-3; measured by
          bench/gpu_campaign.py phase HS (twelfth session). Written as bench/preregister_mtp.py, the name in its record.
  eagle3  Llama-3.1-8B drafting with an EAGLE-3 head of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's published shapes
          (configs/EAGLE3-Llama-3.1-8B: one layer, fc fusion of three target layers, a 32000-row draft vocabulary),
          K 1-4, and the KV tokens of every engine; measured by phase HE (thirteenth session).
  eagle3-qwen3  Qwen3-8B drafting with an EAGLE-3 head of AngelSlim/Qwen3-8B_eagle3's shapes (configs/
          EAGLE3-Qwen3-8B), K 1-4 and the KV tokens; predicted by the head step model built after the eagle3 case was
          scored (speedup.stepcost.head_on_async_runner), measured by phase HQ: the check of that model.

Both: H200, TP=1, synthetic acceptance 0.8, batch 1/8/32/128, context 112 tokens (the campaign's 64-token prompts +
half of its 96 new tokens), vLLM 0.26 (the version that runs on the lent H200). The prediction is the library's own
path: speedup.predict.predict_speedup, memory.plan.predict_record on the record bench/memory.py will write.

    .venv/bin/python bench/preregister_head.py --case eagle3 [--write]     (without --write: print only)
    .venv/bin/python bench/preregister_head.py --case eagle3 --score data/calibration/raw/<date>/HE*_gpu0.json [--no-readme]

--score reads the timed engines (their steady-state speedups, calibration.tables as for every table; the table is
not written to draftfit/data/calibration, so no fit sees it) and writes the score into docs/benchmarks.md (section
<case>-preregistered).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from draftfit.calibration.tables import tables_digest  # noqa: E402
from draftfit.catalog.specs import mtp_drafter, resolve_gpu, resolve_model  # noqa: E402
from draftfit.engine import resolve_target  # noqa: E402
from draftfit.rules import NO_SPECULATION_BELOW  # noqa: E402
from draftfit.speedup.predict import predict_speedup  # noqa: E402

CONFIGS = ROOT / "draftfit" / "data" / "calibration" / "configs"
PREDICTIONS = ROOT / "draftfit" / "data" / "predictions"
BATCHES, ALPHA, CONTEXT_LEN, VLLM = (1, 8, 32, 128), 0.8, 112, "0.26.0"
# The timed engines' memory settings (bench/gpu_campaign.py MEASURE, max_num_seqs = the largest batch).
MEMORY = {"util": 0.85, "max_model_len": 2048, "max_num_seqs": 128, "gpu_total_gib": 139.81}


@dataclass(frozen=True)
class Case:
    name: str
    target_dir: Path
    head_dir: Path | None  # None: the target's own MTP layers
    method: str
    ks: tuple
    out: Path
    phase: str
    what: str  # one line on the target and drafter, for the score
    memory: bool  # whether the KV tokens of the engines are pre-registered too
    # Why the library no longer predicts what the committed record says (a model change after it was scored), or "".
    superseded: str = ""


# The fifteenth session's change after these were scored: steps over 512 tokens cost the longer of their GPU work and a
# measured launch time, and the fitted overheads lost their per-layer eager term (so every prior moved a little).
_GRAPH_MISS = ("speedup.stepcost.eager_forward_ms: a pass over more tokens than vLLM's largest CUDA graph costs the "
               "longer of its GPU work and its measured launch time, replacing a fitted per-layer term, so the other "
               "overheads were refitted")
GRAPH_MISS_CHANGE = f"the step model changed after this score ({_GRAPH_MISS})"
# And for heads on the V1 runner (the mtp case), made after its score: async scheduling's plain host overhead.
ASYNC_V1_CHANGE = (f"the step model changed after this score ({_GRAPH_MISS}; a head on the V1 runner pays a plain "
                   "step's host overhead, not draft_model's fixed cost (speedup.stepcost.heads_async_scheduling))")
CASES = {
    "mtp": Case("mtp", CONFIGS / "Qwen3-Next-80B-A3B-24L", None, "mtp", (1, 2, 3),
                PREDICTIONS / "2026-12-02_Qwen3-Next-24L__MTP__H200__tp1__a0.8.json", "HS",
                "Qwen3-Next-80B-A3B's shapes at 24 of 48 layers: 18 gated-DeltaNet, 6 full attention, 512 experts "
                "top-10 + a shared one; drafter its one MTP layer (vLLM method mtp, reused for every K)", False,
                superseded=ASYNC_V1_CHANGE),
    "eagle3": Case("eagle3", CONFIGS / "Llama-3.1-8B", CONFIGS / "EAGLE3-Llama-3.1-8B", "eagle3", (1, 2, 3, 4),
                   PREDICTIONS / "2026-12-02_Llama-3.1-8B__EAGLE3__H200__tp1__a0.8.json", "HE",
                   "Llama-3.1-8B; drafter an EAGLE-3 head of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's shapes (vLLM method "
                   "eagle3: one layer over three fused target layers, a 32000-row draft vocabulary)", True,
                   superseded="the head step model changed after this score (speedup.stepcost.head_on_async_runner: a "
                              "head on vLLM's V2 runner pays a plain step's host overhead); case eagle3-qwen3 checks "
                              "it"),
    "eagle3-qwen3": Case("eagle3-qwen3", CONFIGS / "Qwen3-8B", CONFIGS / "EAGLE3-Qwen3-8B", "eagle3", (1, 2, 3, 4),
                         PREDICTIONS / "2026-12-02_Qwen3-8B__EAGLE3__H200__tp1__a0.8.json", "HQ",
                         "Qwen3-8B; drafter an EAGLE-3 head of AngelSlim/Qwen3-8B_eagle3's shapes (vLLM method eagle3, "
                         "one layer, a 32000-row draft vocabulary), predicted by the head step model made after the "
                         "eagle3 case was scored", True, superseded=GRAPH_MISS_CHANGE),
}


def _models(case: Case):
    target = resolve_model(str(case.target_dir), allow_hub=False)
    draft = mtp_drafter(target) if case.head_dir is None else resolve_model(str(case.head_dir), allow_hub=False)
    return target, draft


def predict(case: Case) -> dict:
    target, draft = _models(case)
    pred = predict_speedup(target, draft, resolve_gpu("H200"), tp=1, acceptance=ALPHA, batches=BATCHES,
                           k_values=case.ks, context_len=CONTEXT_LEN,
                           rules=resolve_target(VLLM).rules)
    return {"target": target.name, "draft": pred.draft, "gpu": "H200", "tp": 1, "alpha": ALPHA, "source": pred.source,
            "batches": {str(b): {"base_step_ms": round(bp.base_step_ms, 4), "best_k": bp.best_k,
                                 "per_k": {str(k): {"speedup": round(v["speedup"], 4), "low": round(v["low"], 4),
                                                    "high": round(v["high"], 4),
                                                    "spec_step_ms": round(v["spec_step_ms"], 4)}
                                           for k, v in bp.per_k.items()}}
                        for b, bp in pred.batches.items()},
            "notes": pred.notes}


def _memory_record(case: Case, k: int) -> dict:
    """The record bench/memory.py record_from_engine writes for the campaign's engine at K (0: the target alone),
    with what the log will add left out."""
    head = k and case.head_dir is not None
    return {"backend": "gpu", "target": case.target_dir.name,
            "target_config": json.loads((case.target_dir / "config.json").read_text()),
            "draft": case.head_dir.name if head else None,
            "draft_config": json.loads((case.head_dir / "config.json").read_text()) if head else None,
            "speculative_method": case.method if k else None, "num_speculative_tokens": k, "gpu": "H200", "tp": 1,
            "max_num_batched_tokens": None, "entrypoint": "llm", "vllm_version": VLLM, **MEMORY}


def predict_memory(case: Case) -> list[dict]:
    from draftfit.memory.plan import predict_record

    out = []
    for k in (0, *case.ks):
        plan = predict_record(_memory_record(case, k))
        out.append({"num_speculative_tokens": k, "kv_tokens": plan.kv_tokens,
                    "kv_tokens_band": [plan.kv_tokens_low, plan.kv_tokens_high],
                    "draft_weights_gib": round(plan.draft_weights_gib, 3),
                    "peak_activation_gib": round(plan.peak_activation_gib, 3),
                    "cudagraph_gib": round(plan.cudagraph_gib, 3)})
    return out


def _k(k: int) -> str:
    return f"K={k}" if k else "none"


def _read_engines(raw_paths: list[Path], case: Case) -> list[dict]:
    from draftfit.calibration.tables import engine_results_from_campaign

    results = []
    for p in raw_paths:
        try:
            results += engine_results_from_campaign(p)
        except (OSError, ValueError, AttributeError) as exc:  # missing, unreadable, not JSON, not a lane file
            sys.exit(f"cannot read {p} as a campaign lane file ({exc.__class__.__name__}: {exc}): pass the "
                     f"data/calibration/raw/<date>/{case.phase}*_gpu0.json files phase {case.phase} wrote")
    return results


def _score_memory(case: Case, raw_paths: list[Path], predicted: list[dict]) -> tuple[str, list[float]]:
    """The pre-registered KV tokens against `GPU KV cache size` of each engine's log (every start of a K)."""
    from bench._readme import markdown_table
    from bench.memory import record_from_engine

    by_k = {p["num_speculative_tokens"]: p for p in predicted}
    rows, errors = [], []
    for p in raw_paths:
        for entry in json.loads(Path(p).read_text()).get("configs", []):
            rec = record_from_engine(entry, Path(p).name)
            if rec is None or rec["num_speculative_tokens"] not in by_k:
                continue
            pk = by_k[rec["num_speculative_tokens"]]
            err = pk["kv_tokens"] / rec["kv_tokens"] - 1
            errors.append(err)
            rows.append([entry["id"], f"{pk['kv_tokens']:,}", f"{rec['kv_tokens']:,}", f"{err:+.2%}"])
    if not rows:
        return "", []
    text = (f"\n\nKV tokens, pre-registered in the same file, against `GPU KV cache size` in each engine's log: "
            f"{sum(abs(e) <= 0.01 for e in errors)} of {len(errors)} within 1 %.\n\n"
            + markdown_table(["engine", "predicted", "vLLM", "error"], rows))
    return text, errors


def _judge(pred: dict, table) -> tuple[list, list]:
    """A prediction (predict's dict) against a measured table, as bench/speedup.py judges every table: the scored
    points [(batch, K, predicted entry, measured speedup)] and the advice per batch [(batch, measured option,
    predicted option, right)]."""
    from bench.speedup import _advice_judged

    points, advice = [], []
    for b, row in pred["batches"].items():
        measured = {int(k): table.speedup(int(k), int(b)) for k in row["per_k"]}
        measured = {k: v for k, v in measured.items() if v is not None}
        points += [(b, k, row["per_k"][str(k)], v) for k, v in sorted(measured.items())]
        if measured:
            advice.append((b, *_advice_judged(measured, {k: row["per_k"][str(k)]["speedup"] for k in measured})))
    return points, advice


def _error(point) -> float:
    _, _, pk, measured = point
    return pk["speedup"] / measured - 1


def score(case: Case, raw_paths: list[Path]) -> tuple[str, dict]:
    """The committed prediction against the measured steady-state speedups: a markdown section and its figures."""
    from bench._readme import markdown_table
    from draftfit.calibration.tables import tables_from_results

    rec = json.loads(case.out.read_text())
    pred = rec["prediction"]
    tables = [t for t in tables_from_results(_read_engines(raw_paths, case)) if t.draft == pred["draft"]]
    if len(tables) != 1:
        sys.exit(f"expected one {pred['draft']} table in {', '.join(map(str, raw_paths))}, found {len(tables)}")
    table = tables[0]
    points, advice = _judge(pred, table)
    errors = [_error(pt) for pt in points]
    rows = []
    for (b, k, pk, v), err in zip(points, errors):
        rows.append([b, k, f"{pk['speedup']:.2f} [{pk['low']:.2f}-{pk['high']:.2f}]", f"{v:.2f}", f"{err:+.0%}",
                     "yes" if pk["low"] <= v <= pk["high"] else "no",
                     f"{pk['spec_step_ms']:.1f} / {table.spec_step_ms(k, int(b)):.1f}"])
    if not errors:
        sys.exit(f"no timed engine in {', '.join(map(str, raw_paths))} measured a pre-registered K "
                 f"({', '.join(map(str, case.ks))})")
    # K measured beyond the pre-registered ones: shown, not scored.
    extra = sorted(int(k) for k in table.spec if str(k) not in next(iter(pred["batches"].values()))["per_k"])
    extra_text = "".join(
        f" K={k} (measured, not pre-registered): speedup "
        + ", ".join(f"batch {b} {table.speedup(k, int(b)):.2f} ({table.spec_step_ms(k, int(b)):.1f} ms)"
                    for b in pred["batches"] if table.speedup(k, int(b)) is not None) + "."
        for k in extra)
    mean_abs = sum(abs(e) for e in errors) / len(errors)
    within = sum(abs(e) <= 0.15 for e in errors) / len(errors)
    memory_text, memory_errors = _score_memory(case, raw_paths, rec.get("memory") or [])
    if case.superseded:  # today's library on the same engines: not a held-out score, it was built on them
        now_points, now_advice = _judge(predict(case), table)
        now = [_error(pt) for pt in now_points]
        extra_text += (f" Since then {case.superseded}. Today's model on these engines (built on them, so not a "
                       f"held-out score): mean abs error {sum(map(abs, now)) / len(now):.0%}, "
                       f"{sum(abs(e) <= 0.15 for e in now)} of {len(now)} within 15 %, advice right at "
                       f"{sum(a[3] for a in now_advice)} of {len(now_advice)} batch sizes.")
    text = (f"Pre-registered in `{case.out.relative_to(ROOT)}` ({rec['created_utc']} UTC, committed before phase "
            f"{case.phase} ran; `{rec['command']}`), measured by `{rec['measured_by']}`; raw files "
            f"{', '.join(str(Path(p).relative_to(ROOT)) if Path(p).is_absolute() else str(p) for p in raw_paths)}. "
            f"Target {case.what}; H200, TP=1, vLLM {table.vllm_version}; steady-state TPOT speedup. Mean abs error "
            f"{mean_abs:.0%}, {within:.0%} of {len(errors)} points within 15 %; advice (K, or no speculation below "
            f"{NO_SPECULATION_BELOW}x predicted; right when its measured TPOT is within 3 % of the best option's) right "
            f"at {sum(a[3] for a in advice)} of {len(advice)} batch sizes "
            f"({'; '.join(f'batch {b}: measured {_k(m)}, predicted {_k(p)}' for b, m, p, _ in advice)})"
            + (f"; with one K measured ({', '.join(f'K={k}' for k in sorted(table.spec, key=int))}) the advice is "
               "judged on speculate-or-not only. " if len(table.spec) == 1 else ". ")
            + "Nothing was fitted on these engines." + extra_text + "\n\n"
            + markdown_table(["batch", "K", "predicted [band]", "measured", "error", "in band",
                              "spec step ms predicted / measured"], rows) + memory_text)
    figures = {"mean_abs": mean_abs, "within_15": within, "advice_right": sum(a[3] for a in advice),
               "advice_cases": len(advice)}
    if memory_errors:
        figures["kv_within_1"] = sum(abs(e) <= 0.01 for e in memory_errors)
        figures["kv_records"] = len(memory_errors)
    return text, figures


def record(case: Case) -> dict:
    names, sha = tables_digest()
    rec = {"what": f"Pre-registered speedup of {case.what}, written before any timed engine of it ran (phase "
                   f"{case.phase}). Do not regenerate.",
           "command": f".venv/bin/python bench/preregister_head.py --case {case.name} --write",
           "model": "roofline prior (speedup.stepcost) with the overheads fitted on the vLLM 0.26 draft_model tables "
                    "(no table of this method ships)",
           "calibration_tables": names, "calibration_tables_sha256": sha,
           "created_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "measured_by": f"python3 bench/gpu_campaign.py --phase {case.phase} (synthetic acceptance 0.8, dummy "
                          "weights, vLLM 0.26)",
           "prediction": predict(case)}
    if case.memory:
        rec["memory"] = predict_memory(case)
        rec["memory_settings"] = dict(MEMORY, model="memory.plan.predict_record on the record bench/memory.py "
                                      "record_from_engine will write; score: `GPU KV cache size: N tokens`, goal 1 %")
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", required=True, choices=sorted(CASES), help="which head drafter")
    ap.add_argument("--write", action="store_true", help="write the case's prediction file (never over an existing one)")
    ap.add_argument("--score", nargs="+", type=Path, metavar="RAW", help="score the prediction against the phase's files")
    ap.add_argument("--no-readme", action="store_true", help="with --score: print only")
    args = ap.parse_args(argv)
    case = CASES[args.case]
    if args.no_readme and not args.score:
        ap.error("--no-readme goes with --score (without --score nothing is written to docs/benchmarks.md)")
    if args.score and args.write:
        ap.error("--write and --score are separate steps: write the prediction before the engines run, score after")
    if args.score:
        if not case.out.exists():
            sys.exit(f"{case.out.relative_to(ROOT)} does not exist: pre-register first (--case {case.name} --write)")
        text, _ = score(case, args.score)
        print(text)
        if not args.no_readme:
            from bench._readme import write_section
            write_section(f"{case.name}-preregistered", text,
                          command=f".venv/bin/python bench/preregister_head.py --case {case.name} --score "
                          + " ".join(str(p) for p in args.score))
        return 0
    rec = record(case)
    if args.write:
        if case.out.exists():
            sys.exit(f"{case.out} exists: a pre-registration is never rewritten")
        case.out.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"wrote {case.out.relative_to(ROOT)}")
    else:
        print(json.dumps({k: rec[k] for k in ("prediction", "memory") if k in rec}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
