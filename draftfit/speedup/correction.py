"""A learned correction to the analytic speedup model (scikit-learn, imported only inside functions).

What it learns: log(measured speedup / roofline-prior speedup) for a (target, draft, GPU, TP, batch, K,
acceptance). The analytic part (Leviathan et al. 2023's E(K) over roofline step costs) carries the
physics; the regressor learns what the roofline misses (kernel efficiency at small shapes, vLLM's
scheduling overheads, CUDA-graph coverage of large verify batches). Training data: the calibration tables
(draftfit/data/calibration/*.json: measured TPOT with and without speculation at a synthetic acceptance) and,
when the measurement store holds calibration entries, those too.

Features (FEATURES, in this order), and why each is there:
  size_ratio        draft params / target params: the classic proxy for c
  depth_ratio       draft layers / target layers: launch-bound drafts cost per layer, not per byte
  draft_layers      vLLM's draft passes pay a host cost per layer (seen on H200: ~0.15-0.25 ms/layer)
  log2_target_params  big targets are bandwidth-bound longer (verify nearly free)
  alpha             first-position acceptance; curve_e_k: E(K) from the whole acceptance curve (its
                    summary); curve_decay: a_K^(1/K) / a_1, how fast the curve falls off
  temperature       sampling costs more than greedy in the rejection sampler (0 for synthetic runs)
  workload          synthetic / code / math / chat / other as 0..4 (acceptance shape differs)
  log2_batch, k     the operating point
  graph_miss        batch x (K+1) above vLLM's largest captured CUDA graph (512): the verify runs eager
  bandwidth_tbps, bf16_pflops  the GPU
  tp                all-reduce latency per layer grows with TP
  prior_c, prior_ratio  the roofline's own c and plain/speculative step ratio: the model corrects them

Persisted to draftfit/data/models/speedup_model.joblib with draftfit/data/models/speedup_model.json (training report,
cross-validated error by leaving whole configurations out).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftfit.errors import DraftfitError, require
from draftfit.paths import DATA_DIR
from draftfit.acceptance.curve import expected_tokens_per_step, extend_curve
from draftfit.rules import NO_SPECULATION_BELOW, best_k
from draftfit.calibration.tables import load_tables, tables_of_version
from draftfit.speedup.stepcost import calibration_points, fitted_overheads, gpu_spec, graph_miss, model_spec, prior_step_cost

MODEL_DIR = DATA_DIR / "models"
MODEL_PATH = MODEL_DIR / "speedup_model.joblib"
REPORT_PATH = MODEL_DIR / "speedup_model.json"
FEATURES = ["size_ratio", "depth_ratio", "draft_layers", "log2_target_params", "alpha", "curve_e_k",
            "curve_decay", "temperature", "workload", "log2_batch", "k", "graph_miss", "bandwidth_tbps",
            "bf16_pflops", "tp", "prior_c", "prior_ratio"]
WORKLOADS = {"synthetic": 0, "code": 1, "math": 2, "chat": 3}


def featurize(*, target, draft, gpu, tp: int, batch: int, k: int, acceptance, temperature: float = 0.0,
              workload: str = "synthetic", prior=None, context_len: int = 1024) -> list[float]:
    """One feature row (order of FEATURES). `prior`: a stepcost.StepCost at this batch (computed if None)."""

    if prior is None or k not in prior.spec_step_ms:
        prior = prior_step_cost(target, draft, gpu, batch=batch, k_values=[k], tp=tp, context_len=context_len)
    if isinstance(acceptance, (int, float)):
        curve = [float(acceptance) ** (i + 1) for i in range(k)]
    else:
        curve = extend_curve(acceptance, k)
    a1 = curve[0]
    decay = (curve[-1] ** (1.0 / k) / a1) if a1 > 0 and curve[-1] > 0 else 0.0

    return [
        draft.params_b / max(target.params_b, 1e-9), draft.num_layers / max(target.num_layers, 1),
        float(draft.num_layers), math.log2(max(target.params_b, 1e-3)), a1, expected_tokens_per_step(curve, k),
        decay, float(temperature), float(WORKLOADS.get(workload, 4)), math.log2(batch), float(k),
        float(graph_miss(batch, k)), gpu.bandwidth_gbps / 1000.0, gpu.bf16_tflops / 1000.0, float(tp), prior.c,
        prior.base_step_ms / prior.spec_step_ms[k],
    ]


def _build_corrector_class():
    from sklearn.base import BaseEstimator, RegressorMixin

    class SpeedupCorrector(RegressorMixin, BaseEstimator):
        """sklearn regressor of log(measured / prior speedup). fit(X, y) / predict(X) validate their
        input like sklearn estimators (2-D finite arrays, matching feature count; predict before fit raises
        NotFittedError). A shallow gradient-boosted tree ensemble: few samples, nonlinear in batch and K."""

        def __init__(self, n_estimators: int = 150, max_depth: int = 2, learning_rate: float = 0.05,
                     random_state: int = 0):
            self.n_estimators = n_estimators
            self.max_depth = max_depth
            self.learning_rate = learning_rate
            self.random_state = random_state

        def fit(self, X, y):
            from sklearn.ensemble import GradientBoostingRegressor
            from sklearn.utils.validation import check_X_y

            X, y = check_X_y(X, y, ensure_all_finite=True, y_numeric=True)
            if X.shape[1] != len(FEATURES):
                raise ValueError(f"X has {X.shape[1]} features, SpeedupCorrector expects {len(FEATURES)} ({FEATURES})")
            self.n_features_in_ = X.shape[1]
            self.feature_names_in_ = list(FEATURES)
            self.regressor_ = GradientBoostingRegressor(
                n_estimators=self.n_estimators, max_depth=self.max_depth, learning_rate=self.learning_rate,
                random_state=self.random_state, subsample=1.0)
            self.regressor_.fit(X, y)
            return self

        def predict(self, X):
            from sklearn.utils.validation import check_array, check_is_fitted

            check_is_fitted(self, "regressor_")
            X = check_array(X, ensure_all_finite=True)
            if X.shape[1] != self.n_features_in_:
                raise ValueError(f"X has {X.shape[1]} features, but SpeedupCorrector was fitted with "
                                 f"{self.n_features_in_}")
            return self.regressor_.predict(X)

    SpeedupCorrector.__module__ = __name__
    SpeedupCorrector.__qualname__ = "SpeedupCorrector"
    return SpeedupCorrector


def _corrector():
    """The estimator class, built on first use so that importing this module does not import sklearn."""
    cls = globals().get("SpeedupCorrector")
    if cls is None:
        cls = _build_corrector_class()
        globals()["SpeedupCorrector"] = cls
    return cls


def __getattr__(name):  # `from draftfit.speedup.correction import SpeedupCorrector`, and unpickling, build it lazily
    if name == "SpeedupCorrector":
        return _corrector()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class TrainingSet:
    X: list = field(default_factory=list)
    y: list = field(default_factory=list)  # log(measured / prior)
    groups: list = field(default_factory=list)  # configuration id (one per calibration table)
    rows: list = field(default_factory=list)  # human-readable provenance per sample


def training_set(tables, *, overheads: dict | None = None) -> TrainingSet:
    """Samples from calibration tables: one per (table, K, batch) with a measured speedup."""

    ts = TrainingSet()
    for pt in calibration_points(tables, overheads=overheads):
        x = featurize(target=pt.target, draft=pt.draft, gpu=pt.gpu, tp=pt.table.tp, batch=pt.batch, k=pt.k,
                      acceptance=pt.table.acceptance, prior=pt.prior, context_len=pt.context_len)
        prior_speedup = x[FEATURES.index("curve_e_k")] * x[FEATURES.index("prior_ratio")]
        ts.X.append(x)
        ts.y.append(math.log(pt.measured / prior_speedup))
        ts.groups.append(pt.group)
        ts.rows.append({"group": pt.group, "batch": pt.batch, "k": pt.k, "measured": pt.measured,
                        "prior": prior_speedup})
    return ts


def loo_by_configuration(tables, **params) -> dict | None:
    """Leave one configuration out (its tables at every synthetic rate together, as they share step costs):
    overheads refitted and the corrector trained on the others, both the roofline alone and the corrected
    prediction scored on the held-out tables (errors vs measured)."""
    import numpy as np


    usable = [t for t in tables_of_version(tables) if training_set([t]).y]
    configurations = sorted({t.configuration for t in usable})
    if len(configurations) < 2:
        return None
    err_c, err_p = [], []
    for held in configurations:
        train = [t for t in usable if t.configuration != held]
        ov = fitted_overheads(tables=train)
        tr = training_set(train, overheads=ov)
        te = training_set([t for t in usable if t.configuration == held], overheads=ov)
        if len(tr.y) < 4 or not te.y:
            continue
        model = _corrector()(**params).fit(tr.X, tr.y)
        pred = model.predict(te.X)
        y = np.asarray(te.y)
        err_c += list(np.abs(np.exp(pred - y) - 1))
        err_p += list(np.abs(np.exp(-y) - 1))
    if not err_c:
        return None
    err_c, err_p = np.asarray(err_c), np.asarray(err_p)
    return {"method": f"leave-one-configuration-out ({len(configurations)} configurations; overheads and corrector "
                      f"refitted without the held-out one)", "n": int(len(err_c)),
            "mape_corrected": float(err_c.mean()), "mape_prior": float(err_p.mean()),
            "max_err_corrected": float(err_c.max()), "within_15pct_corrected": float((err_c <= 0.15).mean())}


def cross_validate(ts: TrainingSet, **params) -> dict:
    """Leave-one-configuration-out (GroupKFold over configurations) when there are 2+, else 5-fold."""
    import numpy as np
    from sklearn.model_selection import GroupKFold, KFold

    X, y, groups = np.asarray(ts.X), np.asarray(ts.y), np.asarray(ts.groups)
    n_groups = len(set(ts.groups))
    if n_groups >= 2:
        splitter, how = GroupKFold(n_splits=n_groups), f"leave-one-configuration-out ({n_groups} configurations)"
        splits = splitter.split(X, y, groups)
    else:
        n = min(5, len(y))
        splitter, how = KFold(n_splits=n, shuffle=True, random_state=0), f"{n}-fold (one configuration)"
        splits = splitter.split(X, y)
    pred = np.zeros_like(y)
    for train, test in splits:
        model = _corrector()(**params).fit(X[train], y[train])
        pred[test] = model.predict(X[test])
    rel_corrected = np.abs(np.exp(pred - y) - 1)  # |corrected / measured - 1|
    rel_prior = np.abs(np.exp(-y) - 1)  # |prior / measured - 1|
    return {"method": how, "n": int(len(y)), "mape_corrected": float(rel_corrected.mean()),
            "mape_prior": float(rel_prior.mean()), "max_err_corrected": float(rel_corrected.max()),
            "within_15pct_corrected": float((rel_corrected <= 0.15).mean())}


@dataclass
class FitReport:
    n_samples: int
    configurations: list
    cv: dict
    model_path: str
    report_path: str
    features: list
    sklearn_version: str
    trained_unix: int


def fit_default(tables=None, *, model_dir: Path = MODEL_DIR) -> FitReport:
    """Train on every calibration table, cross-validate, persist model + report."""
    require("sklearn")
    import joblib
    import sklearn


    # 0.26's tables only: the 0.33 prior has overheads of its own and too few configurations to learn from.
    tables = tables_of_version(load_tables() if tables is None else tables)
    # The prior it corrects is the one predictions use: overheads refitted on these same tables.
    ts = training_set(tables, overheads=fitted_overheads(tables=tables))
    if len(ts.y) < 4:
        raise DraftfitError(f"not enough calibration data to train on ({len(ts.y)} samples; no calibration data yet)"
                            if ts.y else "no calibration data yet",
                            fix="run the GPU campaign (docs/METHODS.md, sections 2 and 4) and `draftfit calibrate --ingest`")
    cv = loo_by_configuration(tables) or cross_validate(ts)
    model = _corrector()().fit(ts.X, ts.y)
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    mpath, rpath = model_dir / MODEL_PATH.name, model_dir / REPORT_PATH.name
    joblib.dump({"model": model, "features": FEATURES, "sklearn": sklearn.__version__}, mpath)
    report = FitReport(n_samples=len(ts.y), configurations=sorted(set(ts.groups)), cv=cv, model_path=str(mpath),
                       report_path=str(rpath), features=FEATURES, sklearn_version=sklearn.__version__,
                       trained_unix=int(time.time()))
    rpath.write_text(json.dumps({**report.__dict__, "samples": ts.rows}, indent=1) + "\n")
    global _DEFAULT
    _DEFAULT = None
    return report


class LoadedCorrector:
    """What predict_speedup(correction=...) applies: a fitted SpeedupCorrector with its report."""

    def apply(self, out: dict, model, acc, tp: int, notes: list) -> str | None:
        return _apply(self, out, model, acc, tp, notes)

    def __init__(self, model, report: dict):
        self.model = model
        self.report = report
        self.name = "speedup_model (draftfit/data/models)"
        cv = report.get("cv", {})
        self.cv_error_text = f"{cv.get('mape_corrected', float('nan')):.1%} MAPE, {cv.get('method', '?')}"

    def correction_factors(self, *, model, acceptance, batch: int, ks, tp: int) -> dict:

        target, draft, gpu = model_spec(model.target), model_spec(model.draft), gpu_spec(model.gpu)
        prior = model.per_batch[batch]
        X = [featurize(target=target, draft=draft, gpu=gpu, tp=tp, batch=batch, k=k, acceptance=acceptance,
                       prior=prior, context_len=model.context_len) for k in ks]
        return {k: math.exp(float(v)) for k, v in zip(ks, self.model.predict(X))}


_DEFAULT: LoadedCorrector | None = None


def load_default(model_dir: Path = MODEL_DIR) -> LoadedCorrector | None:
    """The persisted model, or None when none was trained (or sklearn is missing or of another version)."""
    global _DEFAULT
    mpath, rpath = Path(model_dir) / MODEL_PATH.name, Path(model_dir) / REPORT_PATH.name
    if _DEFAULT is not None and model_dir == MODEL_DIR:
        return _DEFAULT
    if not mpath.exists() or not rpath.exists():
        return None
    try:
        import joblib
        import sklearn
    except ImportError:
        return None
    try:
        report = json.loads(rpath.read_text())
    except (OSError, ValueError):
        return None
    cv = report.get("cv", {}) if isinstance(report, dict) else {}
    if cv.get("mape_corrected", 1.0) >= cv.get("mape_prior", 0.0):
        return None  # cross-validation says the correction does not beat the roofline: do not apply it
    try:
        blob = joblib.load(mpath)
    except Exception:  # noqa: BLE001 - a pickle of a renamed module or another library version: not trusted
        # (the shipped file once named draftfit.predictor, gone in the package restructure: `speedup
        # --learned-correction` died with an internal error)
        return None
    if not isinstance(blob, dict) or blob.get("sklearn") != sklearn.__version__ or blob.get("features") != FEATURES:
        return None  # retrain with `draftfit fit`; a pickled model of another version is not trusted
    loaded = LoadedCorrector(blob["model"], report)
    if model_dir == MODEL_DIR:
        _DEFAULT = loaded
    return loaded


def _apply(pred, out: dict, model, acc, tp: int, notes: list) -> str | None:
    """When a trained predictor exists (draftfit/data/models/), scale each speedup by its learned correction.
    Calibrated step costs already hold what it would learn, so it only corrects the roofline prior."""
    try:
        for b, bp in out.items():
            factors = pred.correction_factors(model=model, acceptance=acc, batch=b, ks=list(bp.per_k), tp=tp)
            for k, f in factors.items():
                row = bp.per_k[k]
                for key in ("speedup", "low", "high"):
                    row[key] *= f
            best = best_k({k: row["speedup"] for k, row in bp.per_k.items()})
            s = bp.per_k[best]["speedup"]
            if s >= NO_SPECULATION_BELOW:
                bp.best_k, bp.speedup, bp.low, bp.high, bp.verdict = best, s, bp.per_k[best]["low"], \
                    bp.per_k[best]["high"], "speculate"
            else:
                bp.best_k, bp.speedup, bp.verdict = 0, 1.0, "don't"
                bp.low, bp.high = min(bp.per_k[best]["low"], 1.0), max(bp.per_k[best]["high"], 1.0)
            bp.source += f" + {pred.name}"
    except Exception as exc:  # a stale or incompatible model must not break a prediction
        notes.append(f"learned correction skipped ({exc})")
        return None
    notes.append(f"roofline corrected by {pred.name} (cross-validated error {pred.cv_error_text})")
    return pred.name
