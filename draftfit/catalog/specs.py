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
# Parameter counts live with the other shapes (catalog.shapes); re-exported for the callers that import them here.
from draftfit.catalog.shapes import (LINEAR_SHAPE_FIELDS, attention_layer_params, linear_layer_params,  # noqa: F401
                                     linear_layer_params_of, mla_attention_params, MLA_SHAPE_FIELDS)

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
    # The checkpoint's own weight format, a key of memory.plan.QUANT_BYTES_PER_PARAM ("" = the dtype): read from
    # config.json's quantization_config, so a local FP8 folder is sized as FP8 without any flag.
    quantization: str = ""
    # The checkpoint's quantization_config leaves the attention projections in the model dtype
    # (modules_to_not_convert / ignore naming self_attn: gpt-oss's mxfp4 converts only its experts).
    unquantized_attention: bool = False
    # EAGLE-3 heads: rows of the head's own lm_head (0: vocab_size), and the width of the target hidden states
    # its fc layer fuses (0: hidden_size; the EAGLE3-LLaMA3.3-70B head is narrower than its target).
    draft_vocab_size: int = 0
    target_hidden_size: int = 0
    # Targets that ship multi-token-prediction layers (DeepSeek-V3/R1): vLLM drafts with them (method mtp).
    num_nextn_predict_layers: int = 0
    # Multi-head latent attention (DeepSeek): the KV cache holds one compressed latent of kv_lora_rank +
    # qk_rope_head_dim values per token and layer, the same on every TP rank.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    # MLA's other shapes (catalog.shapes.mla_attention_params): the query's low rank (0: a full-rank q_proj, as
    # DeepSeek-V2-Lite), the non-rotary query/key width and the value width per head (0: head_dim).
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    # The always-active shared expert(s) of an MoE layer, as one MLP's intermediate size: Qwen2-MoE's
    # shared_expert_intermediate_size, DeepSeek's n_shared_experts x moe_intermediate_size; 0 when none.
    shared_expert_intermediate_size: int = 0
    # Layers of an MoE model whose MLP is dense (intermediate_size wide) instead of routed: DeepSeek-V3's and
    # GLM-4.5's first_k_dense_replace, Qwen2/3-MoE's mlp_only_layers and decoder_sparse_step (dense_mlp_layers_of).
    dense_mlp_layers: int = 0
    sliding_window: int = 0
    # RoPE buffers (vLLM keeps a cos/sin cache per distinct rope, loaded with the weights): linear and YaRN
    # scaling build it for max_position_embeddings x factor positions (rotary_embedding/linear_scaling_rope.py,
    # yarn_scaling_rope.py); Gemma-3's sliding layers use a second, unscaled rope (rope_local_base_freq).
    rope_scaling_factor: float = 0.0
    rope_local_base_freq: float = 0.0
    # Attention kind of each layer, compact: tokens of F (full) / S (sliding, window `sliding_window`) / L (linear
    # attention, below), each optionally repeated, e.g. "SF*21" (Gemma-2-9b), "SSSSSF*8" (Gemma-3-12b), "LLLF*12"
    # (Qwen3-Next), "F*20 S*8"; "" = all full.
    # Expanded by layer_kinds(), which mirrors how vLLM 0.26 gives each layer its window (see there).
    layer_types: str = ""
    # Gated-DeltaNet linear attention (Qwen3-Next, Qwen3.5; layer kind "L" in layer_types): such a layer keeps a
    # fixed recurrent state per sequence (a causal-conv window and a value x key matrix per value head) instead of
    # KV per token (vLLM: MambaSpec, model_executor/layers/mamba/mamba_utils.py gated_delta_net_state_shape).
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # The recurrent (temporal) state's dtype when the config names one (Qwen3.5's mamba_ssm_dtype float32; vLLM
    # 0.26 applies it, models/config.py Qwen3_5ForConditionalGenerationConfig); "" = the model dtype.
    linear_state_dtype: str = ""
    # Gated attention (Qwen3-Next/3.5 attn_output_gate): q_proj also emits a sigmoid gate, doubling its width.
    attn_output_gate: bool = False
    # Share of head_dim that RoPE rotates (partial_rotary_factor; Qwen3-Next 0.25): sizes the cos/sin cache.
    partial_rotary_factor: float = 0.0
    # Parameters vLLM loads beside the text model (a vision tower, Qwen3.5's), in billions; 0 for text models.
    vision_params_b: float = 0.0
    local_path: str = ""  # set when resolved from a folder on disk

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP routes to experts (all but dense_mlp_layers; 0 for a dense model)."""
        return max(self.num_layers - self.dense_mlp_layers, 0) if self.is_moe else 0

    @property
    def linear_attention_layers(self) -> int:
        """Layers of gated-DeltaNet linear attention (state per sequence, no KV per token)."""
        return sum(1 for k in layer_kinds(self) if k == LINEAR) if LINEAR in self.layer_types else 0

    @property
    def attention_layers(self) -> int:
        """Layers that keep KV per token (full or sliding attention): all but the linear-attention ones."""
        return self.num_layers - self.linear_attention_layers

    @property
    def is_eagle(self) -> bool:
        # MTP layers run through vLLM's EAGLE proposer and obey every head rule (only for the model they ship in,
        # the target's tokenizer and TP, no separate vocab check), so they count as heads here too.
        return self.method.startswith("eagle") or self.method == "mtp"

    @property
    def is_mtp(self) -> bool:
        return self.method == "mtp"

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


def _catalog_entries(path: Path, key: str, cls) -> tuple:
    """The entries under `key` of a catalog YAML file as `cls` instances; a file that is missing, not YAML or not
    a catalog (a broken DRAFTFIT_HOME) is one line naming it."""
    import yaml

    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_yaml_loader())
        return tuple(cls(**_tuple_fields(cls, m)) for m in data[key])
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        detail = " ".join(str(exc).split())[:100] or type(exc).__name__
        raise DraftfitError(f"the catalog {path} is not readable ({type(exc).__name__}: {detail})",
                            fix="restore it (reinstall draftfit), or unset DRAFTFIT_HOME if it points elsewhere") from None


@lru_cache(maxsize=None)
def load_models(catalog_dir: Path = CATALOG_DIR) -> tuple[ModelSpec, ...]:
    models = _catalog_entries(catalog_dir / "models.yaml", "models", ModelSpec)
    for m in models:
        if m.layer_types:
            layer_kinds(m)  # one layer kind per layer, or a one-line error naming the entry
    return models


@lru_cache(maxsize=None)
def load_gpus(catalog_dir: Path = CATALOG_DIR) -> tuple[GpuSpec, ...]:
    return _catalog_entries(catalog_dir / "gpus.yaml", "gpus", GpuSpec)


@lru_cache(maxsize=8)
def _index(items: tuple) -> dict[str, object]:
    """Normalized name -> entry. `items` is load_models()/load_gpus()'s cached tuple, so rank's 20-odd name
    resolutions build the index once."""
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


MAX_NAME_BYTES = 255  # one path component, on every Linux file system (NAME_MAX)


def is_folder(path: Path | str) -> bool:
    """Whether `path` is a folder; a name no file system can hold (a component over 255 bytes, a NUL) is one
    line naming it, where Path.is_dir raises OSError (ENAMETOOLONG) or ValueError."""
    text = str(path)
    for part in Path(text).parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > MAX_NAME_BYTES:
            raise DraftfitError(f"path component {part[:40]}... is {size} bytes; file systems hold at most "
                                f"{MAX_NAME_BYTES}", fix="shorten that folder name (or pass a catalog model name)")
    if "\0" in text:
        raise DraftfitError(f"path {text[:60]!r} holds a NUL byte", fix="pass the folder's real path")
    try:
        return Path(text).is_dir()
    except OSError as exc:
        raise DraftfitError(f"{text[:120]} cannot be read ({exc.strerror or exc})",
                            fix="check the path and its permissions") from None


def resolve_model(name: str, *, allow_hub: bool = True) -> ModelSpec:
    """Catalog name or alias, hub id, or a local folder with config.json; else UnknownModelError."""
    path = Path(name).expanduser()
    if is_folder(path):
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
    if norm.endswith("mtp") and len(name) > 4 and name[-4] in "-_ ":
        # "<target>-MTP": the target's own MTP layers (rank lists them under that name).
        base = resolve_model(name[:-4], allow_hub=False)
        mtp = mtp_drafter(base)
        if mtp is not None:
            return mtp
        raise UnknownModelError(f"{base.name} ships no MTP layers (num_nextn_predict_layers is 0)",
                                fix="pick a draft model or EAGLE head for it (`draftfit rank` lists them)")
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
                        "sliding_window", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                        "linear_value_head_dim", "linear_conv_kernel_dim", "mtp_num_hidden_layers")
# MoE layer-placement fields, non-negative integers when present (dense_mlp_layers_of reads them).
_MOE_PLACEMENT_FIELDS = ("first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step")
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
    for key in _MOE_PLACEMENT_FIELDS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 2**20):
            raise DraftfitError(f"{where}: {key} = {v!r} is not a non-negative integer",
                                fix=f"fix {key} in config.json (copy it from the model's published config)")
    only = cfg.get("mlp_only_layers")
    if only is not None and not (isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                and i >= 0 for i in only)):
        raise DraftfitError(f"{where}: mlp_only_layers = {only!r} is not a list of layer indices",
                            fix="fix mlp_only_layers in config.json, e.g. [] or [0, 1]")
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if heads % kv:
        raise DraftfitError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                            fix="fix the head counts in config.json")
    _validate_against_engines(cfg, where)
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


# What vLLM and transformers accept, checked before anything is sized (each bound far above any published model):
# layers (Llama-3.1-405B: 126), heads, widths, positions (Llama-4-Scout: 10M), vocabulary rows (Gemma: 262k).
_SANE_LIMITS = {"num_hidden_layers": 4096, "num_attention_heads": 4096, "num_key_value_heads": 4096,
                "head_dim": 4096, "hidden_size": 2**20, "intermediate_size": 2**22, "moe_intermediate_size": 2**22,
                "vocab_size": 2**24, "max_position_embeddings": 2**28, "num_experts": 2**14,
                "num_local_experts": 2**14, "n_routed_experts": 2**14, "num_experts_per_tok": 2**14,
                "sliding_window": 2**28}
# RoPE kinds vLLM 0.34 builds (model_executor/layers/rotary_embedding/__init__.py get_rope), plus transformers'
# older names it renames ("su" -> longrope, "mrope" -> default).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "longrope", "su",
              "llama3", "mllama4", "ntk", "mrope", "bailing_mrope", "proportional", "openpangu")
MAX_ROPE_FACTOR = 1024.0  # published factors are 2..64 (YaRN 4, Llama-3.1 8, Scout 16)


def _finite_number(v) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _validate_rope(cfg: dict, where: str) -> None:
    for key in ("rope_scaling", "rope_parameters"):
        block = cfg.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise DraftfitError(f"{where}: {key} = {str(block)[:60]!r} is not an object",
                                fix=f'write {key} as an object, e.g. {{"rope_type": "yarn", "factor": 4.0}}, or drop it')
        subs = [b for b in block.values() if isinstance(b, dict)] or [block]
        for b in subs:
            kind = b.get("rope_type", b.get("type", "default"))
            if not isinstance(kind, str) or kind not in ROPE_TYPES:
                raise DraftfitError(f"{where}: {key} type {str(kind)[:40]!r} is not a RoPE kind vLLM builds",
                                    fix=f"use one of {', '.join(ROPE_TYPES[:8])}, ...")
            for name in ("factor", "original_max_position_embeddings", "rope_theta", "beta_fast", "beta_slow"):
                v = b.get(name)
                if v is not None and not (_finite_number(v) and 0 < v <= (MAX_ROPE_FACTOR if name == "factor"
                                                                           else 2**40)):
                    raise DraftfitError(f"{where}: {key} {name} = {str(v)[:40]} is not a finite positive number"
                                        + (f" up to {MAX_ROPE_FACTOR:g}" if name == "factor" else ""),
                                        fix=f"fix {key}.{name} in config.json (copy it from the published config)")
            if kind in ("linear", "dynamic", "yarn", "llama3", "deepseek_yarn") and b.get("factor") is None:
                raise DraftfitError(f"{where}: {key} type {kind!r} has no factor",
                                    fix=f"add {key}.factor to config.json (e.g. 4.0), or drop {key}")


def _validate_against_engines(cfg: dict, where: str) -> None:
    """What vLLM and transformers refuse while building the model, refused here first with the field named."""
    for key, limit in _SANE_LIMITS.items():
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > limit:
            raise DraftfitError(f"{where}: {key} = {v:,} is beyond any model vLLM can build (at most {limit:,})",
                                fix=f"fix {key} in config.json (copy it from the model's published config)")
    for key in ("rope_theta", "rms_norm_eps", "layer_norm_eps", "partial_rotary_factor", "initializer_range"):
        v = cfg.get(key)
        if v is not None and not (_finite_number(v) and v > 0):
            raise DraftfitError(f"{where}: {key} = {str(v)[:40]} is not a finite positive number",
                                fix=f"fix {key} in config.json (copy it from the model's published config)")
    prf = cfg.get("partial_rotary_factor")
    if prf is not None and prf > 1:
        raise DraftfitError(f"{where}: partial_rotary_factor = {prf} is above 1 (vLLM: between 0.0 and 1.0)",
                            fix="fix partial_rotary_factor in config.json")
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg.get("head_dim") is None and not cfg.get("kv_lora_rank") and hidden % heads:
        raise DraftfitError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads} "
                            "(and no head_dim is given)", fix="fix hidden_size or the head count, or add head_dim")
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    topk = cfg.get("num_experts_per_tok")
    if isinstance(topk, int) and isinstance(experts, int) and topk and experts and topk > experts:
        raise DraftfitError(f"{where}: num_experts_per_tok {topk} is more than the {experts} experts (top-k of "
                            "experts must be at most their number)", fix="fix num_experts_per_tok in config.json")
    given = cfg.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or not all(isinstance(t, str) for t in given):
            raise DraftfitError(f"{where}: layer_types is not a list of layer kind names",
                                fix='write e.g. ["sliding_attention", "full_attention", ...], one per layer')
        if len(given) != cfg["num_hidden_layers"]:
            raise DraftfitError(f"{where}: layer_types names {len(given)} layers, num_hidden_layers is "
                                f"{cfg['num_hidden_layers']} (transformers refuses the mismatch)",
                                fix="give layer_types one entry per layer, or drop it")
    _validate_rope(cfg, where)


FULL, SLIDING, LINEAR = "F", "S", "L"
_LAYER_TOKEN = re.compile(r"^([FSL]+)(?:\*(\d+))?$")


def expand_layer_types(pattern: str) -> tuple[str, ...]:
    """"SF*2 S" -> ("S", "F", "S", "F", "S"); "" -> () (all full attention)."""
    out: list[str] = []
    for tok in (pattern or "").split():
        m = _LAYER_TOKEN.match(tok)
        if not m:
            raise DraftfitError(f"layer_types token {tok!r} is not F/S/L letters with an optional *N",
                                fix='write e.g. "SF*21", "SSSSSF*8 SS" or "LLLF*12"')
        out += list(m.group(1)) * int(m.group(2) or 1)
    return tuple(out)


def compact_layer_types(kinds) -> str:
    """The shortest-period form of a per-layer kind list: ("S","F")*21 -> "SF*21"; all full -> ""."""
    kinds = list(kinds)
    if not kinds or all(k == FULL for k in kinds):
        return ""
    n = len(kinds)
    for period in range(1, n + 1):
        reps, rest = divmod(n, period)
        unit = kinds[:period]
        if unit * reps + unit[:rest] == kinds:
            body = "".join(unit) + (f"*{reps}" if reps > 1 else "")
            return body + (" " + "".join(unit[:rest]) if rest else "")
    return "".join(kinds)


def layer_kinds(spec) -> tuple[str, ...]:
    """F/S/L per layer. Sliding layers need spec.sliding_window (without one they are full attention); linear
    (gated-DeltaNet) layers need the linear_* shapes; "" means every layer is full attention."""
    if not spec.layer_types or not (spec.sliding_window or LINEAR in spec.layer_types):
        return (FULL,) * spec.num_layers
    kinds = expand_layer_types(spec.layer_types)
    if len(kinds) != spec.num_layers:
        raise DraftfitError(f"{spec.name}: layer_types {spec.layer_types!r} names {len(kinds)} layers, the model "
                            f"has {spec.num_layers}", fix="fix layer_types in draftfit/catalogs/models.yaml")
    if LINEAR in kinds and not (spec.linear_num_value_heads and spec.linear_num_key_heads
                                and spec.linear_key_head_dim and spec.linear_value_head_dim
                                and spec.linear_conv_kernel_dim):
        raise DraftfitError(f"{spec.name}: linear-attention layers without their shapes",
                            fix="set linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, "
                                "linear_value_head_dim and linear_conv_kernel_dim (config.json's linear_* fields)")
    if not spec.sliding_window:
        kinds = tuple(FULL if k == SLIDING else k for k in kinds)
    return kinds


# Architectures whose vLLM attention takes the model-level window for every layer (cache_config.sliding_window),
# ignoring layer_types: model_executor/models/qwen2.py builds Attention without per_layer_sliding_window.
_MODEL_LEVEL_WINDOW_ARCHS = ("Qwen2ForCausalLM",)


def layer_types_from_config(config: dict, cfg: dict, layers: int) -> tuple[int, str]:
    """(sliding_window, layer_types) as vLLM 0.26 applies them to a config.json:
    - `use_sliding_window: false` (Qwen2/Qwen3) turns the window off (transformers sets it to None);
    - `layer_types` ("sliding_attention" / "full_attention") sets each layer (models/gemma2.py, gemma3.py,
      llama.py: per_layer_sliding_window only for "sliding_attention");
    - absent, transformers derives it: Gemma-2 alternates from a sliding layer 0 (Gemma2Config), Gemma-3 has
      `sliding_window_pattern` - 1 sliding layers per full one (default 6, Gemma3TextConfig), Qwen2/Qwen3 slide
      from `max_window_layers` on;
    - otherwise a window applies to every layer (layers/attention/attention.py falls back to
      cache_config.sliding_window), e.g. Mistral-7B-v0.1."""
    linear = _linear_kinds(cfg, layers)
    if linear:
        return 0, compact_layer_types(linear)
    window = cfg.get("sliding_window") or 0
    if cfg.get("use_sliding_window") is False or not isinstance(window, int) or isinstance(window, bool):
        return 0, ""
    if not window or layers <= 0:
        return 0, ""
    archs = config.get("architectures") or []
    model_type = str(cfg.get("model_type") or config.get("model_type") or "")
    given = cfg.get("layer_types")
    if any(a in _MODEL_LEVEL_WINDOW_ARCHS for a in archs):
        kinds = [SLIDING] * layers
    elif isinstance(given, list) and len(given) == layers:
        kinds = [SLIDING if t == "sliding_attention" else FULL for t in given]
    elif model_type.startswith("gemma2"):
        kinds = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    elif model_type.startswith("gemma3"):
        period = cfg.get("sliding_window_pattern") or config.get("sliding_window_pattern") or 6
        period = period if isinstance(period, int) and not isinstance(period, bool) and period > 0 else 6
        kinds = [SLIDING if (i + 1) % period else FULL for i in range(layers)]
    elif cfg.get("use_sliding_window") and isinstance(cfg.get("max_window_layers"), int):
        kinds = [SLIDING if i >= cfg["max_window_layers"] else FULL for i in range(layers)]
    else:
        kinds = [SLIDING] * layers
    pattern = compact_layer_types(kinds)
    return (window if pattern else 0), pattern


def _linear_kinds(cfg: dict, layers: int) -> list:
    """F/L per layer of a gated-DeltaNet hybrid (a config with linear_num_value_heads: Qwen3-Next, Qwen3.5), [] for
    any other config. `layer_types` ("linear_attention" / "full_attention") when given; else vLLM 0.26's
    Qwen3NextConfig default (transformers_utils/configs/qwen3_next.py): layer i is linear unless (i + 1) % 4 == 0,
    a literal 4 there, whatever full_attention_interval says."""
    if not cfg.get("linear_num_value_heads") or layers <= 0:
        return []
    given = cfg.get("layer_types")
    if isinstance(given, list) and len(given) == layers:
        return [LINEAR if t == "linear_attention" else FULL for t in given]
    return [LINEAR if (i + 1) % 4 else FULL for i in range(layers)]


# quantization_config.quant_method values vLLM loads -> the weight format memory.plan.QUANT_BYTES_PER_PARAM sizes.
_QUANT_METHODS = {"fp8": "fp8", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8", "awq": "awq", "awq_marlin": "awq",
                  "gptq": "gptq", "gptq_marlin": "gptq", "compressed-tensors": "", "compressed_tensors": "",
                  "bitsandbytes": "bitsandbytes", "mxfp4": "mxfp4", "modelopt": "fp8", "experts_int8": "int8"}


def quantization_of(config: dict, where: str = "config.json") -> str:
    """The weight format a config.json's quantization_config names ("" when there is none), with the details
    that change its size: FP8 block scales (DeepSeek's weight_block_size), GPTQ bits, the compressed-tensors
    scheme (8-bit float = fp8, 8-bit int = int8, 4-bit int = w4a16), bitsandbytes 4 or 8 bit."""
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("text_config"), dict):
        qc = config["text_config"].get("quantization_config")
    if qc is None:
        return ""
    if not isinstance(qc, dict):
        raise DraftfitError(f"{where}: quantization_config is a JSON {type(qc).__name__}, not an object",
                            fix="fix quantization_config in config.json (copy it from the published checkpoint)")
    method = str(qc.get("quant_method") or "").lower()
    if method not in _QUANT_METHODS:
        raise DraftfitError(f"{where}: quantization_config.quant_method {method or None!r} is not one draftfit sizes",
                            fix="use a checkpoint in " + ", ".join(sorted(m for m in _QUANT_METHODS if m)))
    fmt = _QUANT_METHODS[method]
    bits = qc.get("bits") if isinstance(qc.get("bits"), int) else None
    if method == "fp8" and qc.get("weight_block_size"):
        return "fp8-block"
    if fmt == "gptq" and bits == 8:
        return "gptq-8bit"
    if method == "bitsandbytes":
        return "bitsandbytes-8bit" if qc.get("load_in_8bit") else "bitsandbytes"
    if method == "modelopt" and "fp8" not in str(qc.get("quant_algo", "fp8")).lower():
        raise DraftfitError(f"{where}: modelopt quant_algo {qc.get('quant_algo')!r} is not one draftfit sizes",
                            fix="use an FP8 modelopt checkpoint, or one in fp8, awq, gptq or compressed-tensors")
    if fmt == "":  # compressed-tensors: the first scheme's weights say what the linear layers hold
        groups = qc.get("config_groups") if isinstance(qc.get("config_groups"), dict) else {}
        weights = next((g.get("weights") for g in groups.values() if isinstance(g, dict)
                        and isinstance(g.get("weights"), dict)), None)
        if weights is None:
            raise DraftfitError(f"{where}: compressed-tensors quantization_config has no config_groups weights",
                                fix="copy quantization_config from the published checkpoint")
        nbits, kind = weights.get("num_bits"), str(weights.get("type", "int"))
        if nbits == 8:
            return "fp8" if kind == "float" else "int8"
        if nbits == 4:
            return "w4a16" if kind == "int" else "mxfp4"
        raise DraftfitError(f"{where}: compressed-tensors weights of {nbits!r} bits are not a size draftfit knows",
                            fix="use an 8-bit or 4-bit compressed-tensors checkpoint")
    return fmt


def dense_mlp_layers_of(cfg: dict, layers: int, experts: int) -> int:
    """How many of an MoE config's layers keep a dense MLP, by the rule each architecture's vLLM model applies:
    DeepSeek-V2/V3, GLM-4.5, Kimi-K2 route layer i when i >= first_k_dense_replace and i % moe_layer_freq == 0
    (deepseek_v2.py); Qwen2/3-MoE when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    (qwen2_moe.py, qwen3_moe.py); Llama-4 when (i + 1) % interleave_moe_layer_step == 0 (llama4.py)."""
    if not experts or layers <= 0:
        return 0
    first_k = cfg.get("first_k_dense_replace") or 0
    freq = cfg.get("moe_layer_freq") or 1
    step = cfg.get("decoder_sparse_step") or 1
    interleave = cfg.get("interleave_moe_layer_step") or 1
    only = set(cfg.get("mlp_only_layers") or [])
    routed = sum(1 for i in range(layers) if i >= first_k and i % freq == 0 and i not in only
                 and (i + 1) % step == 0 and (i + 1) % interleave == 0)
    return layers - routed


def attention_left_unquantized(config: dict) -> bool:
    """Whether quantization_config keeps the attention projections out of the quantized format: vLLM skips the
    modules named in modules_to_not_convert (mxfp4, awq, bitsandbytes, modelopt's exclude_modules) or compressed-tensors'
    `ignore` (names or `re:` patterns), matched here on the module path's "self_attn" part."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return False
    names = []
    for key in ("modules_to_not_convert", "ignore", "exclude_modules"):
        v = qc.get(key)
        if isinstance(v, list):
            names += [x for x in v if isinstance(x, str)]
    return any("self_attn" in n or n.rstrip("*.").endswith(("attn", "attention")) for n in names)


def spec_from_config(config: dict, *, name: str, hub_id: str = "", local_path: str = "",
                     tokenizer: str = "") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json dict (text models; nested text_config honoured; a
    speculators-format EAGLE-3 head read the way vLLM reads it, see _flatten_speculators)."""
    config, verifier = _flatten_speculators(config)
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
    # Mixtral-style configs have no moe_intermediate_size: each expert is intermediate_size wide.
    moe_inter = (cfg.get("moe_intermediate_size") or inter) if experts else 0
    shared_inter = _shared_expert_intermediate_size(cfg, moe_inter) if experts else 0
    dense_layers = dense_mlp_layers_of(cfg, layers, experts)
    archs = config.get("architectures") or ["unknown"]
    window, layer_pattern = layer_types_from_config(config, cfg, layers)
    linear_layers = expand_layer_types(layer_pattern).count(LINEAR) if LINEAR in layer_pattern else 0
    lin = {k: _pos_int(cfg.get(k)) for k in LINEAR_SHAPE_FIELDS}
    # vLLM's Qwen3NextAttention: getattr(config, "attn_output_gate", True); other architectures have no gate.
    gate = cfg.get("attn_output_gate", True if linear_layers else False) is True
    # Parameter count from the shapes: attention (q_proj twice as wide with an output gate), gated-DeltaNet layers
    # (linear_layer_params), MLP (or experts), norms, embeddings.
    attn = attention_layer_params(hidden, heads, kv_heads, head_dim, gate)
    if _pos_int(cfg.get("kv_lora_rank")):  # multi-head latent attention (DeepSeek-V2/V3): its own projections
        attn = mla_attention_params({"hidden_size": hidden, "num_attention_heads": heads, "head_dim": head_dim,
                                     **{k: _pos_int(cfg.get(k)) for k in MLA_SHAPE_FIELDS}})
    mlp = 3 * hidden * (moe_inter or inter) * (experts or 1) + (hidden * experts if experts else 0) \
        + 3 * hidden * shared_inter
    params = (layers - linear_layers) * attn + linear_layers * linear_layer_params(hidden, **lin) \
        + layers * 2 * hidden + (layers - dense_layers) * mlp + dense_layers * 3 * hidden * inter \
        + vocab * hidden * (1 if tie else 2) + hidden
    vision = _vision_params(config.get("vision_config")) if config.get("text_config") else 0
    dtype = str(config.get("torch_dtype") or config.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype")
                or "bfloat16")
    mtp_layers = _pos_int(cfg.get("num_nextn_predict_layers")) or _pos_int(cfg.get("mtp_num_hidden_layers"))
    if not mtp_layers and str(cfg.get("model_type") or config.get("model_type")) == "qwen3_next":
        mtp_layers = 1  # vLLM's qwen3_next_mtp.py: getattr(config, "num_nextn_predict_layers", 1)
    ssm_dtype = cfg.get("mamba_ssm_dtype")
    return ModelSpec(
        name=name, hub_id=hub_id, architecture=archs[0], hidden_size=hidden, num_layers=layers,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inter,
        vocab_size=vocab, max_position_embeddings=cfg.get("max_position_embeddings") or 0,
        tie_word_embeddings=tie, params_b=round(params / 1e9, 3), tokenizer=tokenizer,
        family=str(config.get("model_type", "")), dtype=dtype.replace("torch.", ""),
        num_experts=experts, num_experts_per_tok=cfg.get("num_experts_per_tok") or 0,
        moe_intermediate_size=moe_inter, shared_expert_intermediate_size=shared_inter, dense_mlp_layers=dense_layers,
        sliding_window=window, layer_types=layer_pattern,
        rope_scaling_factor=_rope_cache_factor(cfg), rope_local_base_freq=_pos_float(cfg.get("rope_local_base_freq")),
        local_path=local_path, source=f"{local_path or hub_id}/config.json",
        quantization=quantization_of(config, f"{local_path or hub_id or name}/config.json"),
        unquantized_attention=attention_left_unquantized(config),
        draft_vocab_size=_pos_int(cfg.get("draft_vocab_size")), target_hidden_size=_pos_int(cfg.get("target_hidden_size")),
        num_nextn_predict_layers=mtp_layers, **lin, attn_output_gate=gate,
        linear_state_dtype=ssm_dtype if isinstance(ssm_dtype, str) and linear_layers else "",
        partial_rotary_factor=_partial_rotary(cfg), vision_params_b=round(vision / 1e9, 3),
        kv_lora_rank=_pos_int(cfg.get("kv_lora_rank")), qk_rope_head_dim=_pos_int(cfg.get("qk_rope_head_dim")),
        q_lora_rank=_pos_int(cfg.get("q_lora_rank")), qk_nope_head_dim=_pos_int(cfg.get("qk_nope_head_dim")),
        v_head_dim=_pos_int(cfg.get("v_head_dim")),
        method="eagle3" if "eagle3" in archs[0].lower() else "draft_model",
        draft_for=(verifier,) if verifier else (),
    )


# speculators_model_type -> the architecture vLLM gives the head, by the inner model_type
# (vllm/transformers_utils/configs/speculators/algos.py update_eagle3, 0.26 and 0.33).
_SPECULATORS_EAGLE3_ARCHS = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}


def _flatten_speculators(config):
    """A vllm-project/speculators config.json (RedHatAI's *-speculator.eagle3 heads) as the flat config vLLM builds
    from it: the shapes are `transformer_layer_config`, draft_vocab_size and target_hidden_size sit beside it, the
    architecture follows the inner model_type. Returns (config, the catalog name of
    speculators_config.verifier.name_or_path or ""). Anything else passes through unchanged."""
    if not isinstance(config, dict) or config.get("speculators_model_type") != "eagle3" \
            or not isinstance(config.get("transformer_layer_config"), dict):
        return config, ""
    inner = config["transformer_layer_config"]
    flat = dict(inner)
    for key in ("draft_vocab_size", "target_hidden_size"):
        if config.get(key) is not None:
            flat[key] = config[key]
    for key in ("torch_dtype", "dtype", "tie_word_embeddings"):
        if key in config and key not in flat:
            flat[key] = config[key]
    flat["architectures"] = [_SPECULATORS_EAGLE3_ARCHS.get(str(inner.get("model_type", "llama")),
                                                           "Eagle3LlamaForCausalLM")]
    verifier = (config.get("speculators_config") or {}).get("verifier") if isinstance(
        config.get("speculators_config"), dict) else None
    target = ""
    if isinstance(verifier, dict) and isinstance(verifier.get("name_or_path"), str):
        try:
            target = resolve_model(verifier["name_or_path"], allow_hub=False).name
        except DraftfitError:
            target = ""
    return flat, target


def _vision_params(vc) -> int:
    """A Qwen3-VL-style vision tower's parameters from vision_config (Qwen3.5: depth blocks of attention + MLP,
    a patch embedding and the merger to the text width); 0 when there is none or its shapes are missing."""
    if not isinstance(vc, dict):
        return 0
    d, h, inter = _pos_int(vc.get("depth")), _pos_int(vc.get("hidden_size")), _pos_int(vc.get("intermediate_size"))
    if not (d and h and inter):
        return 0
    patch = 3 * (_pos_int(vc.get("temporal_patch_size")) or 2) * (_pos_int(vc.get("patch_size")) or 16) ** 2 * h
    merge = (_pos_int(vc.get("spatial_merge_size")) or 2) ** 2 * h
    out = _pos_int(vc.get("out_hidden_size")) or h
    block = 4 * h * h + 2 * h * inter + 9 * h + 2 * inter  # qkv + proj, fc1 + fc2, their biases and two norms
    pos = (_pos_int(vc.get("num_position_embeddings")) or 0) * h
    return d * block + patch + pos + merge * merge + merge * out


def _partial_rotary(cfg: dict) -> float:
    """partial_rotary_factor at the top level or in rope_parameters (transformers 5.x), 0 when absent."""
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    v = cfg.get("partial_rotary_factor", rp.get("partial_rotary_factor"))
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 else 0.0


def _pos_float(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0.0


def _rope_cache_factor(cfg: dict) -> float:
    """How many times max_position_embeddings vLLM's cos/sin cache spans: the factor of a linear or YaRN
    rope_scaling (transformers' older key) or rope_parameters (5.x; per layer type for Gemma-3), else 0."""
    found = 0.0
    for key in ("rope_scaling", "rope_parameters"):
        block = cfg.get(key)
        if not isinstance(block, dict):
            continue
        subs = [b for b in block.values() if isinstance(b, dict)] or [block]
        for b in subs:
            kind = str(b.get("rope_type") or b.get("type") or "")
            if kind in ("linear", "yarn"):
                found = max(found, _pos_float(b.get("factor")))
    return found if found > 1 else 0.0


def _pos_int(v) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _shared_expert_intermediate_size(cfg: dict, moe_inter: int) -> int:
    """The shared experts of an MoE config.json as one MLP width: Qwen2-MoE names it, DeepSeek counts
    n_shared_experts of moe_intermediate_size each."""
    named = cfg.get("shared_expert_intermediate_size")
    if isinstance(named, int) and not isinstance(named, bool) and named > 0:
        return named
    n = cfg.get("n_shared_experts")
    return n * moe_inter if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


_SHAPE_FIELDS = ("architecture", "hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "vocab_size", "num_experts")


@lru_cache(maxsize=1)
def _tokenizer_markers() -> dict[str, tuple]:
    """Each tokenizer family's (bos, eos, eos_id) from draftfit/catalogs/tokenizers.yaml: what tells apart two
    catalog models that share every shape (Llama-3.1-8B and DeepSeek-R1-Distill-Llama-8B)."""
    import yaml

    data = yaml.load((CATALOG_DIR / "tokenizers.yaml").read_text(), Loader=_yaml_loader()) or {}
    return {k: (v.get("bos"), v.get("eos"), v.get("eos_id")) for k, v in (data.get("tokenizers") or {}).items()
            if isinstance(v, dict)}


def _folder_markers(folder: str, config: dict) -> tuple[set[str], set[int]]:
    """The special tokens a folder's tokenizer_config.json names and the eos ids its config.json names."""
    names: set[str] = set()
    try:
        tok = json.loads((Path(folder) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        tok = {}
    for key in ("bos_token", "eos_token") if isinstance(tok, dict) else ():
        v = tok.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            names.add(v)
    eos = config.get("eos_token_id")
    ids = {i for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int) and not isinstance(i, bool)}
    return names, ids


def catalog_match(spec: ModelSpec, config: dict | None = None) -> tuple[ModelSpec | None, str]:
    """The catalog entry a config.json describes (same architecture and shapes) and why it was chosen. Several
    entries can share a shape (a base model and its distill, 3.0 and 3.1). Never the folder's name (the same files
    in `final` or `main` are the same model): a hub id the caller resolved, else the same context length, then the
    folder's tokenizer specials (tokenizer_config.json bos/eos) and config.json eos ids against each entry's
    tokenizer family, then catalog order."""
    shape = tuple(getattr(spec, f) for f in _SHAPE_FIELDS)
    hits = [m for m in load_models() if m.is_eagle == spec.is_eagle
            and tuple(getattr(m, f) for f in _SHAPE_FIELDS) == shape]
    if not hits:
        return None, ""
    if len(hits) == 1:
        return hits[0], ""
    hub = _normalize(spec.hub_id.split("/")[-1]) if spec.hub_id else ""
    names, ids = _folder_markers(spec.local_path, config or {}) if spec.local_path else (set(), set())
    markers = _tokenizer_markers()

    def score(i: int) -> tuple:
        m = hits[i]
        bos, eos, eos_id = markers.get(m.tokenizer, (None, None, None))
        hub_hit = bool(hub) and hub in {_normalize(n.split("/")[-1]) for n in (m.name, *m.aliases, m.hub_id)}
        return (hub_hit, m.max_position_embeddings == spec.max_position_embeddings,
                len({bos, eos} & names), eos_id in ids, -i)

    best = max(range(len(hits)), key=score)
    others = ", ".join(m.name for i, m in enumerate(hits) if i != best)
    top = score(best)
    tied = [i for i in range(len(hits)) if score(i)[:-1] == top[:-1]]
    why = ("the hub id" if top[0] else "its tokenizer's special tokens" if len(tied) == 1 and top[2]
           else "its eos token id" if len(tied) == 1 and top[3] else "its context length" if len(tied) == 1
           else "catalog order: neither config.json nor the tokenizer files tell them apart")
    return hits[best], f"shapes shared with {others}; chose {hits[best].name} by {why}"


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
    entry, why = catalog_match(spec, config)
    if entry is None:
        return spec
    import dataclasses

    # The folder's own quantization_config wins: an FP8 copy of a bf16 catalog model is sized as FP8; so does its
    # MoE layer placement (the checkpoint's config.json is what vLLM builds).
    return dataclasses.replace(entry, local_path=local, dtype=spec.dtype, quantization=spec.quantization,
                               unquantized_attention=spec.unquantized_attention,
                               dense_mlp_layers=spec.dense_mlp_layers if entry.is_moe else entry.dense_mlp_layers,
                               # Its context and layer kinds too: a fine-tune cut to 2048 positions or given sliding
                               # layers is what vLLM builds, whatever the catalog entry it shares shapes with says.
                               max_position_embeddings=spec.max_position_embeddings,
                               sliding_window=spec.sliding_window, layer_types=spec.layer_types,
                               rope_scaling_factor=spec.rope_scaling_factor,
                               source=f"{local}/config.json (matches catalog entry {entry.name}"
                                      + (f"; {why})" if why else ")"))


def spec_from_tokenizer_folder(path: Path) -> ModelSpec:
    """A folder holding only tokenizer files (tokenizer.json, maybe tokenizer_config.json), no config.json: a
    spec that `check` can compare tokenizers for. Shapes and embedding rows are unknown (0)."""
    local = str(path.resolve())
    return ModelSpec(name=path.resolve().name, hub_id="", architecture="unknown", hidden_size=0, num_layers=0,
                     num_attention_heads=0, num_kv_heads=0, head_dim=0, intermediate_size=0, vocab_size=0,
                     max_position_embeddings=0, tie_word_embeddings=False, params_b=0.0, tokenizer=f"local:{local}",
                     local_path=local, source=f"{local}/tokenizer.json (no config.json)")


def mtp_drafter(target: ModelSpec) -> ModelSpec | None:
    """The drafter made of `target`'s own multi-token-prediction layers (vLLM method mtp: no extra model, the
    weights are in the target's checkpoint), or None when it ships none. params_b counts what vLLM adds for
    them: num_nextn_predict_layers decoder layers (an MLA target's mean layer: its params over its layers,
    the routed experts dominate) and eh_proj (2 x hidden -> hidden); embedding and lm_head are the target's."""
    n = target.num_nextn_predict_layers
    if n <= 0:
        return None
    import dataclasses

    h = target.hidden_size
    inter = target.moe_intermediate_size or target.intermediate_size
    # One of the target's MoE decoder layers (MLA's projections for DeepSeek-V3: catalog.shapes); the MoE MLP has its
    # shared expert and router beside the routed experts.
    attn = mla_attention_params(target) if target.kv_lora_rank else attention_layer_params(
        h, target.num_attention_heads, target.num_kv_heads, target.head_dim, target.attn_output_gate)
    layer = attn + 3 * h * inter * (target.num_experts or 1) \
        + (3 * h * target.shared_expert_intermediate_size + h * target.num_experts if target.num_experts else 0)
    return dataclasses.replace(
        target, name=f"{target.name}-MTP", aliases=(), method="mtp", draft_for=(target.name,), num_layers=n,
        params_b=round(n * (layer + 2 * h * h) / 1e9, 3), family="mtp", num_nextn_predict_layers=0,
        dense_mlp_layers=0,  # an MTP layer routes like the target's MoE layers (DeepSeek-V3's, GLM-4.5's)
        # Qwen3-Next/3.5 MTP layers are full-attention decoder layers (qwen3_next_mtp.py, qwen3_5_mtp.py), whatever
        # the target's layer pattern; no vision tower.
        layer_types="", vision_params_b=0.0,
        source=f"{target.source}#num_nextn_predict_layers={n} (the target's own MTP layers)")


def draft_candidates(target: ModelSpec) -> list[ModelSpec]:
    """Catalog models that could draft for `target`: smaller dense models, EAGLE heads made for it, and its own
    MTP layers when it ships them."""
    mtp = mtp_drafter(target)
    out = [mtp] if mtp is not None else []
    for m in load_models():
        if m.name == target.name:
            continue
        if m.is_eagle:
            if target.name in m.draft_for:
                out.append(m)
        elif m.params_b < target.params_b * 0.5:
            out.append(m)
    return out


# Drafters that are a method, not a model: vLLM proposes from the context itself (no weights, no KV cache).
# ngram: prompt lookup (vllm/v1/spec_decode/ngram_proposer.py); suffix: suffix decoding through the
# arctic-inference package (config/speculative.py _validate_suffix_decoding).
NO_MODEL_METHODS = ("ngram", "suffix")


def method_drafter(method: str, target: ModelSpec) -> ModelSpec:
    """A ModelSpec standing for a model-free drafter of `target`: zero shapes (nothing to load or cache), the
    target's vocabulary and tokenizer (it proposes the target's own tokens)."""
    if method not in NO_MODEL_METHODS:
        raise DraftfitError(f"unknown drafting method {method!r}", fix=f"use one of {', '.join(NO_MODEL_METHODS)}")
    return ModelSpec(name=method, hub_id="", architecture="none", hidden_size=0, num_layers=0,
                     num_attention_heads=0, num_kv_heads=0, head_dim=0, intermediate_size=0,
                     vocab_size=target.vocab_size, max_position_embeddings=target.max_position_embeddings,
                     tie_word_embeddings=False, params_b=0.0, tokenizer=target.tokenizer, family=method,
                     dtype=target.dtype, method=method, source="vLLM speculative method (no model)")
