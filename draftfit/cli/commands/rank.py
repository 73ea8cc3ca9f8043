"""`draftfit rank`: every catalog draft for a target, ranked by predicted speedup."""

from __future__ import annotations

import click

from draftfit.rules import WORKLOAD_HELP, WORKLOADS

from draftfit.errors import DraftfitError
from draftfit.cli.render import util_option
from draftfit.cli.render import json_option
from draftfit.catalog.specs import NO_MODEL_METHODS, _normalize
from draftfit.cli.render import console, emit_json, table
from draftfit.cli.render import fmt_num, fmt_tokens, mixture_lines
from draftfit.layout import check_int, check_name, parse_int_list
from draftfit.rank import rank as run_rank
from draftfit.cli.traffic_options import load_for, render_load, traffic_from, traffic_options

RANK_AT_TRAFFIC = 3  # candidates simulated at the user's traffic (the best by the fixed-batch view)


@click.command(name="rank")
@click.option("--target", "-t", required=True, help="Target model: catalog name, hub id or local folder.")
@click.option("--gpu", "-g", default=None, help="GPU (catalog name). Default: H100-80GB.")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size. Default: the smallest that fits the target.")
@click.option("--workload", "-w", type=click.Choice(WORKLOADS), default="chat", show_default=True,
              help="Which traffic: " + WORKLOAD_HELP + ".")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--batch", "batch", default="1", show_default=True, help="Batch sizes, comma-separated (e.g. 1,32).")
@click.option("--top", type=int, default=None, help="Show only the N best.")
@click.option("--max-model-len", type=int, default=None, help="Context length (default: the target's).")
@util_option
@click.option("--candidates", default="", help="Extra drafts: comma-separated local folders or hub ids.")
@click.option("--explain", "explain", default=None, metavar="DRAFT", help="Show every number behind one candidate.")
@click.option("--vllm-version", default=None, help="vLLM version the serve command is for (default: installed).")
@click.option("--quantization", default="none", show_default=True, help="Target weights: none, fp8, awq or gptq.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="KV cache dtype: auto or fp8.")
@click.option("--max-num-seqs", type=int, default=None,
              help="vLLM's max_num_seqs (default: vLLM's; draftfit lowers it only when nothing fits otherwise).")
@click.option("--prompts-file", type=click.Path(dir_okay=False), default=None,
              help="Your logged requests with their outputs (JSONL: {\"prompt\", \"completion\"}, chat messages ending "
                   "in the assistant's answer, or OpenAI request/response rows): n-gram and suffix are priced at "
                   "their replay over them, in the target's tokens; with --request-rate / --concurrency the "
                   "traffic's prompt lengths come from them too (estimated from characters).")
@click.option("--all", "show_all", is_flag=True,
              help="List every draft, incompatible and not fitting ones too (default: compatible ones and a count).")
@traffic_options(prompts_file=False)  # rank's own --prompts-file above (logged outputs) serves both
@json_option
def rank(target, gpu, tp, workload, temperature, batch, top, max_model_len, util, candidates, explain, vllm_version,
         quantization, kv_cache_dtype, max_num_seqs, prompts_file, show_all, as_json, **traffic_kw):
    """Rank catalog drafts for TARGET: tokenizer, memory, acceptance, best K, speedup, serve command."""

    target = check_name(target, "--target", fix="pass --target a catalog name, hub id or model folder")
    if gpu is not None:
        gpu = check_name(gpu, "--gpu", fix="pass --gpu a catalog GPU, e.g. H100-80GB (see `draftfit catalog list --gpus`)")
    if explain is not None:
        explain = check_name(explain, "--explain", fix="pass --explain one draft name from the ranking")
    if top is not None:
        check_int(top, "--top", 1, 10**6, fix="pass --top 1 or more")
    extra = tuple(c.strip() for c in candidates.split(",") if c.strip())
    if candidates.strip() and not extra:
        raise DraftfitError(f"--candidates {candidates!r} names no model",
                            fix="pass --candidates as comma-separated folders or hub ids, e.g. --candidates ./my-draft")
    if prompts_file is not None and traffic_kw.get("request_log") is None and (
            traffic_kw.get("request_rate") is not None or traffic_kw.get("concurrency") is not None):
        traffic_kw["traffic_prompts_file"] = prompts_file  # the logged prompts' lengths shape the traffic as well
    traffic = traffic_from(traffic_kw, required=False)  # --request-rate etc.: answer at the user's traffic too
    result = run_rank(target, gpu_name=gpu, tp=tp, workload=workload, temperature=temperature,
                      batches=parse_int_list(batch, "--batch"), util=util, max_model_len=max_model_len,
                      extra_candidates=extra, top=None if explain else top, vllm_version=vllm_version,
                      quantization=quantization, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                      prompts_file=prompts_file)
    if explain:
        _explain(result, explain, as_json)
        return
    load = None
    if traffic is not None:
        best = [c.draft for c in result.candidates if c.group == 0 and c.acceptance is not None][:RANK_AT_TRAFFIC]
        # n-gram / suffix at the acceptance the ranking priced them at (the replay of --prompts-file, when given)
        load = load_for(result.layout, best, traffic, traffic_kw, acceptance=result.given_acceptance)
    if as_json:

        emit_json({**result.to_json(), **({"serving_load": load.to_dict() if load else None} if traffic else {})})
        return
    _print_table(result, show_all)
    if traffic is not None:
        con = console()
        con.print()
        con.print(f"At your traffic ({traffic.describe()}), the {RANK_AT_TRAFFIC} best by the fixed-batch view:",
                  style="bold", highlight=False, markup=False)
        if load is None:
            con.print("no candidate can be served at this traffic (see the rows above)", highlight=False, markup=False)
        else:
            render_load(load, con)


def _short(text: str, n: int = 48) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


# Below this many columns the table keeps only the columns that decide (draft, α, K, speedup, verdict).
_NARROW_COLS = 120


def _winner_lines(result, w) -> list[str]:
    """The winner's line: its speedup with band and source, and what would narrow that band."""
    b0 = result.batches[0]
    k = f"K schedule {w.k_schedule}" if w.k_schedule else f"K={w.k}"
    sp = w.speedup.get(b0)
    band = (f"{fmt_num(sp)}x [{fmt_num(w.speedup_low.get(b0))}-{fmt_num(w.speedup_high.get(b0))}] at batch {b0}"
            if sp is not None else "speedup n/a")
    how = k if w.method == w.draft else f"{w.method}, {k}"
    head = (f"Winner: {w.draft} ({how}): {band}, α {fmt_num(w.acceptance)} ({w.acceptance_source}), "
            f"step costs: {w.speedup_basis or 'n/a'}")
    narrow = []
    if w.method in NO_MODEL_METHODS and w.acceptance_source.startswith("replay:") and \
            not (w.acceptance_mixture or {}).get("basis", "").startswith("replay of your"):
        # n-gram / suffix need no engine: the user's logged outputs replay in seconds (acceptance/user_replay.py)
        narrow.append(f"replay your logged traffic: `draftfit rank --target {result.target.name} --prompts-file LOG` "
                      "(prompts with their completions)")
    elif not w.acceptance_source.startswith("measured"):
        narrow.append(f"measure your prompts: `draftfit measure {result.target.name} {w.draft} "
                      f"--workload {result.workload} --prompts-file F`")
    if w.speedup_basis != "calibrated" and w.method not in NO_MODEL_METHODS:  # calibrate times a draft model
        narrow.append(f"calibrate your GPU: `draftfit calibrate {result.target.name} {w.draft} --tp {result.tp}`")
    lines = [head]
    if narrow:
        lines.append("  to narrow the band: " + "; ".join(narrow))
    return lines


def _print_table(result, show_all: bool = False) -> None:

    con = console()
    narrow = con.width < _NARROW_COLS
    title = (f"{result.target.name} on {result.gpu.name} x{result.tp}, max_model_len "
             f"{result.layout.max_model_len}, {result.workload}, T={result.temperature:g}")
    con.print(title, style="bold", highlight=False, markup=False)  # a folder name is text, not markup
    w = next((c for c in result.candidates if c.draft == result.winner), None)
    if w is not None and result.serve_command:
        for i, line in enumerate(_winner_lines(result, w)):
            con.print(line, style="bold green" if i == 0 else None, highlight=False, markup=False)
        con.print("[bold]Serve it:[/bold]", highlight=False)
        click.echo(result.serve_command)  # one unbroken line, to copy
    else:
        con.print("No draft is predicted to speed this target up: serve it without speculation "
                  "(rows below say why)", style="bold yellow", highlight=False, markup=False)
    con.print()

    shown = [c for c in result.candidates if show_all or c.group == 0]
    hidden = [c for c in result.candidates if not show_all and c.group != 0]
    if narrow:
        cols = ["draft", "α [band]", "K"] + [f"b={b} speedup [band]" for b in result.batches] + ["verdict"]
    else:
        cols = ["draft", "tokenizer", "vLLM", "fits: KV left (draft share)", "α [band]", "α source", "K"] + [
            f"speedup b={b} [band]" for b in result.batches] + ["basis", "verdict"]
    rows = []
    footnotes: dict[str, list[str]] = {}
    for c in shown:
        if c.fits is None:
            fit = "n/a"
        else:
            share = f" ({c.draft_pool_share * 100:.0f}%)" if c.draft_pool_share is not None else ""
            fit = ("yes " if c.fits else "NO ") + f"{fmt_tokens(c.kv_tokens)}{share}"
        acc = f"{fmt_num(c.acceptance)} [{fmt_num(c.acceptance_low)}-{fmt_num(c.acceptance_high)}]"
        sp = []
        for b in result.batches:
            s = c.speedup.get(b)
            kb = c.k_by_batch.get(b)
            at = f" K={kb}" if c.k_schedule and kb else ""
            sp.append("n/a" if s is None else
                      f"{s:.2f}x [{fmt_num(c.speedup_low.get(b))}-{fmt_num(c.speedup_high.get(b))}]{at}")
        ok = "n/a" if c.vllm_accepts is None else ("yes" if c.vllm_accepts else "NO")
        if c.decision == "speculate":
            verdict = "WINNER" if c.draft == result.winner else "speculate"
        else:
            footnotes.setdefault(c.reason, []).append(c.draft)
            verdict = f"{c.decision} [{list(footnotes).index(c.reason) + 1}]"
        k_col = ("/".join(str(r[2]) for r in c.k_schedule)) if c.k_schedule else (c.k or "-")
        if narrow:
            rows.append([c.draft, acc, k_col, *sp, verdict])
        else:
            rows.append([c.draft, c.verdict, ok, fit, acc, c.acceptance_source, k_col, *sp,
                         c.speedup_basis or "-", verdict])
    srcs = sorted({c.speedup_source for c in shown
                   if c.speedup_source and c.group == 0 and not c.speedup_source.startswith("not computed")})
    caption = "speedup: " + "; ".join(srcs) if srcs else None
    con.print(table(f"Compatible drafts ({len(shown)})" if not show_all else f"All drafts ({len(shown)})",
                    cols, rows, caption=caption, overflow="fold"))
    for i, (reason, names) in enumerate(footnotes.items(), 1):
        con.print(f"[{i}] {', '.join(names)}: {reason}", highlight=False, markup=False)
    if hidden:
        kinds: dict[str, int] = {}
        for c in hidden:
            kinds[c.decision] = kinds.get(c.decision, 0) + 1
        what = ", ".join(f"{n} {d}" for d, n in kinds.items())
        con.print(f"{len(hidden)} more draft{'s' if len(hidden) > 1 else ''} not shown ({what}); `--all` lists them", highlight=False, markup=False)
    for line in result.layout.notes:
        con.print(line, style="dim", highlight=False, markup=False)
    con.print("[dim]rows are sorted by predicted speedup over the batch sizes asked for; step costs are calibrated "
              "(measured) or the roofline prior (wider band)[/dim]", highlight=False)
    cites = sorted({(c.acceptance_source, c.acceptance_citation) for c in shown
                    if c.acceptance_source.startswith(("prior", "replay")) and c.acceptance_citation and c.group == 0})
    for src, cit in cites:
        con.print(f"{src}: {cit}", style="dim", highlight=False, markup=False)
    for n in result.notes:
        con.print(f"note: {n}", style="dim", highlight=False, markup=False)
    con.print(f"[dim]ranked {len(result.candidates)} drafts in {result.elapsed_s:.2f}s; "
              f"`--explain DRAFT` shows every number behind one row, `--json` for machines[/dim]", highlight=False)


def _explain(result, name: str, as_json: bool) -> None:

    want = _normalize(name.split("/")[-1])
    hit = next((c for c in result.candidates if _normalize(c.draft) == want or _normalize(c.hub_id.split("/")[-1]) == want),
               None)
    if hit is None:
        raise DraftfitError(f"{name!r} is not among the candidates for {result.target.name}",
                            fix="candidates: " + ", ".join(c.draft for c in result.candidates[:12]))
    if as_json:

        emit_json({"target": result.target.name, "gpu": result.gpu.name, "tp": result.tp, **hit.to_json(),
                   "compat_notes": hit.compat_notes, "compat_fix": hit.compat_fix, "memory_reason": hit.memory_reason,
                   "memory_fix": hit.memory_fix, "per_k": {str(k): v for k, v in hit.per_k.items()}})
        return

    lines = [f"{hit.draft} drafting for {result.target.name} on {result.gpu.name} x{result.tp} "
             f"({result.workload}, T={result.temperature:g})", ""]
    lines.append(f"tokenizer: {hit.verdict} (vLLM accepts: {hit.vllm_accepts}; source: {hit.compat_source or 'n/a'})")
    lines += [f"  - {n}" for n in hit.compat_notes]
    if hit.compat_fix:
        lines.append(f"  fix: {hit.compat_fix}")
    lines.append(f"memory: fits={hit.fits}, KV tokens {fmt_tokens(hit.kv_tokens)} with the draft vs "
                 f"{fmt_tokens(hit.kv_tokens_without_draft)} without; draft weights {fmt_num(hit.draft_weights_gib)} GiB/rank, "
                 f"draft KV share {fmt_num((hit.draft_pool_share or 0) * 100, 0)}%, headroom {fmt_num(hit.headroom_gib)} GiB")
    if hit.memory_reason:
        lines.append(f"  {hit.memory_reason}")
    if hit.memory_fix:
        lines.append(f"  fix: {hit.memory_fix}")
    lines.append(f"acceptance: α={fmt_num(hit.acceptance, 3)} band [{fmt_num(hit.acceptance_low, 3)}, "
                 f"{fmt_num(hit.acceptance_high, 3)}], relation {hit.relation}, source {hit.acceptance_source}")
    if hit.acceptance_mixture:
        lines += mixture_lines(hit.acceptance_mixture)
        b = hit.acceptance_mixture_builtin
        if b:
            lines.append(f"  for comparison, the built-in {result.workload} reference ({b.get('reference', '')}): draft "
                         f"probability {fmt_num(b['draft_probability'], 3)}, accepted length given a draft "
                         f"{fmt_num(b['accepted_per_draft'], 2)} at K={b['k']}")
    lines.append(f"  citation: {hit.acceptance_citation}")
    lines.append(f"speedup ({hit.speedup_source or 'n/a'}):")
    for b in result.batches:
        lines.append(f"  batch {b}: {fmt_num(hit.speedup.get(b))}x [{fmt_num(hit.speedup_low.get(b))}, "
                     f"{fmt_num(hit.speedup_high.get(b))}] at K={hit.best_k_by_batch.get(b)}")
    if hit.per_k:
        lines.append(f"  per K at batch {result.batches[0]}: " + ", ".join(
            f"K={k}: {fmt_num(v.get('speedup'))}x" for k, v in sorted(hit.per_k.items())))
        for k, v in sorted(hit.per_k.items()):  # the speculative step as its named sum, each term's source
            if v.get("terms"):
                lines.append(f"  step at K={k}, batch {result.batches[0]}: {fmt_num(v.get('spec_step_ms'))} ms = "
                             + " + ".join(f"{n} {t['ms']:.2f}" for n, t in v["terms"].items()))
                lines += [f"    {n}: [{t['source']}]" for n, t in v["terms"].items()] if k == min(hit.per_k) else []
    lines += [f"  note: {n}" for n in hit.speedup_notes]
    lines.append(f"verdict: {hit.decision} — {hit.reason}")
    click.echo("\n".join(lines))
