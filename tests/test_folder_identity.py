"""Issue 39: a local folder is what its files say, never its name; what was priced is what the command serves.

- The same config.json (+ tokenizer files) in folders named `final`, `prod`, `checkpoint-1000`, `main` or a snapshot
  hash resolves to the same catalog entry and the same ranking; where catalog entries share shapes, the folder's
  tokenizer specials choose, and the choice and its reason are in the spec's source.
- The folder's own max_position_embeddings binds later stages: a context past it is refused, never a command vLLM
  refuses.
- Every --quantization / --kv-cache-dtype / context that changed the prediction is in the printed serve command.
- Read-only commands create nothing; a folder named like rich markup is text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.catalog.specs import spec_from_folder
from draftfit.cli import cli

sys.path.insert(0, str(Path(__file__).parent))
import hostile_corpus as hc  # noqa: E402

NAMES = ["final", "prod", "checkpoint-1000", "main", "8f3c2a1b9d0e4f5a6b7c8d9e0f1a2b3c4d5e6f7a"]
# Llama-3.1-8B-Instruct's and DeepSeek-R1-Distill-Llama-8B's config.json share every shape.
LLAMA_TOKCFG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
R1_TOKCFG = {"bos_token": {"content": "<｜begin▁of▁sentence｜>"}, "eos_token": {"content": "<｜end▁of▁sentence｜>"}}


def _folder(root: Path, name: str, config: dict, tokcfg: dict | None = None) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    if tokcfg is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokcfg))
    return path


def _run(argv, env=None):
    r = CliRunner().invoke(cli, argv, env=env, catch_exceptions=False)
    return r


@pytest.mark.parametrize("tokcfg, want", [(None, None), (LLAMA_TOKCFG, "Llama-3.1-8B"),
                                          (R1_TOKCFG, "DeepSeek-R1-Distill-Llama-8B")])
def test_same_files_in_differently_named_folders_resolve_the_same(tmp_path, tokcfg, want):
    specs = [spec_from_folder(_folder(tmp_path, n, hc.GOOD_CONFIG, tokcfg)) for n in NAMES]
    assert len({s.name for s in specs}) == 1, [(n, s.name) for n, s in zip(NAMES, specs)]
    if want:
        assert specs[0].name == want
    # The tie and its reason are said, not hidden: both entries share the shapes.
    assert "shapes shared with" in specs[0].source and "chose" in specs[0].source


def test_same_files_in_differently_named_folders_rank_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTFIT_STORE", str(tmp_path / "s.sqlite"))
    answers = set()
    for n in ("final", "main"):
        folder = _folder(tmp_path, n, hc.GOOD_CONFIG, LLAMA_TOKCFG)
        r = _run(["rank", "--target", str(folder), "--gpu", "H100-80GB", "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        rows = tuple((c["draft"], c.get("mix_speedup")) for c in out["candidates"])
        answers.add((out.get("winner"), rows, (out.get("serve_command") or "").replace(str(folder), "FOLDER")))
    assert len(answers) == 1


def test_folder_context_binds_the_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTFIT_STORE", str(tmp_path / "s.sqlite"))
    folder = _folder(tmp_path, "final", {**hc.GOOD_CONFIG, "max_position_embeddings": 2048}, LLAMA_TOKCFG)
    assert spec_from_folder(folder).max_position_embeddings == 2048  # not the catalog entry's 131072
    r = _run(["rank", "--target", str(folder), "--max-model-len", "100000"])
    assert r.exit_code == 2 and "2048" in r.stderr, r.output
    r = _run(["rank", "--target", str(folder), "--gpu", "H100-80GB", "--json"])
    assert r.exit_code == 0, r.output
    cmd = json.loads(r.stdout)["serve_command"]
    assert "--max-model-len 2048" in cmd


@pytest.mark.parametrize("quant", ["awq", "gptq", "mxfp4", "fp8"])
def test_quantization_kv_dtype_and_context_reach_the_command(quant, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTFIT_STORE", str(tmp_path / "s.sqlite"))
    r = _run(["rank", "--target", "Llama-3.1-8B", "--gpu", "H100-80GB", "--quantization", quant,
              "--kv-cache-dtype", "fp8", "--max-model-len", "8192", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    cmd = out["serve_command"]
    assert cmd, out.get("notes")
    assert f"--quantization {quant}" in cmd and "--kv-cache-dtype fp8" in cmd and "--max-model-len 8192" in cmd
    if quant != "fp8":  # vLLM loads these only from a checkpoint in that format: the note says so
        assert any(f"--quantization {quant}" in n and "checkpoint" in n for n in out["notes"])


def test_serve_cmd_carries_the_quantization(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTFIT_STORE", str(tmp_path / "s.sqlite"))
    r = _run(["serve-cmd", "Llama-3.1-8B", "Llama-3.2-1B", "--quantization", "awq", "--gpu", "H100-80GB"])
    assert r.exit_code == 0, r.output
    assert "--quantization awq" in r.stdout


def test_read_only_listing_creates_nothing(tmp_path):
    store = tmp_path / "newdir" / "x.sqlite"
    for argv in (["runs", "list", "--store", str(store)], ["runs", "export", "--store", str(store)]):
        r = _run(argv)
        assert r.exit_code == 0, r.output
    assert not (tmp_path / "newdir").exists()


def test_markup_like_folder_name_is_text(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTFIT_STORE", str(tmp_path / "s.sqlite"))
    folder = tmp_path / "ckpt [" / "old]"
    hc._model_folder(folder, hc.GOOD_CONFIG)
    draft = tmp_path / "draft"
    hc._model_folder(draft, hc.GOOD_DRAFT_CONFIG)
    for argv, ok in ((["check", str(folder), str(draft)], (0,)), (["catalog", "show", str(folder)], (0,)),
                     (["preflight", str(folder), "Llama-3.2-1B", "--gpu", "H200"], (0, 1))):
        r = _run(argv)
        assert r.exit_code in ok and "internal error" not in r.output, r.output


def test_k_range_past_the_bound_is_named_as_typed():
    r = _run(["speedup", "--target", "Llama-3.1-8B", "--draft", "Llama-3.2-1B", "--gpu", "H200", "--alpha", "0.7",
              "--k", "1..1000"])
    assert r.exit_code == 2 and "1..1000" in r.stderr and "--k 9 " not in r.stderr, r.stderr
