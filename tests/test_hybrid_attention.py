"""Sliding-window and hybrid attention: each layer's kind in the catalog and from config.json, vLLM 0.26's
KV-cache groups in memory, and the draft_model KV-cache-group rule in check, preflight and rank."""

from __future__ import annotations

import dataclasses
import json

from click.testing import CliRunner

from draftfit.engine import resolve_target
from draftfit.engine.rules import VLLM_RULES
from draftfit.catalog.specs import (compact_layer_types, expand_layer_types, layer_kinds, load_models,
                                    resolve_gpu, resolve_model, spec_from_config)
from draftfit.cli import cli
from draftfit.memory.plan import cdiv, kv_cache_groups, plan_memory
from draftfit.pipeline import vllm_verdict

GEMMA2_9B_CONFIG = {  # google/gemma-2-9b-it config.json (the fields that matter here)
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336,
    "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096, "torch_dtype": "bfloat16"}


def test_catalog_layer_kinds_follow_the_published_patterns():
    by = {m.name: m for m in load_models()}
    g2 = layer_kinds(by["Gemma-2-9b"])
    assert len(g2) == 42 and g2[:4] == ("S", "F", "S", "F") and g2.count("F") == 21  # layer 0 slides
    g3 = layer_kinds(by["Gemma-3-12b"])
    assert len(g3) == 48 and g3.count("F") == 8 and [i for i, k in enumerate(g3) if k == "F"][:2] == [5, 11]
    assert layer_kinds(by["Gemma-3-1b"]).count("F") == 4  # 26 layers: full at 5, 11, 17, 23
    assert set(layer_kinds(by["Llama-3.1-8B"])) == {"F"}
    for m in load_models():
        assert len(layer_kinds(m)) == m.num_layers, m.name
        if m.family.startswith("gemma"):
            assert m.layer_types and m.sliding_window, m.name


def test_layer_type_patterns_round_trip():
    for kinds in (("S", "F") * 21, ("S",) * 5 + ("F",) + ("S",) * 5 + ("F",) + ("S", "S"), ("F",) * 20 + ("S",) * 8):
        assert expand_layer_types(compact_layer_types(kinds)) == kinds
    assert compact_layer_types(("F",) * 8) == ""


def test_spec_from_config_reads_layer_kinds_as_vllm_applies_them():
    g2 = spec_from_config(GEMMA2_9B_CONFIG, name="g2")
    assert g2.layer_types == "SF*21" and g2.sliding_window == 4096
    assert g2.layer_types == resolve_model("Gemma-2-9b").layer_types
    g3 = spec_from_config({**GEMMA2_9B_CONFIG, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
                           "num_hidden_layers": 12, "sliding_window": 1024, "sliding_window_pattern": 6}, name="g3")
    assert g3.layer_types == "SSSSSF*2"
    explicit = ["full_attention", "sliding_attention"] * 21
    assert spec_from_config({**GEMMA2_9B_CONFIG, "layer_types": explicit}, name="x").layer_types == "FS*21"
    qwen = {**GEMMA2_9B_CONFIG, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 28}
    off = spec_from_config({**qwen, "use_sliding_window": False}, name="q")
    assert off.layer_types == "" and off.sliding_window == 0
    assert spec_from_config({**qwen, "use_sliding_window": True}, name="q").layer_types == "S*28"
    mistral = {**GEMMA2_9B_CONFIG, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
               "num_hidden_layers": 32}
    assert spec_from_config(mistral, name="m").layer_types == "S*32"  # no layer_types: every layer slides


def test_kv_cache_groups_of_gemma2_pair_put_the_draft_in_two_groups():
    t, d = resolve_model("Gemma-2-9b"), resolve_model("Gemma-2-2b")
    alone = kv_cache_groups(t)
    assert alone.hybrid and alone.group_size == 21 and [g.kind for g in alone.groups] == ["sliding", "full"]
    pair = kv_cache_groups(t, d)
    # 21+21 target layers (8 KV heads), 13+13 draft layers (4 KV heads, block 32 to match the page): group size 13
    assert pair.group_size == 13 and len(pair.groups) == 6 and len(pair.draft_group_ids) == 2
    assert {g.block_size for g in pair.groups if g.draft_layers} == {32}
    dense = kv_cache_groups(resolve_model("Llama-3.1-8B"), resolve_model("Llama-3.2-1B"))
    assert not dense.hybrid and len(dense.groups) == 1


def test_sliding_window_target_memory_differs_from_all_full_as_vllm_source_says():
    gpu = resolve_gpu("H200")
    t = resolve_model("Gemma-2-9b")
    full = dataclasses.replace(t, layer_types="")
    # 16-token blocks: vLLM 0.33's default (0.34's 64 is tests/test_vllm034_memory.py's)
    kw = dict(tp=1, util=0.85, max_model_len=2048, entrypoint="llm", max_num_seqs=128, strict=False,
              rules=VLLM_RULES["0.33"])
    h, f = plan_memory(t, None, gpu, **kw), plan_memory(full, None, gpu, **kw)
    # Same pool; hybrid blocks hold 21 layers (one per group), full blocks 42.
    assert h.kv_pool_gib == f.kv_pool_gib and abs(h.kv_blocks - 2 * f.kv_blocks) <= 1
    # A 2048-token request: 128 full-layer blocks + cdiv(min(4095 + in-flight, 2048), 16) + 1 = 129 sliding.
    assert h.kv_blocks_per_request == 128 + 129 and f.kv_blocks_per_request == 128
    assert h.kv_tokens == int(h.kv_blocks / 257 * 2048) and h.kv_tokens < f.kv_tokens
    assert abs(h.kv_tokens / f.kv_tokens - 256 / 257) < 1e-3
    # Gemma-3-12b at its full context: the five sliding groups keep only window - 1 + 2 x T tokens.
    g3 = resolve_model("Gemma-3-12b")
    kw3 = dict(tp=1, util=0.9, max_model_len=131072, entrypoint="serve", max_num_seqs=16, strict=False,
               rules=VLLM_RULES["0.33"])
    h3, f3 = plan_memory(g3, None, gpu, **kw3), plan_memory(dataclasses.replace(g3, layer_types=""), None, gpu, **kw3)
    T = h3.max_num_batched_tokens
    assert h3.kv_blocks_per_request == 8192 + 5 * (cdiv(min(1023 + 2 * T, 131072), 16) + 1)
    assert abs(h3.kv_blocks - 6 * f3.kv_blocks) <= 6  # 8 layers per group vs 48 in one block
    assert h3.kv_tokens > 3 * f3.kv_tokens


def test_verdict_refuses_gemma2_draft_on_026_and_keeps_dense_pairs():
    t, d = resolve_model("Gemma-2-9b"), resolve_model("Gemma-2-2b")
    runs, why, fix = vllm_verdict(t, d, engine=resolve_target("0.26.0"))
    assert not runs and "All drafting layers should belong to the same kv cache group" in why
    assert "KV-cache group" in why and "--disable-hybrid-kv-cache-manager" in fix
    assert vllm_verdict(t, d, engine=resolve_target("0.30.0"))[0] is False
    assert vllm_verdict(t, d, engine=resolve_target("0.33.0"))[0] is True  # V2 runner's draft_model speculator
    # 0.31 has it too, but is not modelled: it maps down to 0.26's rules (a stated reason), not up
    assert vllm_verdict(t, d, engine=resolve_target("0.31.0"))[0] is False
    assert vllm_verdict(resolve_model("Llama-3.1-8B"), resolve_model("Llama-3.2-1B"), engine=resolve_target("0.26.0"))[0]
    assert vllm_verdict(resolve_model("Qwen3-8B"), resolve_model("Qwen3-0.6B"), engine=resolve_target("0.26.0"))[0]


def test_preflight_fails_with_exit_2_and_names_the_kv_cache_group_rule():
    res = CliRunner().invoke(cli, ["preflight", "Gemma-2-9b", "Gemma-2-2b", "--gpu", "H200", "--vllm-version",
                                   "0.26.0", "--json"])
    assert res.exit_code == 2, res.output
    data = json.loads(res.output)
    row = next(c for c in data["checks"] if c["name"] == "vLLM KV-cache groups")
    assert row["status"] == "fail" and "same kv cache group" in row["detail"] and row["fix"]
    assert next(c for c in data["checks"] if c["name"] == "vLLM vocab rule")["status"] == "pass"
    ok = CliRunner().invoke(cli, ["preflight", "Llama-3.1-8B", "Llama-3.2-1B", "--gpu", "H200", "--vllm-version",
                                  "0.26.0", "--json"])
    assert ok.exit_code in (0, 1), ok.output


def test_rank_never_shows_a_multi_group_draft_as_runnable():
    res = CliRunner().invoke(cli, ["rank", "--target", "Gemma-2-9b", "--gpu", "H200", "--vllm-version", "0.26.0",
                                   "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    rows = {c["draft"]: c for c in data["candidates"]}
    assert rows["Gemma-2-2b"]["decision"] == "incompatible" and rows["Gemma-2-2b"]["vllm_accepts"] is False
    assert "kv cache group" in rows["Gemma-2-2b"]["reason"]
    for c in data["candidates"]:
        if c["draft"].startswith("Gemma"):
            assert c["decision"] == "incompatible" and c["vllm_accepts"] is False, c
    cmd = data.get("serve_command") or {}
    assert "gemma-2-2b" not in json.dumps(cmd).lower()


def test_check_says_vllm_fails_at_start_up(monkeypatch):
    # `check` judges the default vLLM: an installed GPU vLLM, else the newest modelled (0.33, whose V2 draft_model
    # runner handles several KV-cache groups); pinned to an installed 0.26 here, where the start-up fails.
    monkeypatch.setattr("draftfit.engine.versions.installed_gpu_vllm_version", lambda: "0.26.0")
    res = CliRunner().invoke(cli, ["check", "Gemma-2-9b", "Gemma-2-2b", "--catalog-only", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["vllm_starts"] is False and "kv cache group" in data["vllm_reason"] and data["vllm_fix"]
    monkeypatch.setattr("draftfit.engine.versions.installed_gpu_vllm_version", lambda: None)
    newest = json.loads(CliRunner().invoke(cli, ["check", "Gemma-2-9b", "Gemma-2-2b", "--catalog-only", "--json"]).output)
    assert newest["vllm_starts"] is True and "V2 draft_model runner" in newest["vllm_reason"]
