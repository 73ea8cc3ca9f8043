"""The published acceptance data file (acceptance_published.yaml) and the per-method prior fitted on it (issue 36)."""

from __future__ import annotations

import yaml

from draftfit.acceptance import prior

REQUIRED = ("id", "source", "url", "engine", "engine_version", "gpu", "target", "drafter", "method", "dataset",
            "workload", "temperature", "k", "figure", "value", "read_from", "checked")


def _rows() -> list[dict]:
    return yaml.safe_load(prior.PUBLISHED_FILE.read_text())["points"]


def test_every_row_names_its_url_settings_and_kind_of_figure():
    rows = _rows()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    for r in rows:
        missing = [f for f in REQUIRED if f not in r]
        assert not missing, (r["id"], missing)
        assert r["url"].startswith("https://"), r["id"]
        assert "2601.11580" not in r["url"], "SpecDecode-Bench is the held-out external check"
        assert r["figure"] in ("tokens_per_step", "acceptance_rate", "speedup"), r["id"]
        assert r["figure"] != "speedup" or r.get("fit") is False, f"{r['id']}: a speedup is context, never fitted"
        assert r["read_from"] in ("table", "text"), r["id"]
        v = r["value"]
        for x in v if isinstance(v, list) else [v]:
            if r["figure"] == "acceptance_rate":
                assert 0 < x < 1, r["id"]
            else:
                assert 1 <= x <= (r["k"] or 64) + 1, r["id"]
        if r.get("fit", True):
            assert r["k"], f"{r['id']}: a fitted row needs K (a missing T counts as 0, said in the file)"


def test_at_least_40_points_from_6_sources():
    rows = _rows()
    assert len(rows) >= 40 and len({r["source"] for r in rows}) >= 6
    fitted = prior.published_method_points()
    assert len(fitted) >= 40 and len({p.source for p in fitted}) >= 6


def test_the_fit_reproduces_the_shipped_method_priors():
    fit = prior.method_prior_fit()
    for method, shipped in prior.METHOD_PRIORS.items():
        got = {k: fit[method][k] for k in shipped}
        assert got == shipped, method


def test_leave_one_source_out_band_covers_80_percent():
    fit = prior.method_prior_fit()
    for method, d in fit.items():
        if d["sources"] >= 2:
            assert d["coverage"] >= 0.8, method
            # no wider than needed: shrinking the band by a hair loses coverage below 80 %
            res = [abs(pred - prior._clip_logit(p.alpha)) for p, pred in d["loso"]]
            assert sum(r <= d["band_logit"] - 1e-3 for r in res) / len(res) < 0.8, method


def test_tokens_per_step_converts_through_the_iid_curve():
    p = next(p for p in prior.published_method_points() if p.id == "vllm-issue26191-l31-8b-eagle3-mtbench")
    assert abs(prior.tau_from_alpha(p.alpha, 7) - 3.53) < 1e-3


def test_eagle3_prior_has_no_temperature_term_the_data_do_not_show():
    t0 = prior.prior_acceptance("Qwen3-8B", "EAGLE3-Qwen3-8B", temperature=0.0, use_store=False)
    t1 = prior.prior_acceptance("Qwen3-8B", "EAGLE3-Qwen3-8B", temperature=1.0, use_store=False)
    assert prior.METHOD_PRIORS["eagle3"]["temperature"] is None
    assert t0.alpha == t1.alpha and "acceptance_published.yaml" in t0.citation
    # published vLLM EAGLE-3 at T=0 (Llama-3.1-8B MT-bench K=7: 3.53 tokens per step) lies inside the band
    assert t0.low <= prior.alpha_from_tau(3.53, 7) <= t0.high


def test_draft_model_band_covers_80_percent_with_the_source_left_out():
    points, _ = prior.fit_points()
    fitted = prior.AcceptancePrior().fit(points)
    res = []
    for s in sorted({p.source for p in points}):
        w = prior.fit_weights([p for p in points if p.source != s])
        res += [prior.predict_logit(w, p.relation, p.log_size_ratio, p.workload, p.temperature) - prior._logit(p.alpha)
                for p in points if p.source == s]
    half = max(prior.BAND_Z * fitted.loo_sd_, fitted.loso_half_)
    assert sum(abs(r) <= half + 1e-9 for r in res) / len(res) >= 0.8
    e = prior.prior_acceptance("Llama-3.1-70B", "Llama-3.1-8B", "chat", 0.0, use_store=False)
    z = prior._logit(e.alpha)
    assert abs(prior._logit(e.low) - (z - half)) < 0.05 or e.low <= prior.ALPHA_MIN + 1e-6
