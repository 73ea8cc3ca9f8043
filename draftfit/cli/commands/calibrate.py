"""`draftfit calibrate`: measure step costs on a GPU with vLLM (dummy weights, synthetic acceptance), or
ingest the files a GPU campaign (bench/gpu_campaign.py) brought back."""

from __future__ import annotations

import json
from pathlib import Path

import click

from draftfit.errors import DraftfitError
from draftfit.cli.render import json_option
from draftfit.calibration import tables as cal
from draftfit.cli.render import console, emit_json, table
from draftfit.catalog.specs import resolve_model
from draftfit.layout import (MAX_BATCH, check_float, check_int, check_name, check_output_file, check_tp,
                             parse_float_list, parse_int_list)


CALIBRATE_K_MAX = 16
MAX_TOKENS = 131_072
MAX_REPEATS = 1000
MAX_BUDGET_S = 7 * 24 * 3600.0


def _ints(text: str, option: str, hi: int, example: str) -> list[int]:
    """'1..8' or '1,2,4' (or both, comma-separated: layout.parse_int_list) -> the integers, each in 1..hi; else one
    error."""
    out = parse_int_list(text, option, example)
    if not out or min(out) < 1 or max(out) > hi:
        raise DraftfitError(f"{option} {text!r} has values outside 1..{hi}", fix=f"e.g. {option} {example}")
    return sorted(set(out))


def _check_lane_files(paths) -> None:
    """Each --ingest file is a JSON object (a campaign lane file or one engine result)."""
    for p in paths:
        try:
            data = json.loads(Path(p).read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
            raise DraftfitError(f"--ingest {p} is not readable JSON ({detail})",
                                fix="pass the <phase>_<lane>.json files bench/gpu_campaign.py brought back") from None
        if not isinstance(data, dict):
            raise DraftfitError(f"--ingest {p} holds a JSON {type(data).__name__}, not a campaign lane object",
                                fix="pass the <phase>_<lane>.json files bench/gpu_campaign.py brought back")
        if "configs" in data and not (isinstance(data["configs"], list)
                                      and all(isinstance(c, dict) for c in data["configs"])):
            raise DraftfitError(f"--ingest {p}: 'configs' is not a list of engine results",
                                fix="pass the <phase>_<lane>.json files bench/gpu_campaign.py brought back")


@click.command(name="calibrate")
@click.argument("target", required=False)
@click.argument("draft", required=False)
@click.option("--k", "k_text", default="1,2,3,4,6,8", show_default=True, help="K values, e.g. 1..8 or 1,2,4.")
@click.option("--batch", "batch_text", default="1,8,32,128", show_default=True, help="Batch sizes.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel size (draft uses the same).")
@click.option("--acceptance", "acc_text", default="0.8", show_default=True,
              help="Synthetic acceptance rate(s); step time does not depend on it, the first one is measured.")
@click.option("--max-tokens", type=int, default=96, show_default=True, help="Decode tokens per timed run.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed repeats per batch size (median).")
@click.option("--budget-s", type=float, default=3600, show_default=True, help="Stop starting engines after this.")
@click.option("--out", type=click.Path(dir_okay=False), help="Table path (default data/calibration/<pair>.json).")
@click.option("--ingest", "ingest", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Instead of measuring: turn campaign lane files (<phase>_<lane>.json) into tables.")
@click.option("--write-configs", is_flag=True, help="Only write data/calibration/configs/<model>/config.json.")
@click.option("--show", is_flag=True, help="Print the stored tables (all, or TARGET's / TARGET+DRAFT's) instead.")
@json_option
def calibrate(target, draft, k_text, batch_text, tp, acc_text, max_tokens, repeats, budget_s, out, ingest,
              write_configs, show, as_json):
    """Measure step costs of TARGET with DRAFT on this GPU (vLLM 0.26+, dummy weights): one engine for the
    baseline and one per K, each batch size timed in it; writes a step-cost table that `draftfit speedup`
    and `rank` use ('calibrated:<file>').

    \b
    Examples:
      draftfit calibrate Llama-3.1-8B Llama-3.2-1B --k 1..8 --batch 1,8,32,128
      draftfit calibrate --ingest A_gpu0.json --ingest A_gpu1.json
      draftfit calibrate --show Llama-3.1-8B --json     # stored tables: offline and steady-state speedups
    """

    if show:
        tables = [t for t in cal.load_tables() if (not target or cal._norm(t.target) == cal._norm(target))
                  and (not draft or cal._norm(t.draft) == cal._norm(draft))]
        if not tables:
            raise DraftfitError(f"no calibration table for {target or 'any target'}"
                                + (f" + {draft}" if draft else ""),
                                fix="see `draftfit calibrate --show` for what is stored, or run the campaign")
        if as_json:
            emit_json({"tables": [_detail(t) for t in tables]})
            return
        con = console()
        for t in tables:
            _render_table(t, con)
        return

    if write_configs:
        names = [n for n in (target, draft) if n] or None
        paths = [str(p / "config.json") for p in cal.write_campaign_configs(names)]
        emit_json({"configs": paths}) if as_json else [click.echo(p) for p in paths]
        return
    if ingest:
        _check_lane_files(ingest)
        try:
            paths = cal.ingest_results(list(ingest), directory=None if not out else __import__("pathlib").Path(out).parent,
                                       command=cal.cli_command())
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise DraftfitError(f"--ingest {', '.join(map(str, ingest))}: a field is missing or has the wrong type "
                                f"({type(exc).__name__}: {str(exc)[:80]})",
                                fix="pass the unmodified lane files bench/gpu_campaign.py brought back") from None
        tables = [cal.load_table(p) for p in paths]
        if as_json:
            emit_json({"tables": [str(p) for p in paths], "summary": [_summary(t) for t in tables]})
            return
        con = console()
        for t in tables:
            _render_table(t, con)
        return
    if not (target and draft):
        raise DraftfitError("calibrate needs TARGET and DRAFT (or --ingest FILES)",
                            fix="e.g. draftfit calibrate Llama-3.1-8B Llama-3.2-1B")
    # Every option is checked here, before vLLM is imported or a worker starts.
    acc = list(parse_float_list(acc_text, "--acceptance", example="0.6,0.8"))
    for a in acc:
        check_float(a, "--acceptance", 0, 1, lo_open=True, fix="rates in (0, 1], e.g. --acceptance 0.6,0.8")
    ks = _ints(k_text, "--k", CALIBRATE_K_MAX, "1..8")
    batches = _ints(batch_text, "--batch", MAX_BATCH, "1,8,32,128")
    check_int(max_tokens, "--max-tokens", 2, MAX_TOKENS, fix="e.g. --max-tokens 96")
    check_int(repeats, "--repeats", 1, MAX_REPEATS, fix="e.g. --repeats 3")
    check_float(budget_s, "--budget-s", 0, MAX_BUDGET_S, lo_open=True, fix="seconds, e.g. --budget-s 3600")
    t_spec, d_spec = resolve_model(check_name(target, "TARGET")), resolve_model(check_name(draft, "DRAFT"))
    check_tp(t_spec, tp)
    if not d_spec.is_eagle:
        check_tp(d_spec, tp)
    if out:
        check_output_file(out, "--out")
    run = cal.run_calibration(target, draft, ks=ks, batches=batches,
                              tp=tp, acceptance=acc, out=out, budget_s=budget_s, max_tokens=max_tokens,
                              repeats=repeats, command=cal.cli_command())
    if as_json:
        emit_json(run)
        return
    con = console()
    for e, status in run.statuses.items():
        con.print(f"{e}: {status}")
    for p in run.tables:
        _render_table(cal.load_table(p), con)


def _summary(t) -> dict:
    return {"target": t.target, "draft": t.draft, "gpu": t.gpu, "tp": t.tp, "ks": t.ks, "batches": t.batches,
            "path": t.path}


def _detail(t) -> dict:
    """Every measured point of a table: offline (as timed) and steady-state (drain taken out) numbers."""
    points = []
    for k in t.ks:
        for b in t.batches:
            row = t.spec.get(str(k), {}).get(str(b))
            if not row or not t.measured_speedup(k, b):
                continue
            points.append({"k": k, "batch": b, "plain_step_ms": t.baseline[str(b)].get("step_ms"),
                           "offline_step_ms": row.get("step_ms"), "steady_step_ms": t.spec_step_ms(k, b),
                           "offline_speedup": t.measured_speedup(k, b), "steady_speedup": t.speedup(k, b),
                           "drain_ratio": t.drain_ratio(k, b), "engines": row.get("engines", 1),
                           "engine_spread": row.get("engine_spread"), "repeat_spread": row.get("repeat_spread")})
    return {**_summary(t), "gpu_name": t.gpu_name, "vllm_version": t.vllm_version, "acceptance": t.acceptance,
            "provenance": {k: v for k, v in t.provenance.items() if k != "shapes"}, "points": points}


def _render_table(t, con) -> None:

    rows = []
    for b in t.batches:
        base = t.baseline.get(str(b), {})
        row = [b, f"{base.get('tpot_ms', 0):.2f}"]
        for k in t.ks:
            s, off = t.speedup(k, b), t.measured_speedup(k, b)
            row.append(f"{t.spec_step_ms(k, b):.2f} / {s:.2f}x ({off:.2f}x)" if s and off else "—")
        rows.append(row)
    con.print(table(f"{t.target} + {t.draft} on {t.gpu_name or t.gpu} TP={t.tp} (vLLM {t.vllm_version})",
                    ["batch", "plain TPOT ms", *[f"K={k} step ms / speedup (offline)" for k in t.ks]], rows,
                    caption=(f"measured at synthetic acceptance {t.acceptance}" if t.provenance.get("synthetic", True)
                             else "measured with real rejection of dummy-weight drafts (acceptance ~0)")
                    + "; step and speedup at steady state (batch drain of the offline run taken out), "
                      f"offline TPOT ratio in brackets; {t.path}"))
