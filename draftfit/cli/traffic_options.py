"""The traffic options serve-sim, rank and preflight share (one set of names, one validation: serving.traffic),
and the rendering of a serving-load result beside a fixed-batch view."""

from __future__ import annotations

import click

from draftfit.cli.render import table
from draftfit.errors import DraftfitError
from draftfit.layout import check_float
from draftfit.pipeline import INCOMPATIBLE, NO_FIT, evaluate_pair, resolve_drafter, served_spec
from draftfit.serving import serving_load
from draftfit.serving.traffic import Traffic, build_traffic

DEFAULT_NUM_REQUESTS = 300


def traffic_options(f=None, *, prompts_file: bool = True):
    """--request-rate / --concurrency, lengths, request log or prompts file, --num-requests, --seed, SLOs.
    `prompts_file` False leaves --prompts-file to the command (rank's: logged requests with outputs, replayed for
    n-gram / suffix, whose prompt lengths the command passes on as traffic_prompts_file under a load)."""
    if f is None:
        return lambda g: traffic_options(g, prompts_file=prompts_file)
    opts = [
        click.option("--request-rate", "request_rate", default=None, metavar="R[,R...]|auto",
                     help="Poisson request rate(s) in requests/s, as `vllm bench serve --request-rate`; a list sweeps; "
                          "auto: six rates from light load to past the modelled saturation."),
        click.option("--concurrency", type=int, default=None,
                     help="Instead of a rate: this many clients, each sending its next request when one ends "
                          "(`vllm bench serve --max-concurrency`)."),
        click.option("--prompt-len", default="512", show_default=True,
                     help="Prompt tokens: N, LO..HI (uniform) or lognormal:MEAN,SD."),
        click.option("--output-len", default="256", show_default=True,
                     help="Output tokens: N, LO..HI (uniform) or lognormal:MEAN,SD."),
        click.option("--request-log", default=None, metavar="FILE",
                     help="CSV or JSONL rows of prompt_len, output_len (or prompt_tokens, completion_tokens): both "
                          "lengths from your traffic."),
        click.option("--prompts-file", "traffic_prompts_file", default=None, metavar="FILE",
                     help="Your prompts (JSONL, as `draftfit measure --prompts-file`): prompt lengths estimated from "
                          "their characters; output lengths from --output-len.") if prompts_file else None,
        click.option("--num-requests", type=int, default=DEFAULT_NUM_REQUESTS, show_default=True,
                     help="Requests per rate (vllm bench serve --num-prompts)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of lengths, arrivals, acceptance."),
        click.option("--slo-tpot-ms", type=float, default=None, help="Goodput: a request's TPOT at most this (ms)."),
        click.option("--slo-ttft-ms", type=float, default=None, help="Goodput: a request's TTFT at most this (ms)."),
    ]
    for opt in reversed(opts):
        if opt is not None:
            f = opt(f)
    return f


TRAFFIC_PARAMS = ("request_rate", "concurrency", "prompt_len", "output_len", "request_log", "traffic_prompts_file",
                  "num_requests", "seed", "slo_tpot_ms", "slo_ttft_ms")


def check_slo(value, option: str) -> float | None:
    if value is None:
        return None
    return check_float(value, option, 0, 3.6e6, lo_open=True, fix=f"pass {option} in milliseconds, e.g. 50")


def traffic_from(kw: dict, *, required: bool = True) -> Traffic | None:
    """The Traffic the options describe; None when no load option was given and none is required. Any traffic
    option given without a load is an error (it would be silently ignored)."""
    if kw.get("request_rate") is None and kw.get("concurrency") is None and not required:
        ctx = click.get_current_context(silent=True)
        given = []
        if ctx is not None:
            for p in TRAFFIC_PARAMS:
                src = ctx.get_parameter_source(p)
                if src is not None and src != click.core.ParameterSource.DEFAULT:
                    given.append("--" + p.replace("traffic_", "").replace("_", "-"))
        if given:
            raise DraftfitError(f"{', '.join(given)} describe traffic, which needs a load",
                                fix="add --request-rate R (requests/s) or --concurrency N, or drop them")
        return None
    check_slo(kw.get("slo_tpot_ms"), "--slo-tpot-ms")
    check_slo(kw.get("slo_ttft_ms"), "--slo-ttft-ms")
    return build_traffic(request_rate=kw.get("request_rate"), concurrency=kw.get("concurrency"),
                         prompt_len=kw.get("prompt_len", "512"), output_len=kw.get("output_len", "256"),
                         prompts_file=kw.get("traffic_prompts_file"), request_log=kw.get("request_log"),
                         num_requests=kw.get("num_requests", DEFAULT_NUM_REQUESTS), seed=kw.get("seed", 0))


def _b(band, digits=1) -> str:
    if band is None:
        return "n/a"
    return f"{band.value:.{digits}f} [{band.low:.{digits}f}-{band.high:.{digits}f}]"


def render_load(res, con, *, explain: bool = False) -> None:
    """The serving-load tables: one per drafter, a row per rate, no speculation beside the best configuration."""
    slo = res.slo_tpot_ms is not None or res.slo_ttft_ms is not None
    for d in res.drafters:
        rows = []
        for p in d.points:
            rate = f"{p.rate:g}" if p.rate is not None else f"{res.traffic['concurrency']} clients"
            b, s = p.baseline, p.best
            row = [rate, s.label, f"{b.tpot_p50_ms.value:.1f} / {b.tpot_p99_ms.value:.1f}",
                   f"{_b(s.tpot_p50_ms)} / {s.tpot_p99_ms.value:.1f}",
                   f"{b.ttft_p50_ms.value:.0f} / {s.ttft_p50_ms.value:.0f}",
                   f"{b.itl_p50_ms.value:.1f} / {s.itl_p50_ms.value:.1f}",
                   f"{b.output_throughput.value:.0f} / {_b(s.output_throughput, 0)}"]
            if slo:
                row.append(f"{b.goodput.value:.2f} / {_b(s.goodput, 2)}")
            row.append("yes" if p.pays else "no")
            rows.append(row)
        cols = ["req/s", "best config", "TPOT p50/p99 ms, none", "TPOT p50 [band] / p99, spec",
                "TTFT p50 ms none/spec", "ITL p50 ms none/spec", "out tok/s none / spec [band]"]
        if slo:
            cols.append("goodput req/s none / spec [band]")
        cols.append("pays")
        title = (f"{res.target} + {d.drafter} ({d.method}) on {res.gpu} x{res.tp}, vLLM {res.vllm_version}: "
                 f"{res.traffic['prompt_len']} prompt / {res.traffic['output_len']} output tokens")
        caption = (f"step costs: {d.step_cost_source} (vLLM {d.step_cost_vllm}), band ±{d.band_spec:.0%} spec / "
                   f"±{d.band_plain:.0%} plain; acceptance {d.acceptance:.2f} ({d.acceptance_source}); KV "
                   f"{d.kv_tokens:,} tokens with the drafter, {d.kv_tokens_baseline:,} without (memory plan)")
        con.print(table(title, cols, rows, caption=caption, overflow="fold"))
        con.print(f"serve: {d.recommended}; speculation {d.crossover}", highlight=False, markup=False)
        if explain:
            for p in d.points:
                tried = "; ".join(f"{k}: TPOT p50 {v['tpot_p50_ms']:.2f} ms, {v['output_throughput']:.0f} tok/s"
                                  + (f", goodput {v['goodput']:.2f}" if v.get("goodput") is not None else "")
                                  for k, v in p.tried.items())
                con.print(f"  {p.rate if p.rate is not None else 'closed loop'}: {tried}", highlight=False,
                          markup=False)
                con.print(f"    mean decoding batch {p.baseline.mean_batch:.1f} none / {p.best.mean_batch:.1f} spec; "
                          f"{p.best.tokens_per_step:.2f} tokens per sequence-step; preemptions "
                          f"{p.baseline.preemptions} / {p.best.preemptions}; peak KV use "
                          f"{p.baseline.kv_peak_share:.0%} / {p.best.kv_peak_share:.0%}", highlight=False,
                          markup=False)
            for n in d.notes:
                con.print(f"  note: {n}", style="dim", highlight=False, markup=False)
    if res.winner:
        con.print(f"winner at this traffic: {res.winner}", style="bold green", highlight=False, markup=False)
    elif res.drafters:
        con.print("no drafter pays at this traffic: serve without speculation", style="bold yellow",
                  highlight=False, markup=False)
    eng = res.engine
    con.print(f"model: {res.model}; max_num_seqs {eng['max_num_seqs']}, max_num_batched_tokens "
              f"{eng['max_num_batched_tokens']}, KV block {eng['block_size']} tokens; scheduler {eng['scheduler']}; "
              f"memory {eng['memory']}" + (f"; modelled saturation {res.saturation_rate:g} req/s without speculation"
                                           if res.saturation_rate else ""), style="dim", highlight=False, markup=False)
    con.print("TTFT, ITL, TPOT as `vllm bench serve` defines them; [band]: every step at the step-cost band's ends "
              "and acceptance at its band's ends; prefill and context terms are roofline (draftfit/serving/steps.py)",
              style="dim", highlight=False, markup=False)
    for n in res.notes:
        con.print(f"note: {n}", style="dim", highlight=False, markup=False)


def plot_load(res, path: str) -> str:
    """PNG: request rate on x; TPOT p50/p99 and output throughput with and without speculation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for d in res.drafters:
        pts = [p for p in d.points if p.rate is not None]
        x = [p.rate for p in pts]
        if d is res.drafters[0]:
            ax1.plot(x, [p.baseline.tpot_p50_ms.value for p in pts], "k-o", label="no speculation p50")
            ax1.plot(x, [p.baseline.tpot_p99_ms.value for p in pts], "k--", label="no speculation p99")
            ax2.plot(x, [p.baseline.output_throughput.value for p in pts], "k-o", label="no speculation")
        line, = ax1.plot(x, [p.best.tpot_p50_ms.value for p in pts], "-o", label=f"{d.drafter} p50 (best K)")
        ax1.fill_between(x, [p.best.tpot_p50_ms.low for p in pts], [p.best.tpot_p50_ms.high for p in pts],
                         color=line.get_color(), alpha=0.12)
        ax1.plot(x, [p.best.tpot_p99_ms.value for p in pts], "--", color=line.get_color(), label=f"{d.drafter} p99")
        ax2.plot(x, [p.best.output_throughput.value for p in pts], "-o", color=line.get_color(), label=d.drafter)
        ax2.fill_between(x, [p.best.output_throughput.low for p in pts], [p.best.output_throughput.high for p in pts],
                         color=line.get_color(), alpha=0.12)
    ax1.set_xlabel("request rate (req/s)")
    ax1.set_ylabel("TPOT (ms)")
    ax2.set_xlabel("request rate (req/s)")
    ax2.set_ylabel("output throughput (tok/s)")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.suptitle(f"{res.target} on {res.gpu} x{res.tp}, vLLM {res.vllm_version} (predicted; shaded: band)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_for(layout, drafts: list, traffic: Traffic, kw: dict, *, acceptance: dict | None = None):
    """serving_load for drafter names (or specs) on a built layout: each through pipeline.evaluate_pair first,
    those vLLM refuses, that do not fit or have no acceptance left out (their reason is in the fixed-batch view).
    `acceptance`: method -> AcceptanceEstimate overriding the lookup (rank's replay of --prompts-file for n-gram and
    suffix), as the fixed-batch view priced them."""
    pieces = []
    for d in drafts:
        spec = resolve_drafter(layout.target, d)
        ev = evaluate_pair(layout, spec, acceptance=(acceptance or {}).get(spec.method))
        if ev.decision.action in (INCOMPATIBLE, NO_FIT) or ev.acceptance is None or ev.memory is None:
            continue
        pieces.append((ev.draft, ev.acceptance, ev.memory))
    if not pieces:
        return None
    return serving_load(layout, served_spec(layout), pieces, traffic, slo_ttft_ms=kw.get("slo_ttft_ms"),
                        slo_tpot_ms=kw.get("slo_tpot_ms"))
