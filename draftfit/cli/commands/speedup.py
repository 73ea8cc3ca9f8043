"""`draftfit speedup`: the Leviathan closed form, or a full prediction for a target/draft/GPU layout."""

from __future__ import annotations


import click

from draftfit.rules import WORKLOAD_HELP, WORKLOADS

from draftfit.errors import DraftfitError
from draftfit.cli.render import json_option
from draftfit.acceptance.store import result_from_row
from draftfit.cli.render import console, emit_json, mixture_lines, table, to_jsonable
from draftfit.acceptance.curve import Mixture
from draftfit.acceptance.prior import measured_mixture
from draftfit.acceptance.user_replay import user_acceptance
from draftfit.catalog.specs import NO_MODEL_METHODS
from draftfit.speedup.predict import predict_speedup, simple_speedup
from draftfit.acceptance.store import MeasurementStore
from draftfit.catalog.shapes import act_dtype, as_served, kv_dtype_bytes
from draftfit.catalog.specs import resolve_gpu, resolve_model
from draftfit.layout import (KV_CACHE_DTYPES, check_batches, check_choice, check_float, check_int, check_k, check_quantization,
                             check_k_list, check_temperature, check_tp, check_vllm_version, parse_float_list,
                             parse_int_list)
from draftfit.engine import resolve_target

CLOSED_FORM_K_MAX = 16
from draftfit.pipeline import acceptance_for, measure_it, resolve_drafter, vllm_verdict


def _acceptance_from_run(run_id: int):
    with MeasurementStore() as store:
        row = store.get(run_id)
    if row is None:
        raise DraftfitError(f"no stored run {run_id}", fix="see `draftfit runs`")

    res = result_from_row(row, source=f"run {run_id}")
    curve = list(getattr(res, "per_position", None) or [])
    alpha = getattr(res, "acceptance_rate", None)
    mixture = measured_mixture(res, str(run_id)) if str(row.get("draft", "")).lower() in NO_MODEL_METHODS else None
    if mixture is not None:
        # vLLM's per-position rates are per draft; an n-gram / suffix step that found no match drafted nothing,
        # so the speedup sums the mixture's per-decode-step curve instead.
        curve = mixture.per_position
    return res, (curve or None), alpha, mixture


# (parameter, option) pairs only prediction mode reads.
_PREDICTION_ONLY = (("tp", "--tp"), ("batch_text", "--batch"), ("context_len", "--context-len"),
                    ("quantization", "--quantization"), ("kv_cache_dtype", "--kv-cache-dtype"),
                    ("vllm_version", "--vllm-version"))


@click.command(name="speedup")
@click.option("--alpha", type=float, help="Per-token acceptance rate (i.i.d.).")
@click.option("--acceptance-curve", "curve_text", help="a1,a2,...: P(first i drafts all accepted).")
@click.option("--run", "run_id", type=int, help="Use the acceptance of a stored run (`draftfit runs`).")
@click.option("--k", "k_text", help="K (num_speculative_tokens); with --target, a list like 2,4 or 1..4. Default 1..8.")
@click.option("--c", "c", type=float, help="Draft step / target step cost ratio (closed-form mode).")
@click.option("--target", help="Target model (catalog name, hub id or folder): full prediction mode.")
@click.option("--draft", help="Draft model.")
@click.option("--gpu", help="GPU (catalog name), e.g. H200.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel size.")
@click.option("--batch", "batch_text", default="1", show_default=True, help="Batch sizes, e.g. 1,8,32,128.")
@click.option("--context-len", type=int, default=1024, show_default=True, help="Mean context length in tokens.")
@click.option("--quantization", default="auto", show_default=True,
              help="Target weights: auto (the checkpoint's own), none, fp8, awq, gptq, bitsandbytes, mxfp4.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="KV cache dtype: auto or fp8.")
@click.option("--vllm-version", default=None,
              help="vLLM whose step-cost tables to use (default: the installed GPU vLLM, else the newest modelled); "
                   "the band is widened where that version has none.")
@click.option("--workload", "-w", type=click.Choice(WORKLOADS), default=None,
              help="Prediction mode without --alpha/--acceptance-curve/--run: the acceptance prior's workload "
                   "(default chat; " + WORKLOAD_HELP + ").")
@click.option("--temperature", type=float, default=None,
              help="Prediction mode without a given acceptance: the acceptance prior's sampling temperature "
                   "(default 0).")
@click.option("--prompts-file", type=click.Path(dir_okay=False), default=None,
              help="Prediction mode with --draft ngram or suffix: the acceptance of their replay over your logged "
                   "requests and outputs (JSONL, as `rank --prompts-file`).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG of speedup vs K.")
@click.option("--explain", is_flag=True,
              help="Print each speculative step as a named sum of terms with their sources (roofline prior).")
@json_option
def speedup(alpha, curve_text, run_id, k_text, c, target, draft, gpu, tp, batch_text, context_len, quantization,
            kv_cache_dtype, vllm_version, workload, temperature, prompts_file, plot_path, explain,
            as_json):
    """Expected speedup for a K, acceptance and step cost (Leviathan et al. 2023), or, with --target,
    --draft and --gpu, the predicted TPOT speedup per K and batch size from calibrated or roofline step costs.

    \b
    Examples:
      draftfit speedup --alpha 0.8 --k 4 --c 0.05
      draftfit speedup --acceptance-curve 0.8,0.62,0.47 --k 3 --c 0.1 --json
      draftfit speedup --target Llama-3.1-70B --draft Llama-3.2-1B --gpu H200 --tp 2 --alpha 0.7 --batch 1,32
      draftfit speedup --target Qwen3-32B --draft Qwen3-1.7B --gpu H200 --batch 1,8,32 -w code

    With --target/--draft/--gpu and no acceptance given, the pair's stored measurement (`draftfit measure`) is
    used, else draftfit's acceptance prior for the workload and temperature (as rank prices it), with its band.
    """

    if alpha is not None:
        alpha = check_float(alpha, "--alpha", 0, 1, fix="pass --alpha the per-token acceptance rate, 0..1")
    if c is not None:
        c = check_float(c, "--c", 0, 1e6, fix="pass --c the draft/target step cost ratio, e.g. 0.1")
    if run_id is not None:
        check_int(run_id, "--run", 1, 2**63 - 1, fix="pass a run id from `draftfit runs list`")
    if curve_text is not None:
        for a in parse_float_list(curve_text, "--acceptance-curve", example="0.8,0.62,0.5"):
            check_float(a, "--acceptance-curve", 0, 1, fix="each value is a probability 0..1, e.g. 0.8,0.62,0.5")
    given = [x is not None for x in (alpha, curve_text, run_id, prompts_file)]
    if sum(given) > 1:
        raise DraftfitError("give only one of --alpha, --acceptance-curve, --run, --prompts-file",
                            fix="pick one acceptance source")
    acceptance, acc_source, curve, mixture = None, None, None, None
    if alpha is not None:
        acceptance, acc_source = alpha, "given --alpha"
    elif curve_text:
        curve = list(parse_float_list(curve_text, "--acceptance-curve", example="0.8,0.62,0.5"))
        acceptance, acc_source = curve, "given --acceptance-curve"
    elif run_id is not None:
        res, curve, a, mixture = _acceptance_from_run(run_id)
        acceptance, acc_source = (curve or a), f"run {run_id}"
        if mixture is not None:
            acc_source += (f" ({res.draft}: drafts on {mixture.draft_probability:.0%} of decode steps, "
                           f"{mixture.per_k[-1].accepted_given_draft:.2f} accepted given a draft at K={mixture.k_max})")
    prediction_mode = bool(target or draft or gpu)
    if prompts_file is not None and not prediction_mode:
        raise DraftfitError("--prompts-file replays n-gram / suffix for a target's tokens",
                            fix="add --target, --draft ngram (or suffix) and --gpu")
    if prompts_file is not None and (workload is not None or temperature is not None):
        raise DraftfitError("--workload and --temperature choose the acceptance prior, which --prompts-file "
                            "replaces (your outputs carry their own temperature)", fix="drop --workload/--temperature")
    if acceptance is None and not prediction_mode:
        raise DraftfitError("no acceptance given", fix="pass --alpha, --acceptance-curve or --run")
    if acceptance is not None and (workload is not None or temperature is not None):
        raise DraftfitError("--workload and --temperature choose the acceptance prior, which a given acceptance "
                            "replaces", fix="drop --workload/--temperature, or drop --alpha/--acceptance-curve/--run "
                                            "to price the pair at the prior")
    workload = workload or "chat"
    temperature = check_temperature(0.0 if temperature is None else temperature)
    version_given = check_vllm_version(vllm_version)

    if prediction_mode:
        if not (target and draft and gpu):
            raise DraftfitError("prediction mode needs --target, --draft and --gpu together",
                                fix="or use --alpha/--k/--c for the closed form")
        if c is not None:
            raise DraftfitError("--c is for the closed form; with --target the step costs come from the GPU",
                                fix="drop --c")

        t_spec = resolve_model(target)
        d_spec = resolve_drafter(t_spec, draft)
        if prompts_file is not None and d_spec.method not in NO_MODEL_METHODS:
            raise DraftfitError(f"--prompts-file replays n-gram and suffix decoding, not {d_spec.name}",
                                fix=f"{measure_it(t_spec, d_spec)}, or pass --draft ngram or suffix")
        quant = check_quantization(t_spec, quantization)
        t_spec = as_served(t_spec, quant)  # the weight traffic the roofline reads (catalog.shapes)
        check_choice(kv_cache_dtype, KV_CACHE_DTYPES, "--kv-cache-dtype")
        resolve_gpu(gpu)
        check_tp(t_spec, tp)
        batches = list(check_batches(parse_int_list(batch_text, "--batch")))
        ks = check_k_list(k_text, "--k", "1,2,4") if k_text is not None else list(range(1, 9))
        check_int(context_len, "--context-len", 1, t_spec.max_position_embeddings or 10**7,
                  fix=f"pass --context-len up to {t_spec.name}'s {t_spec.max_position_embeddings or 10**7} positions")
        engine = resolve_target(version_given)
        runs, why, fix = vllm_verdict(t_spec, d_spec, tp, engine)
        if not runs:
            raise DraftfitError(f"{d_spec.name} cannot draft for {t_spec.name}: {why}", fix=fix, exit_code=1)
        if prompts_file is not None:
            est = user_acceptance(d_spec.method, t_spec, prompts_file)
            acceptance, mixture = est, est.mixture
            acc_source = f"{est.source}, band {est.low:.2f}-{est.high:.2f}; {est.citation}"
        if acceptance is None:
            # Nothing given: what rank prices the pair at (a stored measurement, else the prior with its band).
            est = acceptance_for(t_spec, d_spec, workload, temperature)
            if est is None:
                raise DraftfitError(f"no acceptance prior for {d_spec.name}",
                                    fix=f"{measure_it(t_spec, d_spec)}, or pass --alpha")
            acceptance, mixture = est, est.mixture
            acc_source = (f"{est.source}" + ("" if workload in est.source else f", {workload}")
                          + f", T={temperature:g}, band {est.low:.2f}-{est.high:.2f}; {est.citation}")
        pred = predict_speedup(t_spec, d_spec, gpu, tp=tp, acceptance=acceptance, batches=batches,
                               k_values=ks, context_len=context_len, rules=engine.rules,
                               kv_dtype_bytes=kv_dtype_bytes(kv_cache_dtype, act_dtype(None, t_spec)[1]))
        pred.acceptance_source = acc_source
        pred.vllm_version = engine.version
        pred.notes.insert(0, engine.note)
        if plot_path:
            plot_prediction(pred, plot_path)
        if isinstance(mixture, Mixture):
            mixture = mixture.to_json()
        if as_json:
            emit_json({**to_jsonable(pred), "acceptance_mixture": mixture} if mixture else pred)
            return
        _render_prediction(pred, console())
        if mixture:
            click.echo("\n".join(line.strip() if i == 0 else line[2:] for i, line in enumerate(mixture_lines(
                {**mixture, "best_k": pred.batches[batches[0]].best_k, "speedup_batch": batches[0],
                 "per_k": [{**p, "speedup": (pred.batches[batches[0]].per_k.get(p["k"]) or {}).get("speedup")}
                           for p in mixture.get("per_k") or []]}))))
        if explain:
            _render_terms(pred)
        if plot_path:
            click.echo(f"plot: {plot_path}")
        return

    # The closed form reads only --alpha/--acceptance-curve/--run, --k and --c: a prediction-mode option given
    # here would be silently ignored (--tp 0 exited 0), so it is refused.
    ctx = click.get_current_context()
    ignored = [opt for param, opt in _PREDICTION_ONLY
               if ctx.get_parameter_source(param) not in (None, click.core.ParameterSource.DEFAULT)]
    if ignored:
        raise DraftfitError(f"{', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} only to prediction "
                            "mode (--target, --draft and --gpu)",
                            fix=f"drop {', '.join(ignored)}, or add --target/--draft/--gpu")
    if k_text is None or c is None:
        raise DraftfitError("closed-form mode needs --k and --c", fix="e.g. --alpha 0.8 --k 4 --c 0.05, "
                            "or give --target/--draft/--gpu for a prediction")

    k = parse_int_list(k_text, "--k", "4")
    if len(k) != 1:  # before the bounds: "--k 1..1000" is a list, not "--k 9 is outside 1..8"
        raise DraftfitError(f"closed-form mode takes one K (--k {k_text} names {len(k)})", fix="e.g. --k 4")
    k = [check_k(k[0], "--k", CLOSED_FORM_K_MAX)]
    if plot_path:
        raise DraftfitError("--plot needs --target, --draft and --gpu", fix="drop --plot")
    if explain:
        raise DraftfitError("--explain needs --target, --draft and --gpu (the closed form has no step terms)",
                            fix="drop --explain")
    res = simple_speedup(k=k[0], c=c, alpha=alpha, curve=curve)
    if as_json:
        out = dict(vars(res))
        out["acceptance_source"] = acc_source
        emit_json(out)
        return
    con = console()
    con.print(f"speedup {res.speedup:.3f}x  (E = {res.expected_tokens_per_step:.3f} tokens per target step, "
              f"K = {res.k}, c = {res.c}; acceptance {acc_source})")
    con.print(f"best K for this acceptance and c: {res.best_k} ({res.per_k[res.best_k]:.3f}x)")
    con.print(f"source: {res.source}", style="dim", markup=False)


def _render_terms(pred) -> None:
    """--explain: each speculative step as the named sum the step-cost model built, term by term with its source."""
    for b, bp in pred.batches.items():
        for k, r in sorted(bp.per_k.items()):
            terms = r.get("terms")
            if not terms:
                click.echo(f"batch {b} K={k}: {r['spec_step_ms']:.2f} ms, one measured step ({bp.source}); "
                           f"plain step {bp.base_step_ms:.2f} ms")
                continue
            click.echo(f"batch {b} K={k}: {r['spec_step_ms']:.2f} ms = "
                       + " + ".join(f"{n} {t['ms']:.2f}" for n, t in terms.items())
                       + f"; plain step {bp.base_step_ms:.2f} ms")
            for n, t in terms.items():
                click.echo(f"    {n:22s} {t['ms']:8.2f} ms  [{t['source']}]")


def _render_prediction(pred, con) -> None:

    ks = sorted(next(iter(pred.batches.values())).per_k)
    rows = []
    for b, bp in pred.batches.items():
        cells = []
        for k in ks:
            s = bp.per_k[k]["speedup"]
            mark = "*" if k == bp.best_k else ""
            meas = f" (m {bp.measured[k]:.2f})" if k in bp.measured else ""
            cells.append(f"{s:.2f}{mark}{meas}")
        best = f"K={bp.best_k} {bp.speedup:.2f}x [{bp.low:.2f}-{bp.high:.2f}]" if bp.best_k else \
            f"don't ({max(v['speedup'] for v in bp.per_k.values()):.2f}x at best)"
        # The speculative step at the best K (the smallest shown where none pays), beside the plain one: both are
        # step costs the speedups come from. Not spec_overhead_ms (a line's intercept at K=0 less the plain step):
        # where the first draft pass hides under the verify that intercept lies below the plain step, and a
        # negative "overhead" read as a real cost.
        k_step = bp.best_k or ks[0]
        rows.append([b, *cells, best, f"{bp.c:.3f}", f"{bp.per_k[k_step]['spec_step_ms']:.2f} (K={k_step})",
                     f"{bp.base_step_ms:.2f}"])
    cols = ["batch", *[f"K={k}" for k in ks], "best (band)", "c", "spec step ms", "plain step ms"]
    con.print(table(f"{pred.target} + {pred.draft} on {pred.gpu} TP={pred.tp}, alpha {pred.alpha:.2f} "
                    f"({pred.acceptance_source})", cols, rows,
                    caption=f"step costs: {pred.source}; E from {pred.citation}; (m x) = measured in calibration"))
    con.print(f"verdict: [bold]{pred.verdict}[/bold]; recommended num_speculative_tokens = {pred.recommended_k}")
    if pred.k_schedule:
        con.print(f"per-batch K schedule (num_speculative_tokens_per_batch_size): {[list(r) for r in pred.k_schedule]}")
    for n in pred.notes:
        con.print(f"note: {n}", style="dim", markup=False)


def plot_prediction(pred, path: str) -> str:
    """PNG of predicted speedup vs K per batch size (band shaded), measured points where calibrated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for b, bp in pred.batches.items():
        ks = sorted(bp.per_k)
        line, = ax.plot(ks, [bp.per_k[k]["speedup"] for k in ks], marker="o", label=f"batch {b} predicted")
        ax.fill_between(ks, [bp.per_k[k]["low"] for k in ks], [bp.per_k[k]["high"] for k in ks],
                        color=line.get_color(), alpha=0.12)
        if bp.measured:
            mk = sorted(bp.measured)
            ax.scatter(mk, [bp.measured[k] for k in mk], marker="x", s=60, color=line.get_color(),
                       label=f"batch {b} measured (synthetic acceptance)")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("K (num_speculative_tokens)")
    ax.set_ylabel("TPOT speedup vs no speculation")
    ax.set_title(f"{pred.target} + {pred.draft}, {pred.gpu} TP={pred.tp}, alpha={pred.alpha:.2f}\n"
                 f"step costs: {pred.source}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
