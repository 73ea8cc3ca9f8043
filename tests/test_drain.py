"""Batch drain of offline calibration runs (draftfit/drain.py) and the steady-state step costs built on it."""

from __future__ import annotations

import random

import pytest

from draftfit.calibration.tables import CalibrationTable, load_tables, tables_from_results
from draftfit.calibration.drain import batch_share, drain, steps_cdf, tokens_per_step_pmf


def _request_steps(rng: random.Random, alpha: float, k: int, n_tokens: int) -> int:
    """One request under vLLM's synthetic rejection: each step accepts position i with probability alpha
    given the ones before, then adds the bonus token."""
    done = steps = 0
    while done < n_tokens:
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        done += accepted + 1
        steps += 1
    return steps


@pytest.mark.parametrize("alpha,k,batch", [(0.8, 4, 32), (0.6, 2, 8), (0.9, 8, 128)])
def test_exact_step_distribution_matches_simulation(alpha, k, batch):
    rng = random.Random(1)
    trials = 300 if batch < 128 else 80
    means, maxes = [], []
    for _ in range(trials):
        steps = [_request_steps(rng, alpha, k, 95) for _ in range(batch)]
        means.append(sum(steps) / batch)
        maxes.append(max(steps))
    d = drain(alpha, k, 95, batch)
    assert d.mean_steps == pytest.approx(sum(means) / trials, rel=0.01)
    assert d.engine_steps == pytest.approx(sum(maxes) / trials, rel=0.02)


def test_drain_grows_with_batch_and_k():
    assert sum(tokens_per_step_pmf(0.7, 5)) == pytest.approx(1.0)
    assert drain(0.8, 4, 95, 1).ratio == pytest.approx(1.0)
    ratios = [[drain(0.8, k, 95, b).ratio for b in (1, 8, 32, 128)] for k in (1, 4, 8)]
    for row in ratios:
        assert row == sorted(row)
    assert ratios[0][-1] < ratios[1][-1] < ratios[2][-1]
    assert 1.2 < drain(0.8, 4, 95, 128).ratio < 1.3  # the docstring's "about 25 %"
    # Without drafts (or accepting everything) every request needs exactly n steps: nothing drains.
    assert drain(0.8, 0, 95, 64).engine_steps == pytest.approx(95)
    assert drain(1.0, 4, 95, 64).engine_steps == pytest.approx(19)
    with pytest.raises(ValueError):
        steps_cdf(1.5, 4, 95)


def test_batch_share():
    assert batch_share(10.0, 10.0, 1, 8) == pytest.approx(1.0)  # flat: nothing scales with requests
    assert batch_share(1.0, 8.0, 1, 8) == pytest.approx(0.0)  # proportional to requests
    assert batch_share(5.0, 8.0, 4, 8) == pytest.approx(0.25)
    assert batch_share(20.0, 8.0, 1, 8) == 1.0  # clipped


def test_steady_step_recovers_the_full_batch_cost_of_a_drained_run():
    """A run simulated with a known cost per step (fixed + per active request) and the real drain: the
    table's offline step cost overstates the full-batch cost, steady_step_ms recovers it."""
    alpha, k, n = 0.8, 4, 95
    fixed_ms, per_req_ms = 10.0, 0.3
    rng = random.Random(2)
    spec = {}
    for b in (1, 8, 32, 128):
        decode, steps = 0.0, 0.0
        trials = 60
        for _ in range(trials):
            per_request = [_request_steps(rng, alpha, k, n) for _ in range(b)]
            for s in range(1, max(per_request) + 1):
                active = sum(1 for x in per_request if x >= s)
                decode += fixed_ms + per_req_ms * active
            steps += sum(per_request) / b
        steps /= trials
        spec[str(b)] = {"step_ms": decode / trials / steps, "steps": steps, "max_tokens": n + 1,
                        "tpot_ms": decode / trials / n}
    base = {str(b): {"step_ms": 5.0, "tpot_ms": 5.0} for b in (1, 8, 32, 128)}
    t = CalibrationTable(target="x", draft="y", gpu="H200", tp=1, acceptance=alpha, baseline=base,
                         spec={str(k): spec})
    for b in (8, 32, 128):
        truth = fixed_ms + per_req_ms * b
        assert spec[str(b)]["step_ms"] > truth * 1.04  # the offline number is off...
        assert t.steady_step_ms(k, b) == pytest.approx(truth, rel=0.02)  # ...the steady one is not
        assert t.drain_ratio(k, b) > 1.04
        assert t.steady_speedup(k, b) > t.measured_speedup(k, b)
    assert t.steady_step_ms(k, 1) == pytest.approx(spec["1"]["step_ms"])


def test_shipped_tables_count_the_steps_the_drain_model_expects():
    """Real H200 runs: the spec-decode counters (drafts per request) agree with the exact step
    distribution of synthetic acceptance, so the drain model describes what vLLM did."""
    rows = 0
    for t in load_tables():
        for k in t.ks:
            for b, row in t.spec[str(k)].items():
                if not row.get("steps"):
                    continue
                n = int(row["max_tokens"]) - 1
                d = drain(t.acceptance, k, n, int(b))
                cdf = steps_cdf(t.acceptance, k, n)
                var = sum(s * s * (cdf[s] - cdf[s - 1]) for s in range(1, len(cdf))) - d.mean_steps ** 2
                # Each row is a median over repeats of the mean over `b` requests: 4 standard errors.
                se = (var / (int(b) * max(row.get("repeats", 2), 2))) ** 0.5 * 1.25
                assert abs(row["steps"] - d.mean_steps) <= 4 * se + 0.5, (t.target, t.draft, k, b)
                rows += 1
    assert rows >= 40


def test_two_engine_starts_of_one_configuration_are_pooled():
    def engine(tpot, steps=29.0):
        return {"status": "ok", "k": 4, "acceptance": 0.8, "gpu_name": "NVIDIA H200", "vllm_version": "0.26.0",
                "spec": {"target": "Llama-3.1-8B", "draft": "Llama-3.2-1B", "tp": 1, "id": "k4"},
                "batches": {"1": {"tpot_ms": tpot, "step_ms": tpot * 95 / steps, "steps": steps, "max_tokens": 96,
                                  "tM_s": [0.5, 0.6], "t1_s": [0.01, 0.01]}}}

    base = {"status": "ok", "k": 0, "gpu_name": "NVIDIA H200", "spec": {"target": "Llama-3.1-8B", "tp": 1},
            "batches": {"1": {"tpot_ms": 5.0, "step_ms": 5.0, "steps": 95, "max_tokens": 96}}}
    (t,) = tables_from_results([base, engine(6.0), engine(7.5, steps=30.0)])
    row = t.spec["4"]["1"]
    assert row["engines"] == 2 and row["tpot_ms"] == pytest.approx(6.75) and row["steps"] == pytest.approx(29.5)
    assert row["engine_spread"] == pytest.approx(0.25) and row["repeats"] == 4
    assert row["repeat_spread"] == pytest.approx(0.2)
    assert t.baseline["1"]["tpot_ms"] == 5.0 and "engines" not in t.baseline["1"]


def test_each_synthetic_rate_gets_its_own_table_with_the_shared_baseline(tmp_path):
    from draftfit.calibration.tables import find_table, write_table

    def engine(k, rate, steps):
        return {"status": "ok", "k": k, "acceptance": rate, "gpu_name": "NVIDIA H200", "vllm_version": "0.26.0",
                "spec": {"target": "Llama-3.1-8B", "draft": "Llama-3.2-1B", "tp": 1, "id": f"k{k}-a{rate}"},
                "batches": {"1": {"tpot_ms": 6.0, "step_ms": 6.0 * 95 / steps, "steps": steps, "max_tokens": 96}}}

    base = {"status": "ok", "k": 0, "gpu_name": "NVIDIA H200", "spec": {"target": "Llama-3.1-8B", "tp": 1},
            "batches": {"1": {"tpot_ms": 5.0, "step_ms": 5.0, "steps": 95, "max_tokens": 96}}}
    tables = tables_from_results([base, engine(2, 0.8, 39.0), engine(4, 0.8, 29.0), engine(2, 0.6, 48.0)])
    by_rate = {t.acceptance: t for t in tables}
    assert sorted(by_rate) == [0.6, 0.8] and by_rate[0.6].ks == [2] and by_rate[0.8].ks == [2, 4]
    assert by_rate[0.6].baseline == by_rate[0.8].baseline
    assert by_rate[0.6].configuration == by_rate[0.8].configuration  # held out together
    names = sorted(write_table(t, tmp_path).name for t in tables)
    assert names == ["Llama-3.1-8B__Llama-3.2-1B__H200__tp1.json", "Llama-3.1-8B__Llama-3.2-1B__H200__tp1__a0.6.json"]
    assert find_table("Llama-3.1-8B", "Llama-3.2-1B", "H200", 1, tmp_path).acceptance == 0.8
    # Step costs read both tables: the mean of the two engine starts where both measured the (K, batch).
    from draftfit.calibration.tables import PooledSteps, find_tables

    pooled = PooledSteps(find_tables("Llama-3.1-8B", "Llama-3.2-1B", "H200", 1, tmp_path))
    assert pooled.spec_step_ms(2, 1) == pytest.approx(
        (by_rate[0.8].spec_step_ms(2, 1) + by_rate[0.6].spec_step_ms(2, 1)) / 2)
    assert pooled.spec_step_ms(4, 1) == pytest.approx(by_rate[0.8].spec_step_ms(4, 1))
    assert sorted(pooled.spec) == ["2", "4"] and pooled.baseline == by_rate[0.8].baseline
    # The measured speedup at 0.6 with the pooled step: its own tokens per step over the mean step.
    own = by_rate[0.6]
    assert pooled.speedup(own, 2, 1) == pytest.approx(
        own.speedup(2, 1) * own.spec_step_ms(2, 1) / pooled.spec_step_ms(2, 1))
    assert pooled.speedup(own, 4, 1) is None  # 0.6 never measured K=4


def test_pooled_steps_weigh_each_table_by_its_engine_starts():
    from draftfit.calibration.tables import PooledSteps

    def engine(rate, step_ms, env=None):
        spec = {"target": "Llama-3.1-8B", "draft": "Llama-3.2-1B", "tp": 1, "id": f"k2-a{rate}-{step_ms}"}
        if env:
            spec["env"] = env
        return {"status": "ok", "k": 2, "acceptance": rate, "gpu_name": "NVIDIA H200", "spec": spec,
                "batches": {"1": {"tpot_ms": step_ms * 40 / 95, "step_ms": step_ms, "steps": 40.0,
                                  "max_tokens": 96}}}

    base = {"status": "ok", "k": 0, "gpu_name": "NVIDIA H200", "spec": {"target": "Llama-3.1-8B", "tp": 1},
            "batches": {"1": {"tpot_ms": 5.0, "step_ms": 5.0, "steps": 95, "max_tokens": 96}}}
    # Two starts at 0.8 (10 and 12 ms), one at 0.6 (20 ms), and an in-process diagnostic engine that
    # must not count: a changed vLLM environment is another setup.
    tables = tables_from_results([base, engine(0.8, 10.0), engine(0.8, 12.0), engine(0.6, 20.0),
                                  engine(0.8, 1.0, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})])
    assert sorted(t.spec["2"]["1"].get("engines", 1) for t in tables) == [1, 2]
    pooled = PooledSteps(tables)
    assert pooled.spec_step_ms(2, 1) == pytest.approx((10.0 + 12.0 + 20.0) / 3)
