"""`draftfit preflight`: every check for one layout; exit 0 (pass), 1 (warnings), 2 (blockers)."""

from __future__ import annotations

import click

from draftfit.rules import WORKLOAD_HELP, WORKLOADS

from draftfit.cli.render import util_option
from draftfit.cli.render import json_option
from draftfit.cli.render import console, emit_json, table
from draftfit.launch.preflight import FAIL, preflight as run
from draftfit.cli.traffic_options import load_for, render_load, traffic_from, traffic_options
from draftfit.layout import (MIN_CONTEXT, build_layout, check_batches, check_int, check_k, check_name, check_temperature,
                             check_util, check_vllm_version)

_STYLE = {"pass": "green", "warn": "yellow", "fail": "red"}


@click.command(name="preflight")
@click.argument("target")
@click.argument("draft")
@click.option("--gpu", "-g", default=None, help="GPU (catalog name); memory and speedup are checked only with it.")
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--k", "k", type=int, default=4, show_default=True, help="Speculative tokens you plan to serve with.")
@click.option("--max-model-len", type=int, default=None)
@util_option
@click.option("--batch", type=int, default=1, show_default=True, help="Batch size the speedup check is for.")
@click.option("--workload", type=click.Choice(WORKLOADS), default="chat", show_default=True,
              help="Which traffic: " + WORKLOAD_HELP + ".")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--vllm-version", default=None, help="Check against this vLLM version instead of the installed one.")
@click.option("--quantization", default="auto", show_default=True,
              help="Target weights: auto (the checkpoint's own), none, fp8, awq, gptq, bitsandbytes, mxfp4.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="KV cache dtype: auto or fp8.")
@traffic_options
@json_option
@click.pass_context
def preflight(ctx, target, draft, gpu, tp, k, max_model_len, util, batch, workload, temperature, vllm_version,
              quantization, kv_cache_dtype, as_json, **traffic_kw):
    """All checks for TARGET + DRAFT on a layout, each with a fix; exit code 0/1/2 for CI."""

    # Bad option values are one `error:` line (exit 2) like every command; the checks below judge the layout.
    target = check_name(target, "TARGET", fix="pass a catalog name, hub id or model folder")
    draft = check_name(draft, "DRAFT", fix="pass a catalog name, hub id or model folder")
    if gpu is not None:
        gpu = check_name(gpu, "--gpu", fix="pass --gpu a catalog GPU, e.g. H200, or leave it out")
    check_int(tp, "--tp", 1, 64, fix="pass --tp 1, 2, 4 or 8")
    check_k(k)
    if max_model_len is not None:
        check_int(max_model_len, "--max-model-len", MIN_CONTEXT, 10**7, fix="e.g. --max-model-len 8192")
    util = check_util(util)
    check_batches((batch,))
    temperature = check_temperature(temperature)
    check_vllm_version(vllm_version)
    traffic = traffic_from(traffic_kw, required=False)  # --request-rate etc.: the pair at the user's traffic too

    rep = run(target, draft, gpu_name=gpu, tp=tp, k=k, max_model_len=max_model_len, util=util, batch=batch,
              workload=workload, temperature=temperature, vllm_version=vllm_version, quantization=quantization,
              kv_cache_dtype=kv_cache_dtype)
    failed = [c for c in rep.checks if c.status == FAIL]
    error = fix = None
    if rep.exit_code == 2 and failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more failed check{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
        error = f"preflight failed: {first.name}: {first.detail}{more}"
        fix = first.fix or "see the checks above"
    load = None
    if traffic is not None and rep.exit_code != 2 and gpu is not None:
        # the layout the checks above judged, with the K planned
        lay = build_layout(target, gpu=gpu, tp=tp, util=util, max_model_len=max_model_len, k=k, workload=workload,
                           temperature=temperature, vllm_version=vllm_version, quantization=quantization,
                           kv_cache_dtype=kv_cache_dtype)
        load = load_for(lay, [draft], traffic, traffic_kw)
    if as_json:
        emit_json({**rep.to_json(), **({"error": error, "fix": fix} if error else {}),
                   **({"serving_load": load.to_dict() if load else None} if traffic is not None else {})})
    else:

        con = console()
        if not con.is_terminal:
            con.width = max(con.width, 160)
        from rich.text import Text

        rows = [[Text(c.status, style=_STYLE[c.status]), c.name, c.detail, c.fix or ""]
                for c in rep.checks]
        title = f"preflight: {target} + {draft}, TP={tp}, K={k}" + (f", {gpu}" if gpu else "")
        con.print(table(title, ["status", "check", "detail", "fix"], rows))
        con.print(f"{rep.summary} -> exit {rep.exit_code}", highlight=False)
        if load is not None:
            render_load(load, con)
        elif traffic is not None:
            con.print("serving load not simulated: " + ("pass --gpu" if gpu is None else "the checks above failed"),
                      highlight=False, markup=False)
    if error and not as_json:  # the table is on stdout; the verdict is one line on stderr (JSON: in the object)
        line = " ".join(f"{error} — {fix}".split())
        click.echo(f"error: {line}", err=True)
    ctx.exit(rep.exit_code)
