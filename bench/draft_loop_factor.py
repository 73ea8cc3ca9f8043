"""Measure, per target, how much slower a draft model's loop runs beside it than the step-cost model's fitted
host cost per draft layer says, from raw diagnostic engines; write draftfit/data/calibration/host_factors/
draft_loop.json (read by draftfit.speedup.loop_factor) and the docs section `draft-loop-factor`.

    .venv/bin/python bench/draft_loop_factor.py           # recompute, write the file and the section
    .venv/bin/python bench/draft_loop_factor.py --check   # exit 1 if the file differs from what the raw files give

Method (decided in docs/archive/GPU_CAMPAIGN.md, eighteenth session, before phases PG1/PG2 ran): at batch 1 the K=6 step
less the K=2 step of the same (target, draft) in the same machine lease is four more draft loop passes. For each
such pair of engines the model is run without a factor (stepcost.prior_step_cost, loop_factor=1, overheads fitted
on the calibration tables of every other target) and with the host cost doubled; the measured difference then gives
the factor that makes the model's difference match: 1 + (measured - model) / (model at 2 - model at 1). A target
gets a factor from at least MIN_PAIRS pairs over at least MIN_LEASES leases, and only from engines whose (target,
draft) has no calibration table (a table's leave-one-out score must not see its own steps through the factor).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import gpu_campaign  # noqa: E402
from bench._readme import markdown_table, write_section  # noqa: E402
from draftfit.calibration.tables import DEFAULT_TABLE_VLLM, load_tables  # noqa: E402
from draftfit.catalog.specs import spec_from_config  # noqa: E402
from draftfit.speedup.loop_factor import LOOP_FACTOR_FILE  # noqa: E402
from draftfit.speedup.stepcost import fitted_overheads, gpu_spec, model_spec, prior_step_cost  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "data" / "calibration" / "raw"
# The raw files with diagnostic engines of one lease each: {file: lease}. A lease is one machine held from install
# to release; engines of one lease share its host, whose speed varies between leases (docs/archive/GPU_CAMPAIGN.md).
LEASES = {
    "2026-12-03/X2a_gpu0.json": "2026-12-03 eighteenth session, lease 2",
    "2026-12-03/X2b_gpu0.json": "2026-12-03 eighteenth session, lease 2",
    "2026-12-03/M2S_gpu0.json": "2026-12-03 eighteenth session, lease 1",
    "2026-12-03/M2SD_gpu0.json": "2026-12-03 eighteenth session, lease 1",
    "2026-12-03/PG1_gpu0.json": "2026-12-03 nineteenth session",
    "2026-12-03/PG1b_gpu0.json": "2026-12-03 nineteenth session",
    "2026-12-03/PG1c_gpu0.json": "2026-12-03 nineteenth session",
    "2026-12-03/PG2_gpu0.json": "2026-12-03 nineteenth session",
    "2026-12-03/PG2b_gpu0.json": "2026-12-03 nineteenth session",
    "2026-12-03/PG2c_gpu0.json": "2026-12-03 nineteenth session",
    "2026-12-03/PG2d_gpu0.json": "2026-12-03 nineteenth session",
}
K_LO, K_HI, BATCH = 2, 6, 1
MIN_PAIRS, MIN_LEASES = 3, 2
CONTEXT_LEN = 112  # the diagnostics' 64-token prompts and 96 output tokens: the mean context of a decode step
SOURCE = "bench/draft_loop_factor.py over data/calibration/raw/2026-12-03 (docs/archive/GPU_CAMPAIGN.md)"
COMMAND = "python bench/draft_loop_factor.py"


def _engines() -> list[dict]:
    """Every engine with a draft that finished, as {lease, file, id, target, draft, draft_spec, k, step_ms}."""
    out = []
    for rel, lease in LEASES.items():
        path = RAW / rel
        if not path.exists():
            continue
        for entry in json.loads(path.read_text()).get("configs", []):
            spec, result = entry.get("spec") or {}, entry.get("result") or {}
            row = (result.get("batches") or {}).get(str(BATCH)) or {}
            if entry.get("status") != "ok" or not spec.get("draft") or not row.get("step_ms"):
                continue
            out.append({"lease": lease, "file": rel, "id": entry.get("id"), "target": spec["target"],
                        "draft": spec["draft"],
                        "draft_spec": spec_from_config(gpu_campaign.draft_config(spec), name=spec["draft"]),
                        "k": int(spec["k"]), "step_ms": float(row["step_ms"])})
    return out


def measure(tables=None) -> dict:
    """{"targets": {name: row}, "pairs": [...], "excluded": [...]}: the factor per target and every pair behind it."""
    tables = load_tables() if tables is None else tables
    with_table = {(t.target, t.draft) for t in tables}
    engines = _engines()
    gpu = gpu_spec("H200")
    pairs, excluded = [], []
    groups: dict = {}
    for e in engines:
        groups.setdefault((e["target"], e["draft"], e["lease"]), []).append(e)
    fits: dict = {}
    for (target, draft, lease), es in sorted(groups.items()):
        lo = [e for e in es if e["k"] == K_LO]
        hi = [e for e in es if e["k"] == K_HI]
        if not lo or not hi:
            continue
        base_draft = es[0]["draft_spec"]
        if (target, draft) in with_table:
            excluded.append({"target": target, "draft": draft, "lease": lease,
                             "why": "its (target, draft) has a calibration table"})
            continue
        if target not in fits:
            fits[target] = fitted_overheads(tables=[t for t in tables if t.target != target])
        ov = fits[target]
        t_spec = model_spec(target)

        def delta(f: float) -> float:
            sc = prior_step_cost(t_spec, base_draft, gpu, batch=BATCH, k_values=[K_LO, K_HI], tp=1,
                                 context_len=CONTEXT_LEN, overheads=ov, loop_factor=f)
            return sc.spec_step_ms[K_HI] - sc.spec_step_ms[K_LO]

        model_1, model_2 = delta(1.0), delta(2.0)
        step_lo = statistics.median(e["step_ms"] for e in lo)  # one K=2 engine per lease in the data so far
        for e in hi:
            measured = e["step_ms"] - step_lo
            factor = 1 + (measured - model_1) / (model_2 - model_1)
            pairs.append({"target": target, "draft": draft, "lease": lease, "k_hi_engine": e["id"], "file": e["file"],
                          "k_lo_engines": [x["id"] for x in lo], "measured_ms": round(measured, 2),
                          "model_ms": round(model_1, 2), "host_ms_per_unit_factor": round(model_2 - model_1, 2),
                          "factor": round(factor, 3)})
    targets = {}
    for target in sorted({p["target"] for p in pairs}):
        mine = [p for p in pairs if p["target"] == target]
        leases = {p["lease"] for p in mine}
        if len(mine) < MIN_PAIRS or len(leases) < MIN_LEASES:
            excluded.append({"target": target, "why": f"{len(mine)} pairs over {len(leases)} leases (needs "
                                                      f"{MIN_PAIRS} over {MIN_LEASES})"})
            continue
        fs = [p["factor"] for p in mine]
        targets[target] = {"factor": round(statistics.mean(fs), 3), "low": min(fs), "high": max(fs),
                           "n_pairs": len(mine), "n_leases": len(leases),
                           "measured_with": sorted({p["draft"] for p in mine})}
    return {"vllm_version": DEFAULT_TABLE_VLLM, "gpu": "H200", "batch": BATCH, "k": [K_LO, K_HI],
            "source": SOURCE, "targets": targets, "pairs": pairs, "excluded": excluded}


def render(doc: dict) -> str:
    rows = [[p["target"], p["draft"], p["lease"], f"{p['file']} {p['k_hi_engine']}",
             f"{p['measured_ms']:.1f}", f"{p['model_ms']:.1f}", f"{p['factor']:.2f}"] for p in doc["pairs"]]
    table = markdown_table(["target", "draft", "lease", "K=6 engine (raw file, id)", "K=6 - K=2 step, measured (ms)",
                            "model without a factor (ms)", "factor"], rows)
    got = "; ".join(f"{t}: {r['factor']:.2f}x ({r['low']:.2f}-{r['high']:.2f}, {r['n_pairs']} pairs, "
                    f"{r['n_leases']} leases)" for t, r in doc["targets"].items()) or "none"
    left = "; ".join(f"{x['target']}" + (f" + {x['draft']}" if x.get("draft") else "") + f": {x['why']}"
                     for x in doc["excluded"]) or "none"
    return (f"How much slower a draft model's loop runs beside a target than the fitted host cost per draft layer "
            f"(vLLM {doc['vllm_version']}, {doc['gpu']}, batch {doc['batch']}: the K=6 step less the K=2 step of the "
            f"same pair in one lease, against the step-cost model fitted on every other target's tables). Factors "
            f"kept (draftfit/data/calibration/host_factors/draft_loop.json, charged by the prior): {got}. "
            f"Not used: {left}.\n\n{table}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    doc = measure()
    text = json.dumps(doc, indent=1) + "\n"
    if "--check" in argv:
        on_file = LOOP_FACTOR_FILE.read_text() if LOOP_FACTOR_FILE.exists() else ""
        if on_file != text:
            print(f"{LOOP_FACTOR_FILE} differs from what the raw files give: run `{COMMAND}`", file=sys.stderr)
            return 1
        print("draft_loop.json matches the raw files")
        return 0
    LOOP_FACTOR_FILE.parent.mkdir(parents=True, exist_ok=True)
    LOOP_FACTOR_FILE.write_text(text)
    write_section("draft-loop-factor", render(doc), command=COMMAND)
    print(render(doc))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DRAFTFIT_NO_PROGRESS", "1")
    raise SystemExit(main())
