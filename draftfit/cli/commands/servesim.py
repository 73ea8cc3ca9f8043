"""`draftfit serve-sim`: the server under your traffic, with and without speculation.

Named beside `serve-cmd` (the command that starts the server) and after what it does: it simulates that server
(vLLM's scheduler over draftfit's step costs) at a request rate, the way `vllm bench serve` would measure it, and
says which K and drafter give the most goodput and where speculation stops paying. Not `bench` (it measures
nothing), not an option of `speedup` (whose answer is per batch size: here the batch size is an output).
"""

from __future__ import annotations

import sys

import click

from draftfit.acceptance.prior import AcceptanceEstimate
from draftfit.cli.render import util_option
from draftfit.cli.render import console, emit_json, json_option
from draftfit.cli.traffic_options import plot_load, render_load, traffic_from, traffic_options
from draftfit.errors import DraftfitError
from draftfit.layout import build_layout, check_float, check_name, check_output_file
from draftfit.pipeline import INCOMPATIBLE, evaluate_pair, resolve_drafter, served_spec
from draftfit.rules import WORKLOAD_HELP, WORKLOADS
from draftfit.serving import serving_load

MAX_DRAFTERS = 8


def _given_acceptance(alpha: float) -> AcceptanceEstimate:
    return AcceptanceEstimate(alpha=alpha, per_position=[alpha ** (i + 1) for i in range(8)], low=alpha, high=alpha,
                              source="given --alpha", citation="")


@click.command(name="serve-sim")
@click.option("--target", "-t", required=True, help="Target model: catalog name, hub id or local folder.")
@click.option("--draft", "drafts", required=True,
              help="Drafter(s), comma-separated: catalog models, folders, or the methods ngram / suffix. Several: "
                   "the one with the most goodput wins.")
@click.option("--gpu", "-g", default=None, help="GPU (catalog name). Default: H100-80GB.")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size. Default: the smallest that fits.")
@util_option
@click.option("--max-model-len", type=int, default=None, help="Context length (default: the target's, or what fits).")
@click.option("--max-num-seqs", type=int, default=None, help="vLLM's max_num_seqs (default: vLLM's for the GPU).")
@click.option("--vllm-version", default=None, help="vLLM version (default: installed GPU vLLM, else the newest modelled).")
@click.option("--k", "k", type=int, default=None,
              help="Serve this K (num_speculative_tokens). Default: the K, or per-batch-size K schedule, with the most "
                   "goodput at each rate.")
@click.option("--workload", "-w", type=click.Choice(WORKLOADS), default="chat", show_default=True,
              help="The acceptance prior's workload: " + WORKLOAD_HELP + ".")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--alpha", type=float, default=None, help="Per-token acceptance to assume instead of the prior.")
@click.option("--quantization", default="none", show_default=True, help="Target weights: none, fp8, awq or gptq.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="KV cache dtype: auto or fp8.")
@traffic_options
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Write TPOT p50/p99 and throughput against request rate, with and without speculation.")
@click.option("--explain", is_flag=True, help="Every configuration tried per rate, batch sizes, preemptions, notes.")
@json_option
def serve_sim(target, drafts, gpu, tp, util, max_model_len, max_num_seqs, vllm_version, k, workload, temperature,
              alpha, quantization, kv_cache_dtype, plot_path, explain, as_json, **traffic_kw):
    """TARGET served at your traffic with and without speculation: TTFT, TPOT and ITL p50/p99, throughput and
    goodput per request rate, the best K and drafter, and the rate where speculation stops paying.

    \b
    Examples:
      draftfit serve-sim -t Llama-3.1-8B --draft Llama-3.2-1B --gpu H200 --request-rate 1,4,16,32 --slo-tpot-ms 20
      draftfit serve-sim -t Qwen3-32B --draft Qwen3-1.7B,Qwen3-0.6B --gpu H200 --request-rate auto --plot load.png
      draftfit serve-sim -t Llama-3.1-70B --draft Llama-3.2-1B --tp 2 --concurrency 64 --request-log log.csv
    """
    target = check_name(target, "--target", fix="pass --target a catalog name, hub id or model folder")
    if gpu is not None:
        gpu = check_name(gpu, "--gpu", fix="pass --gpu a catalog GPU, e.g. H200 (see `draftfit catalog list --gpus`)")
    names = [d.strip() for d in str(drafts).split(",")]
    if not names or any(not n for n in names):
        raise DraftfitError(f"--draft {drafts!r} names no drafter", fix="e.g. --draft Llama-3.2-1B or --draft ngram")
    if len(names) > MAX_DRAFTERS:
        raise DraftfitError(f"--draft names {len(names)} drafters", fix=f"compare at most {MAX_DRAFTERS} at once")
    if alpha is not None:
        alpha = check_float(alpha, "--alpha", 0, 1, lo_open=True, hi_open=True,
                            fix="pass --alpha the per-token acceptance, e.g. 0.8")
    if plot_path is not None:
        plot_path = check_output_file(plot_path, "--plot")
    traffic = traffic_from(traffic_kw)
    layout = build_layout(target, gpu=gpu, tp=tp, util=util, max_model_len=max_model_len, k=k, workload=workload,
                          temperature=temperature, quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                          vllm_version=vllm_version, max_num_seqs=max_num_seqs,
                          probe_draft=None)
    drafters = []
    for name in names:
        d = resolve_drafter(layout.target, name)
        ev = evaluate_pair(layout, d, acceptance=_given_acceptance(alpha) if alpha is not None else None)
        if ev.decision.action == INCOMPATIBLE:
            raise DraftfitError(f"{ev.draft.name} cannot draft for {layout.target.name}: {ev.decision.reason}",
                                fix=ev.decision.fix or "pick another drafter", exit_code=1)
        if ev.acceptance is None:
            raise DraftfitError(f"no acceptance for {ev.draft.name}: {ev.decision.reason}",
                                fix="measure it (`draftfit measure`), or pass --alpha", exit_code=1)
        drafters.append((ev.draft, ev.acceptance, ev.memory))
    bar = _progress(as_json)
    try:
        res = serving_load(layout, served_spec(layout), drafters, traffic, slo_ttft_ms=traffic_kw.get("slo_ttft_ms"),
                           slo_tpot_ms=traffic_kw.get("slo_tpot_ms"), progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    res.notes = list(layout.notes) + res.notes
    if plot_path:
        plot_load(res, plot_path)
    if as_json:
        emit_json(res.to_dict())
        return
    con = console()
    render_load(res, con, explain=explain)
    if plot_path:
        click.echo(f"plot: {plot_path}")


class _Bar:
    """A progress bar on stderr for sweeps that take more than a few seconds (shown after the first second)."""

    def __init__(self):
        import time

        self._t0 = time.monotonic()
        self._progress = None
        self._task = None

    def update(self, done: int, total: int) -> None:
        import time

        if self._progress is None:
            if time.monotonic() - self._t0 < 1.0:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                      TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("sim", total=total)
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _progress(as_json: bool):
    return None if as_json or not sys.stderr.isatty() else _Bar()
