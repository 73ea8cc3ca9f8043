"""The engine-free n-gram replay: vLLM's own proposer rule, and counters that mean what vLLM's mean."""

from __future__ import annotations

import random

import pytest

from draftfit.acceptance.replay import propose_ngram, replay, replay_grid, replay_request, replay_result
from draftfit.errors import DraftfitError


def test_longest_match_and_earliest_occurrence():
    #          0  1  2  3  4  5  6  7  8  9
    context = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    # suffix [1,2,3] occurs at 0 and 4: the earliest (0) wins, so the draft is what followed it there
    assert propose_ngram(context, min_n=1, max_n=3, k=2) == [9, 1]
    assert propose_ngram(context, min_n=4, max_n=5, k=2) == []  # no 4-gram repeats
    assert propose_ngram([5, 6], min_n=3, max_n=5, k=4) == []  # context shorter than min_n
    assert propose_ngram(context, min_n=1, max_n=3, k=4, max_model_len=12) == [9]  # one slot left


def test_proposals_equal_vllms_own_function():
    ngram = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    np = pytest.importorskip("numpy")
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 60)
        vocab = rng.choice([2, 3, 5, 50])
        ctx = [rng.randrange(vocab) for _ in range(n)]
        lo = rng.randint(1, 4)
        hi = rng.randint(lo, 6)
        k = rng.randint(1, 8)
        theirs = ngram._find_longest_matched_ngram_and_propose_tokens(
            origin_tokens=np.array(ctx, dtype=np.int32), min_ngram=lo, max_ngram=hi, max_model_len=1 << 20, k=k)
        assert propose_ngram(ctx, min_n=lo, max_n=hi, k=k) == [int(x) for x in theirs], (ctx, lo, hi, k)


def test_counters_of_a_repeating_output():
    prompt = [7, 8, 9, 10]
    output = [7, 8, 9, 10, 7, 8, 9, 10]
    g = replay_request(prompt, output, k=3, min_n=1, max_n=2)
    # per-position counts never increase with position, accepted never exceeds drafted
    pp = g["per_position_accepted"]
    assert all(a >= b for a, b in zip(pp, pp[1:])) and g["num_accepted"] <= g["num_draft_tokens"]
    assert g["num_accepted"] == sum(pp)
    # every emitted token is accounted for: steps emit accepted + 1 tokens each, except that a last step whose
    # drafts all land inside max_tokens has no room for its bonus token
    assert g["steps"] + g["num_accepted"] in (len(output), len(output) + 1)


def test_no_repetition_means_no_drafts():
    c = replay([(list(range(10)), list(range(10, 30)))], k=4, min_n=2, max_n=4)
    assert c.num_drafts == 0 and c.num_accepted == 0 and c.steps == 20


def test_result_and_grid():
    rng = random.Random(1)
    reqs = []
    for _ in range(4):
        base = [rng.randrange(20) for _ in range(12)]
        reqs.append((base, base[:6] + [rng.randrange(20) for _ in range(4)] + base[6:12]))
    res = replay_result(reqs, k=4, min_n=2, max_n=3, workload="code")
    assert res.backend == "replay" and 0 <= res.acceptance_rate <= 1 and len(res.per_position) == 4
    grid = replay_grid(reqs, ks=(1, 4), lookups=((2, 3), (3, 3)))
    assert set(grid) == {(2, 3, 1), (2, 3, 4), (3, 3, 1), (3, 3, 4)}
    with pytest.raises(DraftfitError):
        replay(reqs, k=4, min_n=3, max_n=2)
