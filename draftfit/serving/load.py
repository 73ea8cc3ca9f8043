"""Stage: serving load. At the user's traffic, each drafter's server against the same server without speculation:
TTFT, TPOT and ITL (p50, p99), output and request throughput and goodput under the SLOs, per request rate, with the
K (or per-batch-size K schedule) that maximises goodput, the band, and the rate where speculation stops paying.

serving_load(layout, target, drafters, traffic) -> ServingLoad. `drafters` are (drafter, acceptance, memory plan)
from the earlier stages (pipeline.evaluate_pair gives them); this stage adds the scheduler model (serving.sim) over
the step costs (serving.steps). Every figure carries its sources: the step costs' (calibrated table or roofline
prior, and the vLLM version they stand for), the acceptance's, the memory plan's KV blocks, and the band: the same
run with every step at the step-cost band's ends and the acceptance at its band's ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from draftfit.acceptance.curve import expected_tokens_per_step, extend_curve
from draftfit.catalog.shapes import act_dtype, kv_dtype_bytes
from draftfit.catalog.specs import ModelSpec
from draftfit.engine import EngineTarget
from draftfit.engine.methods import speculative_method
from draftfit.engine.scheduler import scheduler_rules
from draftfit.errors import DraftfitError
from draftfit.layout import Layout
from draftfit.memory.plan import MemoryPlan, plan_memory
from draftfit.rules import K_VALUES, NO_SPECULATION_BELOW
from draftfit.serving.sim import EngineLimits, SimMetrics, SpecConfig, simulate
from draftfit.serving.steps import StepSurface, build_surface
from draftfit.serving.traffic import Traffic, sample_requests

# A candidate's goodput within this share of another's is a tie, broken by the lower median TPOT.
GOODPUT_TIE = 0.01
# The rate sweep bench/serve_bench.py and `serve-sim --request-rate auto` use: shares of the modelled saturation
# rate (the request rate a closed loop of max_num_seqs clients completes), light load to past saturation.
AUTO_RATE_SHARES = (0.1, 0.3, 0.55, 0.8, 1.0, 1.25)


@dataclass
class Band:
    """A figure and its band: the runs at the step-cost and acceptance bands' ends."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}


@dataclass
class ConfigAtRate:
    """One server configuration at one rate: the figures, each with its band."""

    label: str  # 'no speculation', 'K=4', 'K by batch 1-16:4, 17-1024:0'
    k: int
    k_schedule: list | None
    ttft_p50_ms: Band
    ttft_p99_ms: Band
    tpot_p50_ms: Band
    tpot_p99_ms: Band
    itl_p50_ms: Band
    itl_p99_ms: Band
    output_throughput: Band  # tokens/s
    request_throughput: Band  # requests/s
    goodput: Band | None  # requests/s meeting the SLOs (None: no SLO given)
    mean_batch: float
    tokens_per_step: float
    preemptions: int
    kv_peak_share: float

    def to_dict(self) -> dict:
        out = {}
        for k, v in self.__dict__.items():
            out[k] = v.to_dict() if isinstance(v, Band) else v
        return out


@dataclass
class RatePoint:
    rate: float | None  # requests/s (None: closed loop at traffic.concurrency)
    baseline: ConfigAtRate
    best: ConfigAtRate  # the drafter's configuration that maximises goodput here
    tried: dict  # label -> (goodput or None, tpot p50 ms, output throughput) of every configuration simulated
    pays: bool  # the best configuration's median TPOT beats the baseline's (and goodput is no lower)

    def to_dict(self) -> dict:
        return {"rate": self.rate, "baseline": self.baseline.to_dict(), "best": self.best.to_dict(),
                "tried": self.tried, "pays": self.pays}


@dataclass
class DrafterLoad:
    drafter: str
    method: str
    acceptance: float
    acceptance_source: str
    kv_tokens: int
    kv_tokens_baseline: int
    points: list  # RatePoint per rate
    recommended: str  # the configuration to serve at this traffic ('no speculation' when none pays)
    recommended_k: int
    recommended_schedule: list | None
    crossover_rate: float | None  # requests/s where speculation stops paying (interpolated); None: no crossing
    crossover: str  # in words: 'pays at every rate tried' | 'never pays' | 'stops paying between 8 and 16 req/s'
    step_cost_source: str
    step_cost_vllm: str
    band_spec: float  # relative step-cost band of the speculative steps
    band_plain: float
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k != "points"},
                "points": [p.to_dict() for p in self.points]}


@dataclass
class ServingLoad:
    target: str
    gpu: str
    tp: int
    vllm_version: str
    traffic: dict
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    engine: dict  # max_num_seqs, max_num_batched_tokens, block size, async scheduling, source
    drafters: list  # DrafterLoad
    winner: str | None  # the drafter whose recommended configuration has the best mean goodput (or TPOT)
    saturation_rate: float | None  # requests/s the baseline completes with max_num_seqs clients
    notes: list = field(default_factory=list)
    model: str = ("vLLM V1 scheduler (continuous batching, chunked prefill, KV-block admission and recompute "
                  "preemption, async scheduling) over draftfit's step costs: draftfit.serving.sim")

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k != "drafters"},
                "drafters": [d.to_dict() for d in self.drafters]}


# ----------------------------------------------------------------------------------------------- helpers

def _curves(acceptance, k_max: int) -> tuple[list, list, list]:
    """(point, low, high) acceptance curves to k_max; the band scales each position as the speedup stage does
    (speedup.predict: a_i x (low/alpha)^(i+1), kept non-increasing)."""
    alpha = float(acceptance.alpha)
    point = extend_curve(list(acceptance.per_position) if acceptance.per_position else [alpha], k_max)
    if not alpha:
        return point, point, point
    lo = [v * (acceptance.low / alpha) ** (i + 1) for i, v in enumerate(point)]
    hi = [min(v * (acceptance.high / alpha) ** (i + 1), 1.0) for i, v in enumerate(point)]
    for c in (lo, hi):
        for i in range(1, len(c)):
            c[i] = min(c[i], c[i - 1])
    return point, lo, hi


def per_batch_schedule(surface: StepSurface, curve: list, ks) -> list:
    """vLLM's num_speculative_tokens_per_batch_size: at each grid batch the K (0 = none) with the most tokens per
    ms (E(K) / step(B, K), a plain step for K 0), merged into inclusive ranges that cover 1..the largest batch."""
    best = []
    for b in surface.batches:
        rates = {0: 1.0 / surface.decode_ms(b, 0)}
        for k in ks:
            rates[k] = expected_tokens_per_step(curve, k) / surface.decode_ms(b, k)
        best.append((b, max(sorted(rates), key=lambda k: rates[k])))
    out = []
    lo = 1
    for i, (b, k) in enumerate(best):
        hi = b if i + 1 == len(best) else int(math.sqrt(b * best[i + 1][0]))
        hi = max(hi, lo)
        if out and out[-1][2] == k:
            out[-1][1] = hi
        else:
            out.append([lo, hi, k])
        lo = hi + 1
    return [tuple(r) for r in out]


def candidate_ks(surface: StepSurface, curve: list, ks) -> list:
    """The K worth simulating: the best at some grid batch (tokens per ms), and its neighbours."""
    picks = set()
    for b in surface.batches:
        rates = {k: expected_tokens_per_step(curve, k) / surface.decode_ms(b, k) for k in ks}
        kb = max(sorted(rates), key=lambda k: rates[k])
        picks |= {kb - 1, kb, kb + 1}
    return sorted(k for k in picks if k in set(ks))


def engine_limits(plan: MemoryPlan, engine: EngineTarget, method: str | None, k_max: int) -> EngineLimits:
    rules = scheduler_rules(engine.modelled)
    block_tokens = plan.kv_block_tokens or plan.block_size
    return EngineLimits(
        max_num_seqs=plan.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
        kv_blocks=max(plan.kv_tokens // block_tokens, 1), block_size=block_tokens, max_model_len=plan.max_model_len,
        async_scheduling=bool(engine.rules.async_scheduling.get(method, True)) if method else True,
        draft_slots=rules.drafting_slots(method), lookahead=rules.lookahead_tokens(method, k_max),
        reserve_full_sequence=rules.reserve_full_sequence)


def baseline_plan(layout: Layout, target: ModelSpec) -> MemoryPlan:
    """The target alone on the layout, as the speculative plan is sized (pipeline.evaluate_pair's arguments)."""
    return plan_memory(target, None, layout.gpu, tp=layout.tp, util=layout.util, max_model_len=layout.max_model_len,
                       quantization=layout.quantization, kv_cache_dtype=layout.kv_cache_dtype, dtype=layout.dtype,
                       max_num_seqs=layout.max_num_seqs, strict=False, rules=layout.engine.rules)


def _banded(runs: list[SimMetrics], label: str, k: int, schedule) -> ConfigAtRate:
    point = runs[0]

    def band(get) -> Band:
        vals = [get(r) for r in runs]
        return Band(round(vals[0], 4), round(min(vals), 4), round(max(vals), 4))

    return ConfigAtRate(
        label=label, k=k, k_schedule=[list(r) for r in schedule] if schedule else None,
        ttft_p50_ms=band(lambda r: r.ttft_ms["p50"]), ttft_p99_ms=band(lambda r: r.ttft_ms["p99"]),
        tpot_p50_ms=band(lambda r: r.tpot_ms["p50"]), tpot_p99_ms=band(lambda r: r.tpot_ms["p99"]),
        itl_p50_ms=band(lambda r: r.itl_ms["p50"]), itl_p99_ms=band(lambda r: r.itl_ms["p99"]),
        output_throughput=band(lambda r: r.output_throughput), request_throughput=band(lambda r: r.request_throughput),
        goodput=band(lambda r: r.goodput) if point.goodput is not None else None,
        mean_batch=round(point.mean_batch, 2), tokens_per_step=round(point.tokens_per_step, 3),
        preemptions=point.preemptions, kv_peak_share=round(point.kv_peak_share, 4))


def auto_rates(sat: float) -> list:
    """AUTO_RATE_SHARES of the saturation rate, rounded to 2 significant figures."""
    return sorted({float(f"{s * sat:.2g}") for s in AUTO_RATE_SHARES})


def _pays(spec: SimMetrics, base: SimMetrics, slo: bool) -> bool:
    """Speculation pays at a rate: its median TPOT is at least NO_SPECULATION_BELOW times lower (rules: the one
    worth-it threshold), its output throughput no lower, and, with SLOs, its goodput no lower (within the tie)."""
    if spec.tpot_ms["p50"] * NO_SPECULATION_BELOW > base.tpot_ms["p50"] * (1 + 1e-9):
        return False
    if spec.output_throughput < 0.99 * base.output_throughput:
        return False
    if slo and (spec.goodput or 0.0) < (base.goodput or 0.0) * (1 - GOODPUT_TIE):
        return False
    return True


def _better(a: SimMetrics, b: SimMetrics, slo: bool) -> bool:
    """a beats b: more goodput (beyond the tie share), else a lower median TPOT; without an SLO, a lower median
    TPOT at no less than 99 % of b's output throughput."""
    if slo:
        ga, gb = a.goodput or 0.0, b.goodput or 0.0
        if abs(ga - gb) > GOODPUT_TIE * max(ga, gb, 1e-9):
            return ga > gb
        return a.tpot_ms["p50"] < b.tpot_ms["p50"]
    if a.output_throughput < 0.99 * b.output_throughput:
        return False
    if b.output_throughput < 0.99 * a.output_throughput:
        return True
    return a.tpot_ms["p50"] < b.tpot_ms["p50"]


def saturation_rate(layout: Layout, target: ModelSpec, traffic: Traffic, *, surface: StepSurface,
                    plan: MemoryPlan) -> float:
    """Requests/s the server without speculation completes when max_num_seqs clients keep it full."""
    reqs = sample_requests(traffic, None, max_model_len=plan.max_model_len)
    lim = engine_limits(plan, layout.engine, None, 0)
    m = simulate(reqs.prompt_len, reqs.output_len, None, surface, lim, SpecConfig(), concurrency=plan.max_num_seqs,
                 seed=traffic.seed)
    return m.request_throughput


def serving_load(layout: Layout, target: ModelSpec, drafters: list, traffic: Traffic, *,
                 slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None, k_values=K_VALUES,
                 progress=None) -> ServingLoad:
    """The serving-load stage for every (drafter, acceptance, memory plan) in `drafters` at `traffic`.
    `progress(done, total)` is called after each simulation (the CLI's bar)."""
    if layout.gpu is None:
        raise DraftfitError("the serving load needs a GPU", fix="pass --gpu")
    engine = layout.engine
    ks = (layout.k,) if layout.k else tuple(k_values)
    slo = slo_ttft_ms is not None or slo_tpot_ms is not None
    base_plan = baseline_plan(layout, target)
    if not base_plan.fits:
        raise DraftfitError(f"{target.name} does not fit on {layout.gpu.name} x{layout.tp}: {base_plan.reason}",
                            fix=base_plan.fix or "pass a larger --tp or a GPU with more memory", exit_code=1)
    kvd = kv_dtype_bytes(layout.kv_cache_dtype, act_dtype(layout.dtype, target)[1])  # as the memory plan sizes KV
    rates: list = list(traffic.rates) or ([] if traffic.auto else [None])
    out, notes = [], list(traffic.notes)
    sat = None
    jobs = [0, 0]

    def tick():
        jobs[0] += 1
        if progress:
            progress(jobs[0], jobs[1])

    for drafter, acceptance, plan in drafters:
        method = speculative_method(drafter)
        if plan is None or not plan.fits:
            raise DraftfitError(f"{drafter.name} beside {target.name} does not fit on {layout.gpu.name} x{layout.tp}"
                                + (f": {plan.reason}" if plan is not None else ""), fix=(plan.fix if plan else None)
                                or "pass --max-model-len smaller, a larger --tp or more GPU memory", exit_code=1)
        max_b = max(plan.max_num_seqs, base_plan.max_num_seqs)
        surface = build_surface(target, drafter, layout.gpu, tp=layout.tp, k_values=ks, max_batch=max_b,
                                context_len=traffic.mean_context, rules=layout.engine.rules,
                                kv_dtype_bytes=kvd)
        curve, c_lo, c_hi = _curves(acceptance, max(ks))
        kc = list(ks) if layout.k else candidate_ks(surface, curve, ks)
        sched = None if layout.k else per_batch_schedule(surface, curve, ks)
        configs = [SpecConfig(k=k, curve=tuple(curve)) for k in kc]
        if sched and len({r[2] for r in sched}) > 1:
            configs.append(SpecConfig(k=max(r[2] for r in sched), schedule=tuple(sched), curve=tuple(curve)))
        if sat is None:
            sat = saturation_rate(layout, target, traffic, surface=surface, plan=base_plan)
            if traffic.auto:
                rates = auto_rates(sat)
                notes.append(f"rates {', '.join(f'{r:g}' for r in rates)} req/s: {', '.join(f'{s:g}' for s in AUTO_RATE_SHARES)}"
                             f" x the modelled saturation {sat:.3g} req/s (no speculation, max_num_seqs clients)")
        jobs[1] += len(rates) * (len(configs) + 5)
        base_lim = engine_limits(base_plan, engine, None, 0)
        spec_lims = {id(c): engine_limits(plan, engine, method, c.k_max) for c in configs}
        lo_s, hi_s = surface.scaled(+1), surface.scaled(-1)  # the pessimistic and the optimistic ends
        points = []
        for rate in rates:
            reqs = sample_requests(traffic, rate, max_model_len=min(plan.max_model_len, base_plan.max_model_len))
            kw = dict(concurrency=traffic.concurrency, seed=traffic.seed, slo_ttft_ms=slo_ttft_ms,
                      slo_tpot_ms=slo_tpot_ms)
            args = (reqs.prompt_len, reqs.output_len, reqs.arrival_s)
            base_runs = []
            for s in (surface, lo_s, hi_s):
                base_runs.append(simulate(*args, s, base_lim, SpecConfig(), **kw))
                tick()
            tried, best_cfg, best_m = {}, None, None
            for c in configs:
                m = simulate(*args, surface, spec_lims[id(c)], c, **kw)
                tick()
                tried[c.label()] = {"goodput": m.goodput, "tpot_p50_ms": round(m.tpot_ms["p50"], 3),
                                    "output_throughput": round(m.output_throughput, 1)}
                if best_m is None or _better(m, best_m, slo):
                    best_cfg, best_m = c, m
            lo_cfg = SpecConfig(k=best_cfg.k, schedule=best_cfg.schedule, curve=tuple(c_lo))
            hi_cfg = SpecConfig(k=best_cfg.k, schedule=best_cfg.schedule, curve=tuple(c_hi))
            runs = [best_m, simulate(*args, lo_s, spec_lims[id(best_cfg)], lo_cfg, **kw)]
            tick()
            runs.append(simulate(*args, hi_s, spec_lims[id(best_cfg)], hi_cfg, **kw))
            tick()
            pays = _pays(best_m, base_runs[0], slo)
            points.append(RatePoint(rate=rate, baseline=_banded(base_runs, "no speculation", 0, None),
                                    best=_banded(runs, best_cfg.label(), best_cfg.k, best_cfg.schedule or None),
                                    tried=tried, pays=bool(pays)))
        out.append(_drafter_load(drafter, method, acceptance, plan, base_plan, points, surface, slo))
    winner = None
    paying = [d for d in out if d.recommended != "no speculation"]
    if paying:
        winner = max(paying, key=lambda d: _mean_objective(d, slo)).drafter
    return ServingLoad(target=target.name, gpu=layout.gpu.name, tp=layout.tp, vllm_version=engine.version,
                       traffic=traffic.to_dict(), slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
                       engine={"max_num_seqs": base_plan.max_num_seqs,
                               "max_num_batched_tokens": base_plan.max_num_batched_tokens,
                               "block_size": base_plan.kv_block_tokens or base_plan.block_size,
                               "kv_tokens_no_speculation": base_plan.kv_tokens,
                               "scheduler": f"vLLM {scheduler_rules(engine.modelled).version} (engine/scheduler.py)",
                               "memory": base_plan.source},
                       drafters=out, winner=winner, saturation_rate=float(f"{sat:.3g}") if sat else None, notes=notes)


def _mean_objective(d: DrafterLoad, slo: bool) -> float:
    vals = [(p.best.goodput.value if slo and p.best.goodput else -p.best.tpot_p50_ms.value) for p in d.points]
    return sum(vals) / len(vals)


def _drafter_load(drafter, method, acceptance, plan, base_plan, points, surface, slo) -> DrafterLoad:
    """The recommendation over the rates, and where speculation stops paying."""
    tally: dict = {}
    for p in points:
        if p.pays:
            tally.setdefault(p.best.label, []).append(p)
    if tally:
        label = max(tally, key=lambda lb: (len(tally[lb]), -min(p.rate or 0 for p in tally[lb])))
        rec = tally[label][0].best
        recommended, rk, rsched = label, rec.k, rec.k_schedule
    else:
        recommended, rk, rsched = "no speculation", 0, None
    cross, words = None, ""
    rated = [p for p in points if p.rate is not None]
    if not rated:
        words = "pays at this concurrency" if points and points[0].pays else "does not pay at this concurrency"
    elif len(rated) == 1:
        words = f"{'pays' if rated[0].pays else 'does not pay'} at {rated[0].rate:g} req/s"
    elif all(p.pays for p in rated):
        words = f"pays at every rate tried (up to {rated[-1].rate:g} req/s)"
    elif not any(p.pays for p in rated):
        words = f"never pays at the rates tried ({rated[0].rate:g}-{rated[-1].rate:g} req/s)"
    else:
        for a, b in zip(rated, rated[1:]):
            if a.pays and not b.pays:
                ra = a.baseline.tpot_p50_ms.value / a.best.tpot_p50_ms.value
                rb = b.baseline.tpot_p50_ms.value / b.best.tpot_p50_ms.value
                # where the TPOT ratio falls through the worth-it threshold, linear between the two rates
                f = (ra - NO_SPECULATION_BELOW) / (ra - rb) if ra != rb else 0.5
                cross = round(a.rate + max(0.0, min(1.0, f)) * (b.rate - a.rate), 3)
                words = f"stops paying between {a.rate:g} and {b.rate:g} req/s (about {cross:g})"
                break
        if not words:
            words = "pays at some rates only: " + ", ".join(f"{p.rate:g}" for p in rated if p.pays) + " req/s"
    notes = list(surface.notes)
    return DrafterLoad(drafter=drafter.name, method=method, acceptance=round(float(acceptance.alpha), 4),
                       acceptance_source=getattr(acceptance, "source", ""), kv_tokens=plan.kv_tokens,
                       kv_tokens_baseline=base_plan.kv_tokens, points=points, recommended=recommended,
                       recommended_k=rk, recommended_schedule=rsched, crossover_rate=cross, crossover=words,
                       step_cost_source=surface.source, step_cost_vllm=surface.vllm,
                       band_spec=round(max(surface.band_at(k) for k in surface.band_spec), 4),
                       band_plain=round(surface.band_at(0), 4),
                       notes=notes)
