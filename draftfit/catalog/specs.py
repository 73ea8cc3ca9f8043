"""Stage 1 — catalog: model and GPU specs, and resolution of the loose names users type.

Facts come from `draftfit/catalogs/models.yaml` and `draftfit/catalogs/gpus.yaml` (architecture numbers copied from each
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
    tokenizer: str  # tokenizer family id, a key of draftfit/catalogs/tokenizers.yaml
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
                            fix="fix draftfit/catalogs/*.yaml")
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


# config.json fields that must be positive integers when present (the shapes every stage computes with).
_POSITIVE_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "intermediate_size", "vocab_size", "max_position_embeddings", "num_experts",
                        "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
                        "sliding_window")
_REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# torch dtypes a checkpoint's config.json names (transformers writes these; "auto" is vLLM's own word)
CONFIG_DTYPES = ("bfloat16", "float16", "float32", "float", "half")
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # real config.json files are a few kB; refuse to parse a weights file


def validate_config(config, where: str) -> dict:
    """The text model's config dict, checked once: an object, required shapes present, every size a positive
    integer (bool is not), head counts consistent. `where` names the file in the one-line error."""
    if not isinstance(config, dict):
        raise DraftfitError(f"{where} holds a JSON {type(config).__name__}, not an object",
                            fix="point at a Hugging Face model folder whose config.json is a JSON object")
    if config.get("text_config") is not None and not isinstance(config["text_config"], dict):
        raise DraftfitError(f"{where}: text_config is a JSON {type(config['text_config']).__name__}, not an object",
                            fix="fix text_config in config.json (the text model's settings, as an object)")
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    missing = [k for k in _REQUIRED_FIELDS if cfg.get(k) is None]
    if missing:
        raise DraftfitError(f"{where} lacks {', '.join(missing)}",
                            fix="a causal LM's config.json names hidden_size, num_hidden_layers, "
                                "num_attention_heads and vocab_size")
    for key in _POSITIVE_INT_FIELDS:
        v = cfg.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v > 2**40:
            if key == "sliding_window" and (v is False or v == 0):
                continue
            raise DraftfitError(f"{where}: {key} = {v!r} is not a positive integer",
                                fix=f"fix {key} in config.json (copy it from the model's published config)")
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if heads % kv:
        raise DraftfitError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                            fix="fix the head counts in config.json")
    for key in ("tie_word_embeddings",):
        if key in config and not isinstance(config[key], bool):
            raise DraftfitError(f"{where}: {key} = {config[key]!r} is not true/false", fix=f"fix {key} in config.json")
    for key in ("torch_dtype", "dtype", "model_type"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise DraftfitError(f"{where}: {key} = {config[key]!r} is not a string", fix=f"fix {key} in config.json")
    for key in ("torch_dtype", "dtype"):
        for scope in (config, cfg):
            v = scope.get(key)
            if isinstance(v, str) and v.replace("torch.", "") not in CONFIG_DTYPES:
                raise DraftfitError(f"{where}: {key} = {v!r} is not a model dtype",
                                    fix=f"set {key} to one of {', '.join(CONFIG_DTYPES[:4])} in config.json")
            if v is not None and not isinstance(v, str):
                raise DraftfitError(f"{where}: {key} = {v!r} is not a string", fix=f"fix {key} in config.json")
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise DraftfitError(f"{where}: architectures = {archs!r} is not a list of names",
                            fix='e.g. "architectures": ["LlamaForCausalLM"]')
    return config


def spec_from_config(config: dict, *, name: str, hub_id: str = "", local_path: str = "",
                     tokenizer: str = "") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json dict (text models; nested text_config honoured)."""
    config = validate_config(config, f"{local_path or hub_id or name}/config.json")
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


_SHAPE_FIELDS = ("architecture", "hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "vocab_size", "num_experts")


def catalog_match(spec: ModelSpec) -> ModelSpec | None:
    """The catalog entry a folder's config.json describes: same architecture and shapes. Several entries can
    share a shape (a base and an instruct model, 3.0 and 3.1): the one whose name is closest to the folder's
    name or hub id wins, then the one with the same context length."""
    shape = tuple(getattr(spec, f) for f in _SHAPE_FIELDS)
    hits = [m for m in load_models() if not m.is_eagle and tuple(getattr(m, f) for f in _SHAPE_FIELDS) == shape]
    if not hits:
        return None
    label = _normalize((spec.hub_id or spec.name).split("/")[-1])

    def closeness(m: ModelSpec) -> tuple:
        names = [m.name, *m.aliases, m.hub_id.split("/")[-1]]
        ratio = max(difflib.SequenceMatcher(None, label, _normalize(n)).ratio() for n in names)
        return (ratio, m.max_position_embeddings == spec.max_position_embeddings)

    return max(hits, key=closeness)


def spec_from_folder(path: Path, hub_id: str = "") -> ModelSpec:
    """A model folder: its config.json, checked; when it matches a catalog entry, that entry (its family,
    tokenizer family, heads and priors) with the folder as where the weights and tokenizer files are."""
    config_file = path / "config.json"
    if not config_file.is_file():
        what = "a folder named config.json" if config_file.is_dir() else "no config.json"
        raise DraftfitError(f"{path} has {what}", fix="point at a Hugging Face model folder (config.json inside)")
    try:
        if config_file.stat().st_size > MAX_CONFIG_BYTES:
            raise DraftfitError(f"{config_file} is {config_file.stat().st_size:,} bytes, not a config file",
                                fix="point at the folder's real config.json (a few kB of JSON)")
        config = json.loads(config_file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, DraftfitError):
            raise
        detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DraftfitError(f"{config_file} is not readable JSON ({detail})",
                            fix="restore the model's config.json (it must be a UTF-8 JSON object)") from None
    local = str(path.resolve())
    spec = spec_from_config(config, name=path.name if not hub_id else hub_id.split("/")[-1],
                            hub_id=hub_id, local_path=local, tokenizer=f"local:{local}")
    entry = catalog_match(spec)
    if entry is None:
        return spec
    import dataclasses

    return dataclasses.replace(entry, local_path=local, dtype=spec.dtype,
                               source=f"{local}/config.json (matches catalog entry {entry.name})")


def spec_from_tokenizer_folder(path: Path) -> ModelSpec:
    """A folder holding only tokenizer files (tokenizer.json, maybe tokenizer_config.json), no config.json: a
    spec that `check` can compare tokenizers for. Shapes and embedding rows are unknown (0)."""
    local = str(path.resolve())
    return ModelSpec(name=path.resolve().name, hub_id="", architecture="unknown", hidden_size=0, num_layers=0,
                     num_attention_heads=0, num_kv_heads=0, head_dim=0, intermediate_size=0, vocab_size=0,
                     max_position_embeddings=0, tie_word_embeddings=False, params_b=0.0, tokenizer=f"local:{local}",
                     local_path=local, source=f"{local}/tokenizer.json (no config.json)")


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
