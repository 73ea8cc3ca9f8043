"""`draftfit check TARGET DRAFT`: tokenizer/vocab compatibility, and what vLLM will do with the pair."""

from __future__ import annotations

import click

from draftfit.cli.render import json_option
from pathlib import Path

from draftfit.catalog.specs import is_folder, resolve_model, spec_from_tokenizer_folder
from draftfit.errors import DraftfitError
from draftfit.layout import check_name
from draftfit.cli.render import console, emit_json, table
from draftfit.compat.tokenizers import check_pair
from draftfit.pipeline import vllm_verdict

VERDICT_STYLE = {"identical": "bold green", "compatible": "bold yellow", "incompatible": "bold red"}


def _fact_rows(report, target, draft) -> list[list]:
    t, d = report.target_tokenizer, report.draft_tokenizer

    def tok(side: dict, key: str):
        value = side.get(key)
        return "—" if value in (None, "") else value

    def marker(side: dict, key: str):
        name, ident = side.get(key), side.get(f"{key}_id")
        if name is None:
            return "—"
        return f"{name} ({ident})" if ident is not None else name

    return [
        ["model", target.name, draft.name],
        ["hub id / folder", target.local_path or target.hub_id, draft.local_path or draft.hub_id],
        ["method", target.method, draft.method],
        ["params (B)", target.params_b or "?", draft.params_b or "?"],
        ["embedding rows (config vocab_size)", target.vocab_size or "unknown (no config.json)",
         draft.vocab_size or "unknown (no config.json)"],
        ["tokenizer family", target.tokenizer if not target.tokenizer.startswith("local:") else "local files",
         draft.tokenizer if not draft.tokenizer.startswith("local:") else "local files"],
        ["tokenizer read from", tok(t, "where"), tok(d, "where")],
        ["base vocabulary", f"{t.get('base_size') or '?'} ({t.get('base_fingerprint')})",
         f"{d.get('base_size') or '?'} ({d.get('base_fingerprint')})"],
        ["tokenizer length (with added)", tok(t, "total_size"), tok(d, "total_size")],
        ["added/special tokens fingerprint", tok(t, "specials_fingerprint"), tok(d, "specials_fingerprint")],
        ["BOS", marker(t, "bos"), marker(d, "bos")],
        ["EOS", marker(t, "eos"), marker(d, "eos")],
        ["PAD", marker(t, "pad"), marker(d, "pad")],
        ["normalizer", tok(t, "normalizer"), tok(d, "normalizer")],
        ["pre-tokenizer", tok(t, "pre_tokenizer"), tok(d, "pre_tokenizer")],
        ["chat template", tok(t, "chat_template"), tok(d, "chat_template")],
    ]


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


# Slow-format tokenizer files (GPT-2 style BPE, SentencePiece) that transformers converts to a tokenizer.json.
SLOW_TOKENIZER_FILES = (("vocab.json", "merges.txt"), ("tokenizer.model",), ("spiece.model",))


def _refuse_slow_tokenizer(folder: Path) -> None:
    """A folder whose tokenizer ships only in a slow format: the real problem, not "no config.json"."""
    for files in SLOW_TOKENIZER_FILES:
        if all(_present(folder / f) for f in files):
            raise DraftfitError(
                f"{folder} holds a slow-format tokenizer ({' + '.join(files)}) and no tokenizer.json, which is what "
                "draftfit compares", fix="write the fast format beside it: python -c \"from transformers import "
                f"AutoTokenizer as T; T.from_pretrained('{folder}').save_pretrained('{folder}')\", then run check again")


def _resolve(name: str, catalog_only: bool):
    """A catalog name, hub id or model folder; a folder with tokenizer files but no config.json is checked on
    its tokenizer alone (embedding rows unknown). A folder's own tokenizer files are what `check` compares."""
    folder = Path(name).expanduser()
    if is_folder(folder) and not _present(folder / "tokenizer.json"):
        _refuse_slow_tokenizer(folder)
    if is_folder(folder) and not _present(folder / "config.json") and _present(folder / "tokenizer.json"):
        return spec_from_tokenizer_folder(folder)
    spec = resolve_model(name)
    if spec.local_path and not catalog_only and not _present(Path(spec.local_path) / "tokenizer.json"):
        raise DraftfitError(f"{spec.local_path} has no tokenizer.json, so its tokenizer cannot be checked",
                            fix="put the model's tokenizer.json (and tokenizer_config.json) in the folder, or pass "
                                "--catalog-only to compare catalog fingerprints")
    return spec


@click.command(name="check")
@click.argument("target")
@click.argument("draft")
@click.option("--catalog-only", is_flag=True, help="Compare catalog fingerprints only; read no tokenizer files.")
@json_option
def check(target: str, draft: str, catalog_only: bool, as_json: bool):
    """Tokenizer/vocab compatibility of TARGET and DRAFT (catalog names, hub ids or local folders)."""

    target_spec = _resolve(check_name(target, "TARGET"), catalog_only)
    draft_spec = _resolve(check_name(draft, "DRAFT"), catalog_only)
    report = check_pair(target_spec, draft_spec, use_files=not catalog_only)
    # What vLLM does at start-up beyond the vocab rule (KV-cache groups): pipeline's one verdict, TP 1.
    starts = None
    if report.vllm_accepts and target_spec.num_layers and draft_spec.num_layers:
        starts = vllm_verdict(target_spec, draft_spec, compat=report)
    if as_json:
        data = report.to_dict()
        if starts is not None:
            data["vllm_starts"], data["vllm_reason"], data["vllm_fix"] = starts
        emit_json(data)
        return

    from rich.markup import escape as esc

    out = console()
    if not out.is_terminal:  # piped: rich's 80-column default would truncate paths and fingerprints
        out.width = max(out.width, 160)
    out.print(table(f"{target_spec.name} ← {draft_spec.name}", ["", "target", "draft"],
                    _fact_rows(report, target_spec, draft_spec),
                    caption=f"source: {report.source}; fingerprints are sha256[:16]"))
    style = VERDICT_STYLE.get(report.verdict, "bold")
    diff = f", {report.differing_ids} differing ids" if report.differing_ids >= 0 else ""
    out.print(f"tokenizers: [{style}]{esc(report.verdict)}[/]{diff} (from {esc(report.source)})")
    vllm = ("[yellow]unknown[/] (no config.json, so no embedding rows to compare)" if report.vllm_accepts is None
            else "[green]starts the pair[/]" if report.vllm_accepts else "[red]refuses the pair[/]")
    if starts is not None and not starts[0]:
        vllm = f"[red]accepts the vocabularies, then fails at start-up[/]: {esc(starts[1])}"
    elif starts is not None and "KV-cache group" in starts[1]:
        vllm += f": {esc(starts[1])}"
    out.print(f"vLLM: {vllm}", highlight=False)
    if starts is not None and starts[2]:
        out.print(f"[bold]fix (vLLM start-up):[/] {esc(starts[2])}", highlight=False)
    if report.warning:
        out.print(f"[bold red]WARNING: {esc(report.warning)}[/]")
    for note in report.notes:
        out.print(f"  • {note}", highlight=False, markup=False)
    if report.first_differences:
        out.print(table("first differing ids", ["id", "target", "draft"],
                        [[x["id"], repr(x["target"]), repr(x["draft"])] for x in report.first_differences]))
    if report.fix:
        out.print(f"[bold]fix:[/] {esc(report.fix)}", highlight=False)
