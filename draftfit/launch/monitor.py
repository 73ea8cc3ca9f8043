"""Stage: monitor — read a live vLLM server's Prometheus /metrics, report acceptance and advise K.

vLLM V1 (vllm/v1/spec_decode/metrics.py) exports counters, which prometheus_client suffixes with `_total`:
  vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
  vllm:spec_decode_num_accepted_tokens_total, vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
(one series per engine; we sum over engines). The V0 engine exported a gauge instead,
vllm:spec_decode_draft_acceptance_rate, read when the counters are absent. Stdlib only (urllib): monitoring
runs on machines with nothing but draftfit installed.

What a server sends is not trusted: one scrape is bounded in time (connect timeout, per-read timeout and one
deadline for the whole response, headers included) and in size; a redirect is followed only on the same
scheme, host and port; the body must be UTF-8 Prometheus text; position labels must be small non-negative
integers (< MAX_POSITIONS); counters must be finite, non-negative and consistent (accepted <= drafted, per
position non-increasing). Anything else is one DraftfitError line.
"""

from __future__ import annotations

import io
import math
import re
import time
from dataclasses import dataclass, field

from draftfit.engine.metrics import ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS, V0_EFFICIENCY, V0_RATE
from draftfit.errors import DraftfitError
from draftfit.pipeline import evaluate_pair
from draftfit.rules import best_k
from draftfit.speedup.predict import analytic_speedup

# Draft step cost relative to one target decode step when nothing better is known: a draft ~1/10-1/20 of
# the target's size, memory-bound, plus launch overhead.
DEFAULT_COST_RATIO = 0.1

MAX_POSITIONS = 64  # speculative positions accepted in a position="i" label: 0 .. MAX_POSITIONS - 1
MAX_BODY_BYTES = 8 * 1024 * 1024  # a vLLM /metrics page is ~100 KiB; a larger answer is not one
DEFAULT_TIMEOUT_S = 10.0  # the whole scrape (connect, headers, body)
CONNECT_TIMEOUT_S = 5.0
MAX_REDIRECTS = 5
# Counters are not read atomically: a scrape during an update may see one counter a step ahead of another.
SLACK_ABS, SLACK_REL = 16.0, 0.02

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_AT = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*')
_ESCAPE = re.compile(r"\\(.)", re.S)
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
_POSITION = re.compile(r"[0-9]{1,9}")
MAX_COUNTER = 1e18  # no server counts this many tokens (2**60); a larger value is not a real counter


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _unescape(value: str) -> str:
    """A Prometheus label value: only \\\\, \\" and \\n are escapes; anything else stays as written."""
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), value)


def _parse_line(line: str) -> Sample | None:
    """One sample line (`name{labels} value [timestamp]`), in one linear pass; None when it is not one."""
    m = _NAME.match(line)
    if not m:
        return None
    name, pos = m.group(0), m.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos += 1
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            lm = _LABEL_AT.match(line, pos)
            if not lm:
                return None
            labels[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
            if pos < len(line) and line[pos] == ",":
                pos += 1
            elif not (pos < len(line) and line[pos] == "}"):
                return None
    rest = line[pos:]
    if not rest[:1].isspace():
        return None
    parts = rest.split()
    if len(parts) not in (1, 2):
        return None
    try:
        value = float(parts[0])
        if len(parts) == 2:
            int(parts[1])
    except ValueError:
        return None
    return Sample(name, labels, value)


def parse_prometheus(text: str) -> list[Sample]:
    """The samples of a Prometheus text page; comment lines and lines that are not samples are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        s = _parse_line(line)
        if s is not None:
            out.append(s)
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

    def went_down_from(self, before: "SpecCounters") -> bool:
        """A counter smaller than in `before`: the server restarted in between."""
        pairs = [(self.num_drafts, before.num_drafts), (self.num_draft_tokens, before.num_draft_tokens),
                 (self.num_accepted, before.num_accepted)]
        pairs += list(zip(self.accepted_per_pos, before.accepted_per_pos))
        return any(now < then for now, then in pairs)


def _base(name: str) -> tuple[str, str]:
    for suffix in ("_total", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def _clip(value, limit: int = 60) -> str:
    """A value from the server, safe in a one-line message: repr'd (no raw newlines) and short."""
    shown = repr(value) if not isinstance(value, str) else repr(value)[1:-1]
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _bad_metrics(what: str, source: str | None) -> DraftfitError:
    where = f" from {source}" if source else ""
    return DraftfitError(f"unusable spec-decode metrics{where}: {what}",
                         fix="is this a vLLM server's /metrics? point monitor at the server's base URL", exit_code=2)


def _slack(x: float) -> float:
    return max(SLACK_ABS, SLACK_REL * x)


def counters_from_samples(samples: list[Sample], source: str | None = None) -> SpecCounters:
    """Sum the spec-decode series over engines and check them; DraftfitError on values no server can report."""
    c = SpecCounters()
    per_pos: dict[int, float] = {}
    seen: set[str] = set()
    by_engine: dict[str, dict[str, float]] = {}  # engine label -> counter base -> value, for per-engine checks
    v0_rates: list[float] = []
    v0_eff: list[float] = []
    for s in samples:
        base, suffix = _base(s.name)
        if suffix == "_created":
            continue
        counter = base in (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)
        gauge = s.name in (V0_RATE, V0_EFFICIENCY)
        if not (counter or gauge):
            continue
        if not math.isfinite(s.value):
            raise _bad_metrics(f"{s.name} is {_clip(s.value)}, not a finite number", source)
        if s.value < 0:
            raise _bad_metrics(f"{s.name} is negative ({s.value:g})", source)
        if s.value > MAX_COUNTER:
            raise _bad_metrics(f"{s.name} is {s.value:g}, more than any server counts", source)
        c.found = True
        seen.add(base)
        if counter and base != ACCEPTED_PER_POS:
            engine = by_engine.setdefault(s.labels.get("engine", ""), {})
            engine[base] = engine.get(base, 0.0) + s.value
        if base == DRAFTS:
            c.num_drafts += s.value
        elif base == DRAFT_TOKENS:
            c.num_draft_tokens += s.value
        elif base == ACCEPTED:
            c.num_accepted += s.value
        elif base == ACCEPTED_PER_POS:
            label = s.labels.get("position")
            if label is None:
                raise _bad_metrics(f"{s.name} without a position label", source)
            if not _POSITION.fullmatch(label) or int(label) >= MAX_POSITIONS:
                raise _bad_metrics(f"position label {_clip(label)!s} is not an integer 0..{MAX_POSITIONS - 1}",
                                   source)
            pos = int(label)
            per_pos[pos] = per_pos.get(pos, 0.0) + s.value
        elif s.name == V0_RATE:
            if s.value > 1:
                raise _bad_metrics(f"{V0_RATE} is {s.value:g}, above 1", source)
            v0_rates.append(s.value)
        else:
            if s.value > 1:
                raise _bad_metrics(f"{V0_EFFICIENCY} is {s.value:g}, above 1", source)
            v0_eff.append(s.value)
    if per_pos:
        c.accepted_per_pos = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)]
    if v0_rates:
        c.v0_acceptance_rate = sum(v0_rates) / len(v0_rates)
    if v0_eff:
        c.v0_efficiency = sum(v0_eff) / len(v0_eff)
    _check_consistent(c, source)
    if DRAFTS in seen:  # V0 engines export draft tokens without a drafts counter
        for engine, v in sorted(by_engine.items()):
            drafts, tokens = v.get(DRAFTS, 0.0), v.get(DRAFT_TOKENS, 0.0)
            who = f"engine {_clip(engine)!r}: " if len(by_engine) > 1 else ""
            if DRAFT_TOKENS in seen and drafts > tokens + _slack(tokens):
                raise _bad_metrics(f"{who}{drafts:g} drafts but only {tokens:g} draft tokens (a draft proposes at "
                                   "least one token)", source)
            if tokens > drafts * MAX_POSITIONS + _slack(drafts):
                raise _bad_metrics(f"{who}{tokens:g} draft tokens from {drafts:g} drafts (more than "
                                   f"{MAX_POSITIONS} per draft)", source)
    return c


def _check_consistent(c: SpecCounters, source: str | None) -> None:
    if c.num_draft_tokens > 0 or c.num_accepted > 0:
        if c.num_accepted > c.num_draft_tokens + _slack(c.num_draft_tokens):
            raise _bad_metrics(f"{c.num_accepted:g} accepted tokens but only {c.num_draft_tokens:g} drafted", source)
    pp = c.accepted_per_pos
    if pp and c.num_drafts > 0 and pp[0] > c.num_drafts + _slack(c.num_drafts):
        raise _bad_metrics(f"{pp[0]:g} drafts accepted at position 0 but only {c.num_drafts:g} drafts", source)
    for i in range(1, len(pp)):
        if pp[i] > pp[i - 1] + _slack(pp[i - 1]):
            raise _bad_metrics(f"position {i} accepted more often ({pp[i]:g}) than position {i - 1} "
                               f"({pp[i - 1]:g}); a draft stops at its first rejection", source)


def counters_from_text(text: str, source: str | None = None) -> SpecCounters:
    return counters_from_samples(parse_prometheus(text), source)


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
    acceptance_rate: float | None  # accepted / drafted (or the V0 gauge when there are no counters)
    mean_acceptance_length: float | None  # 1 + accepted / drafts (bonus token included, vLLM's convention)
    per_position: list[float]  # accepted at position i / drafts
    v0_acceptance_rate: float | None = None
    advice: KAdvice | None = None
    notes: list[str] = field(default_factory=list)
    acceptance_source: str = ""  # 'counters', 'v0_gauge' or '' (none)


def advise_k(per_position: list[float], *, cost_ratio: float | None = None, layout: dict | None = None) -> KAdvice | None:
    """Best K <= measured K from the measured per-position rates.

    Per-position rates from one run at K_max give the acceptance of every smaller K (a draft stops at the
    first rejection, so position i's count does not depend on how many positions follow it). Step costs:
    with `layout` ({"layout": a validated draftfit Layout, "draft": its drafter}) the pipeline's evaluation of
    the pair at the measured curve (pipeline.evaluate_pair, the step costs every other command uses); else
    Leviathan's E(K) / (1 + c K) with the given or default cost ratio c. Best K by rules.best_k either way.
    """
    if not per_position:
        return None
    cur = len(per_position)
    speedups: dict[int, float] = {}
    source = ""
    if layout:
        lay, draft = layout["layout"], layout["draft"]
        ev = evaluate_pair(lay, draft, acceptance=list(per_position), k_values=range(1, cur + 1))
        if ev.speedup is not None:
            b = lay.batches[0]
            row = ev.speedup.batches[b]
            speedups = {int(k): round(float(v["speedup"]), 3) for k, v in row.per_k.items()}
            cost_ratio = float(getattr(row, "c", 0.0) or 0.0)
            source = (f"step costs of {lay.target.name} + {ev.draft.name} on {lay.gpu.name} x{lay.tp} at batch {b} "
                      f"({ev.speedup.source})")
    if not speedups:
        if cost_ratio is None:
            cost_ratio = DEFAULT_COST_RATIO
            source = (f"default draft/target step cost ratio {DEFAULT_COST_RATIO} (pass --cost-ratio, or "
                      "--target/--draft/--gpu for the step-cost model)")
        else:
            source = f"--cost-ratio {cost_ratio:g}"
        for k in range(1, cur + 1):
            speedups[k] = round(analytic_speedup(list(per_position[:k]), k, cost_ratio), 3)
    best = best_k(speedups)
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
    drafts = max(c.num_drafts, 0.0)
    tokens = max(c.num_draft_tokens, 0.0)
    accepted = max(c.num_accepted, 0.0)
    rate = min(accepted / tokens, 1.0) if tokens > 0 else None
    source = "counters" if rate is not None else ""
    mal = 1 + min(accepted / drafts, float(MAX_POSITIONS)) if drafts > 0 and tokens > 0 else None
    per_pos = [round(min(max(x, 0.0) / drafts, 1.0), 4) for x in c.accepted_per_pos] if drafts > 0 else []
    notes = []
    if not c.found:
        notes.append("no speculative-decoding series in /metrics: is the server running with --speculative-config?")
    elif rate is None and c.v0_acceptance_rate is not None:
        rate, source = c.v0_acceptance_rate, "v0_gauge"
        notes.append(f"V0 engine: acceptance rate from the gauge {V0_RATE} (no per-position counts, so no K advice)")
    elif drafts <= 0 and tokens <= 0:
        notes.append("no drafts yet in this window: send some requests")
    elif drafts <= 0:
        notes.append("no drafts counter (a V0 engine?): no mean acceptance length or per-position rates")
    r = MonitorReading(url=url, window=window, elapsed_s=elapsed_s, num_drafts=int(drafts),
                       num_draft_tokens=int(tokens), num_accepted=int(accepted),
                       acceptance_rate=None if rate is None else round(rate, 4),
                       mean_acceptance_length=None if mal is None else round(mal, 3), per_position=per_pos,
                       v0_acceptance_rate=c.v0_acceptance_rate, notes=notes, acceptance_source=source)
    r.advice = advise_k(per_pos, cost_ratio=cost_ratio, layout=layout)
    return r


# ------------------------------------------------------------------------------------------------ fetch

def metrics_url(url: str) -> str:
    if not isinstance(url, str) or not url.strip() or any(ch in url for ch in "\0\r\n\t "):
        raise DraftfitError(f"not a server URL: {_clip(url)!s}", fix="pass its base URL, e.g. http://127.0.0.1:8000")
    url = url.rstrip("/")
    scheme = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", url)
    if scheme and scheme.group(1).lower() not in ("http", "https"):
        raise DraftfitError(f"monitor reads http(s) URLs, not {_clip(scheme.group(1))}://",
                            fix="pass the server's base URL, e.g. http://127.0.0.1:8000")
    if not scheme:
        url = "http://" + url
    return url if url.endswith("/metrics") else url + "/metrics"


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


class _DeadlineRaw(io.RawIOBase):
    """The socket reads of one response: each read waits at most `read_timeout` and never past `deadline`;
    at most `max_bytes` in all (headers included)."""

    def __init__(self, sock, keep, *, deadline: float, read_timeout: float, max_bytes: int, timeout_s: float):
        super().__init__()
        self._sock, self._keep = sock, keep  # keep: the original file object, which holds the socket open
        self._deadline, self._read_timeout, self._left = deadline, read_timeout, max_bytes
        self._late = f"timed out after {timeout_s:g}s: no complete answer (the server is too slow or keeps sending)"

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        left_s = self._deadline - time.monotonic()
        if left_s <= 0:
            raise _ScrapeError(self._late)
        if self._left <= 0:
            raise _ScrapeError(f"the answer is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        self._sock.settimeout(min(self._read_timeout, left_s))
        view = memoryview(b)[: min(len(b), self._left)]
        try:
            n = self._sock.recv_into(view)
        except TimeoutError:
            raise _ScrapeError(self._late) from None
        self._left -= n
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                self._keep.close()
            finally:
                super().close()


class _ScrapeError(Exception):
    """Why one scrape failed; turned into a DraftfitError naming the URL."""


def _opener(*, origin, deadline: float, read_timeout: float, max_bytes: int, timeout_s: float):
    import http.client
    import urllib.request

    def response(sock, *args, **kwargs):
        r = http.client.HTTPResponse(sock, *args, **kwargs)
        r.fp = io.BufferedReader(_DeadlineRaw(sock, r.fp, deadline=deadline, read_timeout=read_timeout,
                                              max_bytes=max_bytes + 256 * 1024, timeout_s=timeout_s))
        return r

    class Conn(http.client.HTTPConnection):
        response_class = staticmethod(response)

    class ConnS(http.client.HTTPSConnection):
        response_class = staticmethod(response)

    class Handler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(Conn, req)

    class HandlerS(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(ConnS, req, context=self._context)

    class SameOriginRedirect(urllib.request.HTTPRedirectHandler):
        max_redirections = MAX_REDIRECTS

        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if _origin(newurl) != origin:
                fp.close()
                raise _ScrapeError(f"redirected (HTTP {code}) to another host: {_clip(newurl, 80)}; not followed")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return urllib.request.build_opener(Handler, HandlerS, SameOriginRedirect)


def fetch_metrics(url: str, timeout_s: float = DEFAULT_TIMEOUT_S, *, max_bytes: int = MAX_BODY_BYTES) -> str:
    """The text of URL/metrics, bounded in time (`timeout_s` for the whole answer) and size."""
    import http.client
    import urllib.error
    import urllib.request

    target = metrics_url(url)
    deadline = time.monotonic() + timeout_s
    fix = "is the server up? pass its base URL, e.g. http://127.0.0.1:8000"
    answered = "is that a vLLM server, and up? pass its base URL, e.g. http://127.0.0.1:8000"
    try:
        opener = _opener(origin=_origin(target), deadline=deadline, read_timeout=timeout_s, max_bytes=max_bytes,
                         timeout_s=timeout_s)
        req = urllib.request.Request(target, headers={"Accept": "text/plain;version=0.0.4, */*;q=0.1",
                                                      "Accept-Encoding": "identity",
                                                      "User-Agent": "draftfit-monitor"})
        with opener.open(req, timeout=min(CONNECT_TIMEOUT_S, timeout_s)) as resp:
            status = getattr(resp, "status", None)
            if status != 200:
                raise _ScrapeError(f"HTTP {status} {_clip(getattr(resp, 'reason', ''))}, not 200")
            ctype = resp.headers.get("Content-Type")
            if ctype is not None:
                main = ctype.split(";")[0].strip().lower()
                if not (main.startswith("text/") or main == "application/openmetrics-text"):
                    raise _ScrapeError(f"Content-Type {_clip(main)}, not Prometheus text")
            length = resp.headers.get("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > max_bytes:
                raise _ScrapeError(f"the answer is larger than {max_bytes // (1024 * 1024)} MiB "
                                   f"(Content-Length {int(length)})")
            chunks, total = [], 0
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    raise _ScrapeError(f"the answer is larger than {max_bytes // (1024 * 1024)} MiB")
                chunks.append(chunk)
            if resp.length:  # Content-Length promised more than came
                raise _ScrapeError(f"the connection closed {resp.length} bytes before the end of the answer")
        body = b"".join(chunks)
    except DraftfitError:
        raise
    except _ScrapeError as exc:
        raise DraftfitError(f"cannot read {target}: {exc}", fix=answered, exit_code=2) from None
    except urllib.error.HTTPError as exc:
        raise DraftfitError(f"cannot read {target}: HTTP {exc.code} {_clip(exc.reason)}, not 200", fix=answered,
                            exit_code=2) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        why = f"timed out after {timeout_s:g}s" if isinstance(reason, TimeoutError) else _clip(reason, 100)
        raise DraftfitError(f"cannot read {target} ({why})", fix=fix, exit_code=2) from None
    except TimeoutError:
        raise DraftfitError(f"cannot read {target} (timed out after {timeout_s:g}s)", fix=fix, exit_code=2) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        why = _clip(str(exc) or type(exc).__name__, 100)
        raise DraftfitError(f"cannot read {target} ({type(exc).__name__}: {why})", fix=fix, exit_code=2) from None
    if not body.strip():
        raise _bad_metrics("the answer is empty", target)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad_metrics("the answer is not UTF-8 text", target) from None
    if "\0" in text:
        raise _bad_metrics("the answer holds NUL bytes (binary data, not Prometheus text)", target)
    return text


def scrape(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> SpecCounters:
    """Fetch and check one /metrics page: it must hold Prometheus samples, and its spec-decode counters must add up."""
    target = metrics_url(url)
    samples = parse_prometheus(fetch_metrics(url, timeout_s))
    if not samples:
        raise _bad_metrics("no Prometheus samples in the answer", target)
    return counters_from_samples(samples, target)


def read_once(url: str, *, cost_ratio: float | None = None, layout: dict | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> MonitorReading:
    return reading_from_counters(scrape(url, timeout_s), url=metrics_url(url), window="cumulative",
                                 cost_ratio=cost_ratio, layout=layout)


def watch(url: str, interval_s: float, *, cost_ratio: float | None = None, count: int | None = None,
          layout: dict | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Yield a delta reading every interval (forever, or `count` times)."""
    before = scrape(url, timeout_s)
    t0 = time.monotonic()
    n = 0
    while count is None or n < count:
        time.sleep(interval_s)
        now = scrape(url, timeout_s)
        t1 = time.monotonic()
        restarted = now.went_down_from(before)
        r = reading_from_counters(now if restarted else now.minus(before), url=metrics_url(url), window="delta",
                                  elapsed_s=round(t1 - t0, 2), cost_ratio=cost_ratio, layout=layout)
        if restarted:
            r.notes.insert(0, "counters went down (the server restarted?): this window counts from the restart")
        yield r
        before, t0 = now, t1
        n += 1
