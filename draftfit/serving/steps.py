"""How long one engine step takes under a server's mixed load: the speedup stage's step costs (a plain decode step
and a speculative step of K drafts, per batch size: speedup.stepcost.step_cost_model, calibrated or roofline) on a
grid of batch sizes, plus two terms that stage does not price because an offline batch never has them:

- context: the step costs are priced at one context length (the calibration tables' 112 tokens, or the mean context
  passed to the roofline); a decode sequence holding more or fewer tokens reads more or less KV cache, priced at the
  roofline's bandwidth (speedup.stepcost BANDWIDTH_EFFICIENCY) [roofline].
- prefill: a chunk of prompt tokens in the same step (vLLM's chunked prefill) adds its FLOPs (target, and a draft
  model's own prefill of the same tokens) at the roofline's FLOPs rate (FLOPS_EFFICIENCY), less what the decode
  step's memory-bound time already leaves idle; a step of more than CUDAGRAPH_MAX_TOKENS tokens runs without CUDA
  graphs, so it costs at least the host's launch time of every layer (EAGER_HOST_LAYER_MS, measured) [roofline].

StepSurface.step_ms(decodes, k, prefill_tokens, prefill_flops_ms, context_sum) is what the simulator calls once per
engine step (or once per stretch of identical steps); `scale` multiplies every step (the band's low and high runs).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from draftfit.catalog.shapes import flops_per_token
from draftfit.catalog.specs import NO_MODEL_METHODS
from draftfit.speedup.stepcost import (BANDWIDTH_EFFICIENCY, CUDAGRAPH_MAX_TOKENS, FLOPS_EFFICIENCY, eager_host_ms,
                                       kv_bytes_per_token_per_rank, row_context_len, step_cost_model,
                                       weight_bytes_per_rank)

# Batch sizes the step costs are read at; between them the step is linear in the batch (a step is a fixed part
# plus a part per sequence), past the last one extrapolated along the last segment.
GRID = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
CALIBRATED_CONTEXT = row_context_len({})  # the tables' timed decodes: prompt 64 + half of 96 tokens

STEP_SOURCE_ROOFLINE = "roofline"


@dataclass
class StepSurface:
    """Step costs of one (target, drafter) on one layout as functions of batch, K, prefill tokens and context."""

    batches: list  # the grid actually read (up to max_num_seqs)
    plain_ms: list  # plain decode step at each grid batch (at context ctx_ref)
    spec_ms: dict  # K -> list over the grid
    band_plain: list  # relative band of a plain step at each grid batch (the smallest over K there)
    band_spec: dict  # K -> relative band at each grid batch
    ctx_ref: float  # context (tokens per sequence) the grid's steps are priced at
    kv_ms_per_token_plain: float  # ms per extra token of context per sequence (target KV read once)
    kv_ms_per_token_spec: dict  # K -> the same for a speculative step (verify + K draft passes)
    flop_ms_per_token: tuple  # (a, b): prefill FLOPs ms per token = a + b x position (target)
    draft_flop_ms_per_token: tuple  # the drafter's own prefill (0 for ngram/suffix)
    mem_ms: list  # roofline memory time of a plain decode forward at each grid batch (weights + KV at ctx_ref)
    eager_floor_ms: float  # host launch time of one forward without CUDA graphs (target)
    draft_eager_floor_ms: float
    source: str  # the step-cost model's source (calibrated:<file> | roofline prior)
    vllm: str  # the vLLM version(s) whose tables or fitted overheads the step costs come from
    notes: list = field(default_factory=list)
    scale: float = 1.0

    def scaled(self, sign: int) -> "StepSurface":
        """The surface at the step-cost band's high (sign +1: every step longer by its band) or low end (-1), each
        grid batch and K by its own band. A speculative step stays at least the plain step (it verifies at least
        the plain step's tokens: tests/test_speedup_invariants.py), and no step falls under a tenth of its point."""
        out = StepSurface(**{**self.__dict__})
        out.plain_ms = [max(v * (1 + sign * u), 0.1 * v) for v, u in zip(self.plain_ms, self.band_plain)]
        out.spec_ms = {k: [max(v * (1 + sign * u), 0.1 * v, p) for v, u, p in zip(vs, self.band_spec[k], out.plain_ms)]
                       for k, vs in self.spec_ms.items()}
        return out

    def band_at(self, k: int = 0) -> float:
        """The largest relative band over the grid (k 0: plain steps)."""
        return max(self.band_plain if not k else self.band_spec[k])

    def _interp(self, values: list, batch: float) -> float:
        xs = self.batches
        if batch <= xs[0]:
            return values[0]
        i = bisect.bisect_left(xs, batch)
        if i >= len(xs):
            i = len(xs) - 1
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = values[i - 1], values[i]
        return y0 + (y1 - y0) * (batch - x0) / (x1 - x0)

    def decode_ms(self, batch: int, k: int) -> float:
        """A decode-only step of `batch` sequences at context ctx_ref (k = 0: plain)."""
        return self._interp(self.plain_ms if k == 0 else self.spec_ms[k], batch)

    def step_ms(self, decodes: int, k: int, prefill_tokens: int = 0, prefill_flops_ms: float = 0.0,
                context_sum: float = 0.0, draft_prefill_flops_ms: float = 0.0) -> float:
        """One engine step: `decodes` sequences decoding (k drafts each, 0: plain) with `context_sum` tokens of
        context between them, and `prefill_tokens` prompt tokens whose FLOPs take prefill_flops_ms."""
        if decodes:
            t = self.decode_ms(decodes, k)
            per_tok = self.kv_ms_per_token_spec[k] if k else self.kv_ms_per_token_plain
            t += (context_sum - decodes * self.ctx_ref) * per_tok
            t = max(t, 0.5 * self.decode_ms(decodes, k))  # a short context never halves a step
        else:
            t = self.decode_ms(1, 0)  # the weights are streamed once whatever the step holds
        if prefill_tokens:
            # The decode forward streams its weights and KV while the tensor cores idle: the prefill's FLOPs fill
            # that time first (a forward costs max(bytes, FLOPs), not their sum).
            slack = max(self._interp(self.mem_ms, max(decodes, 1))
                        - decodes * (k + 1) * self.flop_ms_per_token[0], 0.0)
            extra = max(prefill_flops_ms - slack, 0.0) + draft_prefill_flops_ms
            if decodes * (k + 1) + prefill_tokens > CUDAGRAPH_MAX_TOKENS:
                extra = max(extra, self.eager_floor_ms + (self.draft_eager_floor_ms if k else 0.0))
            t += extra
        return t * self.scale


def _kv_ms_per_token(spec, gpu, tp: int, kv_dtype_bytes: int) -> float:
    """ms to read one token of one sequence's KV cache at the roofline's bandwidth."""
    if spec is None or not getattr(spec, "num_layers", 0):
        return 0.0
    return 1000 * kv_bytes_per_token_per_rank(spec, tp, kv_dtype_bytes) / (gpu.bandwidth_gbps * 1e9 *
                                                                            BANDWIDTH_EFFICIENCY)


def _flop_ms_per_token(spec, gpu, tp: int) -> tuple[float, float]:
    """Prefill FLOPs time per token as a + b x position (attention grows with the tokens before it)."""
    if spec is None or not getattr(spec, "num_layers", 0):
        return 0.0, 0.0
    rate = gpu.bf16_tflops * 1e12 * FLOPS_EFFICIENCY
    f0 = flops_per_token(spec, 0, tp)
    f1 = flops_per_token(spec, 1000, tp) - f0
    return 1000 * f0 / rate, 1000 * f1 / 1000 / rate


def build_surface(target, drafter, gpu, *, tp: int, k_values, max_batch: int, context_len: float,
                  rules=None, kv_dtype_bytes: int = 2) -> StepSurface:
    """Read the speedup stage's step costs on GRID (up to max_batch) and add the context and prefill terms."""
    grid = [b for b in GRID if b < max_batch] + [max_batch]
    grid = sorted(set(grid))
    if len(grid) == 1:
        grid = [grid[0], grid[0] + 1]
    ks = sorted(set(int(k) for k in k_values)) or [1]
    ctx = max(int(context_len), 1)
    model = step_cost_model(target, drafter, gpu, batches=grid, k_values=ks, tp=tp, context_len=ctx,
                            rules=rules, kv_dtype_bytes=kv_dtype_bytes)
    t, d = target, drafter
    calibrated = model.source.startswith("calibrated")
    ctx_ref = CALIBRATED_CONTEXT if calibrated else ctx
    plain = [model.per_batch[b].base_step_ms for b in grid]
    spec = {k: [model.per_batch[b].spec_step_ms[k] for b in grid] for k in ks}
    band_spec = {k: [model.per_batch[b].band(k) for b in grid] for k in ks}
    band_plain = [min(band_spec[k][i] for k in ks) for i in range(len(grid))]
    has_model = getattr(d, "method", "") not in NO_MODEL_METHODS and getattr(d, "num_layers", 0) > 0
    kv_t = _kv_ms_per_token(t, gpu, tp, kv_dtype_bytes)
    kv_d = _kv_ms_per_token(d, gpu, tp, kv_dtype_bytes) if has_model else 0.0
    bw = gpu.bandwidth_gbps * 1e9 * BANDWIDTH_EFFICIENCY
    mem = [1000 * (weight_bytes_per_rank(t, tp, b) / bw) + b * ctx_ref * kv_t for b in grid]
    return StepSurface(
        batches=grid, plain_ms=plain, spec_ms=spec, band_plain=band_plain, band_spec=band_spec, ctx_ref=ctx_ref,
        kv_ms_per_token_plain=kv_t, kv_ms_per_token_spec={k: kv_t + k * kv_d for k in ks},
        flop_ms_per_token=_flop_ms_per_token(t, gpu, tp),
        draft_flop_ms_per_token=_flop_ms_per_token(d, gpu, tp) if has_model else (0.0, 0.0),
        mem_ms=mem, eager_floor_ms=eager_host_ms(t), draft_eager_floor_ms=eager_host_ms(d) if has_model else 0.0,
        source=model.source, vllm=model.vllm_version, notes=list(model.notes))
