"""Rendering helpers shared by commands: JSON for machines, rich tables for people."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import click

from draftfit.errors import DraftfitError


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(to_jsonable(obj), indent=2, sort_keys=False))


def console():
    from rich.console import Console

    import shutil

    # Piped output would default to 80 columns and truncate numbers; keep tables whole.
    width = None if shutil.get_terminal_size((0, 0)).columns else 160
    return Console(soft_wrap=False, width=width)


def table(title: str | None, columns: list[str], rows: list[list[Any]], caption: str | None = None,
          overflow: str = "ellipsis"):
    """A rich table of data: every str title, caption, header and cell is escaped (a folder named `ckpt [/old]`
    or a header "α [band]" is text, not markup); pass a rich Text for a styled cell."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    def cell(v):
        return v if isinstance(v, Text) else escape("" if v is None else str(v))

    t = Table(title=None if title is None else escape(title), caption=None if caption is None else escape(caption),
              header_style="bold")
    for col in columns:
        t.add_column(escape(col), overflow=overflow)
    for row in rows:
        t.add_row(*[cell(v) for v in row])
    return t


def write_text_file(path: str, text: str, *, option: str = "--output", fix: str = "pass a writable file path") -> None:
    """Write a command's output file, or one error line naming the option (never a traceback)."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise DraftfitError(f"cannot write {option} {path}: {exc.strerror or exc}", fix=fix) from None


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def util_option(f):
    """--util as every command that plans vLLM's memory takes it: unset means the version's own default."""
    return click.option("--util", type=float, default=None,
                        help="gpu_memory_utilization (default: left unset, so the vLLM version's own default, as vLLM "
                             "runs without the flag).")(f)


def fmt_num(v, digits=2, suffix="") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}{suffix}"


def fmt_tokens(n) -> str:
    if n is None:
        return "n/a"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.0f}k"
    return str(int(n))


def mixture_lines(m: dict) -> list[str]:
    """--explain: an n-gram / suffix drafter's acceptance as the mixture it is, per K, carried to the speedup."""
    window = f", lookup {m['lookup'][0]}-{m['lookup'][1]}" if m.get("lookup") else ""
    how = "each K replayed on its own" if m.get("per_k_runs") else f"every K read from one run at K={m['k']}"
    lines = [f"  mixture ({m.get('basis') or m.get('reference', '')}{window}; {how}): drafts on "
             f"{fmt_num(m['draft_probability'] * 100, 0)}% of decode steps (draft probability "
             f"{fmt_num(m['draft_probability'], 3)}, {m.get('num_drafts', '?')} of {m.get('decode_steps', '?')}), "
             f"accepted length given a draft {fmt_num(m['accepted_per_draft'], 2)} tokens at K={m['k']}"]
    at = f" at batch {m['speedup_batch']}" if m.get("speedup_batch") else ""
    for p in m.get("per_k") or []:
        sp = f", speedup{at} {fmt_num(p['speedup'])}x" if p.get("speedup") is not None else ""
        best = "  <- best K" if m.get("best_k") == p["k"] else ""
        priced = p.get("priced_tokens_per_step")
        shown = (f" (priced at {fmt_num(priced, 2)})" if priced is not None
                 and abs(priced - p["tokens_per_step"]) > 0.005 * p["tokens_per_step"] else "")
        lines.append(f"    K={p['k']}: draft probability {fmt_num(p['draft_probability'], 3)} x accepted given a "
                     f"draft {fmt_num(p['accepted_given_draft'], 2)} -> {fmt_num(p['tokens_per_step'], 2)} tokens "
                     f"per step{shown}{sp}{best}")
    lines += [f"    note: {n}" for n in m.get("notes") or []]
    return lines
