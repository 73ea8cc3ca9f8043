"""Leave-one-out error of draftfit's acceptance prior on the published (and stored) data points.

Each point is predicted by the prior refitted without it; the table reports alpha and, for readability,
the mean acceptance length at K=4 it implies. Writes the README section `priors`.

    .venv/bin/python bench/priors.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._readme import markdown_table, write_section  # noqa: E402
from draftfit.acceptance import prior as priors# noqa: E402


def main() -> int:
    published = priors.published_points()
    points, excluded = priors.fit_points()
    stored = [p for p in points if p.source == "measured"]
    loo = priors.leave_one_out(points)
    rows, errs, by_rel = [], [], {}
    for p, pred in loo:
        err = pred - p.alpha
        errs.append(err)
        by_rel.setdefault(p.relation, []).append(err)
        rows.append([p.id, f"{p.target} <- {p.draft}", p.relation, p.workload, f"{p.temperature:g}",
                     f"{p.alpha:.3f}", f"{pred:.3f}", f"{err:+.3f}",
                     f"{priors.tau_from_alpha(p.alpha, 4):.2f} / {priors.tau_from_alpha(pred, 4):.2f}",
                     p.reported.replace("|", "/")])
    mae = sum(abs(e) for e in errs) / len(errs)
    rmse = math.sqrt(sum(e * e for e in errs) / len(errs))
    weights, sd, _, n = priors._model()
    coef = ", ".join(f"{f} {w:+.2f}" for f, w in zip(priors.FEATURES, weights))
    summary = [[rel, len(es), f"{sum(abs(e) for e in es) / len(es):.3f}", f"{sum(es) / len(es):+.3f}"]
               for rel, es in sorted(by_rel.items())]
    excl = "; ".join(f"`{p.id}` (alpha {p.alpha:.3f}, T={p.temperature:g}: {why})" for p, why in excluded)
    body = "\n\n".join([
        f"Acceptance prior (draftfit/priors.py), leave-one-out over {len(points)} data points "
        f"({len(published)} published, {len(stored)} stored measurements): alpha MAE {mae:.3f}, RMSE {rmse:.3f}; "
        f"LOO residual sd on the logit scale {sd:.2f}; the prior's band is ±1.64 sd widened to "
        f"±{max(1.64 * sd, priors.fitted_prior().loso_half_):.2f} logit, what covers 80 % of points when their whole "
        "source is left out (see priors-published below)."
        + (f" Stored runs left out of the fit as outliers: {excl}." if excluded else ""),
        markdown_table(["relation", "points", "MAE alpha", "mean error"], summary),
        markdown_table(["point", "pair", "relation", "workload", "T", "alpha reported", "alpha LOO", "error",
                        "tau@K=4 reported / LOO", "as reported"], rows),
        f"Fitted logit coefficients (all points): {coef}. Sources and URLs: `draftfit/catalogs/acceptance_priors.yaml`.",
    ])
    print(body)
    write_section("priors", body, command=".venv/bin/python bench/priors.py")
    published = published_section()
    print(published)
    write_section("priors-published", published, command=".venv/bin/python bench/priors.py")
    return 0


def published_section() -> str:
    """Leave-one-source-out error per method of the per-method prior (prior.method_prior_fit) on
    draftfit/data/reference/acceptance_published.yaml, and how many held-out points its band covers."""
    import yaml

    rows_all = yaml.safe_load(priors.PUBLISHED_FILE.read_text())["points"]
    points = priors.published_method_points()
    fit = priors.method_prior_fit(points)
    k_show = 4
    table, detail = [], []
    for method, d in fit.items():
        loso = d["loso"]
        tau_err = [priors.tau_from_alpha(priors._sigmoid(pred), p.k) - priors.tau_from_alpha(p.alpha, p.k)
                   for p, pred in loso]
        rel = [e / priors.tau_from_alpha(p.alpha, p.k) for e, (p, _) in zip(tau_err, loso)]
        alpha = priors._sigmoid(d["logit"])
        lo, hi = priors._sigmoid(d["logit"] - d["band_logit"]), priors._sigmoid(d["logit"] + d["band_logit"])
        table.append([
            method, d["points"], d["sources"], f"{alpha:.3f} ({lo:.3f}-{hi:.3f})",
            f"{priors.tau_from_alpha(alpha, k_show):.2f}",
            ", ".join(f"{k} {v:.3f}" for k, v in d["trials"].items()) or "n/a (one source)",
            f"{d['loso_mae_logit']:.3f}" if loso else "n/a (one source)",
            f"{sum(abs(e) for e in tau_err) / len(tau_err):.2f}" if loso else "n/a",
            f"{sum(abs(r) for r in rel) / len(rel):.0%}" if loso else "n/a",
            f"{d['coverage']:.0%} of {len(loso)}" if loso else "n/a"])
        by_src: dict[str, list] = {}
        for (p, pred), e in zip(loso, tau_err):
            by_src.setdefault(p.source, []).append((p, pred, e))
        for src, items in sorted(by_src.items()):
            inside = sum(abs(pred - priors._clip_logit(p.alpha)) <= d["band_logit"] + 1e-12 for p, pred, _ in items)
            temps = sorted({p.temperature for p, _, _ in items})
            detail.append([method, src, len(items), ", ".join(f"{t:g}" for t in temps),
                           f"{sum(p.alpha for p, _, _ in items) / len(items):.3f}",
                           f"{priors._sigmoid(items[0][1]):.3f}",
                           f"{sum(e for _, _, e in items) / len(items):+.2f}", f"{inside}/{len(items)}"])
    # Draft models (the relation fit of acceptance_priors.yaml plus stored runs): left out one source at a time
    # too, against the band rank shows for them (BAND_Z x the LOO logit sd, widened to cover 80 % left out by source).
    dpts, _ = priors.fit_points()
    _, sd, _, _ = priors._model()
    res, tau_err = [], []
    for src in sorted({p.source for p in dpts}):
        w = priors.fit_weights([p for p in dpts if p.source != src])
        for p in [p for p in dpts if p.source == src]:
            z = priors.predict_logit(w, p.relation, p.log_size_ratio, p.workload, p.temperature)
            res.append(z - priors._clip_logit(p.alpha))
            tau_err.append(priors.tau_from_alpha(priors._sigmoid(z), k_show) - priors.tau_from_alpha(p.alpha, k_show))
    half = max(priors.BAND_Z * sd, priors.fitted_prior().loso_half_)  # the band rank shows (prior_acceptance)
    table.append(["draft model (relation fit)", len(dpts), len({p.source for p in dpts}), "by relation, size, T",
                  "", "relation fit (bench:priors above)", f"{sum(map(abs, res)) / len(res):.3f}",
                  f"{sum(map(abs, tau_err)) / len(tau_err):.2f} (at K={k_show})", "",
                  f"{sum(abs(r) <= half for r in res) / len(res):.0%} of {len(res)} (band ±{half:.2f} logit)"])
    n_src = len({r["source"] for r in rows_all})
    return "\n\n".join([
        f"`draftfit/data/reference/acceptance_published.yaml`: {len(rows_all)} published real-weight rows from "
        f"{n_src} sources, {len(points)} used by the fit (the rest state no K or temperature, or come from "
        "another engine). Each figure is turned into per-token alpha with the i.i.d. curve (tokens per step tau "
        "at K: (1-a^(K+1))/(1-a) = tau, curve.iid_alpha; a rate over drafted tokens: (tau-1)/K). Per method the "
        "prior is the source-weighted mean logit alpha; temperature and workload (code, math, summarization) "
        "terms are tried and kept only if they lower the leave-one-source-out (LOSO) error; the band is the smallest logit half-width covering "
        f"{priors.BAND_COVERAGE:.0%} of the LOSO residuals. Errors below are on tokens per step at each held-out "
        f"point's own K. Not fitted on, and not read: arXiv 2601.11580 (the external check).",
        markdown_table(["method", "points", "sources", "alpha (band)", f"tau@K={k_show}", "LOSO logit MAE by terms tried (none is kept unless it wins)",
                        "LOSO MAE logit", "LOSO MAE tau", "LOSO MAE tau %", "band coverage (held out)"], table),
        markdown_table(["method", "held-out source", "points", "T", "alpha published (mean)", "alpha LOSO",
                        "mean tau error", "inside band"], detail),
        "Draft models keep the relation fit above (their published points: acceptance_priors.yaml); ngram and "
        "suffix priors shown to users are the replay of method_prior.py, these rows are their cross-check; "
        "methods with one source cannot be left out and show n/a.",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
