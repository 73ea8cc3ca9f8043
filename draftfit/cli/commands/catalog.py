"""`draftfit catalog list|show`: what the embedded catalog knows (no heavy imports)."""

from __future__ import annotations

import click

from draftfit.errors import DraftfitError, UnknownModelError
from draftfit.cli.render import json_option
from draftfit.catalog.specs import load_gpus, load_models, resolve_gpu, resolve_model
from draftfit.cli.render import console, emit_json, table
from draftfit.compat.tokenizers import load_tokenizer_catalog
from draftfit.paths import CATALOG_DIR


def _require_gpus():

    if not (CATALOG_DIR / "gpus.yaml").exists():
        raise DraftfitError(f"{CATALOG_DIR / 'gpus.yaml'} is missing", fix="reinstall draftfit or restore catalogs/")
    return load_gpus()


def _wide(out):
    # Piped output (tests, `| less`, CI logs) gets rich's 80-column default, which truncates the numbers.
    if not out.is_terminal:
        out.width = max(out.width, 160)
    return out


@click.group(name="catalog")
def catalog():
    """List or show catalog models and GPUs."""


@catalog.command(name="list")
@click.option("--gpus", is_flag=True, help="List GPUs instead of models.")
@click.option("--family", default=None, help="Only models of this family or tokenizer family (e.g. qwen3, llama-3.1).")
@json_option
def list_cmd(gpus: bool, family: str | None, as_json: bool):
    """Catalog models (or GPUs) with the numbers draftfit uses."""

    if gpus and family:  # families are of models; dropping it silently would list every GPU as if filtered
        raise DraftfitError("--family filters models, not GPUs", fix="drop --family, or drop --gpus")
    if gpus:
        items = _require_gpus()
        if as_json:
            emit_json([g.to_dict() for g in items])
            return
        rows = [[g.name, g.vendor, g.memory_gib, g.bandwidth_gbps, g.bf16_tflops, ", ".join(g.aliases)] for g in items]
        _wide(console()).print(table("GPUs", ["name", "vendor", "memory GiB", "HBM GB/s", "bf16 TFLOP/s (dense)", "aliases"],
                              rows, caption="source: catalogs/gpus.yaml"))
        return

    models = list(load_models())
    if family:
        want = family.lower()
        models = [m for m in models if want in (m.family.lower(), m.tokenizer.lower())
                  or m.family.lower().startswith(want) or m.tokenizer.lower().startswith(want)]
        if not models:
            fams = sorted({m.family for m in load_models()} | {m.tokenizer for m in load_models()})
            raise DraftfitError(f"no catalog model of family {family!r}", fix="families: " + ", ".join(fams))
    if as_json:
        emit_json([m.to_dict() for m in models])
        return
    rows = [[m.name, m.params_b, m.num_layers, f"{m.num_attention_heads}/{m.num_kv_heads}", m.vocab_size, m.tokenizer,
             m.max_position_embeddings, "draft" if m.method == "draft_model" else f"{m.method} for {', '.join(m.draft_for)}"]
            for m in models]
    t = table(f"models ({len(models)})",
              ["name", "params B", "layers", "heads/kv", "vocab rows", "tokenizer", "max ctx", "method"], rows,
              caption="source: catalogs/models.yaml; `draftfit catalog show NAME` gives each entry's config.json")
    _wide(console()).print(t)


@catalog.command(name="show")
@click.argument("name")
@json_option
def show(name: str, as_json: bool):
    """Every field of one model (with its tokenizer family) or GPU."""

    try:
        spec = resolve_model(name, allow_hub=False)
        kind = "model"
    except UnknownModelError as model_error:
        try:
            spec = resolve_gpu(name)
            kind = "gpu"
        except DraftfitError:
            raise model_error from None
    data = spec.to_dict()
    tok_entry = load_tokenizer_catalog().get(getattr(spec, "tokenizer", "")) if kind == "model" else None
    if as_json:
        emit_json({"kind": kind, **data, **({"tokenizer_family": tok_entry} if kind == "model" else {})})
        return
    out = _wide(console())
    rows = [[k, ", ".join(v) if isinstance(v, (list, tuple)) else v] for k, v in data.items() if v not in ("", (), None)]
    out.print(table(f"{kind} {spec.name}", ["field", "value"], rows))
    if kind == "model":
        if tok_entry:
            trows = [[k, v if not isinstance(v, dict) else ", ".join(f"{a}={b}" for a, b in v.items())]
                     for k, v in tok_entry.items() if v is not None]
            out.print(table(f"tokenizer family {spec.tokenizer}", ["field", "value"], trows,
                            caption="source: catalogs/tokenizers.yaml"))
        elif not spec.tokenizer.startswith("local:"):
            out.print(f"tokenizer family {spec.tokenizer!r} has no entry in catalogs/tokenizers.yaml")
