"""A target's measured draft-loop factor (speedup/loop_factor.py, bench/draft_loop_factor.py) and the draft's
model-level sliding window (memory/plan.py cache_sliding_window): both from the nineteenth session's H200 engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
DRAFTFIT = [sys.executable, "-m", "draftfit"]
RECORDS = ROOT / "draftfit" / "data" / "reference" / "memory"


def test_factor_file_is_what_the_raw_engines_give():
    """The shipped factor is recomputed from the raw files by the bench's own path: no hand-set number."""
    import draft_loop_factor as bench
    from draftfit.speedup.loop_factor import LOOP_FACTOR_FILE

    doc = bench.measure()
    assert json.loads(LOOP_FACTOR_FILE.read_text()) == json.loads(json.dumps(doc))
    row = doc["targets"]["Qwen1.5-MoE-A2.7B"]
    assert row["n_pairs"] >= bench.MIN_PAIRS and row["n_leases"] >= bench.MIN_LEASES
    assert 1.2 < row["factor"] < 1.8 and row["low"] <= row["factor"] <= row["high"]
    # Only engines whose (target, draft) has no calibration table: the table's own pair is never in it.
    assert all((p["target"], p["draft"]) != ("Qwen1.5-MoE-A2.7B", "Qwen1.5-0.5B") for p in doc["pairs"])
    assert set(doc["targets"]) == {"Qwen1.5-MoE-A2.7B"}  # Qwen3-8B: one pair in one lease, not enough


def test_one_lease_is_not_enough(monkeypatch):
    """The same engines from one lease alone (the nineteenth session's four pairs) give no factor."""
    import draft_loop_factor as bench

    monkeypatch.setattr(bench, "LEASES", {k: v for k, v in bench.LEASES.items() if "nineteenth" in v})
    doc = bench.measure()
    assert doc["targets"] == {}
    assert any(x["target"] == "Qwen1.5-MoE-A2.7B" and "leases" in x["why"] for x in doc["excluded"])


def test_prior_charges_the_factor_beside_that_target_only():
    from draftfit.speedup.loop_factor import draft_loop_factor
    from draftfit.speedup.stepcost import fitted_overheads, gpu_spec, model_spec, prior_step_cost

    ov, h200 = fitted_overheads(), gpu_spec("H200")
    qm, q06 = model_spec("Qwen1.5-MoE-A2.7B"), model_spec("Qwen3-0.6B")
    f = draft_loop_factor(qm, q06).factor

    def loop(t, d, factor=None):
        sc = prior_step_cost(t, d, h200, batch=1, k_values=[2, 6], context_len=112, overheads=ov, loop_factor=factor)
        return sc.spec_step_ms[6] - sc.spec_step_ms[2]

    # Four more host-bound passes of 28 layers, each layer at the fitted cost times the factor.
    assert loop(qm, q06) - loop(qm, q06, 1.0) == pytest.approx(4 * 28 * ov["draft_layer_ms"] * (f - 1), rel=1e-6)
    for t, d in [("Mixtral-8x7B", "Mistral-7B-v0.1"), ("Qwen3-8B", "Qwen3-0.6B"), ("Qwen3-30B-A3B", "Qwen3-0.6B")]:
        assert draft_loop_factor(model_spec(t), model_spec(d)) is None
        assert loop(model_spec(t), model_spec(d)) == loop(model_spec(t), model_spec(d), 1.0)
    # Heads and model-free drafters do not run the draft_model loop it was measured on; other vLLMs have none.
    assert draft_loop_factor(qm, model_spec("EAGLE3-Qwen3-8B")) is None
    assert draft_loop_factor(qm, q06, "0.33") is None


def test_speedup_says_it_beside_the_target(tmp_path):
    env = dict(__import__("os").environ, DRAFTFIT_STORE=str(tmp_path / "s.sqlite"))
    base = DRAFTFIT + ["speedup", "--target", "Qwen1.5-MoE-A2.7B", "--gpu", "H200", "--batch", "1", "--json"]
    out = subprocess.run(base + ["--draft", "Qwen3-0.6B", "--vllm-version", "0.26"], capture_output=True, text=True,
                         cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    notes = json.loads(out.stdout)["notes"]
    assert any("beside Qwen1.5-MoE-A2.7B" in n and "measured engine pairs" in n for n in notes)
    # Its calibrated pair reads its own table: no factor note there.
    out = subprocess.run(base + ["--draft", "Qwen1.5-0.5B", "--vllm-version", "0.26"], capture_output=True,
                         text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert not any("measured engine pairs" in n for n in json.loads(out.stdout)["notes"])


def test_draft_takes_the_targets_model_level_window():
    """vLLM 0.26 builds the draft under the target's cache config: beside Mistral-7B-v0.1 (window 4096 on every
    layer) TinyLlama's layers slide too, one group; the record is within 1 % of vLLM's log only so."""
    from draftfit.catalog.specs import spec_from_config
    from draftfit.memory.plan import cache_sliding_window, kv_cache_groups, predict_record
    from draftfit.speedup.stepcost import model_spec

    rec = json.loads((RECORDS / "gpu_h200_mistral-7b-v0.1+tinyllama-1.1b_k6_tp1_u0.85_l2048_s128.json").read_text())
    tiny = spec_from_config(rec["draft_config"], name="TinyLlama-1.1B")
    m7 = model_spec("Mistral-7B-v0.1")
    assert cache_sliding_window(m7) == 4096
    kvg = kv_cache_groups(m7, tiny, num_speculative_tokens=6)
    assert not kvg.hybrid and [(g.kind, g.window, g.layers, g.draft_layers) for g in kvg.groups] == \
        [("sliding", 4096, 54, 22)]
    plan = predict_record(rec)
    assert abs(plan.kv_tokens - rec["kv_tokens"]) / rec["kv_tokens"] < 0.01
    # A target without a window (Mixtral) leaves a draft's own; an interleaved target (Gemma-2) has no model-level
    # window, so its draft keeps its per-layer windows and the pair stays in several groups (vLLM 0.26 fails it).
    assert cache_sliding_window(model_spec("Mixtral-8x7B")) == 0
    assert cache_sliding_window(model_spec("Gemma-2-9b")) == 0
    gemma = kv_cache_groups(model_spec("Gemma-2-9b"), model_spec("Gemma-2-2b"), num_speculative_tokens=2)
    assert gemma.hybrid and {g.kind for g in gemma.groups} == {"sliding", "full"}
    # A dense target without a window: unchanged, one full-attention group.
    one = kv_cache_groups(model_spec("Llama-3.1-8B"), tiny, num_speculative_tokens=4)
    assert [(g.kind, g.layers) for g in one.groups] == [("full", 54)]
