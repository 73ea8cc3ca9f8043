"""Memory stage: exact against vLLM on CPU (stored records + one live run), shape rules, CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.catalog.specs import GpuSpec, resolve_gpu, resolve_model, spec_from_config
from draftfit.errors import DraftfitError
from draftfit.memory.plan import (
    GIB,
    SYNTHETIC_DRAFT_CONFIG,
    SYNTHETIC_TARGET_CONFIG,
    kv_bytes_per_token,
    logged_kv_tokens,
    padded_vocab,
    parse_vllm_memory_log,
    plan_memory,
    plan_memory_cpu,
    predict_record,
    weights_bytes_per_rank,
)
from draftfit.paths import DATA_DIR

RECORDS = sorted((DATA_DIR / "reference" / "memory").glob("*.json"))
CPU_RECORDS = [p for p in RECORDS if json.loads(p.read_text()).get("backend") == "cpu"]
GPU_RECORDS = [p for p in RECORDS if json.loads(p.read_text()).get("backend", "gpu") == "gpu"]


def _spec(**over):
    cfg = {**SYNTHETIC_TARGET_CONFIG, **over}
    return spec_from_config(cfg, name=over.pop("name", "m") if "name" in over else "m")


def test_cpu_records_exist_for_synthetic_and_real_pair():
    names = {p.stem for p in CPU_RECORDS}
    assert "cpu_synthetic_pair" in names
    assert any("qwen2.5-coder" in n for n in names), "the real Qwen2.5-Coder pair record is missing"


@pytest.mark.parametrize("path", CPU_RECORDS, ids=[p.stem for p in CPU_RECORDS])
def test_cpu_record_predicted_exactly(path):
    rec = json.loads(path.read_text())
    plan = predict_record(rec)
    assert plan.kv_tokens == rec["kv_tokens"], rec["log_lines"]
    # The stored number is the one in vLLM's own log line.
    assert any(f"{rec['kv_tokens']:,} tokens" in line for line in rec["log_lines"])


@pytest.mark.parametrize("path", GPU_RECORDS, ids=[p.stem for p in GPU_RECORDS])
def test_gpu_record_within_band(path):
    rec = json.loads(path.read_text())
    plan = predict_record(rec)
    assert plan.kv_tokens_low <= rec["kv_tokens"] <= plan.kv_tokens_high, (plan.kv_tokens, rec["kv_tokens"])
    if rec.get("log", {}).get("model_loading_gib"):  # weights are shape arithmetic: within 2 %
        assert plan.weights_gib == pytest.approx(rec["log"]["model_loading_gib"], rel=0.02)


def test_gpu_records_cover_the_issue_cases():
    recs = [json.loads(p.read_text()) for p in GPU_RECORDS]
    pairs = {(r["target"], r.get("draft"), r["tp"]) for r in recs}
    for need in [("Llama-3.1-8B", None, 1), ("Llama-3.1-8B", "Llama-3.2-1B", 1), ("Qwen3-8B", "Qwen3-0.6B", 1),
                 ("Qwen2.5-Coder-32B", "Qwen2.5-Coder-7B", 1), ("Llama-3.1-70B", "Llama-3.1-8B", 2),
                 ("Llama-3.1-70B", "Llama-3.2-1B", 2)]:
        assert need in pairs, need
    assert len({r["util"] for r in recs}) >= 2 and len({r["max_model_len"] for r in recs}) >= 2


def _kv_error(path) -> tuple[float, str]:
    """draftfit's KV tokens against the record's vLLM log: (relative error, the line that says both)."""
    rec = json.loads(path.read_text())
    plan = predict_record(rec)
    err = (plan.kv_tokens - rec["kv_tokens"]) / rec["kv_tokens"]
    return err, f"draftfit {plan.kv_tokens:,} vs vLLM {rec['kv_tokens']:,} ({100 * err:+.2f}%)"


@pytest.mark.parametrize("path", GPU_RECORDS, ids=[p.stem for p in GPU_RECORDS])
def test_gpu_record_kv_tokens_within_3_percent(path):
    # The modelled terms (activation, non-torch, CUDA-graph estimate) come from shapes and the engine
    # arguments only; the record's own 'Actual usage' numbers are never read by predict_record.
    err, said = _kv_error(path)
    assert abs(err) <= 0.03, said


# Records whose modelled terms are known to miss vLLM's 'Actual usage' line, with why; strict: a fix must drop them.
_QWEN3_HEAD_ODD_K_GAP = (
    "peak activation 2.09 GiB modelled, 2.50 logged at K=1 and K=3 (2.03 at K=2 and K=4, the same engine otherwise): "
    "the EAGLE-3 head adds 0.91 GiB on Qwen3-8B at odd K, 0.44 at even K and 0.44-0.54 on Llama-3.1-8B with the same "
    "widths; the three fused hidden states explain the even-K and Llama figures, not the odd-K rest (KV +0.38 %)")
KNOWN_TERM_GAPS = {
    "gpu_h200_qwen3-8b+eagle3-qwen3-8b_k1_tp1_u0.85_l2048_s128": _QWEN3_HEAD_ODD_K_GAP,
    "gpu_h200_qwen3-8b+eagle3-qwen3-8b_k3_tp1_u0.85_l2048_s128": _QWEN3_HEAD_ODD_K_GAP,
}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=KNOWN_TERM_GAPS[p.stem]))
                                  if p.stem in KNOWN_TERM_GAPS else p for p in GPU_RECORDS],
                         ids=[p.stem for p in GPU_RECORDS])
def test_gpu_record_runner_and_scheduler_as_vllm_ran(path):
    rec = json.loads(path.read_text())
    plan = predict_record(rec)
    assert plan.model_runner == rec["log"]["model_runner"]  # V2 alone, V1 with a draft_model drafter
    ran = rec.get("vllm_scheduler") or {}
    if ran.get("max_num_batched_tokens"):
        assert plan.max_num_batched_tokens == ran["max_num_batched_tokens"]
    if ran.get("max_num_seqs"):
        assert plan.max_num_seqs == ran["max_num_seqs"]
    # Each modelled term against vLLM's own 'Actual usage' line (loose: a term off by more than this
    # would mean the model is wrong, not noisy).
    au = rec["log"]["actual_usage"]
    assert plan.peak_activation_gib == pytest.approx(au["peak_activation_gib"], rel=0.1, abs=0.1)
    assert plan.non_torch_gib == pytest.approx(au["non_torch_gib"], abs=0.05)
    if plan.model_runner == "v1":
        assert plan.cudagraph_reserved_gib == pytest.approx(rec["log"]["cudagraph_estimated_gib"], abs=0.3) or \
            rec["log"]["cudagraph_estimated_gib"] > 2 * plan.cudagraph_reserved_gib  # vLLM's noisy sample
    else:
        assert plan.cudagraph_reserved_gib == 0


@pytest.mark.vllm
def test_live_vllm_cpu_synthetic_pair(tmp_path):
    from draftfit.memory.plan import run_vllm_cpu, write_synthetic_pair

    target_dir, draft_dir = write_synthetic_pair(tmp_path)
    parsed = run_vllm_cpu(target_dir, draft_dir, max_model_len=1000, k=3, kvcache_space_gib=1)
    t = spec_from_config(SYNTHETIC_TARGET_CONFIG, name="t")
    d = spec_from_config(SYNTHETIC_DRAFT_CONFIG, name="d")
    plan = plan_memory_cpu(t, d, kvcache_space_gib=1, max_model_len=1000)
    assert parsed["kv_device"] == "CPU"
    assert plan.kv_tokens == parsed["kv_tokens"]


def test_cpu_pool_arithmetic():
    t = spec_from_config(SYNTHETIC_TARGET_CONFIG, name="t")
    d = spec_from_config(SYNTHETIC_DRAFT_CONFIG, name="d")
    plan = plan_memory_cpu(t, d, kvcache_space_gib=1, max_model_len=1024)
    per_token = 4 * 2 * 2 * 64 * 4 + 2 * 2 * 1 * 64 * 4  # layers x K,V x kv heads x head_dim x fp32
    assert plan.kv_bytes_per_token == per_token
    assert plan.kv_blocks == GIB // (128 * per_token)
    assert plan.draft_pool_share == pytest.approx(1024 / 5120, abs=1e-4)


def test_logged_tokens_follow_vllm_float_arithmetic():
    # int(num_blocks / cdiv(len, bs) * len): not num_blocks * bs when len is not a block multiple.
    assert logged_kv_tokens(2000, 1000, 128) == int(2000 / 8 * 1000) == 250000
    assert logged_kv_tokens(2000, 1024, 128) == 256000


def test_gqa_kv_heads_replicated_when_fewer_than_tp():
    m = _spec(num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_hidden_layers=4)
    assert kv_bytes_per_token(m, 1, 2) == 4 * 2 * 2 * 64 * 2
    assert kv_bytes_per_token(m, 2, 2) == 4 * 2 * 1 * 64 * 2
    # TP=4 > 2 KV heads: each rank keeps one whole (replicated) head, not half of one.
    assert kv_bytes_per_token(m, 4, 2) == kv_bytes_per_token(m, 2, 2)
    w2 = weights_bytes_per_rank(m, 2, 2)["linear"]
    w4 = weights_bytes_per_rank(m, 4, 2)["linear"]
    assert w4 > w2 / 2  # replicated K/V projections do not shrink


def test_vocab_padded_to_64_and_sharded():
    assert padded_vocab(151665) == 151680
    assert padded_vocab(128256) == 128256
    m = _spec(vocab_size=1000, hidden_size=256, tie_word_embeddings=False)
    w1 = weights_bytes_per_rank(m, 1, 2)
    w2 = weights_bytes_per_rank(m, 2, 2)
    assert w1["embedding"] == 1024 * 256 * 2
    assert w2["embedding"] == 512 * 256 * 2
    assert w1["lm_head"] == w1["embedding"]


def test_tied_embeddings_counted_once():
    tied = weights_bytes_per_rank(_spec(tie_word_embeddings=True), 1, 2)
    untied = weights_bytes_per_rank(_spec(tie_word_embeddings=False), 1, 2)
    assert tied["lm_head"] == 0
    assert untied["total"] - tied["total"] == padded_vocab(SYNTHETIC_TARGET_CONFIG["vocab_size"]) * 256 * 2


def test_known_weight_totals_match_vllm_load_logs():
    # "Model loading took 14.99 GiB" is what vLLM prints for Llama-3.1-8B in bf16 on one GPU.
    plan = plan_memory(resolve_model("Llama-3.1-8B"), None, resolve_gpu("H200"), max_model_len=8192)
    assert plan.target_weights_gib == pytest.approx(14.99, abs=0.02)


def test_heads_not_divisible_by_tp_is_a_clear_error():
    m = _spec(num_attention_heads=12, num_key_value_heads=2, head_dim=64)
    with pytest.raises(DraftfitError) as e:
        plan_memory(m, None, resolve_gpu("H200"), tp=8, max_model_len=1024)
    assert "not divisible by TP=8" in e.value.message and "--tp" in e.value.fix


def test_draft_must_shard_at_target_tp():
    t = resolve_model("Llama-3.1-70B")
    d = _spec(num_attention_heads=6, num_key_value_heads=2, head_dim=64, name="odd")
    with pytest.raises(DraftfitError, match="draft"):
        plan_memory(t, d, resolve_gpu("H100-80GB"), tp=4, max_model_len=8192)


def test_fp8_kv_halves_bytes_and_grows_tokens():
    t, d, g = resolve_model("Llama-3.1-8B"), resolve_model("Llama-3.2-1B"), resolve_gpu("H100-80GB")
    a = plan_memory(t, d, g, max_model_len=8192)
    b = plan_memory(t, d, g, max_model_len=8192, kv_cache_dtype="fp8")
    assert b.kv_bytes_per_token * 2 == a.kv_bytes_per_token
    assert b.kv_tokens == pytest.approx(2 * a.kv_tokens, rel=0.01)


def test_draft_adds_weights_and_kv_and_share():
    t, d, g = resolve_model("Llama-3.1-70B"), resolve_model("Llama-3.2-1B"), resolve_gpu("H200")
    alone = plan_memory(t, None, g, tp=2, max_model_len=8192)
    pair = plan_memory(t, d, g, tp=2, max_model_len=8192)
    assert pair.weights_gib > alone.weights_gib
    assert pair.kv_tokens < alone.kv_tokens
    # 70B: 80 layers x 4 KV heads/rank x 128; 1B: 16 layers x 4 KV heads/rank (8 / TP 2) x 64.
    assert pair.draft_pool_share == pytest.approx(16 * 4 * 64 / (80 * 4 * 128 + 16 * 4 * 64), abs=1e-4)


def test_model_that_cannot_fit_names_the_tp():
    with pytest.raises(DraftfitError) as e:
        plan_memory(resolve_model("Llama-3.1-70B"), None, resolve_gpu("H100-80GB"), tp=1, max_model_len=8192)
    assert "--tp" in e.value.fix


def test_tight_layout_gets_fixes_with_numbers():
    # 22 GiB: room for the 17.3 GiB of weights and ~1 GiB of profiled overheads, not for a 128k request.
    gpu = GpuSpec(name="tiny", memory_gib=22, bandwidth_gbps=1, bf16_tflops=1)
    plan = plan_memory(resolve_model("Llama-3.1-8B"), resolve_model("Llama-3.2-1B"), gpu, max_model_len=131072,
                       max_num_seqs=64, max_num_batched_tokens=2048)
    assert not plan.fits and plan.fix
    assert plan.fixes and all(f["kv_tokens"] > 0 for f in plan.fixes)
    assert any("fp8" in f["fix"] or "max-model-len" in f["fix"] for f in plan.fixes)


def test_parse_log_v1_and_v2_wordings():
    text = """
INFO [core.py:117] Initializing a V1 LLM engine (v0.26.0) with config: model='x'
INFO [gpu_worker.py:378] Using V2 Model Runner
INFO [model_runner.py:306] Model loading took 14.99 GiB and 3.2 seconds
INFO [gpu_worker.py:560] Available KV cache memory: 108.45 GiB
INFO [kv_cache_utils.py:2177] GPU KV cache size: 888,432 tokens
INFO [kv_cache_utils.py:2178] Maximum concurrency for 8,192 tokens per request: 108.45x
INFO [gpu_worker.py:850] Free memory on device (139.2/139.81 GiB) on startup. Desired GPU memory utilization is (0.9, 125.83 GiB). Actual usage is 14.99 GiB for weight, 1.6 GiB for peak activation, 0.12 GiB for non-torch memory, and 0.49 GiB for CUDAGraph memory. Replace ...
"""
    out = parse_vllm_memory_log(text)
    assert out["kv_tokens"] == 888432 and out["kv_device"] == "GPU"
    assert out["model_loading_gib"] == 14.99 and out["available_kv_gib"] == 108.45
    assert out["actual_usage"]["cudagraph_gib"] == 0.49 and out["total_gib"] == 139.81
    assert out["model_runner"] == "v2" and out["vllm_version"] == "0.26.0"
    v1 = parse_vllm_memory_log("Model loading took 17.3 GiB memory and 5.1 seconds\nGPU KV cache size: 1,024 tokens")
    assert v1["model_loading_gib"] == 17.3 and v1["model_runner"] == "v1"


def _cli(args):
    from draftfit.cli import cli

    return CliRunner().invoke(cli, args)


def test_cli_json_keys_and_speed():
    start = time.perf_counter()
    r = _cli(["memory", "Llama-3.1-8B", "--draft", "Llama-3.2-1B", "--gpu", "H200", "--max-model-len", "8192",
              "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    for key in ("kv_tokens", "kv_bytes_per_token", "weights_gib", "fits", "draft_pool_share", "source"):
        assert key in out
    assert out["source"].startswith("estimate: draftfit model of vLLM")
    assert time.perf_counter() - start < 1.0


def test_cli_table_says_estimate():
    r = _cli(["memory", "Qwen2.5-Coder-32B", "--draft", "Qwen2.5-Coder-7B", "--gpu", "H200", "--gpu", "A100-80GB",
              "--max-model-len", "32768"])
    assert r.exit_code == 0, r.output
    assert "KV tokens" in r.output and "estimate" in r.output and "A100-80GB" in r.output
    assert "--tensor-parallel-size 2" in r.output  # the A100 cannot hold 75 GiB of weights at TP=1


def test_cli_unknown_gpu_exit_2():
    from draftfit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["memory", "Llama-3.1-8B", "--gpu", "H9000"])
    assert e.value.code == 2


def _is_moe_or_sliding(rec: dict) -> bool:
    cfgs = [rec.get("target_config") or {}, rec.get("draft_config") or {}]
    # Qwen2 configs carry a sliding_window with use_sliding_window false: full attention, not counted.
    return any(c.get("num_experts") or c.get("num_local_experts") or c.get("layer_types")
               or (c.get("sliding_window") and c.get("use_sliding_window", True)) for c in cfgs)


MOE_OR_SLIDING = [p for p in GPU_RECORDS if _is_moe_or_sliding(json.loads(p.read_text()))]


def test_moe_and_sliding_records_cover_both_contexts():
    recs = [json.loads(p.read_text()) for p in MOE_OR_SLIDING]
    assert len(recs) >= 30
    assert {2048, 8192} <= {r["max_model_len"] for r in recs}
    assert {"Mixtral-8x7B", "Qwen1.5-MoE-A2.7B", "Qwen3-30B-A3B", "Gemma-2-9b"} <= {r["target"] for r in recs}


@pytest.mark.parametrize("path", MOE_OR_SLIDING, ids=[p.stem for p in MOE_OR_SLIDING])
def test_moe_and_sliding_records_kv_within_1_percent(path):
    # Issue 16's bar for MoE, sliding-window and linear-attention engines. Two of these records fit a constant:
    # Mixtral-8x7B alone at 2048 tokens (fwd_attn_q_copies) and Qwen3-Next's shapes alone at 8192 tokens
    # (cg_per_graph_mib_per_linear_layer); the rest are checks.
    err, said = _kv_error(path)
    assert abs(err) <= 0.01, said


def test_v1_sampler_peak_depends_on_speculation():
    # vLLM 0.26's V1 runner runs the rejection sampler on 2R fresh rows only with speculative decoding: an
    # MoE target alone (V1 in 0.26) stops at the sampler. The pre-registered model charged the pair's 31.9 B
    # per logit to the target alone too: 5.62 GiB of activations against vLLM's 3.21 (-3.95 % KV tokens).
    rec = json.loads((DATA_DIR / "reference" / "memory" /
                      "gpu_h200_qwen3-30b-a3b_tp1_u0.85_l8192_s1024.json").read_text())
    alone = predict_record(rec)
    assert alone.model_runner == "v1" and alone.max_num_seqs == 1024
    assert alone.peak_activation_gib == pytest.approx(rec["log"]["actual_usage"]["peak_activation_gib"], abs=0.25)
    pair = predict_record(dict(rec, draft="Qwen3-0.6B", num_speculative_tokens=4,
                               draft_config=json.loads((DATA_DIR / "reference" / "memory" /
                                   "gpu_h200_qwen3-30b-a3b+qwen3-0.6b_k1_tp1_u0.85_l2048_s128.json"
                                   ).read_text())["draft_config"]))
    # The pair of the same engine at 8192 tokens started on the H200 and logged 274,240 KV tokens before the
    # campaign's deadline stopped its graph capture (data/calibration/raw/2026-12-02/MC_gpu0.json).
    assert pair.peak_activation_gib > alone.peak_activation_gib + 2.0
    assert abs(pair.kv_tokens / 274_240 - 1) < 0.01


def test_attention_phase_never_changes_a_dense_catalog_forward():
    # fwd_attn_q_copies is the peak only where the MLP phase is small (MoE layers): every dense catalog
    # model's MLP phase (3 x intermediate) is larger, so dense predictions are unchanged by it.
    from draftfit.catalog.specs import load_models
    from draftfit.memory.plan import MODEL_CONSTANTS as C

    dense = [m for m in load_models() if not getattr(m, "num_experts", 0) and m.intermediate_size]
    assert len(dense) >= 10
    for m in dense:
        assert C["fwd_intermediate_copies"] * m.intermediate_size > \
            C["fwd_attn_q_copies"] * m.num_attention_heads * m.head_dim, m.name


def test_ingest_never_rewrites_a_record_on_file(tmp_path, monkeypatch):
    """A second start of an engine already on file (a timed phase's baseline) leaves the first record alone: the
    memory constants were fitted on the first."""
    from bench import memory as bench_memory

    monkeypatch.setattr(bench_memory, "RECORDS", tmp_path)
    raw = Path(__file__).resolve().parent.parent / "data" / "calibration" / "raw" / "2026-12-02"
    first = bench_memory.ingest([str(raw / "HE_gpu0.json")])
    assert first and all(p.parent == tmp_path for p in first)
    before = {p.name: p.read_bytes() for p in first}
    again = bench_memory.ingest([str(raw / "HER_gpu0.json"), str(raw / "HE_gpu0.json")])
    assert not {p.name for p in again} & set(before)  # the -r2 starts of those cases are not written
    assert {p.name: p.read_bytes() for p in first} == before
