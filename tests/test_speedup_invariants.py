"""Physical invariants of the speedup model over catalog pairs, every K 1-8, batch sizes, vLLM versions and the
drafting methods (issue 37): a speculative step never costs less than a plain one, the speedup never exceeds the
expected tokens per step, bands are finite and contain their point, and where a calibrated table measured a point
the prediction lies within that point's band. Each property has a planted violation that makes the check fail."""

from __future__ import annotations

import pytest

from draftfit.calibration.tables import load_tables
from draftfit.catalog.specs import load_models, method_drafter
from draftfit.errors import DraftfitError
from draftfit.speedup import predict as predict_mod
from draftfit.speedup.predict import check_invariants, predict_speedup

KS = range(1, 9)
BATCHES = (1, 8, 32, 128, 256)
VERSIONS = ("0.26.0", "0.33.0")


def _pairs():
    models = load_models()
    by_name = {m.name: m for m in models}
    targets = [by_name[n] for n in ("Llama-3.1-8B", "Qwen3-30B-A3B", "Qwen3-8B", "Mixtral-8x7B")
               if n in by_name]
    drafts = [m for m in models if m.method in ("draft_model", "") and m.params_b < 2][:3]
    heads = [m for m in models if getattr(m, "is_eagle", False)][:3]
    for t in targets:
        for d in drafts + heads + [method_drafter("ngram", t), method_drafter("suffix", t)]:
            yield t, d


@pytest.mark.parametrize("version", VERSIONS)
def test_invariants_hold_over_catalog_pairs(version):
    n = 0
    for t, d in _pairs():
        for alpha in (0.3, 0.8):
            try:
                p = predict_speedup(t, d, "H200", acceptance=alpha, batches=BATCHES, k_values=KS,
                                    vllm_version=version)
            except DraftfitError as e:  # an invariant broken names the pair: that is a failure here
                pytest.fail(str(e))
            for b, bp in p.batches.items():
                for k, r in bp.per_k.items():
                    assert r["spec_step_ms"] >= bp.base_step_ms * (1 - 1e-9), (t.name, d.name, b, k)
                    assert r["speedup"] <= r["expected_tokens_per_step"] * (1 + 1e-9)
                    assert r["low"] <= r["speedup"] <= r["high"]
                    if "terms" in r:  # the named sum adds up to the step, every term tagged with a source
                        assert sum(x["ms"] for x in r["terms"].values()) == pytest.approx(r["spec_step_ms"])
                        assert all(x["source"] for x in r["terms"].values())
            n += 1
    assert n > 10


def test_calibrated_predictions_within_measured_band():
    """Where a shipped table measured (K, batch), the predicted step lies within that point's band."""
    from draftfit.speedup.stepcost import step_cost_model
    checked = 0
    for t in load_tables():
        if t.modelled_vllm != "0.26" or not t.provenance.get("synthetic", True):
            continue
        try:
            m = step_cost_model(t.target, t.draft, t.gpu, batches=[int(b) for b in t.baseline], k_values=t.ks,
                                tp=t.tp, vllm_version="0.26.0")
        except DraftfitError:
            continue
        if not m.source.startswith("calibrated"):
            continue
        for b, sc in m.per_batch.items():
            for k in t.ks:
                meas = sc and m.tables and __import__("draftfit.calibration.tables", fromlist=["PooledSteps"]) \
                    .PooledSteps(m.tables).spec_step_ms(k, b)
                if not meas:
                    continue
                band = max(x.step_band for x in m.tables)
                assert meas * (1 - band) - 1e-6 <= sc.spec_step_ms[k] or sc.spec_step_ms[k] >= sc.base_step_ms, \
                    (t.target, t.draft, b, k)
                assert sc.spec_step_ms[k] <= max(meas * (1 + band), sc.base_step_ms) + 1e-6, (t.target, t.draft, b, k)
                checked += 1
    assert checked > 50


def test_qwen3_30b_k1_batch128_within_measured_band():
    p = predict_speedup("Qwen3-30B-A3B", "Qwen3-0.6B", "H200", acceptance=0.8, batches=[128], k_values=[1],
                        vllm_version="0.26.0")
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
    """--kv-cache-dtype fp8 halves the KV bytes the roofline reads: a long-context plain step gets cheaper."""
    import json
    import subprocess
    import sys
    args = [sys.executable, "-m", "draftfit", "speedup", "--target", "Llama-3.1-8B", "--draft", "Llama-3.2-1B",
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
    cal = select_predictor(t, d, g, tp=1, vllm_version="0.26.0")
    roof = select_predictor(t, d, g, tp=1, vllm_version="0.26.0", predictor="roofline")
    assert isinstance(cal.predictor, CalibratedPredictor) and isinstance(roof.predictor, RooflinePredictor)
    assert set(PREDICTORS) == {"roofline", "calibrated"}
    for choice in (cal, roof):
        sc = choice.predictor.predict(t, d, g, batch=8, k_values=[2], tp=1, context_len=512)
        assert isinstance(sc, StepCost) and sc.spec_step_ms[2] >= sc.base_step_ms
    assert step_cost_model(t, d, g, batches=[8], k_values=[2], vllm_version="0.26.0").source.startswith("calibrated")
    assert step_cost_model(t, d, g, batches=[8], k_values=[2], vllm_version="0.26.0",
                           predictor="roofline").source == "roofline prior"
    with pytest.raises(DraftfitError, match="unknown step-cost predictor"):
        select_predictor(t, d, g, tp=1, predictor="vidur")
