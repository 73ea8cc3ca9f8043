"""draftfit/engine/: the one home of what each vLLM version does (issue 38)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftfit.engine import resolve_target
from draftfit.catalog.specs import method_drafter, resolve_model
from draftfit.cli import cli
from draftfit.engine import EngineTarget, check_version, resolve_target
from draftfit.engine.flags import flag_list
from draftfit.engine.rules import VLLM_RULES
from draftfit.engine.versions import MODELLED
from draftfit.errors import DraftfitError
from draftfit.pipeline import vllm_verdict


def test_every_modelled_version_has_rules_and_flags():
    assert MODELLED[-1] == "0.34"
    for m in MODELLED:
        assert VLLM_RULES[m].version.startswith(m) and flag_list(m)["vllm_version"].startswith(m)


def test_034_rules_read_from_the_wheel():
    r = VLLM_RULES["0.34"]
    assert (r.kv_sizing, r.default_block_size, r.default_util, r.drafter_cudagraphs) == ("measured", 64, None, True)
    assert VLLM_RULES["0.33"].kv_sizing == "estimate" and not VLLM_RULES["0.33"].drafter_cudagraphs
    keys = set(flag_list("0.34")["speculative_config_keys"])
    assert not keys & r.removed_spec_keys and "custom_method" not in keys  # field(init=False) skipped
    assert r.removed_spec_keys <= set(flag_list("0.33")["speculative_config_keys"])


@pytest.mark.parametrize("bad", ["banana", "", " ", "0.0", "0.0.0", "1..2", "-1"])
def test_nonsense_versions_are_refused(bad):
    with pytest.raises(DraftfitError, match="not a vLLM version"):
        check_version(bad)


@pytest.mark.parametrize("old", ["0.6.0", "0.10.0", "0.25.9"])
def test_versions_older_than_the_oldest_modelled_are_refused_with_the_list(old):
    with pytest.raises(DraftfitError, match="older than the oldest") as e:
        check_version(old)
    assert "0.34.0" in e.value.fix


def test_between_and_above_map_down_with_a_reason(monkeypatch):
    assert resolve_target("0.35.2").modelled == "0.34" and "not modelled" in resolve_target("0.35.2").note
    assert resolve_target("0.30.1").modelled == "0.26"
    monkeypatch.setattr("draftfit.engine.versions.installed_gpu_vllm_version", lambda: None)
    t = resolve_target(None)
    assert isinstance(t, EngineTarget) and t.modelled == "0.34" and t.rules is VLLM_RULES["0.34"]


def test_rank_on_an_unmodelled_old_vllm_names_no_winner():
    out = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-8B", "--vllm-version", "0.6.0"])
    assert out.exit_code == 2 and "speculative" not in out.output and len(out.output.strip().splitlines()) == 1


def test_serve_cmd_034_carries_no_removed_key():
    for args in (["Llama-3.1-8B", "Llama-3.2-1B"], ["Llama-3.1-8B", "ngram"], ["Qwen3-8B", "suffix"]):
        out = CliRunner().invoke(cli, ["serve-cmd", *args, "--vllm-version", "0.34.0"])
        assert out.exit_code == 0, out.output
        assert not any(k in out.output for k in VLLM_RULES["0.34"].removed_spec_keys)


def test_suffix_on_034_needs_no_arctic_inference():
    t = resolve_model("Qwen3-8B")
    s = method_drafter("suffix", t)
    assert "arctic-inference" not in vllm_verdict(t, s, engine=resolve_target("0.34.0"))[1]
    assert "arctic-inference" in vllm_verdict(t, s, engine=resolve_target("0.33.0"))[1]


def test_a_fix_proposing_another_pair_passes_the_same_rules():
    """Gemma-3-27b + Gemma-3-1b on 0.26: the vocab refusal's fix must not name drafts that 0.26 kills at start-up
    (KV-cache groups), and the padded draft carries the same start-up fix; on 0.34 no removed key is proposed."""
    t, d = resolve_model("Gemma-3-27b"), resolve_model("Gemma-3-1b")
    runs, _, fix = vllm_verdict(t, d, engine=resolve_target("0.26.0"))
    assert not runs
    for name in ("Gemma-3-4b", "Gemma-3-12b"):
        assert name not in fix
        assert not vllm_verdict(t, resolve_model(name), engine=resolve_target("0.26.0"))[0]
    assert "--disable-hybrid-kv-cache-manager" in fix
    fix34 = vllm_verdict(t, d, engine=resolve_target("0.34.0"))[2]
    assert "Gemma-3-4b" in fix34 and "use_heterogeneous_vocab" not in fix34
    for name in ("Gemma-3-4b", "Gemma-3-12b"):
        assert vllm_verdict(t, resolve_model(name), engine=resolve_target("0.34.0"))[0]


def test_the_printed_tokenizer_fix_proposes_no_key_the_version_removed():
    """preflight and rank print the tokenizer report's fix: on 0.34 it must not propose use_heterogeneous_vocab."""
    for version, present in (("0.34.0", False), ("0.33.0", True)):
        out = CliRunner().invoke(cli, ["preflight", "Llama-3.1-8B", "Qwen3-0.6B", "--vllm-version", version, "--json"])
        assert out.exit_code == 2
        assert ("use_heterogeneous_vocab" in out.output) is present, version


def test_served_util_is_one_rule_for_every_version():
    """VllmRules.served_util: the flag is left out only where the plan is what vLLM does with it unset."""
    r26, r33, r34 = (VLLM_RULES[v] for v in ("0.26", "0.33", "0.34"))
    assert r26.served_util(0.9) is None and r33.served_util(0.92) is None  # each version's own default
    assert r33.served_util(0.9) == 0.9 and r34.served_util(0.9) == 0.9  # 0.34: unset means 1.0, not 0.9
    assert all(r.served_util(None) is None for r in (r26, r33, r34))  # planned at the version's default


def _flag(cmd: str, name: str = "--gpu-memory-utilization"):
    argv = cmd.split()
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_printed_command_serves_the_util_that_was_ranked():
    def rank(*extra):
        out = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-8B", "--gpu", "H200", "--json", *extra])
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    # --util not given: planned at the version's own default (0.34: unset, read as 1.0 by its extensible KV cache),
    # and the command leaves the flag out, as vLLM then runs at that default.
    default = rank()
    assert (default["util"], default["util_given"]) == (1.0, False) and _flag(default["serve_command"]) is None
    given = rank("--util", "0.8")
    assert (given["util"], given["util_given"]) == (0.8, True) and _flag(given["serve_command"]) == "0.8"
    assert rank("--vllm-version", "0.26.0")["util"] == 0.9  # 0.26's own default
    assert _flag(rank("--vllm-version", "0.26.0", "--util", "0.9")["serve_command"]) is None  # = its default
    assert _flag(rank("--vllm-version", "0.33.0", "--util", "0.9")["serve_command"]) == "0.9"  # 0.33's is 0.92
    # serve-cmd: with a GPU the memory is planned (at the version's default unless given) and the command carries
    # only a util that differs from it; without one nothing is planned and vLLM's default stands.
    out = CliRunner().invoke(cli, ["serve-cmd", "Llama-3.1-8B", "Llama-3.2-1B", "--gpu", "H200", "--util", "0.85",
                                   "--json"])
    assert out.exit_code == 0 and _flag(json.loads(out.stdout)["text"]) == "0.85", out.output
    out = CliRunner().invoke(cli, ["serve-cmd", "Llama-3.1-8B", "Llama-3.2-1B", "--json"])
    assert out.exit_code == 0 and _flag(json.loads(out.stdout)["text"]) is None, out.output


def test_the_layout_carries_one_engine_and_json_keeps_the_version_keys():
    from draftfit.layout import Layout, build_layout

    lay = build_layout("Llama-3.1-8B", gpu="H200", max_model_len=8192, vllm_version="0.33.0")
    assert not {"vllm_version", "vllm_version_used", "vllm_modelled"} & set(Layout.__dataclass_fields__)
    d = lay.to_dict()
    assert (d["vllm_version"], d["vllm_version_given"], d["vllm_modelled"]) == ("0.33.0", "0.33.0", "0.33")
    assert lay.engine.rules is VLLM_RULES["0.33"] and lay.engine.origin == "requested"
