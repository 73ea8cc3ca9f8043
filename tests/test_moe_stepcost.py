"""MoE in the step-cost model: expert coverage of a step's tokens, dense models untouched, and the held-out
prediction for Qwen3-30B-A3B + Qwen3-0.6B committed before it was measured (issue 16)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftfit.engine import resolve_target
from draftfit.calibration.tables import tables_digest
from draftfit.speedup.stepcost import (eager_host_ms, expert_coverage, expert_params_per_layer, forward_ms, gpu_spec,
                                       model_spec, prior_step_cost, weight_bytes_per_rank)


ROOT = Path(__file__).resolve().parent.parent
PREDICTIONS = sorted((ROOT / "draftfit" / "data" / "predictions").glob("*_Qwen3-30B-A3B__Qwen3-0.6B__H200__tp1__a0.8*.json"))


def _expert_bytes(spec, tokens: int) -> float:
    return expert_params_per_layer(spec) * spec.num_layers * expert_coverage(spec.num_experts, spec.num_experts_per_tok,
                                                                             tokens) * 2


def test_expert_coverage_formula():
    assert expert_coverage(128, 8, 1) == pytest.approx(8)  # one token reads exactly its top-k
    assert expert_coverage(128, 8, 0) == 0.0
    assert expert_coverage(128, 8, 32) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 32))
    assert expert_coverage(128, 8, 10_000) == pytest.approx(128)  # never more than every expert
    assert expert_coverage(8, 2, 3) == pytest.approx(8 * (1 - 0.75 ** 3))


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_verify_reads_k_plus_one_times_the_experts_at_batch_1_and_about_the_same_at_batch_32(k):
    """128 experts top-8 (Qwen3-30B-A3B): verifying K+1 tokens at batch 1 reads nearly K+1 times the expert
    weights of a plain one-token step; at batch 32 the plain step already covers ~112 of 128 experts."""
    moe = model_spec("Qwen3-30B-A3B")
    ratio_1 = _expert_bytes(moe, k + 1) / _expert_bytes(moe, 1)
    assert 0.8 * (k + 1) < ratio_1 <= k + 1
    ratio_32 = _expert_bytes(moe, 32 * (k + 1)) / _expert_bytes(moe, 32)
    assert 1.0 <= ratio_32 < 1.15
    # The whole weight traffic (attention, router, LM head read every step) moves the same way, less.
    whole_1 = weight_bytes_per_rank(moe, 1, k + 1) / weight_bytes_per_rank(moe, 1, 1)
    assert 1 + 0.4 * k < whole_1 < k + 1
    assert weight_bytes_per_rank(moe, 1, 32 * (k + 1)) / weight_bytes_per_rank(moe, 1, 32) < 1.15


def test_dense_weight_traffic_does_not_depend_on_tokens_and_shared_experts_always_count():
    dense = model_spec("Llama-3.1-8B")
    assert weight_bytes_per_rank(dense, 1, 512) == weight_bytes_per_rank(dense, 1, 1) == weight_bytes_per_rank(dense, 1)
    qmoe = model_spec("Qwen1.5-MoE-A2.7B")  # 60 experts top-4 and a 5632-wide shared expert
    shared = 3 * qmoe.hidden_size * qmoe.shared_expert_intermediate_size * qmoe.num_layers * 2
    one = weight_bytes_per_rank(qmoe, 1, 1)
    assert one - (weight_bytes_per_rank(qmoe, 1, 1) - shared) == pytest.approx(shared)
    # Every expert read (many tokens): the whole checkpoint but the input embedding.
    every = weight_bytes_per_rank(qmoe, 1, 100_000)
    assert every == pytest.approx(2 * (qmoe.params_b * 1e9 - qmoe.vocab_size * qmoe.hidden_size), rel=0.02)


# Step costs of dense pairs from the step-cost model before MoE coverage existed (git HEAD at the time,
# prior overheads, batch 128, context 112): the MoE terms must leave them bit for bit.
DENSE_BEFORE = {
    ("Llama-3.1-8B", "Llama-3.2-1B", 1): (6.398011733333334, {1: 16.09744478926372, 4: 59.854683973159304,
                                                              8: 92.59766955168674}),
    ("Qwen2.5-Coder-32B", "Qwen2.5-Coder-7B", 1): (19.637102933333335, {1: 42.31114738869381, 4: 145.85308127173454,
                                                                        8: 234.84232644912217}),
    ("Llama-3.1-70B", "Llama-3.2-1B", 2): (22.151074133333335, {1: 43.129760554521546, 4: 141.73793738630388,
                                                                8: 222.015506495347}),
}


@pytest.mark.parametrize("pair", list(DENSE_BEFORE), ids=lambda p: f"{p[0]}+{p[1]}")
def test_dense_prior_is_unchanged_by_the_moe_terms(pair):
    target, draft, tp = pair
    # Since 2026-12-05 (docs/benchmarks.md speedup-ablation) one per-layer host cost serves every TP, so the TP>1
    # prior of then (0.15 ms a layer) is passed in, and no cost per sequence per draft pass is charged (below).
    sc = prior_step_cost(model_spec(target), model_spec(draft), gpu_spec("H200"), batch=128, k_values=[1, 4, 8],
                         tp=tp, context_len=112, overheads={"draft_layer_ms": 0.15} if tp > 1 else None)
    base, spec = DENSE_BEFORE[pair]
    # Since issue 37 (item 5) the streamed weights are catalog.shapes', the memory plan's parameter counts: norms,
    # Qwen2's q/k/v biases and the LM head's padded rows are read too, a few MB of 15-140 GB (under 1e-4 of a step).
    # Anything an MoE term leaked into a dense step would be far larger.
    rel = 1e-4
    assert sc.base_step_ms == pytest.approx(base, rel=rel)
    # Since 2026-12-02 the draft's first pass runs over the B x (K+1) verified tokens (first_pass_roofline_ms, from
    # vLLM's proposer): the only change to these numbers, by exactly that pass's roofline difference.
    t, d, g = model_spec(target), model_spec(draft), gpu_spec("H200")
    one = forward_ms(d, g, batch=128, tokens_per_seq=1, context_len=112, tp=tp)
    moved = {k: v - one + forward_ms(d, g, batch=128, tokens_per_seq=k + 1, context_len=112, tp=tp)
             for k, v in spec.items()}
    # Since 2026-12-03 a verify and first pass over more than 512 tokens (batch 128 at K 4 and 8) cost the longer of
    # their GPU work and their measured launch time (eager_forward_ms) where a prior 0.4 ms per layer was added.
    for k in (4, 8):
        verify = forward_ms(t, g, batch=128, tokens_per_seq=k + 1, context_len=112, tp=tp)
        first = forward_ms(d, g, batch=128, tokens_per_seq=k + 1, context_len=112, tp=tp)
        moved[k] += -0.4 * (t.num_layers + d.num_layers) - verify - first \
            + max(verify, eager_host_ms(t)) + max(first, eager_host_ms(d))
    assert moved[1] > spec[1]  # at batch 128 the first pass is dearer
    # the removed cost per sequence per draft pass: K x 128 sequences x its 0.01 ms prior
    moved = {k: v - k * 128 * 0.01 for k, v in moved.items()}
    assert sc.spec_step_ms == pytest.approx(moved, rel=rel)


def test_moe_target_gains_at_batch_32_and_loses_at_batch_1():
    """The reversal issue 16 measured: with a 0.6B dense draft, speculation on the 128-expert MoE loses at batch
    1 (the verify reads K+1 tokens' experts) and gains at batch 32 (the plain step reads nearly all of them)."""
    t, d, g = model_spec("Qwen3-30B-A3B"), model_spec("Qwen3-0.6B"), gpu_spec("H200")
    b1 = prior_step_cost(t, d, g, batch=1, k_values=[2, 4], context_len=112)
    b32 = prior_step_cost(t, d, g, batch=32, k_values=[2, 4], context_len=112)
    assert b32.verify_ms[4] / b32.base_step_ms < 1.3 < b1.verify_ms[4] / b1.base_step_ms
    # An MoE draft pays coverage too: its pass at batch 32 reads far more than at batch 1.
    moe_draft = model_spec("Qwen1.5-MoE-A2.7B")
    assert forward_ms(moe_draft, g, batch=32, tokens_per_seq=1, context_len=112) > \
        3 * forward_ms(moe_draft, g, batch=1, tokens_per_seq=1, context_len=112)


@pytest.mark.parametrize("path", PREDICTIONS, ids=lambda p: p.stem.split("__")[-1])
def test_held_out_moe_prediction_is_committed_and_is_what_the_library_predicts(path):
    """Each pre-registration (v1, v2 after the MoE tables joined the fit, v3 after the first-pass and per-version
    changes) is what the library predicted from the tables it names; an older one skips once the tables move."""
    rec = json.loads(path.read_text())
    pred = rec["prediction"]
    assert (pred["target"], pred["draft"], pred["gpu"], pred["tp"], pred["alpha"]) == \
        ("Qwen3-30B-A3B", "Qwen3-0.6B", "H200", 1, 0.8)
    assert sorted(map(int, pred["batches"])) == [1, 8, 32, 128]
    assert all(sorted(map(int, r["per_k"])) == [1, 2, 3, 4, 5, 6] for r in pred["batches"].values())
    # Held out: the file names no table of the MoE target (written before it was measured).
    assert not any("Qwen3-30B-A3B" in name for name in rec["calibration_tables"])
    if rec["calibration_tables_sha256"] != tables_digest()[1]:
        pytest.skip("calibration tables changed since the prediction was written; the file is the frozen record")
    res = subprocess.run([sys.executable, "-m", "draftfit", *rec["command"].split()[1:]], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    now = json.loads(res.stdout)
    for b, row in pred["batches"].items():
        assert now["batches"][b]["best_k"] == row["best_k"]
        for k, pk in row["per_k"].items():
            assert now["batches"][b]["per_k"][k]["speedup"] == pytest.approx(pk["speedup"], rel=1e-9)


def test_held_out_moe_table_is_in_no_fit():
    """The held-out MoE target's table (measured after its pre-registrations, phase PM) is scored, never fitted:
    the overheads fitted and the points scored are the same with and without it."""
    from draftfit.calibration.tables import load_tables, tables_of_version
    from draftfit.speedup.stepcost import HELD_OUT_TARGETS, calibration_points, fitted_overheads

    tables = tables_of_version(load_tables())
    held = [t for t in tables if t.target in HELD_OUT_TARGETS]
    assert held, "the PM table of Qwen3-30B-A3B + Qwen3-0.6B is shipped"
    rest = [t for t in tables if t.target not in HELD_OUT_TARGETS]
    assert fitted_overheads(tables=tables) == fitted_overheads(tables=rest)
    assert not list(calibration_points(held))
    assert list(calibration_points(held, include_held_out=True))  # scored by bench/speedup.py
    assert [(p.group, p.batch, p.k) for p in calibration_points(tables)] == \
        [(p.group, p.batch, p.k) for p in calibration_points(rest)]


def test_moe_layers_pay_per_token_work_a_dense_model_does_not():
    """MOE_TOKEN_LAYER_MS: each of the B x K tokens a speculative step adds costs every MoE layer (target and
    draft) its per-token work; two dense models never pay it, and the plain step never does."""
    from draftfit.speedup.stepcost import gpu_spec, model_spec, moe_extra_token_layers, prior_step_cost

    g = gpu_spec("H200")
    moe, draft = model_spec("Mixtral-8x7B"), model_spec("Mistral-7B-v0.1")
    dense = model_spec("Llama-3.1-8B")
    assert moe_extra_token_layers(moe, draft, batch=32, k=4) == 32 * 4 * moe.num_layers
    assert moe_extra_token_layers(dense, model_spec("Llama-3.2-1B"), batch=32, k=4) == 0
    assert moe_extra_token_layers(moe, moe, batch=2, k=3) == 2 * 3 * 2 * moe.num_layers

    def step(target, d, coef):
        p = prior_step_cost(target, d, g, batch=32, k_values=[4], context_len=112,
                            overheads={"moe_token_layer_ms": coef})
        return p.base_step_ms, p.spec_step_ms[4]

    (b0, s0), (b1, s1) = step(moe, draft, 0.0), step(moe, draft, 0.002)
    assert b1 == b0 and s1 - s0 == pytest.approx(0.002 * 32 * 4 * moe.num_layers)
    assert step(dense, model_spec("Llama-3.2-1B"), 0.0) == step(dense, model_spec("Llama-3.2-1B"), 0.002)


def test_moe_output_says_what_its_step_costs_assume():
    """An MoE layout's step costs name their source and the routing they assume; a dense one says nothing of it.
    The assumption's evidence: the shipped MoE tables' plain steps at batch 32-128 are within 9 % of the uniform
    coverage roofline with the fitted overheads."""
    from draftfit.calibration.tables import load_tables, tables_of_version
    from draftfit.speedup.stepcost import fitted_overheads, gpu_spec, model_spec, prior_step_cost, step_cost_model

    moe = step_cost_model("Mixtral-8x7B", "Mistral-7B-v0.1", "H200", batches=(1, 32), k_values=[2],
                          rules=resolve_target("0.26").rules)
    assert any(n.startswith("MoE: ") and "uniform" in n and "dummy weights" in n for n in moe.notes)
    dense = step_cost_model("Llama-3.1-8B", "Llama-3.2-1B", "H200", batches=(1,), k_values=[2], rules=resolve_target("0.26").rules)
    assert not any(n.startswith("MoE: ") for n in dense.notes)
    ov = fitted_overheads(tables_key="0.26")
    checked = 0
    for t in tables_of_version(load_tables()):
        target = model_spec(t.target)
        if not target.is_moe:
            continue
        for b in (32, 128):
            measured = t.baseline[str(b)]["step_ms"]
            prior = prior_step_cost(target, model_spec(t.draft), gpu_spec(t.gpu), batch=b, k_values=[1],
                                    context_len=112, overheads=ov).base_step_ms
            assert abs(prior / measured - 1) < 0.09, (t.target, b, prior, measured)
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize("cfg, layers, dense", [
    ({"first_k_dense_replace": 3, "moe_layer_freq": 1}, 61, 3),  # DeepSeek-V3
    ({"first_k_dense_replace": 1}, 46, 1),  # GLM-4.5-Air
    ({"decoder_sparse_step": 1, "mlp_only_layers": []}, 48, 0),  # Qwen3-30B-A3B
    ({"decoder_sparse_step": 2}, 24, 12),  # every other layer routed
    ({"mlp_only_layers": [0, 5]}, 24, 2),
    ({"interleave_moe_layer_step": 2}, 48, 24),  # Llama-4 Maverick
    ({}, 32, 0),  # Mixtral
])
def test_dense_mlp_layers_follow_each_architectures_rule(cfg, layers, dense):
    from draftfit.catalog.specs import dense_mlp_layers_of

    assert dense_mlp_layers_of(cfg, layers, experts=8) == dense
    assert dense_mlp_layers_of(cfg, layers, experts=0) == 0


def test_dense_mlp_layers_reach_the_spec_the_roofline_and_the_mtp_drafter(tmp_path):
    """A local DeepSeek-style folder's first_k_dense_replace layers are dense in its parameter count and its
    weight traffic; the catalog's DeepSeek-V3 says the same; its MTP layer routes (not dense)."""
    import json as _json

    from draftfit.catalog.specs import mtp_drafter, resolve_model as model_spec
    from draftfit.speedup.stepcost import weight_bytes_per_rank

    # shapes of no catalog entry (a folder matching one is that entry)
    base = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "vocab_size": 100000, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}
    specs = {}
    for name, extra in {"all-moe": {}, "first-4-dense": {"mlp_only_layers": [0, 1, 2, 3]}}.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(_json.dumps({**base, **extra}))
        specs[name] = model_spec(str(d))
    a, b = specs["all-moe"], specs["first-4-dense"]
    assert (a.dense_mlp_layers, a.moe_layers, b.dense_mlp_layers, b.moe_layers) == (0, 48, 4, 44)
    # 4 layers trade 128 experts (+ router) for one 6144-wide MLP
    assert a.params_b - b.params_b == pytest.approx(4 * (3 * 2048 * 768 * 128 + 2048 * 128 - 3 * 2048 * 6144) / 1e9,
                                                    abs=2e-3)
    # at one token a routed layer reads 8 experts (9.4M params x 2 B... less than the 37.7M dense MLP)
    diff = weight_bytes_per_rank(b, 1, tokens=1) - weight_bytes_per_rank(a, 1, tokens=1)
    assert diff == pytest.approx(4 * 2 * (3 * 2048 * 6144 - 3 * 2048 * 768 * 8 - 2048 * 128), rel=1e-6)
    v3 = model_spec("DeepSeek-V3")
    assert (v3.dense_mlp_layers, v3.moe_layers) == (3, 58)
    assert mtp_drafter(v3).moe_layers == 1


@pytest.mark.parametrize("field, value", [("first_k_dense_replace", -1), ("decoder_sparse_step", "2"),
                                          ("moe_layer_freq", True), ("mlp_only_layers", "0,1"),
                                          ("mlp_only_layers", [0, -3])])
def test_hostile_moe_placement_fields_are_one_line_errors(tmp_path, field, value):
    import json as _json

    from draftfit.catalog.specs import resolve_model as model_spec
    from draftfit.errors import DraftfitError

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(_json.dumps({
        "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 4,
        "num_attention_heads": 8, "vocab_size": 1000, "num_experts": 4, "num_experts_per_tok": 2, field: value}))
    with pytest.raises(DraftfitError) as e:
        model_spec(str(d))
    assert field in str(e.value) and "\n" not in str(e.value)


def test_untuned_fused_moe_config_matches_the_h200_logs():
    # What vLLM 0.26 logged on the H200 for each MoE target (the campaign's raw lane files) against the lookup
    # in the shipped config names (draftfit/data/vllm_flags/vllm-0.26.json, from the wheel).
    import json
    import re
    from pathlib import Path

    from draftfit.speedup.stepcost import gpu_spec, model_spec, moe_kernel_config

    raw = Path(__file__).resolve().parent.parent / "data" / "calibration" / "raw"
    seen = {}
    for f in ("2026-12-01/M1_gpu0.json", "2026-12-01/M2a_gpu0.json", "2026-12-02/PMa_gpu0.json"):
        for c in json.loads((raw / f).read_text())["configs"]:
            log = c.get("log") or ""
            m = re.search(r"configs/(E=[^ ]*?)\.json", log)
            if m:
                seen[c["spec"]["target"]] = (m.group(1), "Using default MoE config" not in log)
    assert set(seen) == {"Mixtral-8x7B", "Qwen1.5-MoE-A2.7B", "Qwen3-30B-A3B"}
    for target, (name, tuned) in seen.items():
        assert moe_kernel_config(model_spec(target), gpu_spec("H200"), tp=1, rules=resolve_target("0.26.0").rules) == (name, tuned)
    assert seen["Qwen1.5-MoE-A2.7B"][1] is False and seen["Mixtral-8x7B"][1] is True
    assert moe_kernel_config(model_spec("Llama-3.1-8B"), gpu_spec("H200"), tp=1) is None


def test_untuned_moe_config_is_said_in_the_step_cost_notes():
    from draftfit.speedup.stepcost import step_cost_model

    untuned = step_cost_model("Qwen1.5-MoE-A2.7B", "Qwen1.5-0.5B", "H200", batches=(128,), k_values=(4,),
                              rules=resolve_target("0.26.0").rules)
    tuned = step_cost_model("Mixtral-8x7B", "Mistral-7B-v0.1", "H200", batches=(128,), k_values=(4,),
                            rules=resolve_target("0.26.0").rules)
    assert any("E=60,N=1408,device_name=NVIDIA_H200" in n and "default MoE config" in n for n in untuned.notes)
    assert not any("default MoE config" in n for n in tuned.notes)


def test_rank_says_once_when_vllm_runs_the_default_moe_kernel():
    import json

    from click.testing import CliRunner

    from draftfit.cli import cli

    out = CliRunner().invoke(cli, ["rank", "--target", "Qwen1.5-MoE-A2.7B", "--gpu", "H200", "--vllm-version",
                                   "0.26.0", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    hits = [n for n in doc["layout_notes"] if "default MoE config" in n]
    assert len(hits) == 1 and "E=60,N=1408,device_name=NVIDIA_H200" in hits[0]
    tuned = json.loads(CliRunner().invoke(cli, ["rank", "--target", "Mixtral-8x7B", "--gpu", "H200", "--json"]).output)
    assert not any("default MoE config" in n for n in tuned["layout_notes"])
    # The same expert shape is tuned for the MI300X (E=60,N=1408,device_name=AMD_Instinct_MI300X ships): no note.
    assert not any("default MoE config" in n for n in json.loads(CliRunner().invoke(
        cli, ["rank", "--target", "Qwen1.5-MoE-A2.7B", "--gpu", "MI300X", "--json"]).output).get("layout_notes", []))
