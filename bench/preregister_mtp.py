"""Pre-register the speedup draftfit predicts for a hybrid MoE target drafting with its own MTP layer, before any
engine of it is timed (issue 16; phase HS of bench/gpu_campaign.py measures it afterwards).

Target: Qwen3-Next-80B-A3B's shapes at 24 of its 48 layers (draftfit/data/calibration/configs/
Qwen3-Next-80B-A3B-24L, the folder the campaign's engines load with dummy weights), drafter: its one MTP layer
(catalog.specs.mtp_drafter), H200, TP=1, synthetic acceptance 0.8, K 1-3, batch 1/8/32/128, context 112 tokens
(the campaign's 64-token prompts + half of its 96 new tokens), vLLM 0.26's step-cost tables (the version that
runs on the lent H200). The prediction is the library's own path: speedup.predict.predict_speedup.

    .venv/bin/python bench/preregister_mtp.py [--write]     (without --write: print only)
    .venv/bin/python bench/preregister_mtp.py --score data/calibration/raw/2026-12-02/HS*_gpu0.json [--no-readme]

--score reads the timed engines (their steady-state speedups, calibration.tables as for every table; the table is
not written to draftfit/data/calibration, so no fit sees it) and scores the committed prediction against them into
docs/benchmarks.md (section mtp-preregistered).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from draftfit.calibration.tables import tables_digest  # noqa: E402
from draftfit.catalog.specs import mtp_drafter, resolve_gpu, resolve_model  # noqa: E402
from draftfit.rules import NO_SPECULATION_BELOW  # noqa: E402
from draftfit.speedup.predict import predict_speedup  # noqa: E402

TARGET_DIR = ROOT / "draftfit" / "data" / "calibration" / "configs" / "Qwen3-Next-80B-A3B-24L"
OUT = ROOT / "draftfit" / "data" / "predictions" / "2026-12-02_Qwen3-Next-24L__MTP__H200__tp1__a0.8.json"
KS, BATCHES, ALPHA, CONTEXT_LEN, VLLM = (1, 2, 3), (1, 8, 32, 128), 0.8, 112, "0.26.0"


def predict() -> dict:
    target = resolve_model(str(TARGET_DIR), allow_hub=False)
    pred = predict_speedup(target, mtp_drafter(target), resolve_gpu("H200"), tp=1, acceptance=ALPHA,
                           batches=BATCHES, k_values=KS, context_len=CONTEXT_LEN, vllm_version=VLLM)
    return {"target": target.name, "draft": pred.draft, "gpu": "H200", "tp": 1, "alpha": ALPHA, "source": pred.source,
            "batches": {str(b): {"base_step_ms": round(bp.base_step_ms, 4), "best_k": bp.best_k,
                                 "per_k": {str(k): {"speedup": round(v["speedup"], 4), "low": round(v["low"], 4),
                                                    "high": round(v["high"], 4),
                                                    "spec_step_ms": round(v["spec_step_ms"], 4)}
                                           for k, v in bp.per_k.items()}}
                        for b, bp in pred.batches.items()},
            "notes": pred.notes}


def _k(k: int) -> str:
    return f"K={k}" if k else "none"


def score(raw_paths: list[Path]) -> tuple[str, dict]:
    """The committed prediction against the measured steady-state speedups: a markdown section and its figures."""
    from bench._readme import markdown_table
    from bench.speedup import _advice_judged
    from draftfit.calibration.tables import engine_results_from_campaign, tables_from_results

    rec = json.loads(OUT.read_text())
    pred = rec["prediction"]
    results = []
    for p in raw_paths:
        try:
            results += engine_results_from_campaign(p)
        except (OSError, ValueError, AttributeError) as exc:  # missing, unreadable, not JSON, not a lane file
            sys.exit(f"cannot read {p} as a campaign lane file ({exc.__class__.__name__}: {exc}): pass the "
                     "data/calibration/raw/<date>/HS*_gpu0.json files phase HS wrote")
    tables = [t for t in tables_from_results(results) if t.draft == pred["draft"]]
    if len(tables) != 1:
        sys.exit(f"expected one {pred['draft']} table in {', '.join(map(str, raw_paths))}, found {len(tables)}")
    table = tables[0]
    rows, errors, advice = [], [], []
    for b, row in pred["batches"].items():
        measured = {int(k): table.speedup(int(k), int(b)) for k in row["per_k"]}
        measured = {k: v for k, v in measured.items() if v is not None}
        for k, v in sorted(measured.items()):
            pk = row["per_k"][str(k)]
            err = pk["speedup"] / v - 1
            errors.append(err)
            rows.append([b, k, f"{pk['speedup']:.2f} [{pk['low']:.2f}-{pk['high']:.2f}]", f"{v:.2f}", f"{err:+.0%}",
                         "yes" if pk["low"] <= v <= pk["high"] else "no",
                         f"{pk['spec_step_ms']:.1f} / {table.spec_step_ms(k, int(b)):.1f}"])
        if measured:  # judged as bench/speedup.py judges every table's advice
            advice.append((b, *_advice_judged(measured, {k: row["per_k"][str(k)]["speedup"] for k in measured})))
    # K measured beyond the pre-registered ones (phase HS4): shown, not scored.
    extra = sorted(int(k) for k in table.spec if str(k) not in next(iter(pred["batches"].values()))["per_k"])
    extra_text = "".join(
        f" K={k} (measured, not pre-registered): speedup "
        + ", ".join(f"batch {b} {table.speedup(k, int(b)):.2f} ({table.spec_step_ms(k, int(b)):.1f} ms)"
                    for b in pred["batches"] if table.speedup(k, int(b)) is not None) + "."
        for k in extra)
    mean_abs = sum(abs(e) for e in errors) / len(errors)
    within = sum(abs(e) <= 0.15 for e in errors) / len(errors)
    text = (f"Pre-registered in `{OUT.relative_to(ROOT)}` ({rec['created_utc']} UTC, committed before phase HS ran; "
            f"`{rec['command']}`), measured by `{rec['measured_by']}`; raw files "
            f"{', '.join(str(Path(p).relative_to(ROOT)) if Path(p).is_absolute() else str(p) for p in raw_paths)}. "
            f"Target {pred['target']} (Qwen3-Next-80B-A3B's shapes at 24 of 48 layers: 18 gated-DeltaNet, 6 full "
            f"attention, 512 experts top-10 + a shared one), drafter {pred['draft']} (vLLM method mtp, its one layer "
            f"reused for every K), H200, TP=1, vLLM {table.vllm_version}; steady-state TPOT speedup. Mean abs error "
            f"{mean_abs:.0%}, {within:.0%} of {len(errors)} points within 15 %; advice (K, or no speculation below "
            f"{NO_SPECULATION_BELOW}x predicted; right when its measured TPOT is within 3 % of the best option's) right at {sum(a[3] for a in advice)} of {len(advice)} batch sizes "
            f"({'; '.join(f'batch {b}: measured {_k(m)}, predicted {_k(p)}' for b, m, p, _ in advice)}). "
            "Nothing was fitted on these engines." + extra_text + "\n\n"
            + markdown_table(["batch", "K", "predicted [band]", "measured", "error", "in band",
                              "spec step ms predicted / measured"], rows))
    return text, {"mean_abs": mean_abs, "within_15": within, "advice_right": sum(a[3] for a in advice),
                  "advice_cases": len(advice)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)} (never over an existing one)")
    ap.add_argument("--score", nargs="+", type=Path, metavar="RAW", help="score the prediction against phase HS files")
    ap.add_argument("--no-readme", action="store_true", help="with --score: print only")
    args = ap.parse_args(argv)
    if args.no_readme and not args.score:
        ap.error("--no-readme goes with --score (without --score nothing is written to docs/benchmarks.md)")
    if args.score and args.write:
        ap.error("--write and --score are separate steps: write the prediction before the engines run, score after")
    if args.score:
        text, figures = score(args.score)
        print(text)
        if not args.no_readme:
            from bench._readme import write_section
            write_section("mtp-preregistered", text, command=".venv/bin/python bench/preregister_mtp.py --score "
                          + " ".join(str(p) for p in args.score))
        return 0
    names, sha = tables_digest()
    rec = {"what": "Pre-registered speedup of Qwen3-Next-80B-A3B's shapes at 24 layers drafting with its own MTP layer "
                   "(vLLM method mtp), written before any timed engine of it ran (phase HS). Do not regenerate.",
           "command": ".venv/bin/python bench/preregister_mtp.py --write",
           "model": "roofline prior (speedup.stepcost): MoE expert coverage, gated-DeltaNet layers' state read and "
                    "written per step, the MTP layer as a one-layer full-attention drafter; overheads fitted on the "
                    "vLLM 0.26 draft_model tables (no MTP table exists)",
           "calibration_tables": names, "calibration_tables_sha256": sha,
           "created_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "measured_by": "python3 bench/gpu_campaign.py --phase HS (synthetic acceptance 0.8, dummy weights, vLLM 0.26)",
           "prediction": predict()}
    if args.write:
        if OUT.exists():
            sys.exit(f"{OUT} exists: a pre-registration is never rewritten")
        OUT.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
    else:
        print(json.dumps(rec["prediction"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
