"""draftfit's speedups against published vLLM measurements nobody on the project made (truth of the second rank:
real weights on real datasets, read from each source; draftfit/data/reference/speedup_published.yaml).

    .venv/bin/python bench/published_speedups.py [--data FILE] [--no-readme] [--freeze]

Per published row that names a catalog target, a catalog drafter (or ngram / suffix / the target's MTP), a catalog
GPU, K and a load that is a batch size or a client concurrency, two predictions through `draftfit speedup --json`
(the path users run, at the default vLLM version):
  as a user gets it   the acceptance prior for the row's method, workload and temperature (what rank prints)
  given acceptance    the row's own published acceptance (mean acceptance length -> i.i.d. alpha at K), where the
                      source gives one: what is left is the step-cost model
A concurrency is scored as that batch size (the decode batch a closed loop of N clients holds, less prefill);
rows at a request rate, or with no stated load, K or GPU, are listed as not scored and say why.

Held out: nothing in draftfit is fitted on these rows. `--freeze` writes the predictions as they stand to
draftfit/data/predictions/published-speedups.json once (with the commit they came from); later runs score those
frozen predictions beside the current ones, so a change made after looking at these rows shows as what it is.
arXiv 2601.11580 (SpecDecode-Bench) is kept out of the data on purpose: an external check outside the repo.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._readme import markdown_table, write_section  # noqa: E402
from draftfit.paths import DATA_DIR  # noqa: E402
from draftfit.rules import WORKLOADS  # noqa: E402

DATA = DATA_DIR / "reference" / "speedup_published.yaml"
FROZEN = DATA_DIR / "predictions" / "published-speedups.json"
COMMAND = ".venv/bin/python bench/published_speedups.py"
NO_MODEL = ("ngram", "suffix")
GPU_ALIASES = {"h100": "H100-80GB", "h100-80gb": "H100-80GB", "h100 80gb": "H100-80GB", "h100-sxm": "H100-80GB",
               "h100 sxm": "H100-80GB", "h100-80gb-hbm3": "H100-80GB", "h200": "H200", "a100": "A100-80GB",
               "a100-80gb": "A100-80GB", "a100 80gb": "A100-80GB", "a100-40gb": "A100-40GB", "l40s": "L40S",
               "mi300x": "MI300X", "b200": "B200", "l4": "L4", "a10g": "A10G", "h100-pcie": "H100-PCIe"}


def load_rows(path: Path) -> list[dict]:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    return list(data.get("rows") or [])


def _stated(v) -> bool:
    return v not in (None, "", "not stated")


def _gpu(text) -> str | None:
    """A published GPU name ("H100 80GB", "2x H100", "NVIDIA H200") as a catalog GPU, or None."""
    if not _stated(text):
        return None
    t = re.sub(r"^\s*\d+\s*x\s*", "", str(text).strip().lower()).replace("nvidia ", "").strip()
    return GPU_ALIASES.get(t)


def _model(name) -> str | None:
    from draftfit.catalog.specs import resolve_model
    from draftfit.errors import DraftfitError

    if not _stated(name):
        return None
    try:
        return resolve_model(str(name), allow_hub=False).name
    except (DraftfitError, ValueError, KeyError):
        return None


def _batch(load) -> int | None:
    if isinstance(load, dict):
        for key in ("batch_size", "concurrency", "max_concurrency"):
            v = load.get(key)
            if isinstance(v, int) and v > 0:
                return v
    return None


def _mal(row) -> float | None:
    acc = row.get("acceptance")
    if isinstance(acc, dict):
        v = acc.get("mean_acceptance_length")
        if isinstance(v, (int, float)) and v > 1:
            return float(v)
    return None


def case_of(row: dict) -> tuple[dict | None, str]:
    """The `draftfit speedup` arguments for a row, or None and why it is not scored."""
    method = str(row.get("method", ""))
    gpu = _gpu(row.get("gpu"))
    target = _model(row.get("target"))
    k, batch = row.get("k"), _batch(row.get("load"))
    if method in NO_MODEL:
        drafter = method
    elif method == "mtp":
        drafter = f"{target}-MTP" if target else None
    else:
        drafter = _model(row.get("drafter"))
    why = [w for w, bad in (("GPU not stated or not in the catalog", gpu is None),
                            ("target not in the catalog", target is None),
                            ("drafter not in the catalog", drafter is None),
                            ("K not stated", not isinstance(k, int)),
                            ("load not a batch size or concurrency", batch is None)) if bad]
    if why:
        return None, "; ".join(why)
    tp = row.get("tp") if isinstance(row.get("tp"), int) else 1
    temp = row.get("temperature")
    workload = row.get("workload") if row.get("workload") in WORKLOADS else "chat"
    args = {"target": target, "draft": drafter, "gpu": gpu, "tp": tp, "k": k, "batch": batch,
            "workload": workload, "temperature": float(temp) if isinstance(temp, (int, float)) else 0.0}
    return args, ""


def _cli_json(argv: list[str], args: dict, alpha: float | None) -> dict:
    """One draftfit command's --json output (the CLI's own path, in process), at the row's acceptance prior or at a
    given alpha; {"error": last line} where it refuses."""
    from click.testing import CliRunner

    from draftfit.cli import cli

    argv = argv + (["--alpha", f"{alpha:.4f}"] if alpha is not None else
                   ["--workload", args["workload"], "--temperature", f"{args['temperature']:g}"])
    res = CliRunner().invoke(cli, argv + ["--json"])
    if res.exit_code != 0:
        return {"error": (res.output or str(res.exception)).strip().splitlines()[-1][:160]}
    return json.loads(res.output)


def _speedup(args: dict, alpha: float | None = None) -> dict:
    out = _cli_json(["speedup", "--target", args["target"], "--draft", args["draft"], "--gpu", args["gpu"],
                     "--tp", str(args["tp"]), "--k", str(args["k"]), "--batch", str(args["batch"])], args, alpha)
    if "error" in out:
        return out
    b = out["batches"][str(args["batch"])]
    pk = (b.get("per_k") or {}).get(str(args["k"])) or {}
    if "speedup" not in pk:
        return {"error": f"no prediction at K={args['k']} ({b.get('verdict', '')})"}
    return {"speedup": pk["speedup"], "low": pk.get("low"), "high": pk.get("high"),
            "tokens_per_step": pk.get("expected_tokens_per_step"), "source": b.get("source", ""),
            "vllm": out.get("step_cost_vllm", "")}


def _serving_lengths(row: dict) -> tuple[int, int, int] | None:
    """Mean prompt and output tokens and the request count of the row's no-speculation serving run, as logged."""
    base = ((row.get("serving") or {}).get("baseline") or {})
    n, ins, outs = base.get("requests"), base.get("input_tokens"), base.get("generated_tokens")
    if not all(isinstance(v, (int, float)) and v > 0 for v in (n, ins, outs)):
        return None
    return round(ins / n), round(outs / n), int(n)


def _serve_sim(args: dict, lengths: tuple[int, int, int], command: str, alpha: float | None = None) -> dict:
    """`draftfit serve-sim --json` at the row's concurrency and mean lengths, with the server limits its logged
    `command` states: the output-throughput ratio and both TPOT p50s, to score against the logged figures."""
    prompt, output, n = lengths
    server = []
    for flag in ("--max-model-len", "--max-num-seqs"):
        m = re.search(rf"{flag}[ =](\d+)", command)
        server += [flag, m.group(1)] if m else []
    out = _cli_json(["serve-sim", *server, "-t", args["target"], "--draft", args["draft"], "--gpu", args["gpu"],
                     "--tp", str(args["tp"]), "--k", str(args["k"]), "--concurrency", str(args["batch"]),
                     "--prompt-len", str(prompt), "--output-len", str(output), "--num-requests", str(n)], args, alpha)
    if "error" in out:
        return out
    point = out["drafters"][0]["points"][0]
    base, spec = point["baseline"], point["best"]
    return {"speedup": spec["output_throughput"]["value"] / base["output_throughput"]["value"],
            "tpot_base_ms": base["tpot_p50_ms"]["value"], "tpot_spec_ms": spec["tpot_p50_ms"]["value"]}


def predict_all(rows: list[dict]) -> list[dict]:
    from draftfit.acceptance.curve import iid_alpha

    out = []
    for row in rows:
        args, why = case_of(row)
        rec = {"id": row.get("id"), "why_not": why}
        if args is not None:
            rec["args"] = args
            rec["user"] = _speedup(args)
            mal = _mal(row)
            alpha = iid_alpha(min(mal, args["k"] + 0.999), args["k"]) if mal is not None else None
            if alpha is not None:
                rec["given"] = _speedup(args, alpha=alpha)
            lengths = _serving_lengths(row)
            if lengths is not None:  # a serving benchmark with its lengths logged: the serving model as well
                command = str(row["serving"].get("command", ""))
                rec["serve_sim"] = _serve_sim(args, lengths, command)
                if alpha is not None:
                    rec["serve_sim_given"] = _serve_sim(args, lengths, command, alpha=alpha)
        out.append(rec)
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _err(pred: dict | None, truth: float) -> float | None:
    if not pred or "speedup" not in pred:
        return None
    return pred["speedup"] / truth - 1


def _fmt(pred: dict | None, truth: float) -> str:
    if not pred:
        return "-"
    if "speedup" not in pred:
        return f"no answer ({pred.get('error', '')})"
    e = _err(pred, truth)
    return f"{pred['speedup']:.2f} ({e:+.0%})"


def _inside(pred: dict | None, truth: float) -> bool | None:
    if not pred or pred.get("low") is None or pred.get("high") is None:
        return None
    return pred["low"] <= truth <= pred["high"]


def summary(rows, preds, key: str) -> dict:
    errs, inside = [], []
    for row, p in zip(rows, preds):
        e = _err(p.get(key), float(row["speedup"]))
        if e is None:
            continue
        errs.append(abs(e))
        ins = _inside(p.get(key), float(row["speedup"]))
        if ins is not None:
            inside.append(ins)
    n = len(errs)
    return {"n": n, "mae": sum(errs) / n if n else math.nan, "within15": sum(e <= 0.15 for e in errs),
            "within25": sum(e <= 0.25 for e in errs), "inside": sum(inside), "banded": len(inside)}


def render(rows: list[dict], preds: list[dict], frozen: dict | None) -> str:
    scored = [(r, p) for r, p in zip(rows, preds) if p.get("args")]
    skipped = [(r, p) for r, p in zip(rows, preds) if not p.get("args")]
    sources = sorted({r.get("source", "") for r in rows})
    lines = [f"{len(rows)} published rows from {len(sources)} sources "
             f"(draftfit/data/reference/speedup_published.yaml, each with its URL and the text read); "
             f"{len(scored)} scored, {len(skipped)} not (reasons below). Predictions through `draftfit speedup --json` "
             "at the default vLLM version; a concurrency is scored as that batch size. Nothing is fitted on these "
             "rows."]
    heads = ["id", "GPU x TP", "target", "drafter", "K", "batch", "workload, T", "published (metric)",
             "draftfit as a user gets it", "inside its band", "given the published acceptance"]
    if frozen:
        heads.append(f"frozen at {frozen.get('commit', '?')}")
    table = []
    fz = {p["id"]: p for p in (frozen or {}).get("predictions", [])}
    for r, p in scored:
        a = p["args"]
        truth = float(r["speedup"])
        ins = _inside(p.get("user"), truth)
        cells = [r.get("id"), f"{a['gpu']} x{a['tp']}", a["target"], a["draft"], a["k"], a["batch"],
                 f"{a['workload']}, {a['temperature']:g}", f"{truth:.2f} ({r.get('speedup_of', '?')})",
                 _fmt(p.get("user"), truth), "-" if ins is None else ("yes" if ins else "no"),
                 _fmt(p.get("given"), truth)]
        if frozen:
            cells.append(_fmt(fz.get(p["id"], {}).get("user"), truth))
        table.append(cells)
    lines += ["", markdown_table(heads, table)]
    by: dict = {}
    for r, p in scored:
        rs, ps = by.setdefault(r.get("method", "?"), ([], []))
        rs.append(r)
        ps.append(p)
    srows = []
    for m in sorted(by) + ["all"]:
        rs, ps = (by[m] if m != "all" else ([r for r, _ in scored], [p for _, p in scored]))
        u, g = summary(rs, ps, "user"), summary(rs, ps, "given")
        srows.append([m, u["n"], f"{u['mae']:.0%}" if u["n"] else "-", f"{u['within15']}/{u['n']}",
                      f"{u['within25']}/{u['n']}", f"{u['inside']}/{u['banded']}",
                      f"{g['mae']:.0%} ({g['within25']}/{g['n']} within 25 %)" if g["n"] else "-"])
    lines += ["", "By method:", "", markdown_table(
        ["method", "scored", "mean abs error (as a user gets it)", "within 15 %", "within 25 %", "inside the band",
         "given the published acceptance"], srows)]
    served = [(r, p) for r, p in scored if p.get("serve_sim")]
    if served:
        srows = []
        for r, p in served:
            truth = float(r["speedup"])
            base, spec = r["serving"]["baseline"], r["serving"]["spec"]
            pl, ol, _ = _serving_lengths(r)
            g = p.get("serve_sim_given") or {}

            def tp(pred, key, measured):
                if not pred or key not in pred or not isinstance(measured, (int, float)):
                    return "-"
                return f"{pred[key]:.1f} vs {measured:.1f} ({pred[key] / measured - 1:+.0%})"
            srows.append([r["id"], p["args"]["batch"], f"{pl} / {ol}", f"{truth:.2f}",
                          _fmt(p.get("serve_sim"), truth), _fmt(g or None, truth),
                          tp(g, "tpot_base_ms", base.get("median_tpot_ms")),
                          tp(g, "tpot_spec_ms", spec.get("median_tpot_ms"))])
        served_rows, served_preds = [r for r, _ in served], [p for _, p in served]
        u, gv = summary(served_rows, served_preds, "serve_sim"), summary(served_rows, served_preds, "serve_sim_given")
        lines += ["", "Rows that are `vllm bench serve` runs with their lengths logged, through `draftfit serve-sim "
                  "--concurrency N --prompt-len MEAN --output-len MEAN --num-requests N --json` (issue 40's serving "
                  "model: continuous batching, chunked prefill, KV admission) instead of a fixed decode batch: the "
                  "output-throughput ratio, and TPOT p50 (ms, predicted vs the log's median) without and with "
                  f"speculation at the published acceptance. Output-throughput ratio: as a user gets it "
                  f"{u['mae']:.0%} mean abs error ({u['within25']}/{u['n']} within 25 %), at the published acceptance "
                  f"{gv['mae']:.0%} ({gv['within25']}/{gv['n']})."
                  + (" These runs' own server logs say custom all-reduce was off for lack of GPU P2P (platform_note "
                     "in the data), a platform draftfit does not model: their absolute TPOT is no test of step costs, "
                     "the ratios are." if any(r.get("platform_note") for r, _ in served) else ""), "",
                  markdown_table(["id", "clients", "mean prompt / output tokens", "published ratio",
                                  "serve-sim as a user gets it", "serve-sim at the published acceptance",
                                  "TPOT p50 no speculation", "TPOT p50 speculation (published acceptance)"], srows)]
    if skipped:
        why: dict = {}
        for r, p in skipped:
            why.setdefault(p["why_not"], []).append(str(r.get("id")))
        lines += ["", "Not scored (kept in the data for when draftfit can answer them):", ""]
        lines += [f"- {reason}: {len(ids)} rows ({', '.join(ids)})" for reason, ids in sorted(why.items())]
    lines += ["", "Sources: " + ", ".join(f"[{s}]({next(r['url'] for r in rows if r.get('source') == s)})"
                                         for s in sources) + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--freeze", action="store_true",
                    help=f"write today's predictions to {FROZEN.relative_to(ROOT)} (once; never rewritten)")
    args = ap.parse_args(argv)
    if not args.data.is_file():
        ap.error(f"{args.data} does not exist")
    rows = [r for r in load_rows(args.data) if isinstance(r.get("speedup"), (int, float)) and r["speedup"] > 0]
    preds = predict_all(rows)
    if args.freeze:
        if FROZEN.exists():
            ap.error(f"{FROZEN.relative_to(ROOT)} exists: frozen predictions are never rewritten")
        FROZEN.parent.mkdir(parents=True, exist_ok=True)
        FROZEN.write_text(json.dumps({"commit": _commit(), "command": f"{COMMAND} --freeze",
                                      "predictions": preds}, indent=1) + "\n")
    frozen = json.loads(FROZEN.read_text()) if FROZEN.is_file() else None
    body = render(rows, preds, frozen)
    print(body)
    if not args.no_readme:
        write_section("published-speedups", body, command=COMMAND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
