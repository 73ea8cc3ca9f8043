"""What varies between timed repeats of a speculative engine: GPU clock, GPU busy time, host CPU.

Reads the campaign files whose rows carry a GPU trace (nvidia-smi every 200 ms beside the repeats,
`bench/gpu_campaign.py --gpu-trace`) and host counters per repeat (the worker's host_snapshot), and the
calibration tables for the cost of each further draft pass. Writes the README section `host-trace`.

    .venv/bin/python bench/host_trace.py [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._readme import markdown_table, write_section  # noqa: E402

COMMAND = ".venv/bin/python bench/host_trace.py"
RAW = ROOT / "data" / "calibration" / "raw"


def repeat_rows(batch_row: dict) -> list[dict]:
    """Per timed repeat: step ms (its own engine steps), GPU-busy ms per step (utilisation x step), the
    median SM clock, steal seconds and the busiest process's CPU share."""
    steps, spans = batch_row.get("engine_steps_per_repeat") or [], batch_row.get("repeat_spans_unix") or []
    trace, hosts = batch_row.get("gpu_trace") or [], batch_row.get("host_per_repeat") or []
    if not steps or None in steps or not spans:
        return []
    t1 = statistics.median(batch_row["t1_s"])
    out = []
    for i, (wall, n) in enumerate(zip(batch_row["tM_s"], steps)):
        step_ms = 1000 * (wall - t1) / n
        lo, hi = spans[i]
        samples = [s for s in trace if lo <= s[0] <= hi]
        host = hosts[i] if i < len(hosts) else {}
        procs = host.get("procs") or []
        out.append({"step_ms": step_ms,
                    "gpu_busy_ms": step_ms * statistics.median(s[3] for s in samples) / 100 if samples else None,
                    "sm_mhz": statistics.median(s[1] for s in samples) if samples else None,
                    "steal_s": host.get("steal_s"),
                    "cpu_share": procs[0]["cpu_s"] / wall if procs and wall else None,
                    "cpu_ms_per_step": 1000 * procs[0]["cpu_s"] / n if procs and n else None})
    return out


def traced_engines(paths) -> list[dict]:
    """Engines with a GPU trace, in the order they ran (by their file's start time, then within it)."""
    engines = []
    loaded = [(json.loads(Path(p).read_text()), p) for p in paths]
    for lane, path in sorted(loaded, key=lambda lp: lp[0].get("started_unix") or 0):
        for entry in lane.get("configs", []):
            res = entry.get("result") or {}
            per_batch = {int(b): repeat_rows(r) for b, r in (res.get("batches") or {}).items() if "tM_s" in r}
            # A repeat shorter than the trace's sampling interval has no sample (the forward probes' 48-token
            # repeats of a 1-3 ms step): only sampled repeats are traced ones.
            per_batch = {b: [r for r in rows if r["sm_mhz"] is not None] for b, rows in per_batch.items()}
            per_batch = {b: rows for b, rows in per_batch.items() if rows}
            spies = {int(b): r["pyspy"] for b, r in (res.get("batches") or {}).items()
                     if (r.get("pyspy") or {}).get("samples")}
            if per_batch:
                env = (entry.get("spec") or {}).get("env") or {}
                engines.append({"id": entry["id"], "file": Path(path).name, "per_batch": per_batch,
                                "in_process": env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0",
                                "k": int(res.get("k") or 0), "pyspy": spies})
    return engines


def further_pass_ms(tables) -> list[dict]:
    """Per table at batch 1: the step cost added by each further draft pass between measured K."""
    out = []
    for t in tables:
        ks = [k for k in t.ks if t.spec_step_ms(k, 1)]
        if len(ks) < 3:
            continue
        steps = {k: t.spec_step_ms(k, 1) for k in ks}
        out.append({"table": Path(t.path).name, "steps": steps,
                    "per_pass": {f"{a}->{b}": (steps[b] - steps[a]) / (b - a) for a, b in zip(ks, ks[1:])}})
    return out


def _stem(engine_id: str) -> str:
    """The configuration of an engine id: 'Qwen3-8B-Qwen3-0.6B-k4-tp1-t3b-inproc' -> '...-k4-tp1'."""
    return engine_id.split("-tp", 1)[0] + "-tp" + engine_id.split("-tp", 1)[1].split("-", 1)[0]


def _in_process_pairs(engines) -> dict:
    """{multiprocess engine id: {batch: (median step in-process / multiprocess, the same for the engine
    core's CPU ms per step)}}, each in-process engine paired with the multiprocess start of the same
    configuration that ran just before it (the same lent machine, minutes apart)."""
    out = {}
    for i, e in enumerate(engines):
        if not e["in_process"]:
            continue
        before = [o for o in engines[:i] if not o["in_process"] and _stem(o["id"]) == _stem(e["id"])]
        if not before:
            continue
        other = before[-1]
        ratios = {}
        for b in sorted(set(e["per_batch"]) & set(other["per_batch"])):
            cpu_in, cpu_mp = _median_of(e, b, "cpu_ms_per_step"), _median_of(other, b, "cpu_ms_per_step")
            ratios[b] = (_median_of(e, b, "step_ms") / _median_of(other, b, "step_ms"),
                         cpu_in / cpu_mp if cpu_in and cpu_mp else None)
        out[other["id"]] = ratios
    return out


def _median_of(engine: dict, batch: int, key: str) -> float | None:
    vals = [r[key] for r in engine["per_batch"][batch] if r.get(key)]
    return statistics.median(vals) if vals else None


def _rng(vals, fmt="{:.1f}") -> str:
    vals = [v for v in vals if v is not None]
    return f"{fmt.format(min(vals))}-{fmt.format(max(vals))}" if vals else ""


def render(engines, passes) -> str:
    if not engines:
        return "No traced engines yet: run `bench/gpu_campaign.py --phase T --gpu-trace` on a GPU."
    batches = sorted({b for e in engines for b in e["per_batch"]})
    rows = []
    for e in engines:
        rows.append([e["id"] + (" (engine core in-process)" if e["in_process"] else ""), e["file"]]
                    + [f"{_rng(r['step_ms'] for r in e['per_batch'][b])} ({_rng(r['gpu_busy_ms'] for r in e['per_batch'][b])})"
                       if b in e["per_batch"] else "" for b in batches])
    allrows = [r for e in engines for rs in e["per_batch"].values() for r in rs]
    spec = [r for e in engines if e["k"] for rs in e["per_batch"].values() for r in rs]
    base = [r for e in engines if not e["k"] for rs in e["per_batch"].values() for r in rs]
    steal = [r["steal_s"] for r in allrows if r["steal_s"] is not None]
    share = lambda rs: _rng((r["cpu_share"] for r in rs), "{:.0%}")  # noqa: E731
    small = [r for e in engines for b, rs in e["per_batch"].items() if b <= 32 for r in rs]
    large = [r for e in engines for b, rs in e["per_batch"].items() if b > 32 for r in rs]
    lines = [
        f"{len(engines)} engines traced ({len(allrows)} timed repeats): SM clock (median over each repeat) "
        f"{_rng((r['sm_mhz'] for r in small), '{:.0f}')} MHz at batch <= 32, "
        f"{_rng((r['sm_mhz'] for r in large), '{:.0f}')} MHz at batch 128 (lowest for the 32B pair), "
        f"CPU steal at most {max(steal, default=float('nan')):.2f} s per repeat. The busiest process "
        f"(vLLM's engine core) used {share(spec)} of one core in the speculative engines and {share(base) or 'n/a'} "
        "in the plain ones. Per engine and batch: step ms over the repeats (min-max), and in brackets the GPU-busy "
        "ms per step (nvidia-smi utilisation x step). Where the step varies and the GPU-busy time does not, the "
        "host (the engine core's single busy thread) made the difference, not the GPU.",
        "",
        markdown_table(["engine", "file"] + [f"batch {b}: step (GPU busy) ms" for b in batches], rows),
    ]
    pairs = _in_process_pairs(engines)
    if pairs:
        qwen = [r for eid, rs in pairs.items() if eid.startswith("Qwen3") for r, _ in rs.values()]
        other = [r for eid, rs in pairs.items() if not eid.startswith("Qwen3") for r, _ in rs.values()]
        lines += ["", "The same configuration with vLLM's engine core in the calling process "
                  "(VLLM_ENABLE_V1_MULTIPROCESSING=0, a diagnostic: `vllm serve` runs it as its own process, so these "
                  "never enter a table), started right after a multiprocess start on the same machine; median step "
                  "in-process / multiprocess per batch (in brackets the same for the engine core's CPU ms per step): "
                  + "; ".join(f"{eid} " + ", ".join(f"b{b} {r:.2f}" + (f" ({c:.2f})" if c else "")
                                                     for b, (r, c) in ratios.items())
                              for eid, ratios in pairs.items()) + "."
                  + (f" Qwen3-8B + Qwen3-0.6B ran faster in-process in {sum(r < 1 for r in qwen)} of {len(qwen)} "
                     f"(start, batch) pairs ({_rng(qwen, '{:.2f}')}x the multiprocess step)" if qwen else "")
                  + (f", the Llama pair did not ({_rng(other, '{:.2f}')}x)" if other else "")
                  + ". The engine core is on the CPU all the time in both layouts and its CPU time per step moves "
                  "with the step: where the layout matters, the multiprocess core runs the same Python more slowly. The absolute steps also "
                  "move between lent machines (see the table above): a host-bound step is a property of the host."]
    spied = [e for e in engines if e.get("pyspy")]
    if spied:
        lines += ["", "py-spy on the engine core during one repeat (250 Hz, --threads): the leaf frames with the most "
                  "samples (self time, share of the samples) at batch 1 and 32. The profile has the same shape in both "
                  "layouts (custom-op dispatch, Tensor.split of the KV cache per layer, CUDA-graph replay): in the Qwen3 "
                  "pairs the multiprocess core does the same work, more slowly.", ""]
        lines += [markdown_table(["engine", "batch", "samples", "leaf frames (share of samples)"],
                                 [[e["id"] + (" (in-process)" if e["in_process"] else ""), b, spy["samples"],
                                   ", ".join(f"{fn.split(' (')[0]} ({fn.split(' (')[-1].split('/')[-1]} "
                                             f"{n / spy['samples']:.0%}" for fn, n in spy["self"][:6])]
                                  for e in spied for b, spy in sorted(e["pyspy"].items()) if b in (1, 32)])]
    if passes:
        lines += ["", "Cost of each further draft pass at batch 1 (ms per pass between the measured K, steady-state "
                  "steps of the calibration tables):", "",
                  markdown_table(["table", "step ms at K", "ms per further pass"],
                                 [[p["table"], ", ".join(f"K{k} {v:.1f}" for k, v in p["steps"].items()),
                                   ", ".join(f"{k}: {v:.1f}" for k, v in p["per_pass"].items())] for p in passes])]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    from draftfit.calibration.tables import load_tables

    engines = traced_engines(sorted(RAW.glob("*/*_gpu*.json")))
    body = render(engines, further_pass_ms([t for t in load_tables() if t.tp == 1]))
    print(body)
    if not args.no_readme:
        write_section("host-trace", body, command=COMMAND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
