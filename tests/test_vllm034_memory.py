"""vLLM 0.34's memory accounting (issue 38): the measured (extensible) KV sizing, its defaults, its log lines, and the
campaign phases pre-registered for it. 0.26/0.33 must not move (pinned records)."""

import json

import pytest

from draftfit.engine import resolve_target
from draftfit.engine.rules import VLLM_RULES
from draftfit.catalog.specs import resolve_gpu, resolve_model
from draftfit.memory.plan import (GIB, INIT_USED_GIB, decode_capture_grid, kv_budget,
                                  parse_vllm_memory_log, plan_memory)

H200 = resolve_gpu("H200")


def _plan(target, draft=None, **kw):
    kw.setdefault("max_model_len", 2048)
    kw.setdefault("entrypoint", "llm")
    kw.setdefault("max_num_seqs", 128)
    return plan_memory(resolve_model(target), resolve_model(draft) if draft else None, H200,
                       num_speculative_tokens=4 if draft else 0, strict=False, **kw)


def test_rules_record_fields():
    r26, r33, r34 = (VLLM_RULES[v] for v in ("0.26", "0.33", "0.34"))
    assert (r26.kv_sizing, r33.kv_sizing, r34.kv_sizing) == ("estimate", "estimate", "measured")
    assert (r26.default_block_size, r33.default_block_size, r34.default_block_size) == (16, 16, 64)
    assert r33.default_util == 0.92 and r34.default_util is None
    assert r34.drafter_cudagraphs and not r33.drafter_cudagraphs
    assert r34.draft_model_runner == r34.moe_runner == r34.hybrid_runner == "v2"


def test_measured_budget_explicit_util_is_bound_by_request():
    rules = VLLM_RULES["0.34"]
    total = 139.81 * GIB
    b = kv_budget(rules, total=total, requested=int(0.9 * total), weights=16 * GIB, peak=2 * GIB,
                  non_torch=0.2 * GIB, cg_reserved=0, cg_pool=1 * GIB, sizing_peak_factor=1.25)
    assert b.bound == "requested"
    # the reserve: torch's reservation growth (1.25 x the 2 GiB peak)
    assert b.pool == pytest.approx(0.9 * total - (16 + 0.2 + 1) * GIB - 2.5 * GIB, abs=16)


def test_measured_budget_unset_util_keeps_margin_below_headroom():
    rules = VLLM_RULES["0.34"]
    total = 139.81 * GIB
    b = kv_budget(rules, total=total, requested=int(total), weights=16 * GIB, peak=2 * GIB, non_torch=0.2 * GIB,
                  cg_reserved=0, cg_pool=1 * GIB, sizing_peak_factor=1.0)
    assert b.bound == "headroom"
    assert b.margin == int(1.5 * GIB)  # max(1 GiB, 0.75 x 2 GiB)
    expected = total - INIT_USED_GIB * GIB - (16 + 0.2 + 1) * GIB - 1.5 * GIB - 2 * GIB
    assert abs(b.pool - expected) < 1024
    # torch's reservation growth (1.5 x the peak) raises the reserve, not the margin (measure_kv_cache_bytes)
    grown = kv_budget(rules, total=total, requested=int(total), weights=16 * GIB, peak=2 * GIB, non_torch=0.2 * GIB,
                      cg_reserved=0, cg_pool=1 * GIB, sizing_peak_factor=1.5)
    assert grown.margin == b.margin and grown.reserve == int(3 * GIB)
    assert abs(grown.pool - (expected - 1 * GIB)) < 1024


def test_reservation_growth_factor_is_the_benchs_fit_and_every_034_record_is_within_one_percent():
    # the shipped factor is what bench/memory034.py fits on the stored 0.34 starts (a new start moves the fit: then
    # rerun the bench and ship its figure), and with it every stored 0.34 record is within 1 % of vLLM's log
    from bench import memory034
    from draftfit.memory import plan as mp

    recs = memory034.records()
    assert len(recs) >= 13
    assert mp.SIZING_PEAK_FACTOR == pytest.approx(memory034.fit(recs), abs=0.01)
    errs = memory034.errors(recs, mp.SIZING_PEAK_FACTOR)
    assert max(map(abs, errs)) <= 0.01, errs
    # and the rule it replaced (the profiled peak alone) was not: the test can fail
    assert max(map(abs, memory034.errors(recs, 1.0))) > 0.01


def test_measured_budget_never_exceeds_profile_capacity():
    # a graph pool of 0 and a low util: the measured budget equals the profile run's, never more
    rules = VLLM_RULES["0.34"]
    b = kv_budget(rules, total=100 * GIB, requested=50 * GIB, weights=10 * GIB, peak=1 * GIB, non_torch=0,
                  cg_reserved=0, cg_pool=0)
    assert b.pool <= 50 * GIB - 11 * GIB


def test_estimate_rule_is_the_033_formula():
    b = kv_budget(VLLM_RULES["0.33"], total=140 * GIB, requested=120 * GIB, weights=16 * GIB, peak=2 * GIB,
                  non_torch=GIB, cg_reserved=GIB, cg_pool=5 * GIB)
    assert b.pool == 100 * GIB


def test_034_defaults_block_64_and_unset_util_gives_more_kv():
    unset = _plan("Llama-3.1-8B", "Llama-3.2-1B", util=None, rules=resolve_target("0.34.0").rules)
    at_09 = _plan("Llama-3.1-8B", "Llama-3.2-1B", util=0.9, rules=resolve_target("0.34.0").rules)
    assert unset.block_size == 64 and unset.util == 1.0
    assert unset.kv_tokens > at_09.kv_tokens * 1.08
    assert unset.kv_tokens_low <= unset.kv_tokens <= unset.kv_tokens_high
    assert any("extensible" in n for n in unset.notes)
    # 0.33 leaves util at its own default 0.92 when unset
    assert _plan("Llama-3.1-8B", util=None, rules=resolve_target("0.33.0").rules).util == 0.92


def test_034_drafter_graphs_add_to_the_pool_033_has_none():
    p33 = _plan("Qwen3-8B", "Qwen3-0.6B", util=0.9, rules=resolve_target("0.33.0").rules)
    p34 = _plan("Qwen3-8B", "Qwen3-0.6B", util=0.9, rules=resolve_target("0.34.0").rules)
    alone = _plan("Qwen3-8B", util=0.9, rules=resolve_target("0.34.0").rules)
    assert p34.cudagraph_gib > p33.cudagraph_gib
    assert p34.cudagraph_gib > alone.cudagraph_gib


def test_decode_grid_is_vllm_034s():
    # config/compilation.py decode_cudagraph_capture_grid: "64 sizes at 1024"
    assert len(decode_capture_grid(1024)) == 64
    assert decode_capture_grid(8)[:6] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("version, expected", [("0.26.0", 648656), ("0.33.0", None)])
def test_026_record_unchanged(version, expected):
    # bench/memory.py record gpu_h200_llama-3.1-8b+llama-3.2-1b_k4_tp1_u0.85_l2048_s128: 648,656 before 0.34
    from bench.memory import RECORDS
    from draftfit.memory.plan import predict_record

    rec = json.loads((RECORDS / "gpu_h200_llama-3.1-8b+llama-3.2-1b_k4_tp1_u0.85_l2048_s128.json").read_text())
    if expected is None:  # 0.33: the same engine follows its own (estimate) rule, block 16
        plan = predict_record(dict(rec, vllm_version=version))
        assert plan.block_size == 16 and plan.vllm_version == "0.33.0"
        return
    assert predict_record(rec).kv_tokens == expected


LOG_034 = """INFO [llm_engine.py] Initializing a V1 LLM engine (v0.34.0) with config: model='/x'
INFO [gpu_worker.py] Model loading took 15.02 GiB memory and 3.1 seconds
INFO [gpu_worker.py] Available KV cache memory: 118.20 GiB
INFO [extensible_kv_cache.py:693] Memory after warmup: 120.55 GiB free, 3.10 GiB committed to the KV cache, 1.62 GiB \
kept for transient activations (1.62 GiB allocated at peak, 0.40 GiB of torch reservation growth); 7543 KV cache \
blocks (117.86 GiB) fit within the requested 139.81 GiB. Torch may reserve up to 2.30 GiB.
INFO [extensible_kv_cache.py:536] Extended KV cache to 7543 blocks (117.86 GiB).
INFO [kv_cache_utils.py] GPU KV cache size: 965,504 tokens
INFO [kv_cache_utils.py] Maximum concurrency for 2,048 tokens per request: 471.44x
INFO Actual usage is 15.40 GiB for consumed memory (weights + non-torch), 1.62 GiB for peak activation, and 0.45 \
GiB for CUDAGraph memory."""


def test_parse_034_log():
    out = parse_vllm_memory_log(LOG_034)
    assert out["model_runner"] == "v2"  # no "Using V2 Model Runner" line in 0.34, and no V1 runner
    assert out["kv_tokens"] == 965504
    assert out["memory_after_warmup"]["kv_blocks"] == 7543
    assert out["memory_after_warmup"]["reserve_gib"] == 1.62
    assert out["kv_blocks_final"] == 7543 and out["kv_gib_final"] == 117.86
    assert out["actual_usage"]["weights_gib"] == 15.02
    # a 0.33-style log without the runner line still reads as V1
    assert parse_vllm_memory_log("GPU KV cache size: 1,000 tokens")["model_runner"] == "v1"


def _lane_entry(spec, log):
    return {"id": spec["id"], "spec": spec, "status": "ok", "log": log,
            "result": {"engine_kwargs": {"max_num_seqs": spec.get("max_num_seqs")}, "vllm_version": "0.34.0"}}


def test_034_engine_ingests_and_scores_against_the_committed_prediction(tmp_path):
    from bench import gpu_campaign, preregister_v034
    from bench.memory import record_from_engine

    spec = gpu_campaign.phases034()["M034"][0][3][0]
    assert spec["util"] is None and spec["id"].endswith("-udef-L8192")
    rec = record_from_engine(_lane_entry(spec, LOG_034), "vllm-0.34/2026-12-04/M034_gpu0.json")
    assert rec["util"] is None and "_udef_" in rec["case"] and rec["vllm_version"] == "0.34.0"
    lane = tmp_path / "M034_gpu0.json"
    lane.write_text(json.dumps({"configs": [_lane_entry(spec, LOG_034)]}))
    rows, errors = preregister_v034.score_memory([lane])
    committed = {p["id"]: p for p in json.loads(preregister_v034.MEMORY_OUT.read_text())["predictions"]}
    assert len(rows) == 1 and errors[0] == pytest.approx(committed[spec["id"]]["kv_tokens"] / 965504 - 1)


def test_034_phases_are_preregistered_and_never_select_runner_v1():
    from bench import gpu_campaign, preregister_v034

    table = gpu_campaign.phases034()
    m034 = table["M034"][0][3]
    assert len({(e["target"], e.get("draft"), e["util"]) for e in m034}) >= 8
    assert any(e["util"] is None for e in m034) and any(e["util"] == 0.9 for e in m034)
    committed = {p["id"] for p in json.loads(preregister_v034.MEMORY_OUT.read_text())["predictions"]}
    steps = json.loads(preregister_v034.STEP_OUT.read_text())["predictions"]
    for ph in ("M034", "S034", "S034-first"):
        for e in table[ph][0][3]:
            assert e["id"] in committed
            assert (e.get("env") or {}).get("VLLM_USE_V2_MODEL_RUNNER") not in ("0", 0)
    assert {p["method"] for p in steps} == {"draft_model", "eagle3", "ngram"}


def test_034_sliding_window_groups_follow_block_64():
    # Gemma-2-9b at 2048 tokens: 2048/64 = 32 full-layer blocks + cdiv(min(4095 + in-flight, 2048), 64) + 1 = 33
    # sliding-layer blocks per request (0.33, 16-token blocks: 128 + 129).
    p = _plan("Gemma-2-9b", util=0.85, rules=resolve_target("0.34.0").rules)
    assert p.block_size == 64 and p.kv_blocks_per_request == 32 + 33
