"""Stage 1 — catalog: model and GPU specs, and resolution of the loose names users type.

Facts come from `catalogs/models.yaml` and `catalogs/gpus.yaml` (architecture numbers copied from each
model's public config.json; the `source` field says which). A local folder holding a config.json is
turned into a spec on the fly; a hub id is fetched only when a hub is reachable.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from draftfit.errors import DraftfitError, UnknownGpuError, UnknownModelError
from draftfit.paths import CATALOG_DIR

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8": 1, "int8": 1, "auto": 2}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hub_id: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # embedding rows (config.json `vocab_size`), not the tokenizer's length
    max_position_embeddings: int
    tie_word_embeddings: bool
    params_b: float
    tokenizer: str  # tokenizer family id, a key of catalogs/tokenizers.yaml
    family: str = ""
    dtype: str = "bfloat16"
    method: str = "draft_model"  # or "eagle3" for EAGLE heads, which draft only for `draft_for`
    draft_for: tuple[str, ...] = ()
    license: str = ""
    source: str = ""
    aliases: tuple[str, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    sliding_window: int = 0
    local_path: str = ""  # set when resolved from a folder on disk

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_eagle(self) -> bool:
        return self.method.startswith("eagle")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float  # what torch.cuda.mem_get_info reports as total (what vLLM multiplies by util)
    bandwidth_gbps: float  # HBM GB/s
    bf16_tflops: float  # dense
    vendor: str = "nvidia"
    aliases: tuple[str, ...] = ()
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def _strip_variant(norm: str) -> str:
    # "Llama-3.1-70B-Instruct" and "Llama-3.1-70B" name the same architecture.
    return re.sub(r"(instruct|chat|it|base|hf)$", "", norm)


def _tuple_fields(cls, raw: dict) -> dict:
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise DraftfitError(f"catalog entry {raw.get('name')!r} has unknown keys {sorted(unknown)}",
                            fix="fix catalogs/*.yaml")
    out = dict(raw)
    for key in ("aliases", "draft_for"):
        if key in out and out[key] is not None:
            out[key] = tuple(out[key])
    return out


def _yaml_loader():
    import yaml

    # The C loader parses models.yaml ~8x faster; every catalog command pays this at start-up.
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=None)
def load_models(catalog_dir: Path = CATALOG_DIR) -> tuple[ModelSpec, ...]:
    import yaml

    data = yaml.load((catalog_dir / "models.yaml").read_text(), Loader=_yaml_loader())
    return tuple(ModelSpec(**_tuple_fields(ModelSpec, m)) for m in data["models"])


@lru_cache(maxsize=None)
def load_gpus(catalog_dir: Path = CATALOG_DIR) -> tuple[GpuSpec, ...]:
    import yaml

    data = yaml.load((catalog_dir / "gpus.yaml").read_text(), Loader=_yaml_loader())
    return tuple(GpuSpec(**_tuple_fields(GpuSpec, g)) for g in data["gpus"])


def _index(items) -> dict[str, object]:
    index: dict[str, object] = {}
    for item in items:
        keys = [item.name, *item.aliases]
        if getattr(item, "hub_id", ""):
            keys += [item.hub_id, item.hub_id.split("/")[-1]]
        for key in keys:
            norm = _normalize(key)
            index.setdefault(norm, item)
            index.setdefault(_strip_variant(norm), item)
    return index


def _nearest(name: str, items) -> list[str]:
    names = [i.name for i in items]
    by_norm = {_normalize(n): n for n in names}
    close = difflib.get_close_matches(_normalize(name.split("/")[-1]), list(by_norm), n=3, cutoff=0.0)
    return [by_norm[c] for c in close]


def resolve_gpu(name: str) -> GpuSpec:
    gpus = load_gpus()
    hit = _index(gpus).get(_normalize(name))
    if hit is None:
        raise UnknownGpuError(f"unknown GPU {name!r}",
                              fix="nearest: " + ", ".join(_nearest(name, gpus)) + " (see `draftfit catalog list --gpus`)")
    return hit


def resolve_model(name: str, *, allow_hub: bool = True) -> ModelSpec:
    """Catalog name or alias, hub id, or a local folder with config.json; else UnknownModelError."""
    path = Path(name).expanduser()
    if path.is_dir():
        return spec_from_folder(path)
    models = load_models()
    index = _index(models)
    norm = _normalize(name)
    hit = index.get(norm) or index.get(_strip_variant(norm))
    if hit is None and "/" in name:
        short = _normalize(name.split("/")[-1])
        hit = index.get(short) or index.get(_strip_variant(short))
    if hit is not None:
        return hit
    if "/" in name and allow_hub:
        folder = _fetch_from_hub(name)
        if folder is not None:
            return spec_from_folder(folder, hub_id=name)
    nearest = ", ".join(_nearest(name, models))
    hub_note = " (not in the catalog; the hub is not reachable offline)" if "/" in name else ""
    raise UnknownModelError(f"unknown model {name!r}{hub_note}",
                            fix=f"nearest catalog names: {nearest}; or pass a local folder with config.json")


def _fetch_from_hub(hub_id: str) -> Path | None:
    """config.json and tokenizer files through huggingface_hub's cache; None when offline or missing."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(hub_id, allow_patterns=["config.json", "tokenizer*", "special_tokens_map.json",
                                                              "vocab.json", "merges.txt"]))
    except Exception:  # offline, gated or missing: resolve_model reports it as unknown
        return None


def spec_from_config(config: dict, *, name: str, hub_id: str = "", local_path: str = "",
                     tokenizer: str = "") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json dict (text models; nested text_config honoured)."""
    cfg = dict(config.get("text_config") or {}) or config
    heads = cfg.get("num_attention_heads") or 1
    hidden = cfg.get("hidden_size") or 0
    head_dim = cfg.get("head_dim") or (hidden // heads if heads else 0)
    layers = cfg.get("num_hidden_layers") or 0
    inter = cfg.get("intermediate_size") or 0
    vocab = cfg.get("vocab_size") or 0
    kv_heads = cfg.get("num_key_value_heads") or heads
    tie = bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    moe_inter = cfg.get("moe_intermediate_size") or 0
    # Parameter count from the shapes: attention, MLP (or experts), norms, embeddings.
    attn = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2
    mlp = 3 * hidden * (moe_inter or inter) * (experts or 1) + (hidden * experts if experts else 0)
    params = layers * (attn + mlp + 2 * hidden) + vocab * hidden * (1 if tie else 2) + hidden
    dtype = str(config.get("torch_dtype") or config.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    archs = config.get("architectures") or ["unknown"]
    return ModelSpec(
        name=name, hub_id=hub_id, architecture=archs[0], hidden_size=hidden, num_layers=layers,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inter,
        vocab_size=vocab, max_position_embeddings=cfg.get("max_position_embeddings") or 0,
        tie_word_embeddings=tie, params_b=round(params / 1e9, 3), tokenizer=tokenizer,
        family=str(config.get("model_type", "")), dtype=dtype.replace("torch.", ""),
        num_experts=experts, num_experts_per_tok=cfg.get("num_experts_per_tok") or 0,
        moe_intermediate_size=moe_inter, sliding_window=cfg.get("sliding_window") or 0,
        local_path=local_path, source=f"{local_path or hub_id}/config.json",
    )


def spec_from_folder(path: Path, hub_id: str = "") -> ModelSpec:
    config_file = path / "config.json"
    if not config_file.exists():
        raise DraftfitError(f"{path} has no config.json", fix="point at a Hugging Face model folder")
    config = json.loads(config_file.read_text())
    return spec_from_config(config, name=path.name if not hub_id else hub_id.split("/")[-1],
                            hub_id=hub_id, local_path=str(path.resolve()), tokenizer=f"local:{path.resolve()}")


def draft_candidates(target: ModelSpec) -> list[ModelSpec]:
    """Catalog models that could draft for `target`: smaller dense models and EAGLE heads made for it."""
    out = []
    for m in load_models():
        if m.name == target.name:
            continue
        if m.is_eagle:
            if target.name in m.draft_for:
                out.append(m)
        elif m.params_b < target.params_b * 0.5:
            out.append(m)
    return out
