"""Stage: monitor — read a live vLLM server's Prometheus /metrics, report acceptance and advise K.

vLLM V1 (vllm/v1/spec_decode/metrics.py) exports counters, which prometheus_client suffixes with `_total`:
  vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
  vllm:spec_decode_num_accepted_tokens_total, vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
(one series per engine; we sum over engines). The V0 engine exported a gauge instead,
vllm:spec_decode_draft_acceptance_rate, read when present. Stdlib only (urllib): monitoring runs on
machines with nothing but draftfit installed.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from draftfit.errors import DraftfitError
from draftfit.speedup.predict import analytic_speedup, predict_speedup

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
V0_RATE = "vllm:spec_decode_draft_acceptance_rate"
V0_EFFICIENCY = "vllm:spec_decode_efficiency"
# Draft step cost relative to one target decode step when nothing better is known: a draft ~1/10-1/20 of
# the target's size, memory-bound, plus launch overhead.
DEFAULT_COST_RATIO = 0.1

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, _, labels_text, value = m.group(1), m.group(2), m.group(3), m.group(4)
        try:
            v = float(value)
        except ValueError:
            continue
        labels = {k: bytes(val, "utf-8").decode("unicode_escape") for k, val in _LABEL.findall(labels_text or "")}
        out.append(Sample(name, labels, v))
    return out


@dataclass
class SpecCounters:
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted: float = 0.0
    accepted_per_pos: list[float] = field(default_factory=list)
    v0_acceptance_rate: float | None = None
    v0_efficiency: float | None = None
    found: bool = False  # any spec-decode series at all

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        a = self.accepted_per_pos + [0.0] * (n - len(self.accepted_per_pos))
        b = before.accepted_per_pos + [0.0] * (n - len(before.accepted_per_pos))
        return SpecCounters(self.num_drafts - before.num_drafts, self.num_draft_tokens - before.num_draft_tokens,
                            self.num_accepted - before.num_accepted, [x - y for x, y in zip(a, b)],
                            self.v0_acceptance_rate, self.v0_efficiency, self.found)


def _base(name: str) -> str:
    for suffix in ("_total", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def counters_from_text(text: str) -> SpecCounters:
    c = SpecCounters()
    per_pos: dict[int, float] = {}
    for s in parse_prometheus(text):
        base, suffix = _base(s.name)
        if suffix == "_created":
            continue
        if base == DRAFTS:
            c.num_drafts += s.value
        elif base == DRAFT_TOKENS:
            c.num_draft_tokens += s.value
        elif base == ACCEPTED:
            c.num_accepted += s.value
        elif base == ACCEPTED_PER_POS:
            pos = int(s.labels.get("position", "0"))
            per_pos[pos] = per_pos.get(pos, 0.0) + s.value
        elif s.name == V0_RATE:
            c.v0_acceptance_rate = s.value
        elif s.name == V0_EFFICIENCY:
            c.v0_efficiency = s.value
        else:
            continue
        c.found = True
    if per_pos:
        c.accepted_per_pos = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)]
    return c


@dataclass
class KAdvice:
    current_k: int
    best_k: int
    speedup_by_k: dict[int, float]  # relative to no speculation, from the measured per-position rates
    cost_ratio: float
    cost_source: str
    reason: str


@dataclass
class MonitorReading:
    url: str
    window: str  # 'cumulative' (since server start) or 'delta' (last interval)
    elapsed_s: float | None
    num_drafts: int
    num_draft_tokens: int
    num_accepted: int
    acceptance_rate: float | None  # accepted / drafted
    mean_acceptance_length: float | None  # 1 + accepted / drafts (bonus token included, vLLM's convention)
    per_position: list[float]  # accepted at position i / drafts
    v0_acceptance_rate: float | None = None
    advice: KAdvice | None = None
    notes: list[str] = field(default_factory=list)


def advise_k(per_position: list[float], *, cost_ratio: float | None = None, layout: dict | None = None) -> KAdvice | None:
    """Best K <= measured K from the measured per-position rates.

    Per-position rates from one run at K_max give the acceptance of every smaller K (a draft stops at the
    first rejection, so position i's count does not depend on how many positions follow it). Step costs:
    with `layout` (target, draft, gpu, tp, batch) speedup.py's step-cost model; else Leviathan's
    E(K) / (1 + c K) with the given or default cost ratio c.
    """
    if not per_position:
        return None
    cur = len(per_position)
    speedups: dict[int, float] = {}
    source = ""
    if layout:
        try:
            pred = predict_speedup(layout["target"], layout["draft"], layout["gpu"], tp=layout.get("tp", 1),
                                   acceptance=list(per_position), batches=(layout.get("batch", 1),),
                                   k_values=range(1, cur + 1))
            row = pred.batches[layout.get("batch", 1)]
            speedups = {int(k): round(float(v["speedup"]), 3) for k, v in row.per_k.items()}
            cost_ratio = float(getattr(row, "c", 0.0) or 0.0)
            source = (f"step costs of {layout['target'].name} + {layout['draft'].name} on {layout['gpu'].name} "
                      f"x{layout.get('tp', 1)} at batch {layout.get('batch', 1)} ({pred.source})")
        except ImportError:
            speedups = {}
    if not speedups:
        if cost_ratio is None:
            cost_ratio = DEFAULT_COST_RATIO
            source = (f"default draft/target step cost ratio {DEFAULT_COST_RATIO} (pass --cost-ratio, or "
                      "--target/--draft/--gpu for the step-cost model)")
        else:
            source = f"--cost-ratio {cost_ratio:g}"
        for k in range(1, cur + 1):
            speedups[k] = round(analytic_speedup(list(per_position[:k]), k, cost_ratio), 3)
    best = max(speedups, key=lambda k: (speedups[k], -k))
    if best < cur:
        drop = ", ".join(f"{per_position[i]:.2f}" for i in range(best, cur))
        reason = (f"positions {best + 1}..{cur} are accepted in only {drop} of drafts, which no longer pays for "
                  f"their draft steps: use K={best}")
    else:
        reason = (f"every position still pays; K={cur} is the best measured — a larger K might help (measure it)"
                  if per_position[-1] > (cost_ratio or DEFAULT_COST_RATIO) * 2 else f"keep K={cur}")
    return KAdvice(current_k=cur, best_k=best, speedup_by_k=speedups, cost_ratio=cost_ratio or 0.0,
                   cost_source=source, reason=reason)


def reading_from_counters(c: SpecCounters, *, url: str, window: str, elapsed_s: float | None = None,
                          cost_ratio: float | None = None, layout: dict | None = None) -> MonitorReading:
    drafts = c.num_drafts
    rate = c.num_accepted / c.num_draft_tokens if c.num_draft_tokens > 0 else None
    mal = 1 + c.num_accepted / drafts if drafts > 0 else None
    per_pos = [round(x / drafts, 4) for x in c.accepted_per_pos] if drafts > 0 else []
    notes = []
    if not c.found:
        notes.append("no speculative-decoding series in /metrics: is the server running with --speculative-config?")
    elif drafts <= 0:
        notes.append("no drafts yet in this window: send some requests")
    r = MonitorReading(url=url, window=window, elapsed_s=elapsed_s, num_drafts=int(drafts),
                       num_draft_tokens=int(c.num_draft_tokens), num_accepted=int(c.num_accepted),
                       acceptance_rate=None if rate is None else round(rate, 4),
                       mean_acceptance_length=None if mal is None else round(mal, 3), per_position=per_pos,
                       v0_acceptance_rate=c.v0_acceptance_rate, notes=notes)
    r.advice = advise_k(per_pos, cost_ratio=cost_ratio, layout=layout)
    return r


def metrics_url(url: str) -> str:
    url = url.rstrip("/")
    if not re.match(r"^https?://", url):
        url = "http://" + url
    return url if url.endswith("/metrics") else url + "/metrics"


def fetch_metrics(url: str, timeout_s: float = 10.0) -> str:
    import urllib.error
    import urllib.request

    target = metrics_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DraftfitError(f"cannot read {target} ({exc})",
                            fix="is the server up? pass its base URL, e.g. http://127.0.0.1:8000",
                            exit_code=2) from None


def read_once(url: str, *, cost_ratio: float | None = None, layout: dict | None = None) -> MonitorReading:
    return reading_from_counters(counters_from_text(fetch_metrics(url)), url=metrics_url(url), window="cumulative",
                                 cost_ratio=cost_ratio, layout=layout)


def watch(url: str, interval_s: float, *, cost_ratio: float | None = None, count: int | None = None,
          layout: dict | None = None):
    """Yield a delta reading every interval (forever, or `count` times)."""
    before = counters_from_text(fetch_metrics(url))
    t0 = time.monotonic()
    n = 0
    while count is None or n < count:
        time.sleep(interval_s)
        now = counters_from_text(fetch_metrics(url))
        t1 = time.monotonic()
        yield reading_from_counters(now.minus(before), url=metrics_url(url), window="delta", elapsed_s=round(t1 - t0, 2),
                                    cost_ratio=cost_ratio, layout=layout)
        before, t0 = now, t1
        n += 1
