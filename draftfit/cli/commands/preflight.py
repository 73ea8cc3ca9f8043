"""`draftfit preflight`: every check for one layout; exit 0 (pass), 1 (warnings), 2 (blockers)."""

from __future__ import annotations

import click

from draftfit.cli.render import json_option
from draftfit.cli.render import console, emit_json, table
from draftfit.launch.preflight import preflight as run

_STYLE = {"pass": "green", "warn": "yellow", "fail": "red"}


@click.command(name="preflight")
@click.argument("target")
@click.argument("draft")
@click.option("--gpu", "-g", default=None, help="GPU (catalog name); memory and speedup are checked only with it.")
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--k", "k", type=int, default=4, show_default=True, help="Speculative tokens you plan to serve with.")
@click.option("--max-model-len", type=int, default=None)
@click.option("--util", type=float, default=0.9, show_default=True)
@click.option("--batch", type=int, default=1, show_default=True, help="Batch size the speedup check is for.")
@click.option("--workload", type=click.Choice(["code", "math", "chat"]), default="chat", show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--vllm-version", default=None, help="Check against this vLLM version instead of the installed one.")
@json_option
@click.pass_context
def preflight(ctx, target, draft, gpu, tp, k, max_model_len, util, batch, workload, temperature, vllm_version, as_json):
    """All checks for TARGET + DRAFT on a layout, each with a fix; exit code 0/1/2 for CI."""

    rep = run(target, draft, gpu_name=gpu, tp=tp, k=k, max_model_len=max_model_len, util=util, batch=batch,
              workload=workload, temperature=temperature, vllm_version=vllm_version)
    if as_json:

        emit_json(rep.to_json())
    else:

        con = console()
        if not con.is_terminal:
            con.width = max(con.width, 160)
        rows = [[f"[{_STYLE[c.status]}]{c.status}[/{_STYLE[c.status]}]", c.name, c.detail, c.fix or ""]
                for c in rep.checks]
        title = f"preflight: {target} + {draft}, TP={tp}, K={k}" + (f", {gpu}" if gpu else "")
        con.print(table(title, ["status", "check", "detail", "fix"], rows))
        con.print(f"{rep.summary} -> exit {rep.exit_code}", highlight=False)
    ctx.exit(rep.exit_code)
