"""Physical invariants of the speedup model over catalog pairs, every K 1-8, batch sizes, vLLM versions and the
drafting methods (issue 37): a speculative step never costs less than a plain one, the speedup never exceeds the
expected tokens per step, bands are finite and contain their point, and where a calibrated table measured a point
the prediction lies within that point's band. Each property has a planted violation that makes the check fail."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from draftfit.engine import resolve_target
from draftfit.calibration.tables import load_tables
from draftfit.catalog.shapes import as_served, kv_dtype_bytes, weights_bytes_per_rank
from draftfit.catalog.specs import draft_candidates, load_models, method_drafter, resolve_model
from draftfit.engine.versions import MODELLED
from draftfit.layout import check_quantization
from draftfit.memory.plan import check_tp
from draftfit.pipeline import resolve_drafter
from draftfit.errors import DraftfitError
from draftfit.speedup import predict as predict_mod
from draftfit.speedup.predict import check_invariants, predict_speedup

KS = range(1, 9)
BATCHES = (1, 8, 32, 128)
VERSIONS = tuple(f"{v}.0" for v in MODELLED)  # every modelled vLLM
QUANTS = ("auto", "fp8", "awq")  # the checkpoint's own weights, fp8, 4-bit; check_quantization drops what vLLM refuses
KV_DTYPES = ("auto", "fp8")
ALPHAS = (0.3, 0.6, 0.9)


def _tp(target, draft) -> int | None:
    """The smallest TP (1-8) both models shard at and the target's weights take under 90 % of an H200 (a drafter
    without a model has no shapes to check)."""
    for tp in (1, 2, 4, 8):
        try:
            check_tp(target, tp)
            if draft.num_layers:
                check_tp(draft, tp, "draft")
        except DraftfitError:
            continue
        if weights_bytes_per_rank(target, tp, 2)["total"] < 0.9 * 141e9:
            return tp
    return None


def _all_pairs():
    """Every catalog pair rank prices: each target (not a head) with its draft candidates, n-gram and suffix."""
    for t in load_models():
        if t.is_eagle:
            continue
        for d in draft_candidates(t) + [method_drafter("ngram", t), method_drafter("suffix", t)]:
            tp = _tp(t, d)
            if tp is not None:
                yield t, d, tp


def _check(t, d, tp, version, quant, kv, alpha):
    where = (t.name, d.name, tp, version, quant, kv, alpha)
    served = as_served(t, check_quantization(t, quant))
    try:
        p = predict_speedup(served, d, "H200", tp=tp, acceptance=alpha, batches=BATCHES, k_values=KS,
                            rules=resolve_target(version).rules, kv_dtype_bytes=kv_dtype_bytes(kv, 2))
    except DraftfitError as e:  # check_invariants' error names the pair: a failure here
        pytest.fail(f"{where}: {e}")
    for b, bp in p.batches.items():
        for k, r in bp.per_k.items():
            assert r["spec_step_ms"] >= bp.base_step_ms * (1 - 1e-9), (where, b, k)
            assert r["speedup"] <= r["expected_tokens_per_step"] * (1 + 1e-9), (where, b, k)
            assert r["low"] <= r["speedup"] <= r["high"], (where, b, k)
            assert all(math.isfinite(x) for x in (r["low"], r["high"], r["spec_step_ms"])), (where, b, k)
            if "terms" in r:  # the named sum adds up to the step, every term tagged with a source
                assert sum(x["ms"] for x in r["terms"].values()) == pytest.approx(r["spec_step_ms"]), (where, b, k)
                assert all(x["source"] for x in r["terms"].values()), (where, b, k)


def test_invariants_hold_over_every_catalog_pair():
    """Every catalog pair (about 1,200), all K 1-8 and batch sizes 1-128, each at one (vLLM version, weight format,
    KV dtype, acceptance) drawn with a fixed seed, so that the whole product is covered across pairs in one pass."""
    rng = random.Random(37)
    n = 0
    for t, d, tp in _all_pairs():
        quants = [q for q in QUANTS if _allowed(t, q)]
        _check(t, d, tp, rng.choice(VERSIONS), rng.choice(quants), rng.choice(KV_DTYPES), rng.choice(ALPHAS))
        n += 1
    assert n > 1000


# One pair of each kind of step the model prices: a dense draft_model pair at TP=2, an MoE target with a small draft,
# an EAGLE-3 head on the V2 runner, a head on an MoE target, an MTP layer of an MLA target at TP=8, n-gram and suffix
# (no draft forward), an FP8 checkpoint.
FULL_PRODUCT = [("Llama-3.1-70B", "Llama-3.2-1B"), ("Qwen3-30B-A3B", "Qwen3-0.6B"),
                ("Llama-3.1-8B", "EAGLE3-Llama-3.1-8B"), ("Qwen3-30B-A3B", "EAGLE3-Qwen3-30B-A3B"),
                ("DeepSeek-V3", "DeepSeek-V3-MTP"), ("Llama-3.1-8B", "ngram"), ("Qwen3-8B", "suffix"),
                ("Llama-3.1-70B-FP8", "Llama-3.2-1B"), ("Mixtral-8x7B", "Mistral-7B-v0.1")]


@pytest.mark.parametrize("pair", FULL_PRODUCT, ids="+".join)
def test_invariants_hold_over_the_full_product(pair):
    """Each kind of step over every vLLM version x weight format x KV dtype x acceptance, K 1-8, batch 1-128."""
    t = resolve_model(pair[0])
    d = resolve_drafter(t, pair[1])
    tp = _tp(t, d)
    for version, quant, kv, alpha in itertools.product(VERSIONS, QUANTS, KV_DTYPES, ALPHAS):
        if _allowed(t, quant):
            _check(t, d, tp, version, quant, kv, alpha)


def _allowed(t, quant) -> bool:
    try:
        check_quantization(t, quant)
        return True
    except DraftfitError:
        return False


def _calibrated_models():
    """step_cost_model for every shipped synthetic-acceptance table's layout, at the table's own vLLM version."""
    from draftfit.speedup.stepcost import step_cost_model
    for t in load_tables():
        if not t.provenance.get("synthetic", True):
            continue
        try:
            m = step_cost_model(t.target, t.draft, t.gpu, batches=[int(b) for b in t.baseline], k_values=t.ks,
                                tp=t.tp, rules=resolve_target(f"{t.modelled_vllm}.0").rules)
        except DraftfitError:
            continue
        if m.source.startswith("calibrated"):
            yield t, m


def _band_misses(t, m) -> list:
    """(batch, K, predicted, measured, band) wherever the predicted step lies outside a measured point's band. The
    floor of physics wins over the band: a step measured under the plain step is predicted at the plain step."""
    from draftfit.calibration.tables import PooledSteps
    pooled, band = PooledSteps(m.tables), max(x.step_band for x in m.tables)
    out = []
    for b, sc in m.per_batch.items():
        for k in t.ks:
            meas = pooled.spec_step_ms(k, b)
            if not meas:
                continue
            pred = sc.spec_step_ms[k]
            lo, hi = meas * (1 - band), max(meas * (1 + band), sc.base_step_ms)
            if not lo - 1e-6 <= pred <= hi + 1e-6:
                out.append((b, k, pred, meas, band))
    return out


def test_calibrated_predictions_within_measured_band():
    """Where a shipped table (any vLLM version) measured (K, batch), the predicted step lies within that point's band."""
    checked = 0
    versions = set()
    for t, m in _calibrated_models():
        assert not _band_misses(t, m), (t.target, t.draft, t.modelled_vllm, _band_misses(t, m))
        checked += 1
        versions.add(t.modelled_vllm)
    assert checked > 10 and {"0.26", "0.33"} <= versions


def test_planted_band_miss_is_caught():
    """The band check can fail: the same predictions with every speculative step 1.6x dearer miss their points."""
    t, m = next(iter(_calibrated_models()))
    for sc in m.per_batch.values():
        sc.spec_step_ms = {k: v * 1.6 for k, v in sc.spec_step_ms.items()}
    assert _band_misses(t, m)


def test_qwen3_30b_k1_batch128_within_measured_band():
    p = predict_speedup("Qwen3-30B-A3B", "Qwen3-0.6B", "H200", acceptance=0.8, batches=[128], k_values=[1],
                        rules=resolve_target("0.26.0").rules)
    bp = p.batches[128]
    assert bp.low <= bp.measured[1] <= bp.high
    assert bp.per_k[1]["spec_step_ms"] >= bp.base_step_ms


def test_ngram_step_not_above_a_heads():
    from draftfit.catalog.specs import resolve_model
    t = resolve_model("Llama-3.1-8B")
    head = next(m for m in load_models() if getattr(m, "is_eagle", False) and "8B" in m.name and "Llama" in m.name)
    for b in (1, 128):
        ng = predict_speedup(t, method_drafter("ngram", t), "H100-80GB", acceptance=0.5, batches=[b], k_values=[3])
        hd = predict_speedup(t, head, "H100-80GB", acceptance=0.5, batches=[b], k_values=[3])
        assert ng.batches[b].per_k[3]["spec_step_ms"] <= hd.batches[b].per_k[3]["spec_step_ms"]


# Planted violations: each check above must be able to fail.
def _row(**kw):
    r = {"speedup": 1.5, "low": 1.2, "high": 1.8, "expected_tokens_per_step": 2.0, "spec_step_ms": 12.0}
    r.update(kw)
    return {1: r}


@pytest.mark.parametrize("bad", [
    {"spec_step_ms": 8.0},  # a speculative step under the 10 ms plain step
    {"speedup": 2.5, "high": 3.0},  # above the expected tokens per step
    {"low": 1.6},  # band misses its point
    {"high": float("inf")},  # band not finite
])
def test_planted_violation_is_an_error_naming_the_pair(bad):
    check_invariants("T", "D", 1, 10.0, _row())  # the clean row passes
    with pytest.raises(DraftfitError, match="T \\+ D at batch 1, K=1"):
        check_invariants("T", "D", 1, 10.0, _row(**bad))


def test_planted_violation_in_step_costs_reaches_the_user(monkeypatch):
    """A step-cost model that prices a speculative step under a plain one is stopped by predict_speedup."""
    real = predict_mod.step_cost_model

    def broken(*a, **kw):
        m = real(*a, **kw)
        for sc in m.per_batch.values():
            sc.spec_step_ms = {k: sc.base_step_ms * 0.5 for k in sc.spec_step_ms}
        return m

    monkeypatch.setattr(predict_mod, "step_cost_model", broken)
    with pytest.raises(DraftfitError, match="Llama-3.1-8B"):
        predict_speedup("Llama-3.1-8B", "Llama-3.2-1B", "H200", acceptance=0.8, batches=[1], k_values=[2])


def test_memory_and_speedup_read_one_kv_figure_for_every_catalog_model():
    """catalog.shapes is the one home of KV bytes per token: the memory plan and the speedup model agree for every
    catalog model (DeepSeek-V3's MLA latent was about 7x in the speedup path before)."""
    from draftfit.memory import plan
    from draftfit.speedup.stepcost import kv_bytes_per_token_per_rank
    for m in load_models():
        if not m.num_layers or not m.num_kv_heads:
            continue
        for tp in (1, 2, 8):
            assert kv_bytes_per_token_per_rank(m, tp) == plan.kv_bytes_per_token(m, tp, 2), (m.name, tp)
            assert kv_bytes_per_token_per_rank(m, tp, 1) == plan.kv_bytes_per_token(m, tp, 1), (m.name, tp)


def test_fp8_kv_cache_reaches_the_speedup_model():
    """--kv-cache-dtype fp8 halves the KV bytes the roofline reads: a long-context plain step gets cheaper. (Qwen3-8B
    + Qwen3-1.7B: no table of it exists; the 8B pairs with 3.2-1B and 0.6B rest on their measured vLLM 0.34 H100
    tables, which no KV dtype changes.)"""
    import json
    import subprocess
    import sys
    args = [sys.executable, "-m", "draftfit", "speedup", "--target", "Qwen3-8B", "--draft", "Qwen3-1.7B",
            "--gpu", "H100-80GB", "--alpha", "0.7", "--k", "2", "--batch", "64", "--context-len", "8192", "--json"]
    steps = []
    for kv in ("auto", "fp8"):
        out = subprocess.run(args + ["--kv-cache-dtype", kv], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        steps.append(json.loads(out.stdout)["batches"]["64"]["base_step_ms"])
    assert steps[1] < steps[0] * 0.9


def test_predictors_behind_one_interface():
    """select_predictor is the one place a predictor is chosen: the pair's table where one exists (CalibratedPredictor),
    the roofline otherwise or when asked; both answer predict() with a StepCost; an unknown name is an error."""
    from draftfit.speedup.stepcost import (PREDICTORS, CalibratedPredictor, RooflinePredictor, StepCost, gpu_spec,
                                           model_spec, select_predictor, step_cost_model)
    t, d, g = model_spec("Llama-3.1-8B"), model_spec("Llama-3.2-1B"), gpu_spec("H200")
    cal = select_predictor(t, d, g, tp=1, rules=resolve_target("0.26.0").rules)
    roof = select_predictor(t, d, g, tp=1, rules=resolve_target("0.26.0").rules, predictor="roofline")
    assert isinstance(cal.predictor, CalibratedPredictor) and isinstance(roof.predictor, RooflinePredictor)
    assert set(PREDICTORS) == {"roofline", "calibrated"}
    for choice in (cal, roof):
        sc = choice.predictor.predict(t, d, g, batch=8, k_values=[2], tp=1, context_len=512)
        assert isinstance(sc, StepCost) and sc.spec_step_ms[2] >= sc.base_step_ms
    r026 = resolve_target("0.26.0").rules
    assert step_cost_model(t, d, g, batches=[8], k_values=[2], rules=r026).source.startswith("calibrated")
    assert step_cost_model(t, d, g, batches=[8], k_values=[2], rules=r026,
                           predictor="roofline").source == "roofline prior"
    with pytest.raises(DraftfitError, match="unknown step-cost predictor"):
        select_predictor(t, d, g, tp=1, predictor="vidur")
