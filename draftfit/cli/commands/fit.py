"""`draftfit fit`: retrain the learned speedup correction on the calibration tables (and store)."""

from __future__ import annotations

import click

from draftfit.cli.render import json_option
from draftfit.cli.render import console, emit_json
from draftfit.speedup.correction import fit_default


@click.command(name="fit")
@json_option
def fit(as_json: bool):
    """Retrain the best-K / speedup correction (scikit-learn) on data/calibration/*.json, cross-validate it
    by leaving whole configurations out, and save it with its training report in data/models/."""

    report = fit_default()
    if as_json:
        emit_json(report)
        return
    cv = report.cv
    con = console()
    con.print(f"trained on {report.n_samples} samples from {len(report.configurations)} configurations: "
              + ", ".join(report.configurations))
    con.print(f"cross-validated ({cv['method']}): corrected speedup error {cv['mape_corrected']:.1%} mean, "
              f"{cv['max_err_corrected']:.1%} max, {cv['within_15pct_corrected']:.0%} within 15%; "
              f"roofline prior alone {cv['mape_prior']:.1%}")
    con.print(f"saved {report.model_path} and {report.report_path}")
