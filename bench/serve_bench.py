#!/usr/bin/env python3
"""Serving load (issue 40): draftfit's serve-sim predictions for `vllm serve` driven by `vllm bench serve`, written
before anything is measured, the device-side folders the runs need, and the score once the results are home.

    .venv/bin/python bench/serve_bench.py --predict      # once, before any run: draftfit/data/predictions/
                                                         #   <date>_serving__H200.json and __H100.json (never rewritten)
    .venv/bin/python bench/serve_bench.py --stage        # bench/.servebench/: config.json + tokenizer per model and
                                                         #   plan.json (what bench/serve_bench_gpu.sh runs), to carry
    .venv/bin/python bench/serve_bench.py --score DIR... # DIR: the fetched $OUT folders (serve_bench/<gpu>/...):
                                                         #   writes the docs/benchmarks.md section serving-load
    .venv/bin/python bench/serve_bench.py --speed        # the simulator's own wall time (section serving-sim-speed)

What is predicted and measured, per GPU (H200, and H100 since a lent machine may be one): vLLM 0.34.0, dummy weights,
synthetic acceptance 0.8 (a_i = 0.8^i, rejection_sample_method synthetic), --max-model-len 2048, util 0.9, the
`vllm serve` defaults otherwise (max_num_seqs 1024, max_num_batched_tokens 8192, async scheduling); random dataset,
512 input / 256 output tokens (--random-range-ratio 0, --ignore-eos), Poisson arrivals, 300 requests per rate, five
rates from light load to past saturation (RATE_SHARES of draftfit's own modelled saturation rate without
speculation), each with no speculation and with the K draftfit finds best (goodput, here the lowest median TPOT at
the lightest rate). Configurations: Llama-3.1-8B + Llama-3.2-1B (draft_model) and Qwen3-30B-A3B + Qwen3-0.6B (MoE,
draft_model). Goals (issue 40): TPOT p50 and output throughput within 15 % below saturation, p99 within 25 %, the
crossover rate within one measured step.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PREDICTIONS = ROOT / "draftfit" / "data" / "predictions"
STAGE = ROOT / "bench" / ".servebench"
CONFIGS = ROOT / "draftfit" / "data" / "calibration" / "configs"
VLLM = "0.34.0"
ACCEPTANCE = 0.8
K_MAX_TRIED = 6
INPUT_LEN, OUTPUT_LEN = 512, 256
NUM_PROMPTS = 300
MAX_MODEL_LEN = 2048
UTIL = 0.9
RATE_SHARES = (0.1, 0.3, 0.55, 0.8, 1.05)  # of the modelled saturation rate without speculation
PAIRS = (("llama", "Llama-3.1-8B", "Llama-3.2-1B"), ("qwen-moe", "Qwen3-30B-A3B", "Qwen3-0.6B"))
GPUS = (("H200", "H200"), ("H100", "H100-80GB"))
COMMAND = ".venv/bin/python bench/serve_bench.py --predict"
TOKENIZER_STAND_IN = {"llama-3.1": "llama-3.0"}


def _acceptance():
    from draftfit.acceptance.prior import AcceptanceEstimate

    curve = [ACCEPTANCE ** (i + 1) for i in range(8)]
    return AcceptanceEstimate(alpha=ACCEPTANCE, per_position=curve, low=ACCEPTANCE, high=ACCEPTANCE,
                              source="synthetic 0.8 (imposed: rejection_sample_method synthetic)", citation="")


def predict_pair(gpu: str, target: str, draft: str) -> dict:
    """serve-sim's prediction for one pair on one GPU: K chosen at the light rate, then five rates."""
    from draftfit.layout import build_layout
    from draftfit.memory.plan import plan_memory
    from draftfit.pipeline import evaluate_pair, served_spec
    from draftfit.serving import build_traffic, saturation_rate, serving_load
    from draftfit.serving.load import baseline_plan
    from draftfit.serving.steps import build_surface

    acc = _acceptance()
    lay0 = build_layout(target, gpu=gpu, tp=1, util=UTIL, max_model_len=MAX_MODEL_LEN, vllm_version=VLLM)
    ev0 = evaluate_pair(lay0, draft, acceptance=acc)
    tgt = served_spec(lay0)
    base = baseline_plan(lay0, tgt)
    probe = build_traffic(request_rate="1", prompt_len=str(INPUT_LEN), output_len=str(OUTPUT_LEN),
                          num_requests=NUM_PROMPTS)
    surface = build_surface(tgt, ev0.draft, lay0.gpu, tp=1, k_values=range(1, K_MAX_TRIED + 1),
                            max_batch=base.max_num_seqs, context_len=probe.mean_context, rules=lay0.engine.rules)
    sat = saturation_rate(lay0, tgt, probe, surface=surface, plan=base)
    rates = [float(f"{s * sat:.2g}") for s in RATE_SHARES]
    # K: the best fixed K at the lightest rate (no SLO: the lowest median TPOT), measured even when draftfit says
    # not to speculate, so the prediction of a loss is checked too.
    light = build_traffic(request_rate=str(rates[0]), prompt_len=str(INPUT_LEN), output_len=str(OUTPUT_LEN),
                          num_requests=NUM_PROMPTS)
    best_k, best_tpot = 1, None
    for k in range(1, K_MAX_TRIED + 1):
        lay_k = build_layout(target, gpu=gpu, tp=1, util=UTIL, max_model_len=MAX_MODEL_LEN, vllm_version=VLLM, k=k)
        ev_k = evaluate_pair(lay_k, draft, acceptance=acc)
        r = serving_load(lay_k, tgt, [(ev_k.draft, acc, ev_k.memory)], light)
        tp50 = r.drafters[0].points[0].best.tpot_p50_ms.value
        if best_tpot is None or tp50 < best_tpot:
            best_k, best_tpot = k, tp50
    lay = build_layout(target, gpu=gpu, tp=1, util=UTIL, max_model_len=MAX_MODEL_LEN, vllm_version=VLLM, k=best_k)
    ev = evaluate_pair(lay, draft, acceptance=acc)
    traffic = build_traffic(request_rate=",".join(f"{r:g}" for r in rates), prompt_len=str(INPUT_LEN),
                            output_len=str(OUTPUT_LEN), num_requests=NUM_PROMPTS)
    res = serving_load(lay, tgt, [(ev.draft, acc, ev.memory)], traffic)
    d = res.drafters[0]
    mem = plan_memory(tgt, ev.draft, lay.gpu, tp=1, util=UTIL, max_model_len=MAX_MODEL_LEN, num_speculative_tokens=best_k,
                      rules=lay.engine.rules)
    return {"target": target, "draft": draft, "gpu": lay.gpu.name, "k": best_k, "rates": rates,
            "saturation_rate": round(sat, 3), "kv_tokens": {"none": base.kv_tokens, "spec": mem.kv_tokens},
            "crossover_rate": d.crossover_rate, "crossover": d.crossover,
            "step_cost_source": d.step_cost_source, "step_cost_vllm": d.step_cost_vllm,
            "band_spec": d.band_spec, "band_plain": d.band_plain,
            "points": [{"rate": p.rate, "none": p.baseline.to_dict(), "spec": p.best.to_dict(), "pays": p.pays}
                       for p in d.points],
            "commands": commands(target, draft, best_k, rates),
            "notes": d.notes + res.notes}


def commands(target: str, draft: str, k: int, rates) -> dict:
    """The server and client commands bench/serve_bench_gpu.sh runs (paths relative to the staged folder)."""
    spec = {"method": "draft_model", "model": f"models/{draft}", "num_speculative_tokens": k,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [round(ACCEPTANCE ** (i + 1), 6) for i in range(k)]}
    serve = (f"vllm serve models/{target} --tokenizer models/{target} --load-format dummy --served-model-name m "
             f"--max-model-len {MAX_MODEL_LEN} --gpu-memory-utilization {UTIL} --seed 0 --no-enable-prefix-caching")
    bench = (f"vllm bench serve --backend vllm --model m --tokenizer models/{target} --dataset-name random "
             f"--random-input-len {INPUT_LEN} --random-output-len {OUTPUT_LEN} --random-range-ratio 0 --ignore-eos "
             f"--num-prompts {NUM_PROMPTS} --seed 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 "
             f"--request-rate RATE --save-result")
    return {"serve_none": serve, "serve_spec": serve + " --speculative-config '" + json.dumps(spec) + "'",
            "bench": bench, "rates": list(rates)}


def _stamp() -> dict:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"command": COMMAND, "created_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "draftfit_parent_commit": head}


def predict() -> int:
    day = time.strftime("%Y-%m-%d", time.gmtime())
    for short, gpu in GPUS:
        out = PREDICTIONS / f"{day}_serving__{short}.json"
        if list(PREDICTIONS.glob(f"*_serving__{short}.json")):
            print(f"a serving prediction for {short} exists: a pre-registration is written once", file=sys.stderr)
            return 1
        t0 = time.time()
        preds = [dict(config=name, **predict_pair(gpu, t, d)) for name, t, d in PAIRS]
        doc = {"what": ("draftfit serve-sim's pre-registered predictions of `vllm bench serve` against `vllm serve` "
                        f"(vLLM {VLLM}, one {gpu}, dummy weights, synthetic acceptance {ACCEPTANCE}), per request rate, "
                        "with no speculation and at draftfit's best K. Score: TPOT p50 and output throughput within "
                        "15 % below saturation, p99 within 25 %, crossover rate within one measured step (issue 40). "
                        "Do not regenerate."),
               "measured_by": "bench/serve_bench_gpu.sh (plan: bench/serve_bench.py --stage)",
               "model": "draftfit.serving (vLLM V1 scheduler over speedup.stepcost step costs; serving/sim.py)",
               "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "num_prompts": NUM_PROMPTS,
               "max_model_len": MAX_MODEL_LEN, "util": UTIL, "acceptance": ACCEPTANCE, "vllm": VLLM,
               "seconds": round(time.time() - t0, 1), **_stamp(), "predictions": preds}
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)} ({doc['seconds']} s)")
    return 0


def stage() -> int:
    """bench/.servebench/: models/<name>/ (config.json + tokenizer files) and plan.json per GPU, from the
    committed predictions (carry it: `run(..., carry=["bench/.servebench"])`)."""
    from draftfit.assets.tokenizers import tokenizer_dir
    from draftfit.catalog.specs import resolve_model

    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "models").mkdir(parents=True)
    plans = {}
    for short, _ in GPUS:
        hits = sorted(PREDICTIONS.glob(f"*_serving__{short}.json"))
        if not hits:
            print(f"no prediction for {short}: run --predict first", file=sys.stderr)
            return 1
        doc = json.loads(hits[-1].read_text())
        plans[short] = [{"config": p["config"], "target": p["target"], "draft": p["draft"], "k": p["k"],
                         "rates": p["rates"], **p["commands"]} for p in doc["predictions"]]
    for _, target, draft in PAIRS:
        family = resolve_model(target).tokenizer
        # Llama 3.1 has no fixture of its own: 3.0's tokenizer.json holds the same 128,256 ids (the random dataset
        # only draws ids and counts tokens, and dummy weights make the text meaningless anyway).
        tok = tokenizer_dir(TOKENIZER_STAND_IN.get(family, family), download=True)
        if tok is None:
            print(f"no tokenizer files for {target} ({family})", file=sys.stderr)
            return 1
        for name in (target, draft):
            dst = STAGE / "models" / name
            dst.mkdir()
            shutil.copy(CONFIGS / name / "config.json", dst / "config.json")
            if name == target:  # the draft uses the target's tokenizer (vLLM 0.34)
                for f in ("tokenizer.json", "tokenizer_config.json"):
                    shutil.copy(Path(tok) / f, dst / f)
    (STAGE / "plan.json").write_text(json.dumps(plans, indent=1) + "\n")
    size = sum(f.stat().st_size for f in STAGE.rglob("*") if f.is_file()) / 2**20
    print(f"staged {STAGE.relative_to(ROOT)} ({size:.1f} MiB)")
    return 0


# ---------------------------------------------------------------------------------------------- score

_LOG_LINE = re.compile(r"\[serve-engine\] rate (?P<rate>[\d.]+) \((?P<n>\d+) req\) in \d+ s: tpot p50 (?P<p50>[\d.]+) "
                       r"p99 (?P<p99>[\d.]+) ms, ttft p50 (?P<ttft>[\d.]+) ms, (?P<thr>\d+) tok/s, (?P<rps>[\d.]+) req/s")
_LOG_HEAD = re.compile(r"\[serve-engine\] (?P<gpu>H\d+) \(.*?\) (?P<config>[\w-]+) (?P<mode>none|spec):")


def _measured(dirs) -> dict:
    """{(gpu, config, mode, rate): result} from serve_bench/<gpu>/<config>/<mode>/rate_<R>.json, the same inside a
    serve_bench.tgz (bench/serve_engine_gpu.py packs them), and, for a rate whose file did not come back, the
    driver's one-line summary in its log (p50/p99 TPOT, p50 TTFT, throughputs: enough for the score)."""
    out = {}

    def add(rel_parts, text):
        gpu, config, mode, name = rel_parts[-4:]
        out[(gpu, config, mode, float(name[len("rate_"):-len(".json")]))] = json.loads(text)

    for d in dirs:
        for f in sorted(Path(d).rglob("serve_*.log")):
            gpu = config = mode = None
            for line in f.read_text(errors="replace").splitlines():
                h = _LOG_HEAD.search(line)
                if h:
                    gpu, config, mode = h["gpu"], h["config"], h["mode"]
                m = _LOG_LINE.search(line)
                if m and gpu:
                    out.setdefault((gpu, config, mode, float(m["rate"])), {
                        "source": f"log line ({f.name})", "num_prompts": int(m["n"]),
                        "median_tpot_ms": float(m["p50"]), "p99_tpot_ms": float(m["p99"]),
                        "median_ttft_ms": float(m["ttft"]), "output_throughput": float(m["thr"]),
                        "request_throughput": float(m["rps"])})
        for f in Path(d).rglob("serve_bench.tgz"):
            with tarfile.open(f) as tar:
                for member in tar.getmembers():
                    if member.isfile() and Path(member.name).name.startswith("rate_") and member.name.endswith(".json"):
                        add(Path(member.name).parts, tar.extractfile(member).read().decode())
        for f in Path(d).rglob("rate_*.json"):
            add(f.parts, f.read_text())
    return out


def _row(short: str, config: str, mode: str, rate: float, p50: float, p99: float, thr: float, m: dict,
         tail) -> tuple[str, tuple[float, float, float]]:
    """One table row, predicted (or simulated) vs measured, and its errors (TPOT p50, p99, throughput); `tail(errs)`
    gives the last column."""
    errs = (_err(p50, m["median_tpot_ms"]), _err(p99, m["p99_tpot_ms"]), _err(thr, m["output_throughput"]))
    return (f"| {short} | {config} | {mode} | {rate:g} | {p50:.1f} / {m['median_tpot_ms']:.1f} | {errs[0]:+.0%} | "
            f"{p99:.1f} / {m['p99_tpot_ms']:.1f} | {errs[1]:+.0%} | {thr:.0f} / {m['output_throughput']:.0f} | "
            f"{errs[2]:+.0%} | {tail(errs)} |"), errs


def _err(pred: float, meas: float) -> float:
    return (pred - meas) / meas if meas else float("nan")


def score(dirs) -> str:
    meas = _measured(dirs)
    lines = ["Predicted (committed before the runs, `draftfit/data/predictions/*_serving__<GPU>.json`) vs measured; "
             "error = (pred - meas) / meas. Measured (data/serving/raw/): vLLM 0.34.0, dummy weights, synthetic "
             "acceptance 0.8, by bench/serve_engine_gpu.py: the engine `vllm serve` builds from the planned command "
             "(vLLM's serve parser, usage context OPENAI_API_SERVER), driven in process by an open-loop Poisson "
             "client with `vllm bench serve`'s metric definitions (the device image has no uvicorn for the server; "
             "no HTTP layer is measured); light rates send a minute (2026-12-05 H200: 40 s) of arrivals, at least "
             "120 requests, instead of 300.",
             "", "| GPU | config | mode | req/s | TPOT p50 pred / meas | err | TPOT p99 pred / meas | err | "
                 "out tok/s pred / meas | err | within goals |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for short, _ in GPUS:
        hits = sorted(PREDICTIONS.glob(f"*_serving__{short}.json"))
        if not hits:
            continue
        doc = json.loads(hits[-1].read_text())
        for p in doc["predictions"]:
            measured_pays = []
            for pt in p["points"]:
                row_pays = {}
                for mode in ("none", "spec"):
                    m = meas.get((short, p["config"], mode, pt["rate"]))
                    if m is None:
                        continue
                    pr = pt[mode]
                    below = pt["rate"] < p["saturation_rate"]

                    def within(e):
                        ok = abs(e[0]) <= 0.15 and abs(e[2]) <= 0.15 and abs(e[1]) <= 0.25
                        return f"{'yes' if ok else 'no'}{'' if below else ' (past saturation)'}"

                    lines.append(_row(short, p["config"], mode if mode == "none" else f"K={p['k']}", pt["rate"],
                                      pr["tpot_p50_ms"]["value"], pr["tpot_p99_ms"]["value"],
                                      pr["output_throughput"]["value"], m, within)[0])
                    row_pays[mode] = m["median_tpot_ms"]
                if len(row_pays) == 2:
                    measured_pays.append((pt["rate"], row_pays["spec"] * 1.05 <= row_pays["none"]))
            cross = next((r for (r0, a), (r, b) in zip(measured_pays, measured_pays[1:]) if a and not b), None)
            summary.append(f"- {short} {p['config']} (K={p['k']}): predicted crossover {p['crossover']}; measured: "
                           + ("no pair of rates measured" if not measured_pays else
                              f"speculation pays at {[r for r, a in measured_pays if a]} req/s"
                              + (f", stops by {cross:g} req/s" if cross else "")))
    return "\n".join(lines + [""] + summary)


def speed() -> str:
    """Wall time of serve-sim's own sweep: 6 rates x (no speculation + one K), point runs only, and the full
    stage (K search, per-batch schedule, band runs) for the same rates, on this machine."""
    from draftfit.layout import build_layout
    from draftfit.pipeline import evaluate_pair, served_spec
    from draftfit.serving import build_traffic, serving_load
    from draftfit.serving.load import baseline_plan, engine_limits
    from draftfit.serving.sim import SpecConfig, simulate
    from draftfit.serving.steps import build_surface
    from draftfit.serving.traffic import sample_requests

    rows = []
    for target, draft in (("Llama-3.1-8B", "Llama-3.2-1B"), ("Qwen3-30B-A3B", "Qwen3-0.6B")):
        lay = build_layout(target, gpu="H200", tp=1, util=UTIL, max_model_len=MAX_MODEL_LEN, vllm_version=VLLM)
        ev = evaluate_pair(lay, draft, acceptance=_acceptance())
        tgt = served_spec(lay)
        base = baseline_plan(lay, tgt)
        tr = build_traffic(request_rate="2,5,10,20,30,40", prompt_len=str(INPUT_LEN), output_len=str(OUTPUT_LEN),
                           num_requests=NUM_PROMPTS)
        t0 = time.perf_counter()
        surf = build_surface(tgt, ev.draft, lay.gpu, tp=1, k_values=(2,), max_batch=base.max_num_seqs,
                             context_len=tr.mean_context, rules=lay.engine.rules)
        curve = tuple(ACCEPTANCE ** (i + 1) for i in range(2))
        n = 0
        for rate in tr.rates:
            r = sample_requests(tr, rate, max_model_len=MAX_MODEL_LEN)
            simulate(r.prompt_len, r.output_len, r.arrival_s, surf, engine_limits(base, lay.engine, None, 0),
                     SpecConfig())
            simulate(r.prompt_len, r.output_len, r.arrival_s, surf,
                     engine_limits(ev.memory, lay.engine, "draft_model", 2), SpecConfig(2, curve=curve))
            n += 2
        t_point = time.perf_counter() - t0
        t0 = time.perf_counter()
        serving_load(lay, tgt, [(ev.draft, _acceptance(), ev.memory)], tr)
        t_full = time.perf_counter() - t0
        rows.append(f"| {target} + {draft} | {n} | {t_point:.2f} | {t_full:.2f} |")
    return ("Wall time of the simulator on this machine (2 shared cores), 300 requests per rate, 512/256 tokens, "
            "rates 2-40 req/s on an H200 layout.\n\n| pair | point runs | s | full stage (K search, schedule, "
            "band) s |\n|---|---|---|---|\n" + "\n".join(rows))


def posthoc(dirs) -> str:
    """Today's serve-sim at the measured configurations (the committed K, the measured rates), NOT pre-registered:
    written after the runs, once the fixed-batch 0.34 tables of the same pair were ingested. It tests the serving
    simulator given step costs measured at fixed batch, not the step-cost prediction."""
    from draftfit.layout import build_layout
    from draftfit.pipeline import evaluate_pair, served_spec
    from draftfit.serving import build_traffic, serving_load

    meas = _measured(dirs)
    acc = _acceptance()
    lines = ["Post hoc (written after the runs; not a pre-registration): today's `serve-sim` at the measured "
             "configurations, with the K and rates of the committed predictions. The step costs of these pairs now "
             "rest on the fixed-batch vLLM 0.34 tables ingested after the same leases (section `vllm034-refit`), so "
             "this checks the serving simulator given measured step costs, not a held-out prediction.", "",
             "| GPU | config | mode | req/s | TPOT p50 sim / meas | err | TPOT p99 sim / meas | err | "
             "out tok/s sim / meas | err | step costs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    pairs = {name: (t, d) for name, t, d in PAIRS}
    for short, gpu in GPUS:
        hits = sorted(PREDICTIONS.glob(f"*_serving__{short}.json"))
        if not hits:
            continue
        for p in json.loads(hits[-1].read_text())["predictions"]:
            rates = [pt["rate"] for pt in p["points"] if any((short, p["config"], m, pt["rate"]) in meas
                                                             for m in ("none", "spec"))]
            if not rates:
                continue
            target, draft = pairs[p["config"]]
            lay = build_layout(target, gpu=gpu, tp=1, util=UTIL, max_model_len=MAX_MODEL_LEN, vllm_version=VLLM,
                               k=p["k"])
            ev = evaluate_pair(lay, draft, acceptance=acc)
            traffic = build_traffic(request_rate=",".join(f"{r:g}" for r in rates), prompt_len=str(INPUT_LEN),
                                    output_len=str(OUTPUT_LEN), num_requests=NUM_PROMPTS)
            res = serving_load(lay, served_spec(lay), [(ev.draft, acc, ev.memory)], traffic)
            d = res.drafters[0]
            for pt in d.points:
                for mode, cfg in (("none", pt.baseline), ("spec", pt.best)):
                    m = meas.get((short, p["config"], mode, pt.rate))
                    if m is None:
                        continue
                    lines.append(_row(short, p["config"], mode if mode == "none" else f"K={p['k']}", pt.rate,
                                      cfg.tpot_p50_ms.value, cfg.tpot_p99_ms.value, cfg.output_throughput.value, m,
                                      lambda _e: d.step_cost_source[:60])[0])
            lines.append("")
            lines.append(f"- {short} {p['config']} (K={p['k']}): simulated crossover today: {d.crossover}")
            lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--speed", action="store_true")
    g.add_argument("--predict", action="store_true")
    g.add_argument("--stage", action="store_true")
    g.add_argument("--score", nargs="+", metavar="DIR")
    g.add_argument("--posthoc", nargs="+", metavar="DIR", help="today's serve-sim at the measured configurations "
                   "(not a pre-registration; section serving-load-posthoc)")
    a = ap.parse_args(argv)
    if a.predict:
        return predict()
    if a.stage:
        return stage()
    from bench._readme import write_section

    if a.speed:
        body = speed()
        write_section("serving-sim-speed", "### Serving-load simulator: how long a sweep takes\n\n" + body,
                      command=".venv/bin/python bench/serve_bench.py --speed")
        print(body)
        return 0

    if a.posthoc:
        body = posthoc(a.posthoc)
        write_section("serving-load-posthoc", "### Serving load, post hoc: today's serve-sim at the measured "
                      "configurations\n\n" + body, command="bench/serve_bench.py --posthoc " + " ".join(a.posthoc))
        print(body)
        return 0

    body = score(a.score)
    write_section("serving-load", "### Serving load: serve-sim vs the served engine under Poisson load (issue 40)\n\n" + body,
                  command="bench/serve_bench.py --score " + " ".join(a.score))
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
