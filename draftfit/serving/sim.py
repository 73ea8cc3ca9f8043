"""One vLLM server under a stream of requests, step by step: vLLM's V1 scheduler (engine.scheduler) over the step
costs of serving.steps, with and without speculation.

Why a hand-written step loop and not a discrete-event library (simpy, salabim, ciw; vidur's simulator): the engine
is ONE server that advances in iterations, each of which schedules every running request at once (continuous
batching) and lasts as long as its whole batch; arrivals are a sorted list known in advance (or, for a closed loop,
the completion that frees a client). There is no contention between processes to arbitrate and no event a
library's queue would order better than `t_end = t_start + step_ms(batch)`: the loop below IS the event loop, with
one event per engine step, and is exact for this model. A DES library would add a generator per request and a
heap operation per token, ~100x slower in Python for the same answer, and its queueing primitives (a resource with
a capacity) do not express token budgets, chunked prefill, KV blocks or preemption, which the scheduler needs.
(vidur, github.com/microsoft/vidur, is the same shape: its simulator steps batch stages from an event heap whose
only events are arrivals and batch ends.) Speed comes from two things: each step is vectorized over the running
requests (numpy), and a stretch of steps in which nothing can change the batch (no arrival that could be admitted,
no completion, no prefill, no block shortage) is applied at once.

What each step does, after vLLM 0.34's `Scheduler.schedule()` (v1/core/sched/scheduler.py):
- running requests first, in order: a decoding request asks for 1 + K tokens (its last sampled token and K drafts;
  K from the fixed K or the per-batch-size schedule at this batch), a prefilling one for the rest of its prompt,
  within the step's token budget (max_num_batched_tokens, less draft_slots per scheduled request). Its KV blocks
  must cover computed + new + lookahead (K for draft models and heads) tokens; when the free blocks do not, the
  LAST running request is preempted (its blocks freed, its prompt and generated tokens recomputed later, from the
  head of the waiting queue).
- then, if nothing was preempted, waiting requests in arrival order, while fewer than max_num_seqs run: admitted
  only if the blocks for their whole current sequence are free (scheduler_reserve_full_isl), their first chunk
  allocated.
- the step's time: StepSurface.step_ms(decodes, K, prefill tokens, ...). A decoding request then emits 1 + A tokens
  as ONE streamed chunk, A accepted drafts drawn from the acceptance curve (P(A >= i) = a_i; one uniform draw per
  request and decode step, shared across K and configurations: common random numbers); computed tokens grow by the
  same. A prefill that completes emits its first token.
- async scheduling (engine.rules.VllmRules.async_scheduling, per version and method): step n+1 is scheduled while
  step n runs, so a request that arrives during step n joins step n+2 at the earliest.
Metrics follow `vllm bench serve` (benchmarks/serve.py calculate_metrics, lib/endpoint_request_func.py): TTFT from
send to the first chunk, ITL per streamed chunk after the first (a speculative step's extra tokens share its chunk),
TPOT = (latency - TTFT) / (output tokens - 1) per request, throughputs over the run from time 0 to the last token,
goodput = requests meeting every SLO given, per second.
Not modelled: the API server's tokenization and streaming (about a millisecond a request), prefix caching (the
random prompts of the benchmark share none), one step's lag before a finished request's blocks and slot are reused
under async scheduling.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from draftfit.serving.steps import StepSurface


@dataclass(frozen=True)
class EngineLimits:
    """The server's limits the scheduler works within (from the memory plan and engine.scheduler)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    block_size: int
    max_model_len: int
    async_scheduling: bool
    draft_slots: int = 0  # per scheduled request (draft_model: 1)
    lookahead: int = 0  # KV slots reserved past the scheduled tokens (K for draft models and heads)
    reserve_full_sequence: bool = True


@dataclass
class SpecConfig:
    """What the server speculates with: nothing (k 0), a fixed K, or vLLM's per-batch-size schedule."""

    k: int = 0
    schedule: tuple = ()  # ((lo, hi, K), ...): num_speculative_tokens_per_batch_size
    curve: tuple = ()  # a_i = P(the first i drafts are all accepted), i = 1..max K

    def k_at(self, batch: int) -> int:
        for lo, hi, k in self.schedule:
            if lo <= batch <= hi:
                return k
        return self.schedule[-1][2] if self.schedule else self.k

    @property
    def k_max(self) -> int:
        return self._k_max

    def __post_init__(self):
        self._k_max = max([self.k] + [r[2] for r in self.schedule])

    def label(self) -> str:
        if self.schedule:
            return "K by batch " + ", ".join(f"{lo}-{hi}:{k}" for lo, hi, k in self.schedule)
        return f"K={self.k}" if self.k else "no speculation"


@dataclass
class SimMetrics:
    """One run's figures, named as `vllm bench serve` prints them (ms, tokens/s, requests/s)."""

    completed: int
    duration_s: float
    output_throughput: float
    request_throughput: float
    goodput: float | None  # requests/s meeting every SLO given (None: no SLO)
    ttft_ms: dict  # {"p50", "p99", "mean"}
    tpot_ms: dict
    itl_ms: dict
    e2el_ms: dict
    mean_batch: float  # mean decoding sequences per step
    tokens_per_step: float  # mean tokens a decoding sequence emitted per step
    preemptions: int
    steps: int
    peak_running: int
    kv_peak_share: float  # peak share of KV blocks in use

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _pct(values, weights=None) -> dict:
    import numpy as np

    v = np.asarray(values, dtype=float)
    if weights is not None:
        v = np.repeat(v, np.asarray(weights, dtype=np.int64))
    if not v.size:
        return {"p50": 0.0, "p99": 0.0, "mean": 0.0}
    return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)), "mean": float(v.mean())}


def simulate(prompt_len, output_len, arrival_s, surface: StepSurface, limits: EngineLimits, spec: SpecConfig, *,
             concurrency: int | None = None, seed: int = 0, slo_ttft_ms: float | None = None,
             slo_tpot_ms: float | None = None, max_steps: int = 5_000_000) -> SimMetrics:
    """Run the requests through the modelled server; arrival_s None with `concurrency` = a closed loop of that
    many clients. Deterministic in its inputs and `seed`."""
    import numpy as np

    P = np.asarray(prompt_len, dtype=np.int64)
    O = np.asarray(output_len, dtype=np.int64)
    N = len(P)
    bs = limits.block_size
    la = limits.lookahead if spec.k_max else 0
    slots = limits.draft_slots if spec.k_max else 0
    # Common random numbers: one uniform per request and output token (an upper bound on its decode steps);
    # accepted drafts at K = min(K, #{i: a_i > u}).
    offs = np.concatenate([[0], np.cumsum(O)])
    if spec.k_max:
        u = np.random.default_rng([seed, 7]).random(int(offs[-1]) + 1)
        neg = -np.asarray(spec.curve[:spec.k_max], dtype=float)
        accept_cap = np.searchsorted(neg, -u, side="left").astype(np.int64)  # a_i > u  <=>  -a_i < -u
    else:
        accept_cap = np.zeros(int(offs[-1]) + 1, dtype=np.int64)

    computed = np.zeros(N, dtype=np.int64)  # tokens whose KV is written (vLLM num_computed_tokens)
    generated = np.zeros(N, dtype=np.int64)
    held = np.zeros(N, dtype=np.int64)  # KV blocks held
    ptr = np.zeros(N, dtype=np.int64)  # decode steps taken (index into the request's draws)
    first_t = np.full(N, np.nan)
    last_t = np.full(N, np.nan)
    finish_t = np.full(N, np.nan)
    arrive = np.zeros(N) if arrival_s is None else np.asarray(arrival_s, dtype=float)
    if arrival_s is None:  # closed loop: the first `concurrency` clients send at 0, each next one on a completion
        released = min(concurrency or N, N)
        arrive[released:] = np.inf
    else:
        released = N
    itl_vals: list = []  # arrays of ITLs (ms)
    itl_w: list = []  # their multiplicities
    free = limits.kv_blocks
    waiting: deque = deque()
    running: list = []
    next_arrival = 0  # requests are released in index order
    t = 0.0  # engine clock, s: end of the last step
    prev_start = 0.0
    busy = False  # the last step ran back to back with the one before (async scheduling look-ahead)
    steps = preemptions = 0
    dec_steps = dec_seq_steps = 0
    dec_tokens = 0
    peak_running = 0
    peak_used = 0
    done = 0
    # Order of arrivals: the index order of release times (sorted for Poisson; closed loop releases in order).
    order = np.argsort(arrive, kind="stable") if arrival_s is not None else np.arange(N)

    def k_step(batch: int) -> int:
        return spec.k_at(batch) if spec.k_max else 0

    def blocks_for(tokens) -> "np.ndarray":
        return -(-tokens // bs)

    while done < N:
        if steps >= max_steps:
            raise RuntimeError(f"serving simulation did not finish in {max_steps} steps")
        if not running and not waiting:
            if next_arrival >= N:
                break
            nxt = order[next_arrival]
            if not math.isfinite(arrive[nxt]):
                break
            t = max(t, arrive[nxt])
            busy = False
        sched = prev_start if (limits.async_scheduling and busy) else t
        while next_arrival < N and arrive[order[next_arrival]] <= sched:
            waiting.append(int(order[next_arrival]))
            next_arrival += 1
        if not running and not waiting:
            busy = False
            continue

        run = np.asarray(running, dtype=np.int64)
        B = len(running)
        ntok = P[run] + generated[run]
        decoding = (generated[run] >= 1) & (computed[run] == ntok - 1) if B else np.zeros(0, bool)
        k = k_step(B)

        # ---- a stretch of identical decode-only steps, applied at once -------------------------------------
        admissible = bool(waiting) and B < limits.max_num_seqs and (
            not limits.reserve_full_sequence
            or int(blocks_for(min(P[waiting[0]] + generated[waiting[0]], limits.max_model_len))) <= free)
        arrival_can_join = (not waiting) and B < limits.max_num_seqs and next_arrival < N
        if B and decoding.all() and not admissible:
            rem = O[run] - generated[run]
            width = int(min(rem.min(), max(16, 8192 // B)))
            if width >= 2 and B * (1 + k + slots) <= limits.max_num_batched_tokens:
                cols = np.arange(width)
                idx = np.minimum(offs[run][:, None] + ptr[run][:, None] + cols[None, :], offs[run + 1][:, None] - 1)
                tau = 1 + np.minimum(k, accept_cap[idx]) if k else np.ones((B, width), dtype=np.int64)
                cum = np.cumsum(tau, axis=1)
                before = cum - tau  # tokens emitted before each step
                # completion: the first step whose tokens reach the request's remainder; stop before it
                done_at = np.where((cum >= rem[:, None]).any(axis=1), (cum >= rem[:, None]).argmax(axis=1), width)
                n = int(done_at.min())
                # blocks: the scheduler's need at each step, against what is held and free
                need = blocks_for(computed[run][:, None] + before + (1 + k) + la)
                extra = np.maximum(need - held[run][:, None], 0).sum(axis=0)
                short = np.nonzero(extra > free)[0]
                if short.size:
                    n = min(n, int(short[0]))
                if n >= 1:
                    ctx = (computed[run][:, None] + before[:, :n]).sum(axis=0).astype(float)
                    base = surface.decode_ms(B, k)
                    per_tok = surface.kv_ms_per_token_spec[k] if k else surface.kv_ms_per_token_plain
                    dt = np.maximum(base + (ctx - B * surface.ctx_ref) * per_tok, 0.5 * base) * surface.scale / 1e3
                    starts = t + np.concatenate([[0.0], np.cumsum(dt)[:-1]])
                    if arrival_can_join:
                        ta = arrive[order[next_arrival]]
                        sched_s = np.concatenate([[sched], starts[:-1]]) if limits.async_scheduling else starts
                        late = np.nonzero(sched_s[1:] >= ta)[0]
                        if late.size:
                            n = min(n, int(late[0]) + 1)
                        dt, starts = dt[:n], starts[:n]
                    ends = starts + dt
                    emitted = before[:, n - 1] + tau[:, n - 1]
                    itl_vals.append((ends[0] - last_t[run]) * 1e3)
                    itl_w.append(np.ones(B, dtype=np.int64))
                    if n > 1:
                        itl_vals.append(dt[1:] * 1e3)
                        itl_w.append(np.full(n - 1, B, dtype=np.int64))
                    generated[run] += emitted
                    computed[run] += emitted
                    ptr[run] += n
                    grow = np.maximum(need[:, n - 1] - held[run], 0)
                    held[run] += grow
                    free -= int(grow.sum())
                    last_t[run] = ends[-1]
                    prev_start, t, busy = float(starts[-1]), float(ends[-1]), True
                    steps += n
                    dec_steps += n
                    dec_seq_steps += n * B
                    dec_tokens += int(emitted.sum())
                    peak_used = max(peak_used, limits.kv_blocks - free)
                    continue

        # ---- one exact step -------------------------------------------------------------------------------
        budget = limits.max_num_batched_tokens
        sched_ids: list = []
        sched_new: list = []
        preempted_now = False
        demand = np.where(decoding, 1 + k, ntok - computed[run]) if B else np.zeros(0, np.int64)
        need_all = blocks_for(computed[run] + demand + la) if B else demand
        extra_all = np.maximum(need_all - held[run], 0) if B else demand
        if B and int((demand + slots).sum()) <= budget and int(extra_all.sum()) <= free:
            sched_ids = running[:]
            sched_new = demand.tolist()
            held[run] += extra_all
            free -= int(extra_all.sum())
            budget -= int((demand + slots).sum())
        else:
            i = 0
            while i < len(running) and budget > 0:
                rid = running[i]
                if budget <= slots:
                    break
                nt = int(P[rid] + generated[rid])
                is_dec = generated[rid] >= 1 and computed[rid] == nt - 1
                want = (1 + k) if is_dec else nt - int(computed[rid])
                want = min(want, budget - slots, limits.max_model_len - int(computed[rid]) - 1)
                if want <= 0:
                    i += 1
                    continue
                need = int(blocks_for(int(computed[rid]) + want + la)) - int(held[rid])
                victim = None
                while need > free:
                    victim = running.pop()
                    free += int(held[victim])
                    held[victim] = 0
                    computed[victim] = 0
                    waiting.appendleft(victim)
                    preemptions += 1
                    preempted_now = True
                    if victim == rid:
                        break
                if victim == rid:
                    break
                if need > 0:
                    held[rid] += need
                    free -= need
                sched_ids.append(rid)
                sched_new.append(want)
                budget -= want + slots
                i += 1
        if not preempted_now:
            while waiting and len(running) < limits.max_num_seqs and budget > slots:
                rid = waiting[0]
                nt = int(P[rid] + generated[rid])
                if limits.reserve_full_sequence and int(blocks_for(min(nt, limits.max_model_len))) > free:
                    break
                chunk = min(nt - int(computed[rid]), budget - slots)
                need = int(blocks_for(int(computed[rid]) + chunk + la)) - int(held[rid])
                if need > free:
                    break
                waiting.popleft()
                running.append(rid)
                held[rid] += max(need, 0)
                free -= max(need, 0)
                sched_ids.append(rid)
                sched_new.append(chunk)
                budget -= chunk + slots
        if not sched_ids:  # nothing fits: only possible when one request needs more blocks than exist
            raise RuntimeError("a request needs more KV blocks than the server has")
        ids = np.asarray(sched_ids, dtype=np.int64)
        new = np.asarray(sched_new, dtype=np.int64)
        nt = P[ids] + generated[ids]
        is_dec = (generated[ids] >= 1) & (computed[ids] == nt - 1)
        dec_ids, pf_ids, pf_new = ids[is_dec], ids[~is_dec], new[~is_dec]
        D = len(dec_ids)
        kk = k if D else 0  # the K the decodes were scheduled with (at the batch before admissions)
        pf_tokens = int(pf_new.sum())
        a, b = surface.flop_ms_per_token
        da, db = surface.draft_flop_ms_per_token
        pos = computed[pf_ids] + pf_new / 2.0  # mean position of each chunk's tokens
        pf_ms = float((pf_new * (a + b * pos)).sum())
        dpf_ms = float((pf_new * (da + db * pos)).sum()) if spec.k_max else 0.0
        dt = surface.step_ms(D, kk, pf_tokens, pf_ms, float(computed[dec_ids].sum()), dpf_ms) / 1e3
        start = t
        end = start + dt
        # decode outcomes: 1 + accepted drafts, one chunk
        if D:
            nd = new[is_dec]
            tau = 1 + np.minimum(nd - 1, accept_cap[np.minimum(offs[dec_ids] + ptr[dec_ids], offs[dec_ids + 1] - 1)])
            tau = np.minimum(tau, O[dec_ids] - generated[dec_ids])
            itl_vals.append((end - last_t[dec_ids]) * 1e3)
            itl_w.append(np.ones(D, dtype=np.int64))
            generated[dec_ids] += tau
            computed[dec_ids] += tau
            ptr[dec_ids] += 1
            last_t[dec_ids] = end
            dec_steps += 1
            dec_seq_steps += D
            dec_tokens += int(tau.sum())
        if len(pf_ids):
            computed[pf_ids] += pf_new
            fin = computed[pf_ids] == P[pf_ids] + generated[pf_ids]
            got = pf_ids[fin]
            resumed = got[generated[got] > 0]
            if len(resumed):
                itl_vals.append((end - last_t[resumed]) * 1e3)
                itl_w.append(np.ones(len(resumed), dtype=np.int64))
            fresh = got[generated[got] == 0]
            first_t[fresh] = end
            generated[got] += 1
            last_t[got] = end
        steps += 1
        prev_start, t, busy = start, end, True
        peak_running = max(peak_running, len(running))
        peak_used = max(peak_used, limits.kv_blocks - free)
        arr = np.asarray(running, dtype=np.int64)
        fin_mask = generated[arr] >= O[arr]
        if fin_mask.any():
            fin_ids = arr[fin_mask].tolist()
            running = arr[~fin_mask].tolist()
            for r in fin_ids:
                free += int(held[r])
                held[r] = 0
                finish_t[r] = end
                done += 1
                if arrival_s is None and released < N:  # the client sends its next request
                    arrive[released] = end
                    released += 1

    ok = np.isfinite(finish_t)
    send = np.where(np.isfinite(arrive), arrive, 0.0)
    ttft = (first_t[ok] - send[ok]) * 1e3
    lat = (finish_t[ok] - send[ok]) * 1e3
    multi = ok & (O > 1)
    tpot = (finish_t[multi] - first_t[multi]) / (O[multi] - 1) * 1e3
    duration = float(np.nanmax(finish_t)) if ok.any() else 0.0
    good = None
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        all_tpot = np.where(O > 1, (finish_t - first_t) / np.maximum(O - 1, 1) * 1e3, 0.0)
        meets = ok.copy()
        if slo_ttft_ms is not None:
            meets &= (first_t - send) * 1e3 <= slo_ttft_ms
        if slo_tpot_ms is not None:
            meets &= all_tpot <= slo_tpot_ms
        good = float(meets.sum()) / duration if duration else 0.0
    itl = np.concatenate(itl_vals) if itl_vals else np.zeros(0)
    w = np.concatenate(itl_w) if itl_w else np.zeros(0, dtype=np.int64)
    return SimMetrics(
        completed=int(ok.sum()), duration_s=duration,
        output_throughput=float(O[ok].sum()) / duration if duration else 0.0,
        request_throughput=float(ok.sum()) / duration if duration else 0.0, goodput=good,
        ttft_ms=_pct(ttft), tpot_ms=_pct(tpot), itl_ms=_pct(itl, w), e2el_ms=_pct(lat),
        mean_batch=dec_seq_steps / dec_steps if dec_steps else 0.0,
        tokens_per_step=dec_tokens / dec_seq_steps if dec_seq_steps else 0.0, preemptions=preemptions,
        steps=steps, peak_running=max(peak_running, 0), kv_peak_share=peak_used / max(limits.kv_blocks, 1))
