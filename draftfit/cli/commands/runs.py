"""`draftfit runs list|show ID|export` — the measurement store."""

from __future__ import annotations

import csv
import io
import json

import click

from draftfit.errors import DraftfitError
from draftfit.layout import check_int, check_output_file
from draftfit.cli.render import json_option, write_text_file
from draftfit.acceptance.store import MeasurementStore, result_from_row
from draftfit.cli.render import console, emit_json, table

_store_option = click.option("--store", "store_path", type=click.Path(), default=None,
                             help="SQLite store (default: $DRAFTFIT_STORE or ~/.cache/draftfit/measurements.sqlite).")

CSV_COLUMNS = ["id", "status", "backend", "target", "draft", "workload", "temperature", "k", "seed", "num_prompts",
               "max_tokens", "num_drafts", "num_draft_tokens", "num_accepted", "acceptance_rate",
               "mean_acceptance_length", "ci_low", "ci_high", "tokens_per_s", "seconds", "vllm_version",
               "transformers_version", "draftfit_version", "device", "target_hash", "draft_hash", "prompt_set_hash",
               "started_at", "ended_at", "error", "per_position_accepted"]


def _open(store_path):

    # runs list/show/export only read: a store that does not exist yet is empty, and nothing is created.
    return MeasurementStore(store_path, read_only=True)


@click.group()
def runs():
    """Stored acceptance measurements."""


@runs.command("list")
@_store_option
@json_option
def list_runs(store_path, as_json):
    """One line per run."""

    with _open(store_path) as store:
        rows = store.runs()
        path = store.path
    if as_json:
        emit_json(rows)
        return
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    console().print(table(f"Runs in {path}", ["id", "status", "backend", "target", "draft", "workload", "T", "K",
                                             "prompts×tokens", "acc. rate", "mean acc. len", "tok/s", "ended"],
                          [[r["id"], r["status"], r["backend"], r["target"], r["draft"], r["workload"],
                            r["temperature"], r["k"], f"{r['num_prompts']}×{r['max_tokens']}",
                            fmt(r["acceptance_rate"], ".3f"), fmt(r["mean_acceptance_length"], ".2f"),
                            fmt(r["tokens_per_s"], ".1f"), r["ended_at"]] for r in rows],
                          caption=None if rows else "no runs yet: `draftfit measure TARGET DRAFT`"))
    # A failed run has no numbers to show in the table: its error line is the whole record of what happened.
    for r in rows:
        if r["status"] == "failed":
            console().print(f"run {r['id']} failed: {' '.join(str(r['error'] or 'no error recorded').split())}",
                            soft_wrap=True, highlight=False, markup=False)


@runs.command("show")
@click.argument("run_id", type=int)
@_store_option
@json_option
def show(run_id, store_path, as_json):
    """Everything stored about one run, with its acceptance curve."""

    check_int(run_id, "RUN_ID", 1, 2**63 - 1, fix="pass a run id from `draftfit runs list`")
    with _open(store_path) as store:
        row = store.get(run_id)
    if row is None:
        raise DraftfitError(f"no run {run_id} in the store", fix="see `draftfit runs list`")
    curve = []
    if row["status"] == "ok":
        res = result_from_row(row)
        curve = [{"k": p.k, "acceptance_rate": p.acceptance_rate, "mean_acceptance_length": p.mean_acceptance_length}
                 for p in res.curve]
    if as_json:
        emit_json({**row, "curve": curve})
        return
    con = console()
    skip = {"groups", "per_position_accepted", "extra"}
    con.print(table(f"Run {run_id}", ["field", "value"], [[k, v] for k, v in row.items() if k not in skip]))
    if curve:
        drafts = row["num_drafts"] or 1
        con.print(table("Curve (from the per-position counts)", ["K", "accepted at pos K-1", "a_K", "acceptance rate",
                                                                  "mean acc. length"],
                        [[c["k"], row["per_position_accepted"][c["k"] - 1],
                          f"{row['per_position_accepted'][c['k'] - 1] / drafts:.3f}", f"{c['acceptance_rate']:.3f}",
                          f"{c['mean_acceptance_length']:.2f}"] for c in curve]))


@runs.command("export")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="File (default: stdout).")
@_store_option
def export(fmt, output, store_path):
    """All runs as CSV (one row per run, per-position counts joined by ';') or JSON."""
    if output:
        check_output_file(output, "--output")
    with _open(store_path) as store:
        rows = store.runs()
    if fmt == "json":
        text = json.dumps(rows, indent=2) + "\n"
    else:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([";".join(map(str, r["per_position_accepted"])) if c == "per_position_accepted" else r.get(c)
                        for c in CSV_COLUMNS])
        text = buf.getvalue()
    if output:
        write_text_file(output, text)
    else:
        click.echo(text, nl=False)
