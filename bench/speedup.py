"""Speedup prediction vs measurement: leave one calibrated configuration out, predict it from the others.

For every calibration table (target, draft, GPU, TP) held out in turn:
  draftfit  = roofline prior with overheads refitted on the other tables, times the learned correction
              trained on the other tables (when they hold enough samples)
  leviathan = the plain formula E / (K c + 1) with c = draft params / target params (no overheads)
against the measured TPOT speedup at the table's synthetic acceptance, per batch size and K.
Goals: |predicted / measured - 1| <= 15 %; best K predicted equal to the measured one, or its measured
TPOT within 3 % of the best, in >= 80 % of held-out (configuration, batch) cases.

    .venv/bin/python bench/speedup.py [--calibration-dir DIR] [--no-readme]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._readme import markdown_table, write_section  # noqa: E402

COMMAND = ".venv/bin/python bench/speedup.py"


def evaluate(tables) -> dict:
    from draftfit.errors import DraftfitError
    from draftfit.predictor import SpeedupCorrector, featurize, training_set
    from draftfit.speedup import analytic_speedup, expected_tokens_per_step
    from draftfit.stepcost import fitted_overheads, gpu_spec, model_spec, prior_step_cost

    cases, best_cases = [], []
    for held in tables:
        train = [t for t in tables if t is not held]
        overheads = fitted_overheads(tables=train) if train else None
        corrector = None
        ts = training_set(train, overheads=overheads) if train else None
        if ts is not None and len(ts.y) >= 8:
            corrector = SpeedupCorrector().fit(ts.X, ts.y)
        try:
            target, draft, gpu = model_spec(held.target), model_spec(held.draft), gpu_spec(held.gpu)
        except DraftfitError:  # a table of models or a GPU outside the catalog (e.g. a CPU test run)
            continue
        if not held.provenance.get("synthetic", True):
            continue  # real rejection of dummy drafts: the acceptance is not the table's nominal one
        c_params = draft.params_b / target.params_b
        for b in held.batches:
            per_k = {}
            for k in held.ks:
                measured = held.measured_speedup(k, b)
                if not measured:
                    continue
                row = held.spec[str(k)][str(b)]
                ctx = int(row.get("prompt_len", 64) + row.get("max_tokens", 96) / 2)
                prior = prior_step_cost(target, draft, gpu, batch=b, k_values=[k], tp=held.tp, context_len=ctx,
                                        overheads=overheads)
                e = expected_tokens_per_step(held.acceptance, k)
                pred = e * prior.base_step_ms / prior.spec_step_ms[k]
                pred_roofline = pred
                if corrector is not None:
                    x = featurize(target=target, draft=draft, gpu=gpu, tp=held.tp, batch=b, k=k,
                                  acceptance=held.acceptance, prior=prior, context_len=ctx)
                    pred *= float(__import__("math").exp(corrector.predict([x])[0]))
                lev = analytic_speedup(held.acceptance, k, c_params)
                per_k[k] = (measured, pred, lev)
                cases.append({"config": f"{held.target}+{held.draft} {held.gpu} TP{held.tp}", "batch": b, "k": k,
                              "measured": measured, "draftfit": pred, "roofline": pred_roofline, "leviathan": lev,
                              "corrected": corrector is not None})
            if per_k:
                k_meas = max(per_k, key=lambda k: per_k[k][0])
                k_pred = max(per_k, key=lambda k: per_k[k][1])
                k_lev = max(per_k, key=lambda k: per_k[k][2])
                # TPOT at K is proportional to 1/speedup: within 3 % of the best TPOT.
                ok = k_pred == k_meas or per_k[k_meas][0] / per_k[k_pred][0] <= 1.03
                ok_lev = k_lev == k_meas or per_k[k_meas][0] / per_k[k_lev][0] <= 1.03
                best_cases.append({"config": f"{held.target}+{held.draft} {held.gpu} TP{held.tp}", "batch": b,
                                   "k_measured": k_meas, "k_draftfit": k_pred, "k_leviathan": k_lev,
                                   "ok": ok, "ok_leviathan": ok_lev, "n_k": len(per_k)})
    return {"cases": cases, "best": best_cases}


def summarize(result: dict) -> dict:
    cases, best = result["cases"], result["best"]
    if not cases:
        return {}

    def err(key):
        return [abs(c[key] / c["measured"] - 1) for c in cases]

    e_d, e_l, e_r = err("draftfit"), err("leviathan"), err("roofline")
    return {"n": len(cases), "mape_draftfit": sum(e_d) / len(e_d), "mape_leviathan": sum(e_l) / len(e_l),
            "mape_roofline": sum(e_r) / len(e_r), "within15_roofline": sum(e <= 0.15 for e in e_r) / len(e_r),
            "within15_draftfit": sum(e <= 0.15 for e in e_d) / len(e_d),
            "within15_leviathan": sum(e <= 0.15 for e in e_l) / len(e_l),
            "bestk_ok": sum(b["ok"] for b in best) / len(best) if best else None,
            "bestk_ok_leviathan": sum(b["ok_leviathan"] for b in best) / len(best) if best else None,
            "n_best": len(best)}


def render(result: dict, summary: dict) -> str:
    if not result["cases"]:
        return ("No calibration data yet: no usable GPU step-cost table in `data/calibration/*.json`. Run the GPU campaign "
                "(docs/GPU_CAMPAIGN_READY.md), then `draftfit calibrate --ingest ...` and this script.")
    lines = [
        f"Leave-one-configuration-out over {len({c['config'] for c in result['cases']})} calibrated configurations, "
        f"{summary['n']} (batch, K) points, synthetic acceptance as calibrated. Goal: within 15 %; best K equal "
        f"or within 3 % TPOT in >= 80 % of cases.",
        "",
        markdown_table(["", "mean abs error", "within 15 %", "best K ok"], [
            ["draftfit (roofline + fitted overheads + learned correction)", f"{summary['mape_draftfit']:.1%}",
             f"{summary['within15_draftfit']:.0%}", f"{summary['bestk_ok']:.0%} of {summary['n_best']}"],
            ["roofline + overheads fitted on the other configurations (no learned correction)",
             f"{summary['mape_roofline']:.1%}", f"{summary['within15_roofline']:.0%}", ""],
            ["Leviathan formula, c = draft/target params", f"{summary['mape_leviathan']:.1%}",
             f"{summary['within15_leviathan']:.0%}", f"{summary['bestk_ok_leviathan']:.0%} of {summary['n_best']}"],
        ]),
        "",
        "Best-K cases of a configuration with a single measured K are trivially right; with 2+ measured K: "
        f"draftfit {sum(b['ok'] for b in result['best'] if b['n_k'] > 1)}/{sum(b['n_k'] > 1 for b in result['best'])}, "
        f"Leviathan {sum(b['ok_leviathan'] for b in result['best'] if b['n_k'] > 1)}/"
        f"{sum(b['n_k'] > 1 for b in result['best'])}. Measured speedups (TPOT ratio at synthetic acceptance 0.8, "
        "vLLM 0.26, H200) are in data/calibration/*.json.",
        "",
        markdown_table(["configuration", "batch", "best K measured", "draftfit", "Leviathan"],
                       [[b["config"], b["batch"], b["k_measured"], f"{b['k_draftfit']}{'' if b['ok'] else ' ✗'}",
                         f"{b['k_leviathan']}{'' if b['ok_leviathan'] else ' ✗'}"] for b in result["best"]]),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration-dir", type=Path, default=None)
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    from draftfit.calibrate import load_tables

    tables = load_tables(args.calibration_dir)
    result = evaluate(tables) if tables else {"cases": [], "best": []}
    summary = summarize(result)
    text = render(result, summary)
    print(text)
    if not args.no_readme:
        write_section("speedup", text, command=COMMAND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
