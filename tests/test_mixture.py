"""n-gram and suffix acceptance as a mixture (issue 36 item 2): draft probability per decode step and accepted length
given a draft, per K, from the built-in references, a measured run in the store and the user's own logged traffic."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from draftfit.acceptance.curve import decode_steps_from_counters, mixture_from_counts, result_from_counts
from draftfit.acceptance.replay import replay
from draftfit.acceptance.suffix_replay import replay_suffix
from draftfit.errors import DraftfitError


# ---- the form itself

def test_mixture_per_k_is_draft_probability_times_accepted_given_draft():
    m = mixture_from_counts([8, 6, 3], num_drafts=10, decode_steps=40, basis="t")
    assert m.draft_probability == pytest.approx(0.25)
    assert [p.accepted_given_draft for p in m.per_k] == pytest.approx([0.8, 1.4, 1.7])
    assert [p.tokens_per_step for p in m.per_k] == pytest.approx([1.2, 1.35, 1.425])
    # the per-decode-step curve the speedup stage sums gives the same tokens per step
    assert 1 + sum(m.per_position) == pytest.approx(m.at(3).tokens_per_step)
    assert m.per_position == pytest.approx([8 / 40, 6 / 40, 3 / 40])
    j = m.to_json()
    assert j["k"] == 3 and j["accepted_per_draft"] == pytest.approx(1.7) and len(j["per_k"]) == 3


@pytest.mark.parametrize("counts, drafts, steps, what", [
    ([], 1, 1, "no per-position"),
    ([3, 4], 5, 10, "rise"),  # acceptance is a prefix: position 2 cannot beat position 1
    ([6], 5, 10, "from 5 drafts"),  # more accepted first tokens than drafts
    ([1], -1, 10, "negative"),
    ([1], 2, -3, "negative"),
    ([1], 2, 0, "0 decode steps"),
])
def test_impossible_counters_are_one_line(counts, drafts, steps, what):
    with pytest.raises(DraftfitError) as e:
        mixture_from_counts(counts, drafts, steps, basis="t")
    assert what in e.value.one_line() and "\n" not in e.value.one_line()


def test_more_drafts_than_derived_steps_clamps_and_says_so():
    m = mixture_from_counts([4], num_drafts=12, decode_steps=10, basis="t")
    assert m.draft_probability == 1.0 and m.notes and "clamped" in m.notes[0]


def test_mixture_from_runs_keeps_each_k_and_prices_a_curve_that_never_rises():
    from draftfit.acceptance.curve import mixture_from_runs

    # (drafts, accepted, decode steps) per K: at K=1 the proposer drafts on more steps than at K=4
    runs = {1: (50, 40, 100), 2: (45, 60, 90), 3: (42, 70, 86), 4: (40, 76, 84)}
    m = mixture_from_runs(runs, basis="t", lookup=(2, 5))
    assert [p.draft_probability for p in m.per_k] == pytest.approx([0.5, 0.5, 42 / 86, 40 / 84])
    assert [p.tokens_per_step for p in m.per_k] == pytest.approx([1.4, 1 + 60 / 90, 1 + 70 / 86, 1 + 76 / 84])
    assert all(a >= b for a, b in zip(m.curve, m.curve[1:])) and m.per_k_runs
    for p in m.per_k:  # the curve the speedup sums gives each K's own tokens per step, here exactly
        assert 1 + sum(m.curve[:p.k]) == pytest.approx(p.tokens_per_step, abs=1e-9)
    # a later K yielding more per extra position than an earlier one: pooled, said, block ends kept
    bumpy = mixture_from_runs({1: (50, 30, 100), 2: (50, 40, 100), 3: (50, 60, 100)}, basis="t")
    assert bumpy.curve == pytest.approx([0.3, 0.15, 0.15])
    assert 1 + sum(bumpy.curve) == pytest.approx(1.6) and bumpy.notes
    with pytest.raises(DraftfitError, match="not 1..K_max"):
        mixture_from_runs({1: (1, 1, 2), 3: (1, 1, 2)}, basis="t")
    with pytest.raises(DraftfitError, match="drafts of at most 2"):
        mixture_from_runs({1: (1, 1, 2), 2: (1, 3, 2)}, basis="t")


def test_decode_steps_from_counters():
    # 3 requests, 100 output tokens, 40 accepted draft tokens: 100 - 40 - 3 decode steps
    assert decode_steps_from_counters(100, 40, 3) == 57
    assert decode_steps_from_counters(5, 40, 3) == 0  # damaged counters never give a negative count


def _random_requests(seed=0, n=6):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(30) for _ in range(60)]
        # outputs that partly copy the prompt (what n-gram lookup feeds on) and partly do not
        output = []
        while len(output) < 80:
            if rng.random() < 0.5:
                s = rng.randrange(50)
                output += prompt[s:s + rng.randrange(3, 10)]
            else:
                output.append(rng.randrange(30))
        out.append((prompt, output))
    return out


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_replay_mixture_equals_tokens_per_decode_step(method):
    reqs = _random_requests()
    c = replay(reqs, k=8, min_n=2, max_n=5) if method == "ngram" else replay_suffix(reqs, k=8)
    m = mixture_from_counts(c.per_position_accepted, c.num_drafts, c.steps - len(reqs), basis="t")
    # every decode step emits 1 + its accepted tokens, except a request's last step when the draft ran to the end of
    # the output (no bonus token past the stop): at most one token per request apart
    steps = c.steps - len(reqs)
    actual = (c.output_tokens - len(reqs)) / steps
    assert actual <= m.at(8).tokens_per_step <= actual + len(reqs) / steps
    # the counters' derivation of decode steps (what a measured run has) is off by the same end effect at most
    assert steps - len(reqs) <= decode_steps_from_counters(c.output_tokens, c.num_accepted, len(reqs)) <= steps
    assert 0 < m.draft_probability < 1


# ---- a measured run from the store

def _store_ngram_run(path, *, target="Qwen2.5-Coder-32B", per_pos=(30, 20, 12, 6), drafts=40, out_tokens=400,
                     prompts=4, workload="code"):
    from draftfit.acceptance.store import MeasurementStore, RunRecord, now_iso

    k = len(per_pos)
    res = result_from_counts(per_position_accepted=list(per_pos), num_drafts=drafts, num_draft_tokens=drafts * k,
                             num_accepted=sum(per_pos), k=k, temperature=0.0, workload=workload, backend="vllm",
                             groups=[], output_tokens=out_tokens, num_prompts=prompts)
    with MeasurementStore(path) as st:
        return st.record_run(RunRecord(backend="vllm", target=target, draft="ngram", workload=workload,
                                       temperature=0.0, k=k, started_at=now_iso(), num_prompts=prompts,
                                       max_tokens=200), res)


@pytest.fixture
def fresh_store(tmp_path, monkeypatch):
    from draftfit.acceptance import prior

    monkeypatch.setenv("DRAFTFIT_STORE", str(tmp_path / "s.sqlite"))
    prior._store.cache_clear()
    yield tmp_path / "s.sqlite"
    prior._store.cache_clear()


def test_measured_ngram_run_is_priced_as_its_mixture(fresh_store):
    from draftfit.cli import cli

    rid = _store_ngram_run(fresh_store)
    argv = ["rank", "--target", "Qwen2.5-Coder-32B", "--gpu", "H100-80GB", "--workload", "code"]
    res = CliRunner().invoke(cli, [*argv, "--explain", "ngram", "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)
    m = row["acceptance_mixture"]
    # 400 output tokens - 68 accepted - 4 prefill tokens = 328 decode steps, 40 of them drafted
    assert m["decode_steps"] == 328 and m["num_drafts"] == 40
    assert m["draft_probability"] == pytest.approx(40 / 328, abs=1e-4)
    assert m["per_k"][1]["accepted_given_draft"] == pytest.approx(50 / 40)
    assert f"measured run {rid}" in m["basis"]
    # the speedup stage prices the per-step mixture, not vLLM's per-draft rates
    assert row["per_k"]["4"]["expected_tokens_per_step"] == pytest.approx(1 + 68 / 328, abs=1e-3)
    assert m["per_k"][3]["speedup"] == pytest.approx(row["per_k"]["4"]["speedup"], abs=1e-3)
    text = CliRunner().invoke(cli, [*argv, "--explain", "ngram"], terminal_width=400).output
    assert "draft probability" in text and "accepted length given a draft" in text and f"measured run {rid}" in text


def test_speedup_run_of_an_ngram_run_uses_the_mixture(fresh_store):
    from draftfit.cli import cli

    rid = _store_ngram_run(fresh_store)
    argv = ["speedup", "--target", "Qwen2.5-Coder-32B", "--draft", "ngram", "--gpu", "H200", "--run", str(rid)]
    res = CliRunner().invoke(cli, [*argv, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["acceptance_mixture"]["draft_probability"] == pytest.approx(40 / 328, abs=1e-4)
    e4 = out["batches"]["1"]["per_k"]["4"]["expected_tokens_per_step"]
    assert e4 == pytest.approx(1 + 68 / 328, abs=1e-3)  # per-draft rates would have said 1 + 68 / 40
    text = CliRunner().invoke(cli, argv, terminal_width=400).output
    assert "draft probability" in text and "drafts on 12% of decode steps" in text


# ---- the user's own logged traffic (rank / speedup --prompts-file)

def _logged(tmp_path, name, rows):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


CODE = "def area(width, height):\n    \"\"\"Area of a rectangle of the given width and height.\"\"\"\n"


def test_logged_traffic_shapes(tmp_path):
    from draftfit.acceptance.user_replay import load_logged_traffic

    p = _logged(tmp_path, "l.jsonl", [
        {"prompt": "a", "completion": "b"},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]},
        {"custom_id": "x", "body": {"messages": [{"role": "user", "content": "q2"}]},
         "response": {"status_code": 200, "body": {"choices": [{"message": {"content": "r2"}}]}}},
        {"request": {"prompt": "p3"}, "response": {"choices": [{"text": "t3"}]}},
        {"prompt": "p4", "output": "o4"},
    ])
    t = load_logged_traffic(p)
    assert [r.output for r in t.requests] == ["b", "r", "r2", "t3", "o4"]
    assert t.requests[1].request.messages == (("user", "q"),)  # the answer is not part of the prompt
    assert t.requests[2].request.kind == "messages" and t.requests[3].request.prompt == "p3"


def test_prompts_file_replay_sees_copying(tmp_path):
    """The replay can fail: outputs that copy the prompt draft far more often than outputs that do not."""
    from draftfit.acceptance.user_replay import user_acceptance
    from draftfit.catalog.specs import resolve_model

    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    target = resolve_model("Qwen2.5-Coder-32B")
    copy = _logged(tmp_path, "copy.jsonl", [{"prompt": f"Fix the typo in:\n{CODE}    return width * heigth\n",
                                             "completion": f"{CODE}    return width * height\n"}] * 4)
    fresh = _logged(tmp_path, "fresh.jsonl", [{"prompt": "Name three rivers in Europe.",
                                               "completion": "The Danube, the Rhine and the Loire."}] * 4)
    a, b = (user_acceptance("ngram", target, p) for p in (copy, fresh))
    assert a.mixture["draft_probability"] > 2 * b.mixture["draft_probability"]
    assert "your --prompts-file copy.jsonl" in a.mixture["basis"] and a.relation == "ngram"
    assert a.mixture["lookup"] == [2, 5]
    s = user_acceptance("suffix", target, copy)
    assert s.mixture["lookup"] is None and 0 < s.mixture["draft_probability"] <= 1


def test_rank_prompts_file_prices_ngram_and_suffix_at_the_replay(tmp_path):
    from draftfit.cli import cli

    pytest.importorskip("transformers")
    p = _logged(tmp_path, "copy.jsonl", [{"prompt": f"Fix the typo in:\n{CODE}    return width * heigth\n",
                                          "completion": f"{CODE}    return width * height\n"}] * 3)
    argv = ["rank", "--target", "Qwen2.5-Coder-32B", "--gpu", "H100-80GB", "--prompts-file", str(p)]
    res = CliRunner().invoke(cli, [*argv, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {c["draft"]: c for c in out["candidates"]}
    for m in ("ngram", "suffix"):
        assert "copy.jsonl" in rows[m]["acceptance_source"]
        assert rows[m]["acceptance_mixture"]["best_k"] == rows[m]["best_k_by_batch"]["1"]
    assert any("copy.jsonl" in n for n in out["notes"])
    text = CliRunner().invoke(cli, [*argv, "--explain", "suffix"], terminal_width=400).output
    assert "replay of your --prompts-file copy.jsonl" in text and "accepted given a draft" in text
    assert "for comparison, the built-in chat reference" in text
    assert rows["ngram"]["acceptance_mixture_builtin"]["reference"].endswith("chat.json")


def test_prompts_file_without_the_targets_tokenizer_is_one_line(tmp_path):
    from draftfit.cli import cli

    p = _logged(tmp_path, "l.jsonl", [{"prompt": "a", "completion": "b c d"}])
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-8B", "--gpu", "H100-80GB", "--prompts-file", str(p)])
    assert res.exit_code == 2 and "tokenizer" in res.output and "Traceback" not in res.output


def test_speedup_prompts_file_prices_the_replay(tmp_path):
    from draftfit.cli import cli

    pytest.importorskip("transformers")
    p = _logged(tmp_path, "copy.jsonl", [{"prompt": f"Fix the typo in:\n{CODE}    return width * heigth\n",
                                          "completion": f"{CODE}    return width * height\n"}] * 3)
    argv = ["speedup", "--target", "Qwen2.5-Coder-32B", "--draft", "suffix", "--gpu", "H200", "--prompts-file", str(p)]
    res = CliRunner().invoke(cli, [*argv, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    m = out["acceptance_mixture"]
    assert "copy.jsonl" in m["basis"] and "copy.jsonl" in out["acceptance_source"]
    e = out["batches"]["1"]["per_k"]["8"]["expected_tokens_per_step"]
    assert e == pytest.approx(m["per_k"][7]["priced_tokens_per_step"], abs=1e-3)
    assert m["per_k_runs"]  # each K replayed on its own
    text = CliRunner().invoke(cli, argv, terminal_width=400).output
    assert "accepted length given a draft" in text and "best K" in text


def test_rank_prompts_file_at_traffic_keeps_the_replay(tmp_path):
    """rank has one --prompts-file (the logged requests with outputs): under --request-rate it also sets the traffic's
    prompt lengths, and the serving-load view prices n-gram / suffix at the same replay as the fixed-batch view."""
    from draftfit.cli import cli

    pytest.importorskip("transformers")
    p = _logged(tmp_path, "copy.jsonl", [{"prompt": f"Fix the typo in:\n{CODE}    return width * heigth\n",
                                          "completion": f"{CODE}    return width * height\n"}] * 3)
    argv = ["rank", "--target", "Qwen2.5-Coder-32B", "--gpu", "H100-80GB", "--prompts-file", str(p),
            "--request-rate", "1", "--num-requests", "30", "--json"]
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    load = out["serving_load"]
    assert "copy.jsonl" in load["traffic"]["prompt_len"]
    fixed = {c["draft"]: c["acceptance_source"] for c in out["candidates"]}
    served = {d["drafter"]: d["acceptance_source"] for d in load["drafters"]}
    assert {"ngram", "suffix"} & set(served)
    for m in {"ngram", "suffix"} & set(served):
        assert served[m] == fixed[m] and "copy.jsonl" in served[m]
    # a request log gives the traffic's lengths; the logged outputs still price n-gram / suffix
    log = tmp_path / "log.csv"
    log.write_text("prompt_len,output_len\n100,50\n200,80\n")
    res = CliRunner().invoke(cli, [*argv[:-1], "--request-log", str(log), "--json"])
    assert res.exit_code == 0, res.output
    assert "request log" in json.loads(res.output)["serving_load"]["traffic"]["prompt_len"]


def test_traffic_prompt_lengths_leave_out_a_logged_answer(tmp_path):
    from draftfit.serving.traffic import prompt_lengths_from_file

    p = _logged(tmp_path, "chat.jsonl", [{"messages": [{"role": "user", "content": "x" * 400},
                                                       {"role": "assistant", "content": "y" * 4000}]}])
    assert prompt_lengths_from_file(p).values == (102,)  # (400 + 8) / 4: the user's turn only
