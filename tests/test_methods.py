"""Model-free drafters (ngram, suffix) through the same pipeline as draft models and heads."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.errors import DraftfitError
from draftfit.layout import build_layout
from draftfit.pipeline import evaluate_pair


def _serve(*args):
    res = CliRunner().invoke(cli, ["serve-cmd", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_serve_cmd_ngram_parses_in_vllms_own_argument_parser(vllm_parses_serve_cmd):
    cmd = _serve("Llama-3.1-8B", "ngram", "--tp", "2")
    spec = cmd["speculative_config"]
    assert spec["method"] == "ngram" and "model" not in spec and "draft_tensor_parallel_size" not in spec
    assert spec["prompt_lookup_min"] <= spec["prompt_lookup_max"]
    parsed, fields = vllm_parses_serve_cmd(cmd)
    assert parsed["method"] == "ngram" and parsed["num_speculative_tokens"] == cmd["k"]
    # vLLM's SpeculativeConfig declares every field draftfit writes
    assert set(parsed) <= fields


def test_ngram_costs_no_memory_and_no_draft_passes():
    layout = build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192)
    ng = evaluate_pair(layout, "ngram")
    small = evaluate_pair(layout, "Llama-3.2-1B")
    assert ng.vllm_runs and ng.compat.verdict == "identical" and ng.method == "ngram"
    assert ng.memory.draft_weights_gib == 0 and ng.memory.kv_tokens > small.memory.kv_tokens


def test_ngram_prior_comes_from_replayed_real_outputs_with_its_source():
    layout = build_layout("Qwen2.5-Coder-32B", gpu="H200", max_model_len=4096, workload="code")
    ev = evaluate_pair(layout, "ngram")
    if ev.acceptance is None:
        pytest.skip("no stored n-gram outputs for this workload (bench/ngram_replay.py writes them)")
    assert ev.acceptance.source.startswith("replay:ngram") and "ngram" in ev.acceptance.citation
    assert ev.acceptance.low <= ev.acceptance.alpha <= ev.acceptance.high
    assert ev.decision.per_batch and ev.speedup is not None


def test_rank_lists_ngram_and_suffix_rows_with_their_sources():
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-8B", "--gpu", "H200", "--workload", "code",
                                   "--json"])
    rows = {c["draft"]: c for c in json.loads(res.stdout)["candidates"]}
    assert rows["ngram"]["method"] == "ngram" and rows["ngram"]["acceptance_source"]
    sfx = rows["suffix"]
    assert sfx["method"] == "suffix" and sfx["acceptance_source"] == "replay:suffix on code"
    assert sfx["acceptance_low"] <= sfx["acceptance"] <= sfx["acceptance_high"] and sfx["best_k"]
    assert sfx["speedup"]["1"] and sfx["speedup_low"]["1"] <= sfx["speedup"]["1"] <= sfx["speedup_high"]["1"]
    # the published figures ride along as a cross-check, each with what it measures and where it was published
    for method in ("ngram", "suffix"):
        cross = rows[method]["acceptance_cross_check"]
        assert cross and all(e["url"].startswith("https://") and e["measures"] for e in cross)
    assert not rows["EAGLE3-Llama-3.1-8B"]["acceptance_cross_check"]
    assert any(r["method"] == "eagle3" for r in rows.values())


def test_suffix_prior_only_where_the_chosen_vllm_has_suffix_decoding():
    ev = evaluate_pair(build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192, workload="code"), "suffix")
    assert ev.acceptance.source == "replay:suffix on code" and ev.decision.action == "speculate"
    assert "native GPU suffix speculator" in ev.vllm_reason  # 0.34, the default: no arctic-inference
    v33 = evaluate_pair(build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192, workload="code",
                                     vllm_version="0.33.0"), "suffix")
    assert "arctic-inference" in v33.vllm_reason  # 0.33 refuses method suffix without the package
    # A vLLM older than the oldest modelled (0.26) is refused at the layout: no verdict for versions not modelled.
    with pytest.raises(DraftfitError, match="older than the oldest"):
        build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192, workload="code", vllm_version="0.11.0")
