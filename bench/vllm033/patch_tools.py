#!/usr/bin/env python3
"""Copies the campaign worker and driver into DEST (an ignored folder that travels to the GPU machine) and
adapts the copies for vLLM 0.33 (issue 17): the driver runs the worker copy by path (not -m draftfit...), reads
model configs from DEST/configs, uses /root/site2, and has phases M033 (memory only), S033 (step costs of both
8B pairs on one GPU), S033-llama and S033-qwen; the worker also keeps vLLM 0.33's memory/runner log lines.
usage: patch_tools.py DEST [--worker draftfit/calibrate_worker.py] [--campaign bench/gpu_campaign.py]
                          [--configs data/calibration/configs]"""
import argparse, os, re, shutil, sys, glob

WORKER_PATTERNS = '''    "init engine", "KV cache", "Graph capturing finished", "async scheduling", "Async scheduling",
)'''
WORKER_PATTERNS_NEW = '''    "init engine", "KV cache", "Graph capturing finished", "async scheduling", "Async scheduling",
    # vLLM 0.33 (copy for issue 17): runner choice, reworded actual-usage line, CUDA-graph profiling
    "Using V2 Model Runner", "Model Runner", "Free memory on device", "Profiling CUDA graph memory",
    "Estimated CUDA graph memory", "CUDA graph pool memory", "Free memory grew", "Initial free memory",
    "Free memory after profiling", "MemoryProfilingResult", "non_kv_cache_memory", "max_num_batched_tokens",
    "Chunked prefill", "gpu-memory-utilization", "cudagraph_capture_sizes", "Loading weights took",
)'''

PHASES = '''def phases033() -> dict:
    """Issue 17, vLLM 0.33 on one H200. M033: memory only (start, log, exit), max_num_seqs 128 as phase A,
    DEBUG log level (the profiler's breakdown lines); last: one engine with vLLM's default max_num_seqs.
    S033: step costs like phase A (acceptance 0.8) for both 8B pairs on one GPU, baselines and K 1, 2, 4 first."""
    l8, l1, q8, q06 = "Llama-3.1-8B", "Llama-3.2-1B", "Qwen3-8B", "Qwen3-0.6B"
    dbg = {"VLLM_LOGGING_LEVEL": "DEBUG"}
    mem = []
    for util, mml in ((0.85, 2048), (0.6, 16384)):
        for t, d in ((l8, l1), (q8, q06)):
            mem.append(engine(t, None, 0, memory_only=True, util=util, max_model_len=mml, max_num_seqs=128, env=dbg))
            mem.append(engine(t, d, 4, memory_only=True, util=util, max_model_len=mml, max_num_seqs=128, env=dbg))
    e = engine(l8, l1, 4, memory_only=True, util=0.85, max_model_len=2048, env=dbg)
    mem.append(dict(e, id=e["id"] + "-defseqs"))
    ks = [1, 2, 4, 3, 6]
    return {"M033": [("gpu0", "0", 90, mem)],
            "S033-llama": [("gpu0", "0", 90, pair_lane(l8, l1, ks))],
            "S033-qwen": [("gpu0", "0", 90, pair_lane(q8, q06, ks))],
            "S033": [("gpu0", "0", 90, pair_lane(l8, l1, [1, 2, 4]) + pair_lane(q8, q06, [1, 2, 4])
                      + [engine(t, d, k) for k in (3, 6) for t, d in ((l8, l1), (q8, q06))])]}


def _with_c2(table: dict) -> dict:'''


LAST_ERROR_OLD = '''def _last_error(log: str) -> str:
    lines = [ln for ln in _ANSI.sub("", log).splitlines() if ln.strip()]
'''
LAST_ERROR_NEW = LAST_ERROR_OLD + '''    for ln in lines:  # the root cause first: vLLM's last line is only "Engine core initialization failed"
        if any(p in ln for p in ("ModuleNotFoundError", "ImportError", "undefined symbol", "OutOfMemoryError",
                                 "CUDA error", "AssertionError", "NotImplementedError")):
            return ln.strip()[:800]
'''
LANE_TAIL_OLD = '''            entry["gpu_free_wait_s"] = _wait_gpu_free(visible)
        _atomic_write_json(out_path, report)
'''
LANE_TAIL_NEW = LANE_TAIL_OLD + '''        done = [c for c in report["configs"] if c.get("status") not in (None, "skipped")]
        if (len(done) >= 2 and all(c.get("status") == "failed" and not (c.get("result") or {}).get("startup_s")
                                   for c in done[-2:]) and len({re.sub(r"^.*\\] ", "", c.get("error") or "") for c in done[-2:]}) == 1):
            print(f"[lane] two starts failed with the same error, stopping: {done[-1].get('error')}", flush=True)
            for c in lane["configs"][i + 1:]:
                report["configs"].append({"id": c.get("id"), "spec": c, "status": "skipped",
                                          "reason": "stopped after two identical start failures"})
            _atomic_write_json(out_path, report)
            break
'''


def resub(text, pattern, new, what):
    out, n = re.subn(pattern, lambda m: new, text)
    if not n:
        sys.exit(f"patch_tools: cannot find {what!r}; the source changed, adapt bench/vllm033/patch_tools.py")
    return out


def sub(text, old, new, what):
    if old not in text:
        sys.exit(f"patch_tools: cannot find {what!r}; the source changed, adapt bench/vllm033/patch_tools.py")
    return text.replace(old, new)


def find(defaults, name, marker):
    for d in defaults:
        if os.path.exists(d):
            return d
    hits = [p for p in glob.glob("**/*.py", recursive=True) if ".gpu" not in p and "bench/vllm033" not in p
            and marker in open(p, errors="replace").read()]
    if not hits:
        sys.exit(f"patch_tools: {name} not found")
    return hits[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dest")
    ap.add_argument("--worker", help="default: draftfit/calibration/worker.py or draftfit/calibrate_worker.py")
    ap.add_argument("--campaign", default="bench/gpu_campaign.py")
    ap.add_argument("--configs", help="default: draftfit/data/calibration/configs or data/calibration/configs")
    a = ap.parse_args()
    os.makedirs(a.dest, exist_ok=True)
    wpath = find([a.worker] if a.worker else ["draftfit/calibration/worker.py", "draftfit/calibrate_worker.py"],
                 "calibrate_worker.py", "def run_lane(")
    w = open(wpath).read()
    w = sub(w, WORKER_PATTERNS, WORKER_PATTERNS_NEW, "MEMORY_LINE_PATTERNS")
    w = resub(w, r'\[sys\.executable, "-m", "draftfit\.[a-z_.]+", "--json-spec", spec_path,',
              '[sys.executable, os.path.abspath(__file__), "--json-spec", spec_path,', "worker subprocess")
    # Fail fast (learned on 2026-12-01: nine engines failed one after another on the same missing module, 305 s):
    # the error names the root cause, and a lane stops after two start failures with the same error.
    w = sub(w, LAST_ERROR_OLD, LAST_ERROR_NEW, "_last_error")
    w = sub(w, LANE_TAIL_OLD, LANE_TAIL_NEW, "fail fast")
    open(os.path.join(a.dest, "calibrate_worker.py"), "w").write(w)
    c = open(find([a.campaign], "gpu_campaign.py", "def phases(")).read()
    c = resub(c, r'REPO = os\.path\.dirname\(os\.path\.dirname\(os\.path\.abspath\(__file__\)\)\)\nCONFIGS = os\.path\.join\(REPO, [^\n]*\)',
            'TOOLS = os.path.dirname(os.path.abspath(__file__))  # copy (issue 17): runs the worker copy by path\nREPO = TOOLS\n'
            'CONFIGS = os.path.join(TOOLS, "configs")\nWORKER = os.path.join(TOOLS, "calibrate_worker.py")', "REPO/CONFIGS")
    c = resub(c, r'cmd = \[sys\.executable, "-m", "draftfit\.[a-z_.]+", "--lane", lane_path,',
              'cmd = [sys.executable, WORKER, "--lane", lane_path,', "lane command")
    c = sub(c, 'if os.path.isdir("/root/site") and "/root/site" not in os.environ.get("PYTHONPATH", ""):\n'
               '        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in ("/root/site", os.environ.get("PYTHONPATH")) if p)',
            'if os.path.isdir("/root/site2") and "/root/site2" not in os.environ.get("PYTHONPATH", ""):\n'
            '        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in ("/root/site2", os.environ.get("PYTHONPATH")) if p)',
            "/root/site")
    c = sub(c, '"Actual usage"))][:6]', '"Actual usage", "Using V2", "CUDA graph pool",\n'
               '                                                 "Estimated CUDA graph"))][:10]', "summary lines")
    c = sub(c, 'def _with_c2(table: dict) -> dict:', PHASES, "_with_c2")
    c = sub(c, 'all_phases = _with_c2(phases(args.work_dir))',
            'all_phases = dict(_with_c2(phases(args.work_dir)), **phases033())', "all_phases")
    open(os.path.join(a.dest, "gpu_campaign.py"), "w").write(c)
    dst = os.path.join(a.dest, "configs")
    shutil.rmtree(dst, ignore_errors=True)
    cfg = a.configs or next((d for d in ("draftfit/data/calibration/configs", "data/calibration/configs")
                             if os.path.isdir(d)), None)
    if not cfg:
        sys.exit("patch_tools: model configs not found (give --configs)")
    shutil.copytree(cfg, dst)
    print(f"patch_tools: worker, campaign and configs in {a.dest}")


if __name__ == "__main__":
    main()
