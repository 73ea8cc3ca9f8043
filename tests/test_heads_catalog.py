"""EAGLE-3 heads for the catalog's targets (issue 16 part 5) and the issue-18 must-show: rank lists, for Llama-3.1-8B
and Qwen3-8B, an EAGLE-3 row and an n-gram row, each with where its acceptance comes from; serve-cmd writes a
--speculative-config vLLM's own argument parser takes for every head."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftfit.catalog.specs import load_models, resolve_model
from draftfit.cli import cli
from draftfit.layout import build_layout
from draftfit.pipeline import evaluate_pair

# (target, head, hub id): the AngelSlim heads added from AngelSlim's training configs, and the heads already listed.
NEW_HEADS = [
    ("Qwen3-8B", "EAGLE3-Qwen3-8B", "AngelSlim/Qwen3-8B_eagle3"),
    ("Qwen3-14B", "EAGLE3-Qwen3-14B", "AngelSlim/Qwen3-14B_eagle3"),
    ("Qwen3-32B", "EAGLE3-Qwen3-32B", "AngelSlim/Qwen3-32B_eagle3"),
    ("Qwen3-30B-A3B", "EAGLE3-Qwen3-30B-A3B", "AngelSlim/Qwen3-a3B_eagle3"),
]


def _json(*args):
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _rows(target, *extra):
    data = _json("rank", "--target", target, "--gpu", "H200", *extra)
    return {c["draft"]: c for c in data["candidates"]}


@pytest.mark.parametrize("target,head,hub_id", NEW_HEADS, ids=[h for _, h, _ in NEW_HEADS])
def test_rank_lists_the_head_with_its_source(target, head, hub_id):
    rows = _rows(target)
    row = rows[head]
    assert row["method"] == "eagle3" and row["hub_id"] == hub_id and row["vllm_accepts"]
    assert row["acceptance_source"].startswith(("prior:eagle_head", "measured:"))
    assert row["acceptance_citation"]
    assert row["acceptance_low"] <= row["acceptance"] <= row["acceptance_high"]
    # Its catalog entry names where the shapes come from: the head's config.json and the training config.
    spec = resolve_model(head)
    assert spec.source.startswith(f"https://huggingface.co/{hub_id}/blob/main/config.json#shapes=github.com/")
    assert resolve_model(hub_id).name == head


@pytest.mark.parametrize("target", ["Qwen3-8B", "Llama-3.1-8B"])
def test_issue18_rank_lists_eagle3_and_ngram_rows_with_sources(target):
    rows = _rows(target, "--workload", "code")
    eagle = [r for r in rows.values() if r["method"] == "eagle3"]
    assert eagle, f"no EAGLE-3 row for {target}"
    for r in eagle:
        assert r["acceptance_source"] and r["acceptance_citation"] and r["decision"]
    ng = rows["ngram"]
    assert ng["method"] == "ngram" and ng["acceptance_source"] and ng["acceptance_citation"]
    assert ng["draft_weights_gib"] == 0


def _published_head_points(hub_id):
    from draftfit.acceptance.prior import _point_alpha, _priors_yaml

    data = _priors_yaml()
    return [(p, _point_alpha(p)) for p in data["points"] if p.get("draft") == hub_id], data["sources"]


@pytest.mark.parametrize("target,head,hub_id", NEW_HEADS, ids=[h for _, h, _ in NEW_HEADS])
def test_each_new_head_has_its_published_acceptance_with_a_source(target, head, hub_id):
    pts, sources = _published_head_points(hub_id)
    assert pts, f"no published acceptance for {hub_id}"
    for p, alpha in pts:
        assert p["target"] == target and p["relation"] == "eagle_head" and p["k"] == 2
        assert sources[p["source"]]["url"].startswith("https://github.com/Tencent/AngelSlim/blob/")
        assert 0.4 < alpha < 0.7  # tau 1.74-2.10 at K=2


def test_the_eagle_head_prior_cites_published_eagle3_numbers():
    row = _rows("Qwen3-8B")["EAGLE3-Qwen3-8B"]
    if row["acceptance_source"].startswith("prior:"):
        # issue 36: the EAGLE-3 prior is the per-method fit on acceptance_published.yaml (nebius' cards among its sources)
        assert "acceptance_published.yaml" in row["acceptance_citation"] and "nebius" in row["acceptance_citation"]


def test_the_qwen3_8b_head_band_covers_its_own_published_acceptance():
    row = _rows("Qwen3-8B", "--workload", "code")["EAGLE3-Qwen3-8B"]
    pts, _ = _published_head_points("AngelSlim/Qwen3-8B_eagle3")
    code = next(a for p, a in pts if p["workload"] == "code")
    assert row["acceptance_low"] <= code <= row["acceptance_high"]


@pytest.mark.parametrize("target,head,hub_id", NEW_HEADS, ids=[h for _, h, _ in NEW_HEADS])
def test_serve_cmd_for_the_head_parses_in_vllms_own_argument_parser(target, head, hub_id, vllm_parses_serve_cmd):
    cmd = _json("serve-cmd", target, head, "--k", "3")
    spec = cmd["speculative_config"]
    assert spec == {"method": "eagle3", "model": hub_id, "num_speculative_tokens": 3}
    parsed, fields = vllm_parses_serve_cmd(cmd)
    assert parsed == spec
    assert set(parsed) <= fields
    from vllm.config.speculative import SpeculativeConfig

    assert "eagle3" in str(SpeculativeConfig.__dataclass_fields__["method"].type)


def test_qwen3_8b_head_is_sized_from_its_own_shapes():
    """One Llama-style layer at the target's width: KV of one layer (the target has 36 of the same shape), the
    decoder layer, fc (3 x 4096 -> 4096) and a 32000-row lm_head; the embedding is the target's (same width)."""
    layout = build_layout("Qwen3-8B", gpu="H200", max_model_len=32768)
    ev = evaluate_pair(layout, "EAGLE3-Qwen3-8B")
    assert ev.vllm_runs and ev.method == "eagle3"
    assert ev.memory.max_model_len == 32768  # sized at the user's context, not a head default
    assert ev.memory.draft_kv_bytes_per_token * 36 == ev.memory.target_kv_bytes_per_token
    h, q, kv, inter, dv = 4096, 32 * 128, 8 * 128, 12288, 32000
    params = 2 * h * (q + 2 * kv) + q * h + 3 * h * inter + 3 * h * h + h * dv
    expected_gib = params * 2 / 1024**3  # bf16, no embedding
    assert ev.memory.draft_weights_gib == pytest.approx(expected_gib, rel=0.03)
    # A head that carried its own 151936-row embedding would add ~1.16 GiB: not this one.
    assert ev.memory.draft_weights_gib < expected_gib + 0.5


def test_a_head_for_another_qwen3_target_is_refused():
    layout = build_layout("Qwen3-14B", gpu="H200", max_model_len=8192)
    ev = evaluate_pair(layout, "EAGLE3-Qwen3-8B")
    assert not ev.vllm_runs and "Qwen3-8B" in ev.vllm_reason


def test_every_head_fuses_its_targets_width_and_vocabulary():
    by_name = {m.name: m for m in load_models()}
    for head in (m for m in load_models() if m.method == "eagle3"):
        for t in head.draft_for:
            target = by_name[t]
            assert (head.target_hidden_size or head.hidden_size) == target.hidden_size, head.name
            assert head.vocab_size == target.vocab_size and head.tokenizer == target.tokenizer, head.name
            assert 0 < (head.draft_vocab_size or head.vocab_size) <= head.vocab_size, head.name


def _speculators_config(intermediate: int) -> dict:
    # The layout of a vllm-project/speculators EAGLE-3 config.json (what vLLM's SpeculatorsConfig reads: shapes in
    # transformer_layer_config, draft_vocab_size beside it, the target in speculators_config.verifier); the shapes
    # are the Qwen3-8B head's of AngelSlim's training config, and 11008 a width no catalog head has.
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": 32000,
        "norm_before_residual": True, "target_hidden_size": None, "tie_word_embeddings": False, "dtype": "bfloat16",
        "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "Qwen/Qwen3-8B"}},
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": intermediate, "vocab_size": 151936,
            "max_position_embeddings": 40960},
    }


def test_a_speculators_format_head_folder_is_read_as_vllm_reads_it(tmp_path):
    from draftfit.catalog.specs import spec_from_folder

    folder = tmp_path / "Qwen3-8B-speculator.eagle3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_speculators_config(12288)))
    spec = spec_from_folder(folder)
    assert spec.name == "EAGLE3-Qwen3-8B" and spec.local_path  # same shapes as the catalog head
    (folder / "config.json").write_text(json.dumps(_speculators_config(11008)))
    spec = spec_from_folder(folder)
    assert spec.method == "eagle3" and spec.architecture == "Eagle3LlamaForCausalLM"
    assert spec.draft_vocab_size == 32000 and spec.intermediate_size == 11008 and spec.num_layers == 1
    assert spec.draft_for == ("Qwen3-8B",)  # from speculators_config.verifier, so vLLM's head rule lets it run
    import shutil

    from draftfit.assets.tokenizers import FAMILY_FIXTURE, fetch_all_tokenizers

    real = fetch_all_tokenizers()[FAMILY_FIXTURE["qwen3"]]  # the speculator ships the verifier's tokenizer files
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (real / name).is_file():
            shutil.copy(real / name, folder / name)
    layout = build_layout("Qwen3-8B", gpu="H200", max_model_len=8192)
    ev = evaluate_pair(layout, str(folder))
    assert ev.vllm_runs and ev.method == "eagle3"
