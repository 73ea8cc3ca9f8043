"""Pre-register the speedup draftfit predicts for a hybrid MoE target drafting with its own MTP layer, before any
engine of it is timed (issue 16; phase HS of bench/gpu_campaign.py measures it afterwards).

Target: Qwen3-Next-80B-A3B's shapes at 24 of its 48 layers (draftfit/data/calibration/configs/
Qwen3-Next-80B-A3B-24L, the folder the campaign's engines load with dummy weights), drafter: its one MTP layer
(catalog.specs.mtp_drafter), H200, TP=1, synthetic acceptance 0.8, K 1-3, batch 1/8/32/128, context 112 tokens
(the campaign's 64-token prompts + half of its 96 new tokens), vLLM 0.26's step-cost tables (the version that
runs on the lent H200). The prediction is the library's own path: speedup.predict.predict_speedup.

    .venv/bin/python bench/preregister_mtp.py [--write]     (without --write: print only)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from draftfit.catalog.specs import mtp_drafter, resolve_gpu, resolve_model  # noqa: E402
from draftfit.speedup.predict import predict_speedup  # noqa: E402

TARGET_DIR = ROOT / "draftfit" / "data" / "calibration" / "configs" / "Qwen3-Next-80B-A3B-24L"
OUT = ROOT / "draftfit" / "data" / "predictions" / "2026-12-02_Qwen3-Next-24L__MTP__H200__tp1__a0.8.json"
KS, BATCHES, ALPHA, CONTEXT_LEN, VLLM = (1, 2, 3), (1, 8, 32, 128), 0.8, 112, "0.26.0"


def tables_sha256() -> tuple[list[str], str]:
    """The calibration tables the prediction came from, and one hash of them (names and bytes, sorted)."""
    h, names = hashlib.sha256(), []
    for p in sorted((ROOT / "draftfit" / "data" / "calibration").glob("*.json")):
        names.append(p.name)
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return names, h.hexdigest()


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)} (never over an existing one)")
    args = ap.parse_args(argv)
    names, sha = tables_sha256()
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
