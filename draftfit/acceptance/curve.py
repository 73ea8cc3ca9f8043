"""Stage 4 — acceptance: what vLLM's spec-decode counters mean, and the curve over K.

vLLM counts, per engine step that carried a draft: one draft (`num_drafts`), K draft tokens
(`num_draft_tokens`), the accepted prefix length (`num_accepted_tokens`), and for every position i < K
whether the draft's i-th token was accepted (`num_accepted_tokens_per_pos[i]`). Acceptance is a prefix
(position i counts only when 0..i were all accepted), so per-position counts never increase with i.

One run at K_max therefore gives every smaller K: with a_i = accepted_i / num_drafts,
    mean acceptance length(K) = 1 + sum_{i<K} a_i          (tokens emitted per target step)
    acceptance rate(K)        = sum_{i<K} accepted_i / (num_drafts * K)
This is exact for the steps the K_max run took; a run at K takes slightly different steps (after a full
accept it drafts from a different position), which bench/acceptance.py checks against separate K runs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from draftfit.errors import DraftfitError


@dataclass
class KPoint:
    k: int
    acceptance_rate: float
    mean_acceptance_length: float
    per_position: list[float]


@dataclass
class AcceptanceResult:
    acceptance_rate: float  # accepted / draft tokens at k
    mean_acceptance_length: float  # 1 + accepted / drafts at k (tokens per target step)
    per_position: list[float]  # a_i = accepted_i / num_drafts, i < k
    num_drafts: int
    num_draft_tokens: int
    num_accepted: int
    k: int
    temperature: float
    workload: str
    backend: str  # 'vllm' or 'hf'
    ci_low: float | None = None  # 95% bootstrap CI (over prompt groups) of acceptance_rate
    ci_high: float | None = None
    run_id: int | None = None
    mal_ci_low: float | None = None  # same, for mean_acceptance_length
    mal_ci_high: float | None = None
    per_position_accepted: list[int] = field(default_factory=list)  # raw counts at k
    curve: list[KPoint] = field(default_factory=list)  # every K <= k from the same counts
    groups: list[dict] = field(default_factory=list)  # per prompt group: num_drafts, per_position_accepted
    target: str = ""
    draft: str = ""
    num_prompts: int = 0
    max_tokens: int = 0
    seed: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    tokens_per_s: float = 0.0
    wall_s: float = 0.0  # the whole measurement (engine start or model load + every temperature)
    source: str = ""  # "measured run <id> (vllm ...)" etc.
    suspect: str | None = None  # why these numbers are known to be wrong (store status 'suspect'), else None


def curve_for_k(per_position_accepted: list[int], num_drafts: int, k: int) -> KPoint:
    """Acceptance at K (<= len(per_position_accepted)) from per-position accepted counts at K_max."""
    if k < 1 or k > len(per_position_accepted):
        raise ValueError(f"k={k} outside 1..{len(per_position_accepted)} (the measured K_max)")
    if num_drafts <= 0:
        return KPoint(k, 0.0, 1.0, [0.0] * k)
    counts = per_position_accepted[:k]
    rates = [c / num_drafts for c in counts]
    return KPoint(k=k, acceptance_rate=sum(counts) / (num_drafts * k),
                  mean_acceptance_length=1.0 + sum(rates), per_position=rates)


def full_curve(per_position_accepted: list[int], num_drafts: int) -> list[KPoint]:
    return [curve_for_k(per_position_accepted, num_drafts, k) for k in range(1, len(per_position_accepted) + 1)]


def _sum_groups(groups: list[dict], k: int) -> tuple[int, list[int]]:
    drafts = sum(g["num_drafts"] for g in groups)
    per_pos = [sum(g["per_position_accepted"][i] for g in groups) for i in range(k)]
    return drafts, per_pos


def bootstrap_ci(groups: list[dict], k: int, *, resamples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> dict[str, tuple[float, float] | None]:
    """Percentile bootstrap over prompt groups (the unit that is independent; tokens within a prompt are
    not). Returns CIs of acceptance_rate and mean_acceptance_length; None with fewer than 2 groups."""
    usable = [g for g in groups if g["num_drafts"] > 0]
    if len(usable) < 2:
        return {"acceptance_rate": None, "mean_acceptance_length": None}
    rng = random.Random(seed)
    rates, lengths = [], []
    for _ in range(resamples):
        sample = [usable[rng.randrange(len(usable))] for _ in usable]
        drafts, per_pos = _sum_groups(sample, k)
        point = curve_for_k(per_pos, drafts, k)
        rates.append(point.acceptance_rate)
        lengths.append(point.mean_acceptance_length)

    def pct(values):
        values.sort()
        lo = values[int((1 - level) / 2 * (len(values) - 1))]
        hi = values[int((1 + level) / 2 * (len(values) - 1))]
        return (lo, hi)

    return {"acceptance_rate": pct(rates), "mean_acceptance_length": pct(lengths)}


def result_from_counts(*, per_position_accepted: list[int], num_drafts: int, num_draft_tokens: int,
                       num_accepted: int, k: int, temperature: float, workload: str, backend: str,
                       groups: list[dict] | None = None, seed: int = 0, with_ci: bool = True,
                       **extra) -> AcceptanceResult:
    """An AcceptanceResult at k (the measured K) with its curve for every smaller K and the bootstrap CI.
    Rates at k come from the totals vLLM reported, so stored numbers equal the counters."""
    point = curve_for_k(per_position_accepted, num_drafts, k)
    rate = num_accepted / num_draft_tokens if num_draft_tokens else 0.0
    mal = 1.0 + num_accepted / num_drafts if num_drafts else 1.0
    # The bootstrap costs ~80 ms a run; the prior's fit reads only the rates (with_ci=False).
    ci = bootstrap_ci(groups or [], k, seed=seed) if with_ci else {"acceptance_rate": None,
                                                                  "mean_acceptance_length": None}
    ar, ml = ci["acceptance_rate"], ci["mean_acceptance_length"]
    return AcceptanceResult(
        acceptance_rate=rate, mean_acceptance_length=mal, per_position=point.per_position,
        num_drafts=num_drafts, num_draft_tokens=num_draft_tokens, num_accepted=num_accepted, k=k,
        temperature=temperature, workload=workload, backend=backend,
        ci_low=ar[0] if ar else None, ci_high=ar[1] if ar else None,
        mal_ci_low=ml[0] if ml else None, mal_ci_high=ml[1] if ml else None,
        per_position_accepted=list(per_position_accepted[:k]), curve=full_curve(per_position_accepted[:k], num_drafts),
        groups=list(groups or []), seed=seed, **extra)


def iid_alpha(mean_acceptance_length: float, k: int) -> float:
    """The i.i.d. per-token acceptance alpha whose (1 - a^(K+1)) / (1 - a) equals the measured mean
    acceptance length at K (Leviathan et al. 2023, eq. 1); bisection, for the speedup stage."""
    target = max(1.0, min(mean_acceptance_length, k + 1.0))
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        value = sum(mid**i for i in range(k + 1))
        lo, hi = (mid, hi) if value < target else (lo, mid)
    return (lo + hi) / 2


# The tokens-per-step formula (Leviathan et al. 2023, arXiv:2211.17192, eq. 1), for an i.i.d. rate or a curve.
def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise DraftfitError(f"acceptance rate {alpha} is outside [0, 1]", fix="pass --alpha between 0 and 1")
    return alpha


def _check_curve(curve) -> list[float]:
    vals = [float(v) for v in curve]
    if not vals:
        raise DraftfitError("empty acceptance curve", fix="pass --acceptance-curve a1,a2,...")
    for i, v in enumerate(vals):
        if not (0.0 <= v <= 1.0):
            raise DraftfitError(f"acceptance curve entry {i + 1} = {v} is outside [0, 1]",
                                fix="a_i is P(first i drafts all accepted), a probability")
        if i and v > vals[i - 1] + 1e-9:
            raise DraftfitError(f"acceptance curve rises at position {i + 1} ({vals[i - 1]} -> {v})",
                                fix="a_i = P(first i drafts all accepted) cannot increase with i")
    return vals


def extend_curve(curve, k: int) -> list[float]:
    """The curve to length k; past its end, each further draft is accepted with the last conditional rate."""
    vals = _check_curve(curve)
    if len(vals) >= k:
        return vals[:k]
    last = vals[-1]
    cond = (vals[-1] / vals[-2]) if len(vals) >= 2 and vals[-2] > 0 else vals[-1]
    out = list(vals)
    while len(out) < k:
        last *= cond
        out.append(last)
    return out


def expected_tokens_per_step(alpha_or_curve, k: int) -> float:
    """Tokens one speculative step yields: (1 - a^(K+1)) / (1 - a) for i.i.d. a; 1 + sum a_i for a curve."""
    k = int(k)
    if k < 0:
        raise DraftfitError(f"K = {k} is negative", fix="K (num_speculative_tokens) is 0 or more")
    if isinstance(alpha_or_curve, (int, float)):
        a = _check_alpha(alpha_or_curve)
        if a >= 1.0:
            return float(k + 1)
        return (1.0 - a ** (k + 1)) / (1.0 - a)
    return 1.0 + sum(extend_curve(alpha_or_curve, k)) if k else 1.0


# ------------------------------------------------------------------------------------ n-gram / suffix mixture
# A model-free drafter (n-gram prompt lookup, suffix decoding) proposes nothing on a step whose context has no
# match. Its acceptance is a mixture, not an i.i.d. per-token rate: how often a decode step drafts, and how many
# of a draft's tokens the target keeps when it does. vLLM's counters give both: num_drafts counts only steps that
# drafted, and each step emits 1 + its accepted tokens, so decode steps = output tokens - accepted - one prefill
# token per request. A replay (engine-free) runs every K on its own (mixture_from_runs): at a smaller K the proposer
# drafts again sooner after a fully accepted draft, so one run at K_max read at smaller K (mixture_from_counts, all
# a measured run has) understates them (bench/ngram_replay.py shows both).

@dataclass
class MixturePoint:
    k: int
    draft_probability: float  # share of decode steps that carry a draft
    accepted_given_draft: float  # mean tokens accepted on a step that drafted, at K
    tokens_per_step: float  # 1 + draft_probability x accepted_given_draft: tokens a decode step emits at K


@dataclass
class Mixture:
    """The two halves of a model-free drafter's acceptance, per K, with what they rest on."""

    k_max: int
    num_drafts: int  # at k_max
    decode_steps: int  # at k_max
    draft_probability: float  # at k_max
    per_k: list[MixturePoint]
    basis: str  # what the counts come from: a replay of which outputs, or which measured run
    lookup: tuple[int, int] | None = None  # n-gram: (prompt_lookup_min, prompt_lookup_max); None for suffix
    notes: list[str] = field(default_factory=list)
    # Acceptance of draft position i per decode step (a step without a draft accepts nothing): what the speedup
    # stage sums into tokens per step; 1 + sum(curve[:K]) is per_k[K-1].tokens_per_step (see mixture_from_runs).
    curve: list[float] = field(default_factory=list)
    per_k_runs: bool = False  # True: each K replayed on its own; False: every K read from one run at k_max

    @property
    def per_position(self) -> list[float]:
        return list(self.curve)

    def at(self, k: int) -> MixturePoint:
        return self.per_k[min(max(int(k), 1), self.k_max) - 1]

    def to_json(self) -> dict:
        top = self.per_k[-1]
        return {"k": self.k_max, "draft_probability": round(self.draft_probability, 4),
                "accepted_per_draft": round(top.accepted_given_draft, 4),
                "tokens_per_step": round(top.tokens_per_step, 4), "num_drafts": self.num_drafts,
                "decode_steps": self.decode_steps, "basis": self.basis,
                "lookup": list(self.lookup) if self.lookup else None, "notes": list(self.notes),
                "per_k_runs": self.per_k_runs,
                "per_k": [{"k": p.k, "draft_probability": round(p.draft_probability, 4),
                           "accepted_given_draft": round(p.accepted_given_draft, 4),
                           "tokens_per_step": round(p.tokens_per_step, 4),
                           "priced_tokens_per_step": round(1.0 + sum(self.curve[:p.k]), 4)} for p in self.per_k]}


def decode_steps_from_counters(output_tokens: int, num_accepted: int, requests: int) -> int:
    """Decode steps of a run from vLLM's counters: every step emits 1 + its accepted tokens and each request's
    first token comes from its prefill. A request whose last draft runs to its stop emits no bonus token after it
    (vLLM counts the acceptance before the stop truncates), so the result is a lower bound by at most one step per
    request, never below 0."""
    return max(int(output_tokens) - int(num_accepted) - int(requests), 0)


def _check_counts(num_drafts: int, num_accepted: int, decode_steps: int, k: int) -> None:
    if num_drafts < 0 or decode_steps < 0 or num_accepted < 0:
        raise DraftfitError(f"negative spec-decode counters (drafts {num_drafts}, decode steps {decode_steps})",
                            fix="the run's counters are damaged: measure again")
    if num_drafts and decode_steps == 0:
        raise DraftfitError(f"{num_drafts} drafts in 0 decode steps", fix="the run's token counts are damaged")
    if num_accepted > num_drafts * k:
        raise DraftfitError(f"{num_accepted} accepted tokens from {num_drafts} drafts of at most {k} at K={k}",
                            fix="the run's counters are damaged: measure again")


def _draft_probability(num_drafts: int, decode_steps: int, notes: list[str]) -> float:
    p = num_drafts / decode_steps if decode_steps else 0.0
    if p > 1.0:  # counters near the stop of requests (decode_steps_from_counters): at most every step drafts
        notes.append(f"{num_drafts} drafts over {decode_steps} decode steps derived from the counters: draft "
                     "probability clamped to 1")
        p = 1.0
    return p


def mixture_from_counts(per_position_accepted: list[int], num_drafts: int, decode_steps: int, *, basis: str,
                        lookup: tuple[int, int] | None = None) -> Mixture:
    """The mixture at every K <= len(per_position_accepted) from one run's counters: per_position_accepted[i] is
    the number of drafts whose first i+1 tokens were all accepted (vLLM's num_accepted_tokens_per_pos). The draft
    probability is the run's at every K (its steps are the K_max run's)."""
    counts = [int(c) for c in per_position_accepted]
    if not counts:
        raise DraftfitError("no per-position acceptance counts to build the mixture from",
                            fix="measure or replay with K >= 1")
    if any(c < 0 for c in counts):
        raise DraftfitError(f"negative spec-decode counters (per-position {counts})",
                            fix="the run's counters are damaged: measure again")
    _check_counts(num_drafts, sum(counts), decode_steps, len(counts))
    if any(b > a for a, b in zip(counts, counts[1:])) or counts[0] > num_drafts:
        raise DraftfitError("per-position accepted counts rise with the position or exceed the drafts",
                            fix="acceptance is a prefix: the counts of a real run never rise; measure again")
    notes: list[str] = []
    p = _draft_probability(num_drafts, decode_steps, notes)
    points, acc = [], 0
    for k, c in enumerate(counts, 1):
        acc += c
        given = acc / num_drafts if num_drafts else 0.0
        points.append(MixturePoint(k=k, draft_probability=p, accepted_given_draft=given,
                                   tokens_per_step=1.0 + p * given))
    curve = [c / num_drafts * p if num_drafts else 0.0 for c in counts]
    return Mixture(k_max=len(counts), num_drafts=int(num_drafts), decode_steps=int(decode_steps),
                   draft_probability=p, per_k=points, basis=basis, lookup=tuple(lookup) if lookup else None,
                   notes=notes, curve=curve)


def _non_increasing(values: list[float]) -> list[float]:
    """The closest non-increasing sequence in least squares (pool adjacent violators): pooled blocks keep their
    sum, so 1 + the sum up to the end of every block is unchanged."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    out: list[float] = []
    for s, n in blocks:
        out += [s / n] * n
    return out


def mixture_from_runs(runs: dict, *, basis: str, lookup: tuple[int, int] | None = None) -> Mixture:
    """The mixture from one replay per K: runs[k] = (num_drafts, num_accepted, decode_steps) of the run at K, for
    K = 1..K_max. Each K's draft probability and accepted length given a draft are its own run's. The speedup stage
    sums a per-position curve whose partial sums must be the tokens per step at each K and must not rise with the
    position; where two runs' increments do (replay noise, a few tenths of a percent), adjacent positions are pooled
    and a note says how far the priced tokens per step move."""
    ks = sorted(int(k) for k in runs)
    if not ks or ks != list(range(1, ks[-1] + 1)):
        raise DraftfitError(f"replays at K {ks} are not 1..K_max", fix="replay every K from 1 up")
    points, notes = [], []
    for k in ks:
        drafts, accepted, steps = (int(x) for x in runs[k])
        _check_counts(drafts, accepted, steps, k)
        p = _draft_probability(drafts, steps, notes)
        given = accepted / drafts if drafts else 0.0
        points.append(MixturePoint(k=k, draft_probability=p, accepted_given_draft=given,
                                   tokens_per_step=1.0 + p * given))
    tokens = [1.0] + [pt.tokens_per_step for pt in points]
    increments = [max(tokens[i + 1] - tokens[i], 0.0) for i in range(len(points))]
    curve = _non_increasing(increments)
    curve = [min(c, 1.0) for c in curve]
    worst = max(abs(1 + sum(curve[:k]) - points[k - 1].tokens_per_step) / points[k - 1].tokens_per_step
                for k in ks)
    if worst > 0.005:
        notes.append(f"the separate K replays' gains per extra position do not shrink steadily with K (or tokens "
                     f"per step fall at a larger K); the priced curve pools neighbouring positions and never falls "
                     f"(at most {worst:.1%} off a replay)")
    top = runs[ks[-1]]
    return Mixture(k_max=ks[-1], num_drafts=int(top[0]), decode_steps=int(top[2]),
                   draft_probability=points[-1].draft_probability, per_k=points, basis=basis,
                   lookup=tuple(lookup) if lookup else None, notes=notes, curve=curve, per_k_runs=True)
