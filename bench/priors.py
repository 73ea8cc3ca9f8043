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
        f"LOO residual sd on the logit scale {sd:.2f} sets the prior's band (±1.64 sd)."
        + (f" Stored runs left out of the fit as outliers: {excl}." if excluded else ""),
        markdown_table(["relation", "points", "MAE alpha", "mean error"], summary),
        markdown_table(["point", "pair", "relation", "workload", "T", "alpha reported", "alpha LOO", "error",
                        "tau@K=4 reported / LOO", "as reported"], rows),
        f"Fitted logit coefficients (all points): {coef}. Sources and URLs: `draftfit/catalogs/acceptance_priors.yaml`.",
    ])
    print(body)
    write_section("priors", body, command=".venv/bin/python bench/priors.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
