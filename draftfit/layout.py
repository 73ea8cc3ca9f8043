"""The user's question, validated once at the boundary.

`build_layout()` turns the options of any command into a `Layout`: the target resolved once (catalog name,
alias, hub id or local folder matched to its catalog entry), the GPU, TP, gpu_memory_utilization, context
length, K, batch sizes, workload, temperature, dtypes, quantization and vLLM version, each checked against
its real range. Every later stage receives the Layout and trusts it; none re-parses a name or re-checks a
range. A bad value is one DraftfitError naming the option, what is allowed and the fix (exit 2).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from draftfit.catalog.specs import GpuSpec, ModelSpec, resolve_gpu, resolve_model, spec_from_folder
from draftfit.errors import DraftfitError
from draftfit.memory.plan import plan_memory
from draftfit.rules import K_MAX, TP_CHOICES, WORKLOADS
from draftfit.speedup.stepcost import untuned_moe_note
from draftfit.engine import EngineTarget, check_version, resolve_target
from draftfit.engine.rules import VllmRules

DEFAULT_GPU = "H100-80GB"
MAX_BATCH = 16384  # far above any max_num_seqs vLLM defaults to (1024 on the largest GPUs)
MIN_CONTEXT = 256  # below this no chat or code request fits; vLLM itself accepts less, nobody serves it
MAX_TEMPERATURE = 2.0  # the OpenAI-compatible API's range
DTYPES = ("auto", "bfloat16", "float16", "float32")
# --quantization: "auto" (the default) and "none" keep the checkpoint's own weights (its quantization_config, if
# any); fp8 and bitsandbytes are quantized by vLLM while loading a bf16 checkpoint; awq, gptq and mxfp4 size a
# checkpoint published in that format. Each is a key of memory.plan.QUANT_BYTES_PER_PARAM.
QUANTIZATIONS = ("auto", "none", "fp8", "awq", "gptq", "bitsandbytes", "mxfp4")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class Layout:
    """One validated question. Built by build_layout(); fields documented where declared."""

    target: ModelSpec  # resolved once; a local folder that matches a catalog entry is that entry
    gpu: GpuSpec | None  # None: no GPU given where none is needed (serve-cmd without --gpu)
    tp: int  # tensor-parallel size of target and draft (vLLM's draft_model needs equal TP)
    # gpu_memory_utilization in (0, 1]; None: not given, so vLLM's own default for the version (the plan resolves
    # it through VllmRules.resolved_util, and the serve command leaves the flag out, as the user would).
    util: float | None
    max_model_len: int  # the context every memory figure assumes
    batches: tuple[int, ...]  # batch sizes the speedup is predicted at, sorted, distinct
    workload: str  # one of rules.WORKLOADS: which prompt set / prior feature
    temperature: float  # sampling temperature, 0 (greedy) to 2
    k: int | None = None  # a fixed K (num_speculative_tokens), or None to let draftfit choose per batch
    dtype: str = "auto"
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    notes: tuple[str, ...] = field(default_factory=tuple)  # what draftfit chose for the user and why
    context_given: bool = False  # the user passed --max-model-len
    tp_given: bool = False
    max_num_seqs: int | None = None  # None: vLLM's default for the GPU; set when draftfit had to lower it to fit
    # The engine resolved once (engine.resolve_target): the vLLM the numbers are for (given, else an installed GPU
    # vLLM, else the newest modelled), the modelled version standing for it, why, and that version's VllmRules
    # (memory accounting, step-cost tables, start-up rules, serve flags). The one source of the version.
    engine: EngineTarget = field(default_factory=resolve_target)

    @property
    def planned_util(self) -> float:
        """The gpu_memory_utilization the memory was planned at (the version's default when --util was not given)."""
        return self.engine.rules.resolved_util(self.util)

    def to_dict(self) -> dict:
        return {"target": self.target.name, "target_hub_id": self.target.hub_id, "target_path": self.target.local_path,
                "gpu": self.gpu.name if self.gpu else None, "tp": self.tp, "util": self.planned_util,
                "util_given": self.util is not None,
                "max_model_len": self.max_model_len, "batches": list(self.batches), "workload": self.workload,
                "temperature": self.temperature, "k": self.k, "dtype": self.dtype, "quantization": self.quantization,
                "kv_cache_dtype": self.kv_cache_dtype, "max_num_seqs": self.max_num_seqs,
                # the version keys every --json has carried, read from the one EngineTarget
                "vllm_version": self.engine.version, "vllm_version_given": self.engine.requested,
                "vllm_modelled": self.engine.modelled,
                "notes": list(self.notes)}


# ----------------------------------------------------------------------------------------- validators

def _finite(value, option: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise DraftfitError(f"{option} {value!r} is not a number", fix=f"pass {option} as a number") from None
    if math.isnan(v) or math.isinf(v):
        raise DraftfitError(f"{option} {value!r} is not a finite number", fix=f"pass {option} as a finite number")
    return v


def check_util(util) -> float | None:
    """--util in (0, 1]; None (not given: vLLM's own default for the version, VllmRules.resolved_util) passes."""
    if util is None:
        return None
    v = _finite(util, "--util")
    if not 0.0 < v <= 1.0:
        raise DraftfitError(f"--util {util} is outside (0, 1]: it is the share of GPU memory vLLM may use",
                            fix="pass --util between 0.5 and 0.95, or leave it out for vLLM's own default")
    return v


def check_temperature(temperature) -> float:
    v = _finite(temperature, "--temperature")
    if not 0.0 <= v <= MAX_TEMPERATURE:
        raise DraftfitError(f"--temperature {temperature} is outside 0..{MAX_TEMPERATURE:g}",
                            fix="pass --temperature 0 (greedy) up to 2")
    return v


def check_k(k, option: str = "--k", k_max: int = K_MAX) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise DraftfitError(f"{option} {k!r} is not an integer", fix=f"pass {option} 1..{k_max}")
    if not 1 <= k <= k_max:
        raise DraftfitError(f"{option} {k} is outside 1..{k_max} (draftfit predicts and measures K up to {k_max})",
                            fix=f"pass {option} between 1 and {k_max}")
    return k


def check_k_list(text: str, option: str = "--k", example: str = "1,2,4", k_max: int = K_MAX) -> list[int]:
    """A K list ('2,4', '1..8'), each in 1..k_max; a range past the bound is named as typed ('--k 1..1000 reaches
    1000'), not by its first value outside."""
    ks = list(parse_int_list(text, option, example))
    bad = [k for k in ks if not 1 <= k <= k_max]
    if bad and (".." in str(text) or len(ks) > 1):
        raise DraftfitError(f"{option} {text} reaches {bad[-1] if bad[-1] > k_max else bad[0]}, outside 1..{k_max} "
                            f"(draftfit predicts and measures K up to {k_max})", fix=f"e.g. {option} 1..{k_max}")
    return [check_k(k, option, k_max) for k in ks]


def check_int(value, option: str, lo: int, hi: int, *, fix: str | None = None) -> int:
    """An integer option in lo..hi (bool is not an integer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise DraftfitError(f"{option} {value!r} is not an integer", fix=fix or f"pass {option} between {lo} and {hi}")
    if not lo <= value <= hi:
        raise DraftfitError(f"{option} {value} is outside {lo}..{hi}", fix=fix or f"pass {option} between {lo} and {hi}")
    return value


def check_float(value, option: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False,
                fix: str | None = None) -> float:
    """A finite number option in [lo, hi] (open ends where asked)."""
    v = _finite(value, option)
    ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise DraftfitError(f"{option} {value} is outside {rng}", fix=fix or f"pass {option} in {rng}")
    return v


def check_name(value, option: str, fix: str | None = None) -> str:
    """A name option (model, GPU, draft): not empty or blank."""
    if value is None or not str(value).strip():
        raise DraftfitError(f"{option} is empty", fix=fix or f"pass {option} a name (see `draftfit catalog list`)")
    return str(value).strip()


def check_output_file(path, option: str) -> str:
    """A file the command will write: not a folder, in a folder that exists."""
    text = str(path)
    if not text.strip() or "\0" in text:
        raise DraftfitError(f"{option} {text!r} is not a file path", fix=f"pass {option} a file path")
    if os.path.isdir(text):
        raise DraftfitError(f"{option} {text} is a folder, not a file", fix=f"pass {option} a file path inside it")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise DraftfitError(f"{option} {text}: folder {parent} does not exist",
                            fix=f"create {parent} first, or pass {option} a path in an existing folder")
    return text


def check_model_folder(path, option: str, *, must_exist: bool = True) -> str:
    """A model folder the command will point vLLM at: it exists (unless `must_exist` is False: a folder on
    another machine), is a folder, and its config.json is sane."""
    text = "" if path is None else str(path)
    if not text.strip() or "\0" in text or "\n" in text:
        raise DraftfitError(f"{option} {text!r} is not a path", fix=f"pass {option} the model folder")
    folder = Path(text).expanduser()
    if not folder.exists() and not folder.is_symlink() and not must_exist:
        return text  # on the serving machine, not here: nothing to check
    if not folder.exists():
        raise DraftfitError(f"{option} {text} does not exist",
                            fix=f"pass {option} a folder holding the model's config.json and weights")
    if not folder.is_dir():
        raise DraftfitError(f"{option} {text} is a file, not a model folder",
                            fix=f"pass {option} the folder that holds config.json, not a file in it")
    spec_from_folder(folder)
    return text


def parse_float_list(text: str, option: str, *, example: str = "0,0.7") -> tuple[float, ...]:
    """'0, 0.7' -> (0.0, 0.7): finite numbers, no empty item."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise DraftfitError(f"{option} {text!r} is not a comma-separated list of numbers", fix=f"e.g. {option} {example}")
    out = []
    for p in parts:
        try:
            v = float(p)
        except ValueError:
            raise DraftfitError(f"{option} {text!r} is not a comma-separated list of numbers",
                                fix=f"e.g. {option} {example}") from None
        if math.isnan(v) or math.isinf(v):
            raise DraftfitError(f"{option} {text!r} holds a value that is not a finite number",
                                fix=f"e.g. {option} {example}")
        out.append(v)
    return tuple(out)


def check_batches(batches) -> tuple[int, ...]:
    out = []
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH:
            raise DraftfitError(f"--batch {b!r} is not a batch size in 1..{MAX_BATCH}", fix="e.g. --batch 1,8,32")
        out.append(b)
    if not out:
        raise DraftfitError("--batch is empty", fix="e.g. --batch 1,8,32")
    return tuple(sorted(set(out)))


def parse_int_list(text: str, option: str, example: str = "1,8,32") -> tuple[int, ...]:
    """'1,8, 32' -> (1, 8, 32) and '1..4' -> (1, 2, 3, 4), mixed freely ('1..3,6'), in the order given; anything
    else is one error naming the option and an `example` of it. Ranges are checked by the callers' bounds like the
    rest (a range's end before its start is an error here)."""
    bad = DraftfitError(f"{option} {text!r} is not a comma-separated list of integers or a..b ranges",
                        fix=f"e.g. {option} {example}")
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise bad
    out: list[int] = []
    try:
        for part in parts:
            if ".." in part:
                lo_s, hi_s = part.split("..")
                lo, hi = int(lo_s), int(hi_s)
                if hi < lo or hi - lo > 100_000:  # a range no option of draftfit could use
                    raise bad
                out += range(lo, hi + 1)
            else:
                out.append(int(part))
    except ValueError:
        raise bad from None
    return tuple(out)


def check_choice(value: str, choices: tuple[str, ...], option: str) -> str:
    if value not in choices:
        raise DraftfitError(f"{option} {value!r} is not one of {', '.join(choices)}", fix=f"pass {option} {choices[0]}")
    return value


def check_vllm_version(version: str | None) -> str | None:
    """The one version policy (engine.check_version): nonsense and versions older than the oldest modelled are
    refused with the modelled list."""
    return check_version(version)


def check_tp(target: ModelSpec, tp) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or tp > 64:
        raise DraftfitError(f"--tp {tp!r} is not a tensor-parallel size", fix="pass --tp 1, 2, 4 or 8")
    if target.num_attention_heads % tp or (target.num_kv_heads and tp > target.num_kv_heads
                                           and tp % target.num_kv_heads):
        ok = [t for t in TP_CHOICES if target.num_attention_heads % t == 0]
        raise DraftfitError(f"--tp {tp}: {target.name} has {target.num_attention_heads} attention heads, "
                            f"not divisible by {tp}", fix=f"pass --tp {' or '.join(map(str, ok))}")
    return tp


def check_context(target: ModelSpec, max_model_len) -> int:
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int):
        raise DraftfitError(f"--max-model-len {max_model_len!r} is not an integer", fix="e.g. --max-model-len 8192")
    limit = target.max_position_embeddings or 10**7
    if not MIN_CONTEXT <= max_model_len <= limit:
        raise DraftfitError(f"--max-model-len {max_model_len} is outside {MIN_CONTEXT}..{limit} "
                            f"({target.name}'s max_position_embeddings)",
                            fix=f"pass --max-model-len between {MIN_CONTEXT} and {limit}")
    return max_model_len


# ------------------------------------------------------------------------------------ TP and context

def _fits(target, probe, gpu, tp, util, max_model_len, quantization, kv_cache_dtype,
          max_num_seqs=None, rules: VllmRules | None = None) -> tuple[bool, str]:
    try:
        plan = plan_memory(target, probe, gpu, tp=tp, util=util, max_model_len=max_model_len,
                           quantization=quantization, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                           num_speculative_tokens=4 if probe is not None else 0, rules=rules)
    except DraftfitError as exc:
        return False, exc.message
    # A probe draft whose KV layout vLLM refuses still sizes the memory; the compatibility stage reports the refusal.
    return bool(plan.memory_fits), "" if plan.memory_fits else (plan.reason or "")


# A smaller max_num_seqs shrinks the profile run's activations and the CUDA-graph pool vLLM reserves; with a draft
# beside a target that fills the GPU (Llama-3.1-70B on two H100s) it is what makes room for any KV cache.
FALLBACK_MAX_NUM_SEQS = 256


def choose_tp_and_context(target: ModelSpec, gpu: GpuSpec, *, tp: int | None, util: float, max_model_len: int | None,
                          probe_draft: ModelSpec | None = None, quantization: str = "none",
                          kv_cache_dtype: str = "auto", max_num_seqs: int | None = None,
                          rules: VllmRules | None = None) -> tuple[int, int, int | None, list[str]]:
    """(tp, max_model_len, max_num_seqs, notes). TP: the smallest that divides the heads and fits the target
    (with `probe_draft` beside it, when given) at the context asked for. When no TP does, the longest context
    that fits: the largest power of two (down to MIN_CONTEXT) at the given TP, or at the largest TP that
    divides; failing that, the same with max_num_seqs FALLBACK_MAX_NUM_SEQS."""
    wanted = max_model_len or target.max_position_embeddings or 4096
    tps = [tp] if tp is not None else [t for t in TP_CHOICES if target.num_attention_heads % t == 0]
    what = f"{target.name}" + (f" + {probe_draft.name}" if probe_draft is not None else "")
    last = ""
    for t in tps:
        ok, why = _fits(target, probe_draft, gpu, t, util, wanted, quantization, kv_cache_dtype, max_num_seqs,
                        rules)
        if ok:
            notes = []
            if tp is None:
                notes.append(f"TP={t}: the smallest tensor-parallel size at which {what} fits on {gpu.name} at "
                             f"{wanted} tokens" + (f" ({last})" if last else "") + "; pass --tp to choose")
            return t, wanted, max_num_seqs, notes
        last = f"TP={t}: {why or 'does not fit'}"
    t = tps[-1]
    seqs_options = [max_num_seqs] + ([FALLBACK_MAX_NUM_SEQS] if max_num_seqs is None else [])
    asked = "the --max-model-len asked for" if max_model_len else f"{target.name}'s default context"
    for seqs in seqs_options:
        length = 1 << (max(wanted - 1, 1).bit_length() - 1)  # the largest power of two below wanted
        while length >= MIN_CONTEXT:
            ok, _ = _fits(target, probe_draft, gpu, t, util, length, quantization, kv_cache_dtype, seqs,
                          rules)
            if ok:
                extra = (f" with max_num_seqs {seqs} (the default leaves no KV cache beside the draft)"
                         if seqs != max_num_seqs else "")
                return t, length, seqs, [
                    f"max_model_len {length}{extra}: {asked} ({wanted} tokens) does not fit {what} on {gpu.name} "
                    f"x{t} ({last}); {length} is the longest power of two that does. Pass --max-model-len to "
                    "choose another, or --tp / --gpu for more memory"]
            length //= 2
    raise DraftfitError(f"{what} does not fit on {gpu.name} x{t} at any context ({last})",
                        fix="pass a larger --tp, a GPU with more memory (--gpu), or --quantization fp8", exit_code=1)


def check_quantization(spec: ModelSpec, quantization) -> str:
    """The weight format the layout is sized and served with: the one asked for, else the checkpoint's own
    ("none" when it has none). vLLM refuses a --quantization that differs from a quantized checkpoint's."""
    asked = check_choice("auto" if quantization is None else quantization, QUANTIZATIONS, "--quantization")
    own = spec.quantization
    if asked in ("auto", "none"):
        return own or "none"
    if own and asked != own.split("-")[0]:
        raise DraftfitError(f"--quantization {asked}: {spec.name} is already quantized ({own}, its "
                            "quantization_config); vLLM refuses another method", fix="leave --quantization out")
    return own or asked


def build_layout(target: str | ModelSpec, *, gpu: str | None = None, tp: int | None = None,
                 util: float | None = None, max_model_len: int | None = None, k: int | None = None,
                 batches=(1,), workload: str = "chat", temperature: float = 0.0, dtype: str = "auto",
                 quantization: str = "none", kv_cache_dtype: str = "auto", vllm_version: str | None = None,
                 need_gpu: bool = True, probe_draft: ModelSpec | None = None, fit_context: bool = True,
                 max_num_seqs: int | None = None) -> Layout:
    """Validate every option once and resolve the names; choose TP and context when not given."""
    spec = target if isinstance(target, ModelSpec) else resolve_model(str(target))
    if spec.is_eagle:
        raise DraftfitError(f"{spec.name} is an EAGLE head, not a target model",
                            fix=f"use the model it drafts for: {', '.join(spec.draft_for) or 'see its card'}")
    util_v = check_util(util)
    temp = check_temperature(temperature)
    wl = check_choice(workload, WORKLOADS, "--workload")
    bs = check_batches(batches)
    k_v = check_k(k) if k is not None else None
    dt = check_choice(dtype or "auto", DTYPES, "--dtype")
    quant = check_quantization(spec, quantization)
    kvd = check_choice(kv_cache_dtype or "auto", KV_CACHE_DTYPES, "--kv-cache-dtype")
    engine = resolve_target(vllm_version)  # the one version policy and default (engine.resolve_target)
    if tp is not None:
        check_tp(spec, tp)
    if max_num_seqs is not None and (isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int)
                                     or not 1 <= max_num_seqs <= MAX_BATCH):
        raise DraftfitError(f"--max-num-seqs {max_num_seqs!r} is outside 1..{MAX_BATCH}", fix="e.g. --max-num-seqs 256")
    if max_model_len is not None:
        check_context(spec, max_model_len)
    notes: list[str] = []
    if spec.quantization:
        notes.append(f"weights sized as {spec.quantization}: {spec.name}'s quantization_config")
    gpu_spec = None
    if gpu is not None or need_gpu:
        if gpu is None:
            notes.append(f"GPU not given: assuming {DEFAULT_GPU} (pass --gpu)")
        gpu_spec = resolve_gpu(gpu or DEFAULT_GPU)
    if gpu_spec is not None and (fit_context or tp is None):
        tp_v, context, seqs, chosen = choose_tp_and_context(spec, gpu_spec, tp=tp, util=util_v,
                                                            max_model_len=max_model_len, probe_draft=probe_draft,
                                                            quantization=quant, kv_cache_dtype=kvd,
                                                            max_num_seqs=max_num_seqs, rules=engine.rules)
        if not fit_context and max_model_len is not None:
            context = max_model_len  # preflight and memory judge the context asked for, as vLLM would
        notes += chosen
    else:
        tp_v, context, seqs = tp or 1, max_model_len or spec.max_position_embeddings or 4096, max_num_seqs
    if gpu_spec is not None and quant in (None, "", "none"):
        # A target-level fact about every speculative step (and the plain one): said once, not per draft.
        untuned = untuned_moe_note(spec, gpu_spec, tp=tp_v, rules=engine.rules)
        if untuned:
            notes.append(untuned)
    if engine.requested is None or engine.mapped:
        notes.append(engine.note)  # which vLLM the numbers are for, and why (installed / newest / nearest)
    return Layout(target=spec, gpu=gpu_spec, tp=tp_v, util=util_v, max_model_len=context, batches=bs, workload=wl,
                  temperature=temp, k=k_v, dtype=dt, quantization=quant, kv_cache_dtype=kvd,
                  notes=tuple(notes), context_given=max_model_len is not None, tp_given=tp is not None,
                  max_num_seqs=seqs, engine=engine)
