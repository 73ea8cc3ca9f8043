"""The `check`, `catalog` and `fixtures` commands as a user runs them (real subprocesses where exit codes
and import side effects matter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "vllm", "sklearn", "tokenizers", "matplotlib")


def draftfit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftfit", *args], capture_output=True, text=True, timeout=120)


def test_check_json_keys():
    p = draftfit("check", "Qwen2.5-7B", "Qwen2.5-0.5B", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    for key in ("verdict", "vllm_accepts", "notes", "differing_ids", "fix", "source", "target_tokenizer",
                "draft_tokenizer", "first_differences", "warning"):
        assert key in data
    assert data["verdict"] == "identical" and data["vllm_accepts"] is False
    assert "152064" in data["fix"]


def test_check_accepts_hub_ids_and_aliases():
    p = draftfit("check", "meta-llama/Llama-3.1-70B-Instruct", "llama3.1-8b", "--json", "--catalog-only")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert (data["target"], data["draft"]) == ("Llama-3.1-70B", "Llama-3.1-8B")
    assert data["source"] == "catalog fingerprints"


def test_check_human_output_has_verdict_and_fix():
    p = draftfit("check", "Llama-3.1-70B", "Qwen2.5-0.5B")
    assert p.returncode == 0, p.stderr
    assert "tokenizers: incompatible" in p.stdout
    assert "vLLM: refuses the pair" in p.stdout
    assert "fix:" in p.stdout and "Llama-3.2-1B" in p.stdout
    assert "embedding rows" in p.stdout


def test_unknown_model_one_line_exit_2():
    p = draftfit("check", "Llama-3.1-70B", "Llama-3.9-1B")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "unknown model 'Llama-3.9-1B'" in lines[0] and "Llama-3.2-1B" in lines[0]
    assert "Traceback" not in p.stderr


def test_catalog_list_json():
    p = draftfit("catalog", "list", "--json")
    assert p.returncode == 0, p.stderr
    models = json.loads(p.stdout)
    names = {m["name"] for m in models}
    assert {"Llama-3.1-70B", "Qwen2.5-0.5B"} <= names
    assert all("vocab_size" in m and "tokenizer" in m for m in models)


def test_catalog_list_family_and_gpus():
    p = draftfit("catalog", "list", "--family", "qwen3", "--json")
    assert p.returncode == 0, p.stderr
    models = json.loads(p.stdout)
    # a family or tokenizer family, or one it prefixes (qwen3_next, qwen3.5)
    assert models and all(m["tokenizer"].startswith("qwen3") or m["family"].startswith("qwen3") for m in models)
    p = draftfit("catalog", "list", "--gpus", "--json")
    assert p.returncode == 0, p.stderr
    assert "H100-80GB" in {g["name"] for g in json.loads(p.stdout)}
    p = draftfit("catalog", "list", "--family", "nosuchfamily")
    assert p.returncode == 2 and "families:" in p.stderr


def test_catalog_list_table():
    p = draftfit("catalog", "list")
    assert p.returncode == 0, p.stderr
    assert "Llama-3.1-70B" in p.stdout and "128256" in p.stdout


def test_catalog_show():
    p = draftfit("catalog", "show", "Qwen/Qwen2.5-7B-Instruct", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["kind"] == "model" and data["vocab_size"] == 152064
    assert data["tokenizer_family"]["base_size"] == 151643
    p = draftfit("catalog", "show", "H100", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["kind"] == "gpu"
    p = draftfit("catalog", "show", "Qwen9-7B")
    assert p.returncode == 2 and "unknown model" in p.stderr


def test_fixtures_command_is_cached_no_op():
    p = draftfit("fixtures", "tokenizers")
    assert p.returncode == 0, p.stderr
    assert "tokenizer qwen2.5:" in p.stdout


@pytest.mark.parametrize("argv", [["--help"], ["catalog", "list"], ["catalog", "list", "--json"],
                                  ["check", "Llama-3.1-70B", "Llama-3.2-1B", "--catalog-only"]])
def test_light_commands_import_nothing_heavy(argv):
    code = (
        "import sys\n"
        "from draftfit.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
