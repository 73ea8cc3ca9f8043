"""`draftfit measure TARGET DRAFT --workload code` — acceptance measured through vLLM (or the HF estimator),
stored with provenance, printed with its curve over K. The measuring itself is draftfit.acceptance.measure.run."""

from __future__ import annotations

import time

import click

from draftfit.rules import WORKLOAD_HELP, WORKLOADS

from draftfit.cli.render import console, emit_json, json_option, table
from draftfit.acceptance.measure import vllm as vllm_backend  # noqa: F401  the module is the seam tests patch
from draftfit.acceptance.measure.vllm import MeasureRequest
from draftfit.acceptance.measure.run import (MAX_MODEL_LEN_TOKENS, MAX_PROMPTS, MAX_SEED, MAX_TOKENS, MEASURE_K_MAX,
                                             MIN_MODEL_LEN_TOKENS, run_measurement)
from draftfit.layout import check_int, check_k, check_temperature, parse_float_list


def _parse_temperatures(value: str) -> list[float]:
    temps = list(parse_float_list(value, "--temperature", example="0,0.7"))
    for t in temps:
        check_temperature(t)
    return temps


@click.command()
@click.argument("target")
@click.argument("draft")
@click.option("--workload", type=click.Choice(WORKLOADS), default="code", show_default=True,
              help="Built-in prompt set: " + WORKLOAD_HELP + ".")
@click.option("--temperature", "temperature", default="0", show_default=True, help="One or more, comma-separated.")
@click.option("--k", "k", type=int, default=8, show_default=True, help="K_max; the curve covers every K <= it.")
@click.option("--prompts", "--max-prompts", "num_prompts", type=int, default=6, show_default=True,
              help="Prompts to run (the first N of the built-in set, or of --prompts-file).")
@click.option("--prompts-file", type=click.Path(dir_okay=False), default=None,
              help='Your own prompts: JSONL of {"prompt": ...} (raw completion) or {"messages": [...]} (chat '
                   "template applied), or an OpenAI-compatible request log; --workload labels them.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Sampling top_p (with --temperature > 0).")
@click.option("--max-tokens", type=int, default=48, show_default=True)
@click.option("--backend", type=click.Choice(["vllm", "hf"]), default="vllm", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-model-len", "max_model_len", type=int, default=MeasureRequest.max_model_len, show_default=True,
              help="vLLM engine's max_model_len in tokens (its KV pool must hold one such request).")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None,
              help="SQLite store (default: ~/.cache/draftfit/measurements.sqlite).")
@json_option
def measure(target, draft, workload, temperature, k, num_prompts, prompts_file, top_p, max_tokens, backend, seed,
            max_model_len, store_path, as_json):
    """Measure acceptance of DRAFT for TARGET (local folders, or the Qwen2.5-Coder pair after `make models`).

    DRAFT is a draft model, or `ngram` / `suffix` (vLLM's model-free drafters). Every K <= --k comes from one run.

    \b
    Examples:
      draftfit measure Qwen2.5-Coder-1.5B Qwen2.5-Coder-0.5B --workload code --k 4 --json
      draftfit measure Qwen2.5-Coder-1.5B ngram --prompts-file my_traffic.jsonl --k 4 --json
    """

    temperatures = _parse_temperatures(temperature)
    check_k(k, "--k", MEASURE_K_MAX)
    check_int(num_prompts, "--prompts", 1, MAX_PROMPTS, fix="e.g. --prompts 6")
    check_int(max_tokens, "--max-tokens", 2, MAX_TOKENS, fix="e.g. --max-tokens 48")
    check_int(seed, "--seed", 0, MAX_SEED, fix="e.g. --seed 0")
    check_int(max_model_len, "--max-model-len", MIN_MODEL_LEN_TOKENS, MAX_MODEL_LEN_TOKENS,
              fix="e.g. --max-model-len 2048")
    t0 = time.monotonic()
    results = run_measurement(target, draft, workload=workload, temperatures=temperatures,
                              k=k, num_prompts=num_prompts, max_tokens=max_tokens, backend=backend, seed=seed,
                              store_path=store_path, progress=not as_json, max_model_len=max_model_len,
                              prompts_file=prompts_file, top_p=top_p)
    if as_json:
        emit_json([{
            "run_id": r.run_id, "target": r.target, "draft": r.draft, "workload": r.workload, "backend": r.backend,
            "temperature": r.temperature, "k": r.k, "acceptance_rate": r.acceptance_rate,
            "mean_acceptance_length": r.mean_acceptance_length, "per_position": r.per_position,
            "ci": {"level": 0.95, "over": "prompt groups (bootstrap)",
                   "acceptance_rate": [r.ci_low, r.ci_high],
                   "mean_acceptance_length": [r.mal_ci_low, r.mal_ci_high]},
            "counts": {"num_drafts": r.num_drafts, "num_draft_tokens": r.num_draft_tokens,
                       "num_accepted": r.num_accepted, "per_position_accepted": r.per_position_accepted},
            "curve": [{"k": p.k, "acceptance_rate": p.acceptance_rate,
                       "mean_acceptance_length": p.mean_acceptance_length} for p in r.curve],
            "tokens_per_s": r.tokens_per_s, "seconds": r.seconds, "source": r.source,
            "suspect": r.suspect} for r in results])
        return
    con = console()
    if any(r.suspect for r in results):  # one line, before any number that must not be trusted
        con.print(f"[bold red]warning:[/] runs {', '.join(str(r.run_id) for r in results if r.suspect)} stored as "
                  f"suspect, not used by rank — {next(r.suspect for r in results if r.suspect)}", soft_wrap=True)
    for r in results:
        ci = (f"{r.ci_low:.3f}–{r.ci_high:.3f}" if r.ci_low is not None else "n/a (1 group)")
        con.print(f"[bold]{r.target}[/] ← draft [bold]{r.draft}[/]  {r.workload}  T={r.temperature}  "
                  f"K={r.k}  run {r.run_id} ({r.backend})")
        con.print(f"acceptance rate {r.acceptance_rate:.3f} (95% CI {ci}), mean acceptance length "
                  f"{r.mean_acceptance_length:.2f} tokens/step, {r.num_drafts} drafts, "
                  f"{r.tokens_per_s:.1f} output tok/s")
        rows = [[p.k, f"{p.acceptance_rate:.3f}", f"{p.mean_acceptance_length:.2f}",
                 f"{r.per_position[p.k - 1]:.3f}"] for p in r.curve]
        con.print(table(f"Acceptance curve from run {r.run_id} (K ≤ {r.k}, same counts)",
                        ["K", "acceptance rate", "mean acc. length", "a_K (position K-1)"], rows))
    con.print(f"[dim]{time.monotonic() - t0:.0f} s; runs {', '.join(str(r.run_id) for r in results)} stored "
              f"(see `draftfit runs show ID`)[/]")
