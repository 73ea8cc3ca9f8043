"""The serving-load stage: the scheduler simulation's logic on hand-computable cases, its limits against the fixed-batch
view, and the serve-sim / rank / preflight surface. Figures that matter (predicted vs measured) live in bench/serve_bench.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftfit.catalog.specs import resolve_gpu, resolve_model
from draftfit.cli import cli
from draftfit.errors import DraftfitError
from draftfit.engine import resolve_target
from draftfit.serving.load import AUTO_RATE_SHARES, _pays, auto_rates, per_batch_schedule
from draftfit.serving.sim import EngineLimits, SpecConfig, simulate
from draftfit.serving.steps import StepSurface, build_surface
from draftfit.serving.traffic import build_traffic, parse_length, sample_requests


def flat_surface(plain=10.0, spec=None, *, flop_ms=0.01, ks=(1, 2, 3, 4), slope_plain=0.0, slope_spec=0.0):
    """A surface with hand-set step costs: plain(B) = plain + slope_plain x (B-1), spec(B, K) = spec[K] + slope."""
    spec = spec or {k: plain + 5.0 * k for k in ks}
    ks = tuple(spec)
    grid = [1, 1024]
    return StepSurface(
        batches=grid, plain_ms=[plain, plain + slope_plain * 1023],
        spec_ms={k: [spec[k], spec[k] + slope_spec * (k + 1) * 1023] for k in ks},
        band_plain=[0.1, 0.1], band_spec={k: [0.2, 0.2] for k in ks}, ctx_ref=0.0, kv_ms_per_token_plain=0.0,
        kv_ms_per_token_spec={k: 0.0 for k in ks}, flop_ms_per_token=(flop_ms, 0.0),
        draft_flop_ms_per_token=(0.0, 0.0), mem_ms=[0.0, 0.0], eager_floor_ms=0.0, draft_eager_floor_ms=0.0,
        source="hand-set", vllm="test")


def limits(**kw):
    base = dict(max_num_seqs=256, max_num_batched_tokens=8192, kv_blocks=100_000, block_size=16, max_model_len=8192,
                async_scheduling=True)
    return EngineLimits(**{**base, **kw})


def test_one_request_alone_hand_computed():
    """One request, no contention: TTFT = its prefill step (plain step + 100 tokens x 0.01 ms), then every step
    emits K+1 tokens at acceptance 1, so TPOT = spec step / (K+1) and each ITL is one step."""
    s = flat_surface(plain=10.0, spec={2: 20.0})
    m = simulate([100], [10], [0.5], s, limits(lookahead=2, draft_slots=1), SpecConfig(k=2, curve=(1.0, 1.0)))
    assert m.ttft_ms["p50"] == pytest.approx(11.0)
    assert m.tpot_ms["p50"] == pytest.approx(20.0 * 3 / 9)  # 9 tokens after the first, 3 steps of 20 ms
    assert m.itl_ms["p50"] == pytest.approx(20.0)
    assert m.steps == 4 and m.completed == 1 and m.preemptions == 0
    base = simulate([100], [10], [0.5], s, limits(), SpecConfig())
    assert base.tpot_ms["p50"] == pytest.approx(10.0) and base.ttft_ms["p50"] == pytest.approx(11.0)


def test_accepted_tokens_follow_the_curve():
    """With a_i = 0.8^i the mean tokens per decode step is 1 + sum a_i (Leviathan et al.'s E)."""
    s = flat_surface()
    curve = tuple(0.8 ** i for i in range(1, 5))
    m = simulate([64] * 200, [400] * 200, [i * 100.0 for i in range(200)], s, limits(lookahead=4),
                 SpecConfig(k=4, curve=curve))
    assert m.tokens_per_step == pytest.approx(1 + sum(curve), rel=0.03)


def test_deterministic_in_seed():
    s = flat_surface(slope_plain=0.01, slope_spec=0.01)
    tr = build_traffic(request_rate="20", prompt_len="64..256", output_len="lognormal:100,50", num_requests=120)
    r = sample_requests(tr, 20.0, max_model_len=8192)
    cfg = SpecConfig(k=3, curve=(0.8, 0.6, 0.45))
    a = simulate(r.prompt_len, r.output_len, r.arrival_s, s, limits(lookahead=3), cfg, seed=1)
    b = simulate(r.prompt_len, r.output_len, r.arrival_s, s, limits(lookahead=3), cfg, seed=1)
    c = simulate(r.prompt_len, r.output_len, r.arrival_s, s, limits(lookahead=3), cfg, seed=2)
    assert a.to_dict() == b.to_dict()
    assert a.tpot_ms != c.tpot_ms


def test_preemption_when_kv_is_tiny():
    """Four clients whose sequences need 19 blocks each on a 40-block cache: requests are preempted and
    recomputed, and every one still completes."""
    s = flat_surface()
    m = simulate([100] * 8, [200] * 8, None, s, limits(kv_blocks=40), SpecConfig(), concurrency=4)
    assert m.preemptions > 0 and m.completed == 8
    roomy = simulate([100] * 8, [200] * 8, None, s, limits(), SpecConfig(), concurrency=4)
    assert roomy.preemptions == 0 and roomy.duration_s < m.duration_s


def test_async_scheduling_delays_a_request_arriving_mid_step():
    """A request arriving while a step runs joins the step after next with async scheduling, the next without."""
    s = flat_surface(plain=10.0)
    args = ([10, 10], [50, 2], [0.0, 0.0015])  # the second arrives 1.5 ms into the first's prefill step
    sync = simulate(*args, s, limits(async_scheduling=False), SpecConfig())
    asyn = simulate(*args, s, limits(async_scheduling=True), SpecConfig())
    assert asyn.ttft_ms["mean"] > sync.ttft_ms["mean"]


# ------------------------------------------------------------------------------- on the real step costs

@pytest.fixture(scope="module")
def llama():
    t, d, g = resolve_model("Llama-3.1-8B"), resolve_model("Llama-3.2-1B"), resolve_gpu("H200")
    return build_surface(t, d, g, tp=1, k_values=(2, 4), max_batch=1024, context_len=640, rules=resolve_target("0.34").rules)


def test_low_rate_tpot_is_the_fixed_batch_one(llama):
    """At a very low rate each request runs alone: its TPOT is the batch-1 step (plain) or step / E(K)."""
    tr = build_traffic(request_rate="0.02", prompt_len="512", output_len="256", num_requests=30)
    r = sample_requests(tr, 0.02, max_model_len=8192)
    lim = limits(max_num_seqs=1024, block_size=64)
    base = simulate(r.prompt_len, r.output_len, r.arrival_s, llama, lim, SpecConfig())
    ctx_adj = (512 + 128 - llama.ctx_ref) * llama.kv_ms_per_token_plain
    assert base.tpot_ms["p50"] == pytest.approx(llama.decode_ms(1, 0) + ctx_adj, rel=0.02)
    curve = (0.8, 0.64, 0.512, 0.4096)
    spec = simulate(r.prompt_len, r.output_len, r.arrival_s, llama, limits(max_num_seqs=1024, block_size=64,
                                                                             lookahead=4), SpecConfig(4, curve=curve))
    fixed = llama.decode_ms(1, 4) / (1 + sum(curve))
    assert spec.tpot_ms["p50"] == pytest.approx(fixed, rel=0.08)
    assert base.mean_batch < 1.1


def test_throughput_saturates(llama):
    """Output throughput grows with the rate, then stops at what a full server (max_num_seqs clients) does."""
    lim = limits(max_num_seqs=256, block_size=64)
    tr = build_traffic(request_rate="1", prompt_len="512", output_len="128", num_requests=400)
    thr = []
    for rate in (2.0, 8.0, 500.0, 5000.0):
        r = sample_requests(tr, rate, max_model_len=8192)
        thr.append(simulate(r.prompt_len, r.output_len, r.arrival_s, llama, lim, SpecConfig()).output_throughput)
    closed = sample_requests(build_traffic(concurrency=256, prompt_len="512", output_len="128", num_requests=400),
                             None, max_model_len=8192)
    full = simulate(closed.prompt_len, closed.output_len, None, llama, lim, SpecConfig(), concurrency=256)
    assert thr[0] < thr[1] < thr[2]
    assert thr[3] == pytest.approx(full.output_throughput, rel=0.1)
    assert thr[3] == pytest.approx(thr[2], rel=0.1)


def test_speculation_stops_paying_past_the_crossover():
    """Cheap drafts at batch 1, compute-bound verifies at large batch: speculation lowers median TPOT at a light
    load and raises it at a heavy one."""
    s = flat_surface(plain=10.0, spec={4: 12.0}, ks=(4,), slope_plain=0.1, slope_spec=0.1)
    curve = (0.8, 0.64, 0.512, 0.4096)
    tr = build_traffic(request_rate="1", prompt_len="128", output_len="200", num_requests=300)
    light = sample_requests(tr, 0.5, max_model_len=8192)
    heavy = sample_requests(tr, 80.0, max_model_len=8192)
    out = {}
    for name, r in (("light", light), ("heavy", heavy)):
        b = simulate(r.prompt_len, r.output_len, r.arrival_s, s, limits(max_num_seqs=1024), SpecConfig())
        sp = simulate(r.prompt_len, r.output_len, r.arrival_s, s, limits(max_num_seqs=1024, lookahead=4),
                      SpecConfig(4, curve=curve))
        out[name] = (b, sp)
    assert _pays(out["light"][1], out["light"][0], False)
    assert out["heavy"][1].tpot_ms["p50"] > out["heavy"][0].tpot_ms["p50"]
    assert not _pays(out["heavy"][1], out["heavy"][0], False)


def test_per_batch_schedule_turns_speculation_off_where_it_costs():
    s = flat_surface(plain=10.0, spec={4: 12.0}, ks=(4,), slope_plain=0.02, slope_spec=0.02)
    sched = per_batch_schedule(s, [0.8, 0.64, 0.512, 0.4096], (4,))
    assert sched[0][0] == 1 and sched[0][2] == 4 and sched[-1][2] == 0 and sched[-1][1] == 1024


@pytest.mark.parametrize("text,kind,mean", [("512", "fixed", 512), ("100..300", "uniform", 200),
                                            ("lognormal:600,300", "lognormal", 600)])
def test_length_forms(text, kind, mean):
    d = parse_length(text, "--prompt-len")
    assert d.kind == kind and d.mean == mean


@pytest.mark.parametrize("text", ["0", "-5", "x", "1.5", "300..100", "lognormal:0,1", "lognormal:5", "nan", ""])
def test_bad_lengths_are_one_error(text):
    with pytest.raises(DraftfitError, match="--prompt-len"):
        parse_length(text, "--prompt-len")


def test_request_log_lengths(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("prompt_tokens,completion_tokens\n100,20\n300,40\n")
    tr = build_traffic(request_rate="1", request_log=str(log), num_requests=2)
    r = sample_requests(tr, 1.0, max_model_len=8192)
    assert list(r.prompt_len) == [100, 300] and list(r.output_len) == [20, 40]


# ------------------------------------------------------------------------------------------------ CLI

def _run(*args):
    return CliRunner().invoke(cli, list(args))


def test_serve_sim_json_answers_per_rate():
    res = _run("serve-sim", "-t", "Llama-3.1-8B", "--draft", "Llama-3.2-1B", "--gpu", "H200", "--vllm-version",
               "0.34.0", "--max-model-len", "4096", "--request-rate", "1,30", "--num-requests", "80", "--k", "2",
               "--slo-tpot-ms", "25", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    d = data["drafters"][0]
    assert [p["rate"] for p in d["points"]] == [1.0, 30.0]
    p = d["points"][0]
    for key in ("tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "itl_p99_ms", "output_throughput", "goodput"):
        band = p["best"][key]
        assert band["low"] <= band["value"] <= band["high"], key
    assert d["step_cost_source"] and d["acceptance_source"] and data["engine"]["max_num_batched_tokens"] == 8192
    assert p["best"]["label"] == "K=2"


def test_rank_and_preflight_answer_at_the_traffic():
    res = _run("rank", "-t", "Qwen3-8B", "--gpu", "H200", "--request-rate", "2", "--num-requests", "60", "--json")
    assert res.exit_code == 0, res.output
    load = json.loads(res.stdout)["serving_load"]
    assert load["drafters"] and load["drafters"][0]["points"][0]["rate"] == 2.0
    res = _run("preflight", "Qwen3-8B", "Qwen3-0.6B", "--gpu", "H200", "--request-rate", "2", "--num-requests", "60",
               "--json")
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["serving_load"]["drafters"][0]["drafter"] == "Qwen3-0.6B"


def test_traffic_options_without_a_load_are_refused():
    res = _run("rank", "-t", "Qwen3-8B", "--slo-tpot-ms", "20")
    assert res.exit_code == 2 and "needs a load" in res.output


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "load.png"
    res = _run("serve-sim", "-t", "Qwen3-8B", "--draft", "ngram", "--gpu", "H200", "--request-rate", "1,8",
               "--num-requests", "40", "--k", "3", "--plot", str(out))
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 1000


def test_auto_rates_are_shares_of_the_modelled_saturation():
    tr = build_traffic(request_rate="auto", num_requests=10)
    assert tr.auto and tr.rates == () and tr.concurrency is None
    assert auto_rates(20.0) == sorted({float(f"{s * 20:.2g}") for s in AUTO_RATE_SHARES})
