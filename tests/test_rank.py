"""rank: JSON shape, ordering (same tokenizer first), sources on every number, and a light import footprint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from draftfit.catalog.specs import NO_MODEL_METHODS
from draftfit.cli import cli

LLAMA_DRAFTS = {"Llama-3.1-8B", "Llama-3.2-1B", "Llama-3.2-3B"}


def _rank_json(*args: str) -> dict:
    res = CliRunner().invoke(cli, ["rank", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.fixture(scope="module")
def llama70b() -> dict:
    return _rank_json("--target", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "4", "--batch", "1,32",
                      "--workload", "code")


def test_json_shape(llama70b):
    assert llama70b["target"] == "Llama-3.1-70B" and llama70b["gpu"] == "H100-80GB" and llama70b["tp"] == 4
    keys = {"draft", "verdict", "vllm_accepts", "fits", "kv_tokens", "acceptance", "acceptance_low", "acceptance_high",
            "acceptance_source", "best_k", "speedup", "speedup_low", "speedup_high", "speedup_source", "reason"}
    assert llama70b["candidates"]
    for c in llama70b["candidates"]:
        assert keys <= set(c), keys - set(c)
        assert set(c["speedup"]) == {"1", "32"} or c["verdict"] == "incompatible"
    assert "serve_command" in llama70b


def test_llama_drafts_on_top_other_families_incompatible(llama70b):
    cands = llama70b["candidates"]
    # The model drafts on top are Llama's (the model-free ngram/suffix rows may sit among them).
    top = [c["draft"] for c in cands if c["method"] not in NO_MODEL_METHODS][:3]
    assert set(top) == LLAMA_DRAFTS, top
    for c in cands:
        fam = c["draft"].split("-")[0]
        if fam in ("Qwen2.5", "Qwen3", "Gemma", "Mistral") or c["draft"].startswith(("Qwen", "Gemma", "Mistral")):
            assert c["verdict"] == "incompatible" and c["vllm_accepts"] is False, c
            assert c["decision"] == "incompatible" and c["reason"]
    # Incompatible ones come after every compatible one.
    groups = [c["verdict"] == "incompatible" for c in cands]
    assert groups == sorted(groups)


def test_every_number_has_a_source(llama70b):
    for c in llama70b["candidates"]:
        assert c["acceptance_source"].startswith(("prior:", "measured:", "replay:", "none: measure it")), c
        if c["acceptance_source"].startswith("replay:"):  # n-gram: replayed real outputs, cited with their file
            assert "draftfit/data/reference/ngram/" in c["acceptance_citation"]
            assert c["acceptance_low"] <= c["acceptance"] <= c["acceptance_high"]
        if c["acceptance_source"].startswith("prior:") and c["verdict"] != "incompatible":
            assert "acceptance_priors.yaml" in c["acceptance_citation"]
            assert c["acceptance_low"] <= c["acceptance"] <= c["acceptance_high"]
        assert c["speedup_source"], c
        for b, s in c["speedup"].items():
            if s is not None:
                assert c["speedup_low"][b] <= s <= c["speedup_high"][b]


def test_winner_serve_command(llama70b):
    if llama70b["winner"] is None:
        pytest.skip("no candidate predicted to pay off in this build")
    assert llama70b["winner"] in LLAMA_DRAFTS | {"ngram", "suffix"}
    cmd = llama70b["serve_command"]
    method = llama70b["winner"] if llama70b["winner"] in ("ngram", "suffix") else "draft_model"
    assert cmd.startswith("vllm serve meta-llama/Llama-3.1-70B-Instruct") and method in cmd


def test_default_gpu_and_tp_are_said():
    data = _rank_json("--target", "Llama-3.1-70B", "--top", "3")
    assert data["gpu"] == "H100-80GB" and "assuming" in data["gpu_note"]
    assert data["tp"] in (2, 4, 8) and "smallest" in data["tp_note"]
    assert len(data["candidates"]) == 3


def test_qwen_coder_target_code_workload():
    data = _rank_json("--target", "Qwen2.5-Coder-32B", "--gpu", "H100-80GB", "--workload", "code", "--tp", "2")
    top = next(c for c in data["candidates"] if c["method"] not in NO_MODEL_METHODS)
    assert top["draft"].startswith("Qwen2.5") and top["verdict"] != "incompatible"
    # code is where n-gram lookup pays most: its row is there, with the replayed source
    ngram = next(c for c in data["candidates"] if c["method"] == "ngram")
    assert ngram["acceptance_source"] == "replay:ngram 2-5 on code"


def test_bad_input_one_line():
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-9-70B"])
    assert res.exit_code == 2 and "unknown model" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-70B", "--tp", "3"])
    assert res.exit_code == 2 and "not divisible" in res.output
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-70B", "--batch", "x"])
    assert res.exit_code == 2


def test_explain_and_table():
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "4",
                                   "--explain", "Llama-3.2-1B"])
    assert res.exit_code == 0, res.output
    assert "acceptance: α=" in res.output and "citation:" in res.output and "memory: fits=" in res.output
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "4"])
    assert res.exit_code == 0 and "Llama-3.2-1B" in res.output


def test_rank_imports_nothing_heavy():
    code = ("import sys; from draftfit.cli import main\n"
            "try:\n main(['rank', '--target', 'Llama-3.1-70B', '--json'])\nexcept SystemExit:\n pass\n"
            "heavy = [m for m in ('torch', 'vllm', 'sklearn', 'tokenizers', 'transformers', 'matplotlib') "
            "if m in sys.modules]\nprint('HEAVY', heavy, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in out.stderr, out.stderr[-2000:]


# --------------------------------------------------------------------------------------- acceptance prior

def test_prior_directions_and_band():
    from draftfit.acceptance.prior import prior_acceptance

    t = "Llama-3.1-70B"
    greedy, hot = prior_acceptance(t, "Llama-3.1-8B", "chat", 0.0), prior_acceptance(t, "Llama-3.1-8B", "chat", 1.0)
    assert hot.alpha < greedy.alpha  # sampling lowers acceptance
    assert prior_acceptance(t, "Llama-3.1-8B", "code", 0.0).alpha > greedy.alpha  # code is easier than chat
    # Same relation, bigger draft: higher acceptance.
    assert prior_acceptance(t, "Llama-3.2-3B", "chat", 0.0).alpha > prior_acceptance(t, "Llama-3.2-1B", "chat", 0.0).alpha
    # A tokenizer-sharing stranger is below a same-family draft of the same size.
    assert prior_acceptance(t, "DeepSeek-R1-Distill-Llama-8B", "chat", 0.0).alpha < greedy.alpha
    for e in (greedy, hot):
        assert e.low <= e.alpha <= e.high and e.source.startswith("prior:") and e.citation
        assert e.per_position == sorted(e.per_position, reverse=True) and len(e.per_position) == 8
    assert prior_acceptance(t, "Qwen2.5-0.5B", "chat", 0.0).alpha == 0.0


def test_prior_leave_one_out_error_is_bounded():
    from draftfit.acceptance import prior as priors

    loo = priors.leave_one_out(priors.published_points())
    mae = sum(abs(a - p.alpha) for p, a in loo) / len(loo)
    assert len(loo) >= 20 and mae < 0.12, mae  # bench/priors.py reports the table


def test_tau_alpha_round_trip():
    from draftfit.acceptance import prior as priors

    for a in (0.3, 0.6, 0.85):
        assert priors.alpha_from_tau(priors.tau_from_alpha(a, 7), 7) == pytest.approx(a, abs=1e-6)
        assert priors.alpha_from_rate(priors.rate_from_alpha(a, 4), 4) == pytest.approx(a, abs=1e-6)
