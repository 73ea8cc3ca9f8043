"""Batch drain: what an offline calibration run measures beyond the steady-state step cost.

A calibration run starts B requests together and times them until the last one has its M tokens. Without
speculation every request needs exactly M - 1 decode steps. With speculation each engine step gives a
request 1..K+1 tokens (the accepted drafts plus one), so requests finish after different numbers of steps
and the run lasts max_i S_i steps, the last ones with fewer requests in the batch. A serving engine under
steady load keeps its batch full instead (continuous batching), so its TPOT is step_cost(B) / E[tokens per
step]: the offline TPOT ratio understates the steady-state speedup, the more so at large B and K (about 25 %
at B=128, K=4, alpha 0.8, 95 tokens).

For synthetic i.i.d. acceptance (what calibration imposes: P(first i drafts accepted) = alpha^i, drawn per
request and step) the distribution of S_i is exact, so the drain can be taken out of a measured run:
  decode_s = sum over engine steps s of cost(active requests at s)
  cost(b) ~ cost(B) x (phi + (1 - phi) x b / B)    (phi: the share of a step that does not scale with batch)
  => E[decode_s] = cost(B) x (phi x E[max_i S_i] + (1 - phi) x E[S])
phi comes from the same K's step costs at the next smaller measured batch (a memory-bound step costs the
same at 8 as at 1 requests: phi ~ 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


def tokens_per_step_pmf(alpha: float, k: int) -> list[float]:
    """P(a speculative step gives a request j tokens), j = 1..K+1 (index j-1)."""
    pmf = [alpha ** (j - 1) * (1 - alpha) for j in range(1, k + 1)]
    return pmf + [alpha ** k]


@lru_cache(maxsize=4096)
def steps_cdf(alpha: float, k: int, n_tokens: int) -> tuple[float, ...]:
    """F(s) = P(a request has its n_tokens after at most s steps), s = 0..S where F(S) ~ 1."""
    if not 0.0 <= alpha <= 1.0 or k < 0 or n_tokens < 1:
        raise ValueError(f"need 0 <= alpha <= 1, k >= 0, n_tokens >= 1 (got {alpha}, {k}, {n_tokens})")
    pmf = tokens_per_step_pmf(alpha, k) if k > 0 else [1.0]
    # dist[t]: P(t tokens so far and not done), t < n_tokens; done mass accumulates in F.
    dist = [0.0] * n_tokens
    dist[0] = 1.0
    cdf = [0.0]
    done = 0.0
    while done < 1 - 1e-12 and len(cdf) <= n_tokens:
        new = [0.0] * n_tokens
        for t, p in enumerate(dist):
            if p == 0.0:
                continue
            for j, q in enumerate(pmf, start=1):
                if t + j >= n_tokens:
                    done += p * q
                else:
                    new[t + j] += p * q
        dist = new
        cdf.append(min(done, 1.0))
    return tuple(cdf)


@dataclass(frozen=True)
class Drain:
    batch: int
    k: int
    mean_steps: float  # E[S] per request
    engine_steps: float  # E[max over the batch of S]: engine steps of the run

    @property
    def ratio(self) -> float:
        return self.engine_steps / self.mean_steps


def drain(alpha: float, k: int, n_tokens: int, batch: int) -> Drain:
    cdf = steps_cdf(round(alpha, 9), int(k), int(n_tokens))
    mean = sum(1 - f for f in cdf)
    engine = sum(1 - f ** batch for f in cdf)
    return Drain(batch=batch, k=k, mean_steps=mean, engine_steps=engine)


def batch_share(cost_small: float, cost_large: float, small: int, large: int) -> float:
    """phi, the share of a step at `large` requests that does not scale with the number of requests, from
    the step costs at two batch sizes (linear in the requests between them); clipped to [0, 1]."""
    if large <= small or cost_large <= 0:
        return 1.0
    x = small / large
    phi = (cost_small / cost_large - x) / (1 - x)
    return min(max(phi, 0.0), 1.0)


def steady_step_ms(decode_ms: float, measured_mean_steps: float, d: Drain, phi: float) -> float:
    """The step cost at a full batch that explains a drained run of decode_ms: decode_ms / (phi x engine
    steps + (1 - phi) x mean steps), engine steps scaled to the measured mean (the counters, not the model)."""
    engine = measured_mean_steps * d.ratio
    return decode_ms / (phi * engine + (1 - phi) * measured_mean_steps)
