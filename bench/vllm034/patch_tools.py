#!/usr/bin/env python3
"""Copies the campaign worker and driver into DEST (an ignored folder that travels to the GPU machine) and
adapts the copies for vLLM 0.34 (issue 38 item 3), the same way bench/vllm033/patch_tools.py does for 0.33
(whose patch texts this reuses): the driver runs the worker copy by path, reads model configs from DEST/configs,
uses /root/site2; the worker keeps the 0.33+ runner/memory log lines and fails fast.
0.34-specific: phases M034/S034 are taken from the copied gpu_campaign.py when it defines them (helper MEM34 adds
them); only when it does not are stand-ins added (the M033/S033 engines under the 0.34 names), and the script says
so. `VLLM_USE_V2_MODEL_RUNNER=0` (forward_probe) is removed from the copy: 0.34 rejects any value but 1.
Rerun after every merge that touches bench/gpu_campaign.py or the worker: bench/prepare_vllm034.sh --tools-only DEST.
usage: patch_tools.py DEST [--worker PATH] [--campaign bench/gpu_campaign.py] [--configs DIR]"""
import argparse, importlib.util, os, re, shutil, sys

_spec = importlib.util.spec_from_file_location(
    "patch_tools033", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vllm033", "patch_tools.py"))
p33 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(p33)

PHASES034 = p33.PHASES.replace("def phases033() -> dict:", "def phases034() -> dict:").replace(
    '"""Issue 17, vLLM 0.33', '"""Stand-in (prepare_vllm034.sh: gpu_campaign.py had no M034/S034), as 0.33\'s').replace(
    '"M033"', '"M034"').replace('"S033-llama"', '"S034-llama"').replace('"S033-qwen"', '"S034-qwen"').replace(
    '"S033"', '"S034"')


def soft(text, old, new, what, notes):
    """An optional edit (log lines, fail-fast): skipped with a note when the source already changed there."""
    if old in text:
        return text.replace(old, new)
    notes.append(f"skipped optional edit {what!r} (source changed; check by hand if it matters)")
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dest")
    ap.add_argument("--worker")
    ap.add_argument("--campaign", default="bench/gpu_campaign.py")
    ap.add_argument("--configs")
    a = ap.parse_args()
    os.makedirs(a.dest, exist_ok=True)
    notes = []
    wpath = p33.find([a.worker] if a.worker else ["draftfit/calibration/worker.py", "draftfit/calibrate_worker.py"],
                     "calibrate_worker.py", "def run_lane(")
    w = open(wpath).read()
    if "Using V2 Model Runner" not in w:
        w = soft(w, p33.WORKER_PATTERNS, p33.WORKER_PATTERNS_NEW.replace("vLLM 0.33 (copy for issue 17)",
                                                                         "vLLM 0.33/0.34 (tools copy)"),
                 "MEMORY_LINE_PATTERNS", notes)
    w = p33.resub(w, r'\[sys\.executable, "-m", "draftfit\.[a-z_.]+", "--json-spec", spec_path,',
                  '[sys.executable, os.path.abspath(__file__), "--json-spec", spec_path,', "worker subprocess")
    w = soft(w, p33.LAST_ERROR_OLD, p33.LAST_ERROR_NEW, "_last_error root cause", notes)
    w = soft(w, p33.LANE_TAIL_OLD, p33.LANE_TAIL_NEW, "fail fast", notes)
    if "VLLM_USE_V2_MODEL_RUNNER" in w:
        sys.exit("patch_tools: the worker sets VLLM_USE_V2_MODEL_RUNNER; vLLM 0.34 rejects it, adapt the worker")
    open(os.path.join(a.dest, "calibrate_worker.py"), "w").write(w)

    cpath = p33.find([a.campaign], "gpu_campaign.py", "def phases(")
    c = open(cpath).read()
    c = p33.resub(c, r'REPO = os\.path\.dirname\(os\.path\.dirname\(os\.path\.abspath\(__file__\)\)\)\nCONFIGS = os\.path\.join\(REPO, [^\n]*\)',
                  'TOOLS = os.path.dirname(os.path.abspath(__file__))  # tools copy (vLLM 0.34): runs the worker copy by path\nREPO = TOOLS\n'
                  'CONFIGS = os.path.join(TOOLS, "configs")\nWORKER = os.path.join(TOOLS, "calibrate_worker.py")', "REPO/CONFIGS")
    c = p33.resub(c, r'cmd = \[sys\.executable, "-m", "draftfit\.[a-z_.]+", "--lane", lane_path,',
                  'cmd = [sys.executable, WORKER, "--lane", lane_path,', "lane command")
    c = c.replace('"/root/site"', '"/root/site2"')
    # 0.34 raises on VLLM_USE_V2_MODEL_RUNNER=0 (notes/vllm-0.34.md R1): the probe runs on the default (V2) runner here.
    c, n_v2 = re.subn(r'env=\{"VLLM_USE_V2_MODEL_RUNNER": "0"\}', 'env={}', c)
    if n_v2:
        notes.append(f"dropped VLLM_USE_V2_MODEL_RUNNER=0 from {n_v2} engine spec(s) (forward_probe runs on V2)")
    code = "\n".join(ln.split("#", 1)[0] for ln in c.splitlines())  # comments may name the variable
    if re.search(r'VLLM_USE_V2_MODEL_RUNNER["\']?\s*[:=]\s*["\']?0', code):
        sys.exit("patch_tools: gpu_campaign.py still sets VLLM_USE_V2_MODEL_RUNNER=0 somewhere; 0.34 rejects it")
    c = soft(c, '"Actual usage"))][:6]', '"Actual usage", "Using V2", "CUDA graph pool",\n'
                '                                                 "Estimated CUDA graph"))][:10]', "summary lines", notes)
    has034 = '"M034"' in c and '"S034"' in c
    if not has034:
        c = p33.sub(c, 'def _with_c2(table: dict) -> dict:', PHASES034, "_with_c2")  # PHASES034 ends with that line
        c = p33.sub(c, 'all_phases = _with_c2(phases(args.work_dir))',
                    '# the source\'s own phases win over the stand-ins\n'
                    '    all_phases = dict(phases034(), **_with_c2(phases(args.work_dir)))', "all_phases")
        notes.append("gpu_campaign.py lacks M034 or S034: added stand-ins for what it lacks (the 0.33 engines under "
                     "0.34 names); rerun --tools-only after MEM34's phases are merged")
    open(os.path.join(a.dest, "gpu_campaign.py"), "w").write(c)
    dst = os.path.join(a.dest, "configs")
    shutil.rmtree(dst, ignore_errors=True)
    cfg = a.configs or next((d for d in ("draftfit/data/calibration/configs", "data/calibration/configs")
                             if os.path.isdir(d)), None)
    if not cfg:
        sys.exit("patch_tools: model configs not found (give --configs)")
    shutil.copytree(cfg, dst)
    for n in notes:
        print(f"patch_tools: note: {n}")
    print(f"patch_tools: worker ({wpath}), campaign ({cpath}; M034/S034 {'from the source' if has034 else 'stand-ins'}) "
          f"and configs in {a.dest}")


if __name__ == "__main__":
    main()
