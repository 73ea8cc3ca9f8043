"""The user's traffic, validated once at the boundary: how requests arrive (a Poisson rate, or a fixed number of
clients each sending its next request when the last one ends) and how long their prompts and outputs are.

Lengths come from flags (`512` fixed, `256..1024` uniform, `lognormal:600,300` mean and standard deviation in
tokens), from a request log (CSV or JSONL rows of prompt_len, output_len; the keys vLLM's and OpenAI's logs use
are read too) or from the user's prompts file (prompt lengths estimated from characters, no tokenizer read).
Arrivals follow `vllm bench serve` (benchmarks/serve.py get_request): exponential gaps at the rate, their sum
rescaled so the last request is sent at N / rate; with a concurrency, N clients with no pause between requests
(its --max-concurrency with an infinite rate).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

from draftfit.acceptance.measure.user_prompts import load_prompts_file
from draftfit.errors import DraftfitError

MAX_LEN_TOKENS = 10_000_000  # no model draftfit knows has more positions
MAX_RATE = 1e6  # requests per second; far past any one server
MAX_REQUESTS = 200_000
MAX_CONCURRENCY = 100_000
MAX_LOG_BYTES = 256 * 1024 * 1024
CHARS_PER_TOKEN = 4.0  # English text in BPE tokenizers (Llama 3, Qwen): a prompts file's lengths are estimated so
_LOG_PROMPT_KEYS = ("prompt_len", "input_len", "prompt_tokens", "num_prompt_tokens", "input_tokens")
_LOG_OUTPUT_KEYS = ("output_len", "output_tokens", "completion_tokens", "num_output_tokens", "max_tokens")


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: fixed, uniform (lo..hi inclusive), lognormal (mean, sd) or empirical."""

    kind: str  # fixed | uniform | lognormal | empirical
    a: float = 0.0  # fixed value, uniform lo, lognormal mean
    b: float = 0.0  # uniform hi, lognormal sd
    values: tuple = ()  # empirical lengths (sampled with replacement, in order when n == len)
    text: str = ""  # as given, for output

    def sample(self, rng, n: int):
        import numpy as np

        if self.kind == "fixed":
            out = np.full(n, self.a)
        elif self.kind == "uniform":
            out = rng.integers(int(self.a), int(self.b) + 1, size=n)
        elif self.kind == "lognormal":
            sigma2 = math.log(1 + (self.b / self.a) ** 2)
            out = rng.lognormal(math.log(self.a) - sigma2 / 2, math.sqrt(sigma2), size=n)
        else:
            vals = np.asarray(self.values)
            out = vals[:n] if n <= len(vals) else vals[rng.integers(0, len(vals), size=n)]
        return np.clip(np.rint(out), 1, MAX_LEN_TOKENS).astype(np.int64)

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "empirical":
            return sum(self.values) / len(self.values)
        return self.a

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform {int(self.a)}..{int(self.b)}"
        if self.kind == "lognormal":
            return f"lognormal mean {self.a:g} sd {self.b:g}"
        return f"{self.text} ({len(self.values)} rows, mean {self.mean:.0f})"


@dataclass(frozen=True)
class Traffic:
    """One traffic description. rates: requests/s (Poisson); concurrency: closed-loop clients (rates empty)."""

    rates: tuple[float, ...]
    concurrency: int | None
    prompt_len: LengthDist
    output_len: LengthDist
    num_requests: int
    seed: int = 0
    notes: tuple[str, ...] = ()
    auto: bool = False  # --request-rate auto: rates at shares of the modelled saturation (serving.load)

    @property
    def mean_context(self) -> float:
        """Mean tokens of context a decoding sequence holds: the prompt plus half its output."""
        return self.prompt_len.mean + self.output_len.mean / 2

    def describe(self) -> str:
        load = (f"Poisson {', '.join(f'{r:g}' for r in self.rates)} req/s" if self.rates
                else "Poisson, rates from light load to past saturation" if self.auto
                else f"{self.concurrency} concurrent clients")
        return (f"{load}; prompt {self.prompt_len.describe()}, output {self.output_len.describe()} tokens; "
                f"{self.num_requests} requests, seed {self.seed}")

    def to_dict(self) -> dict:
        return {"rates": list(self.rates), "concurrency": self.concurrency, "prompt_len": self.prompt_len.describe(),
                "output_len": self.output_len.describe(), "num_requests": self.num_requests, "seed": self.seed,
                "notes": list(self.notes)}


@dataclass(frozen=True)
class Requests:
    """The sampled requests of one run: lengths and (Poisson) send times in seconds; arrivals None: closed loop."""

    prompt_len: "np.ndarray"  # noqa: F821 (numpy is imported where the arrays are made)
    output_len: "np.ndarray"  # noqa: F821
    arrival_s: "np.ndarray | None"  # noqa: F821


def sample_requests(traffic: Traffic, rate: float | None, *, max_model_len: int) -> Requests:
    """Lengths and arrival times for one run, deterministic in (traffic.seed, rate). A prompt longer than the
    context is cut to leave room for its output (vLLM refuses a request longer than max_model_len)."""
    import numpy as np

    rng = np.random.default_rng(traffic.seed)
    n = traffic.num_requests
    p = traffic.prompt_len.sample(rng, n)
    o = traffic.output_len.sample(rng, n)
    o = np.minimum(o, max_model_len - 1)
    p = np.minimum(p, max_model_len - o)
    arrivals = None
    if rate is not None:
        gaps = np.random.default_rng([traffic.seed, 1]).exponential(1.0 / rate, size=n)
        arrivals = np.cumsum(gaps)
        arrivals *= (n / rate) / arrivals[-1]  # benchmarks/serve.py: the last request leaves at N / rate
    return Requests(prompt_len=p.astype(np.int64), output_len=o.astype(np.int64), arrival_s=arrivals)


# ------------------------------------------------------------------------------------------- parsing

def _num(text: str, option: str, example: str) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise DraftfitError(f"{option} {text!r} is not a length in tokens", fix=f"e.g. {option} {example}") from None
    if math.isnan(v) or math.isinf(v):
        raise DraftfitError(f"{option} {text!r} is not a finite length", fix=f"e.g. {option} {example}")
    return v


def parse_length(text, option: str) -> LengthDist:
    """'512' | '256..1024' | 'lognormal:600,300' (mean, sd in tokens), each at least 1 token."""
    example = "512, 256..1024 or lognormal:600,300"
    s = "" if text is None else str(text).strip()
    if not s:
        raise DraftfitError(f"{option} is empty", fix=f"e.g. {option} {example}")

    def check(v: float, what: str) -> float:
        if not 1 <= v <= MAX_LEN_TOKENS:
            raise DraftfitError(f"{option} {s}: {what} {v:g} is outside 1..{MAX_LEN_TOKENS}",
                                fix=f"e.g. {option} {example}")
        return v

    if s.lower().startswith("lognormal:"):
        parts = s.split(":", 1)[1].split(",")
        if len(parts) != 2:
            raise DraftfitError(f"{option} {s!r} is not lognormal:MEAN,SD", fix=f"e.g. {option} lognormal:600,300")
        mean = check(_num(parts[0].strip(), option, "lognormal:600,300"), "the mean")
        sd = _num(parts[1].strip(), option, "lognormal:600,300")
        if not 0 <= sd <= 100 * mean:
            raise DraftfitError(f"{option} {s}: the standard deviation {sd:g} is outside 0..{100 * mean:g}",
                                fix=f"e.g. {option} lognormal:600,300")
        return LengthDist("lognormal" if sd > 0 else "fixed", mean, sd, text=s)
    if ".." in s:
        lo_s, _, hi_s = s.partition("..")
        lo = check(_num(lo_s, option, "256..1024"), "the low end")
        hi = check(_num(hi_s, option, "256..1024"), "the high end")
        if lo != int(lo) or hi != int(hi) or hi < lo:
            raise DraftfitError(f"{option} {s!r} is not a range of whole tokens, low to high",
                                fix=f"e.g. {option} 256..1024")
        return LengthDist("uniform", lo, hi, text=s) if hi > lo else LengthDist("fixed", lo, text=s)
    v = check(_num(s, option, example), "the length")
    if v != int(v):
        raise DraftfitError(f"{option} {s!r} is not a whole number of tokens", fix=f"e.g. {option} 512")
    return LengthDist("fixed", v, text=s)


def parse_rates(text) -> tuple[float, ...]:
    """'2' or '1,2,4,8' requests per second, each > 0, sorted and distinct."""
    s = "" if text is None else str(text).strip()
    fix = "e.g. --request-rate 4, a sweep --request-rate 1,2,4,8, or --request-rate auto"
    parts = [p.strip() for p in s.split(",")]
    if not s or any(not p for p in parts):
        raise DraftfitError(f"--request-rate {s!r} is not a comma-separated list of rates", fix=fix)
    out = []
    for p in parts:
        try:
            v = float(p)
        except ValueError:
            raise DraftfitError(f"--request-rate {s!r}: {p!r} is not a number of requests per second", fix=fix) from None
        if math.isnan(v) or math.isinf(v) or not 0 < v <= MAX_RATE:
            raise DraftfitError(f"--request-rate {s!r}: {p} is outside (0, {MAX_RATE:g}] requests per second",
                                fix=fix + " (for a saturated server use --concurrency)")
        out.append(v)
    if len(out) > 64:
        raise DraftfitError(f"--request-rate gives {len(out)} rates", fix="sweep at most 64 rates")
    return tuple(sorted(set(out)))


def _read_text(path, option: str) -> tuple[Path, str]:
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise DraftfitError(f"{option} {path} is not a file", fix=f"pass {option} an existing file")
    if p.stat().st_size > MAX_LOG_BYTES:
        raise DraftfitError(f"{option} {path} is larger than {MAX_LOG_BYTES >> 20} MiB",
                            fix="take a sample of your traffic (a few thousand rows are plenty)")
    try:
        return p, p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise DraftfitError(f"{option} {path} is not UTF-8 text", fix=f"pass {option} a CSV or JSONL file") from None


def _row_len(row: dict, keys, where: str, what: str) -> int | None:
    for k in keys:
        if k in row and row[k] not in (None, ""):
            v = row[k]
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise DraftfitError(f"{where}: {k} {v!r} is not a number of tokens",
                                    fix="each row holds whole token counts") from None
            if math.isnan(f) or f != int(f) or not 1 <= f <= MAX_LEN_TOKENS:
                raise DraftfitError(f"{where}: {k} {v!r} is not a token count in 1..{MAX_LEN_TOKENS}",
                                    fix="each row holds whole token counts of at least 1")
            return int(f)
    return None


def read_request_log(path) -> tuple[LengthDist, LengthDist]:
    """Prompt and output lengths from a CSV (header row) or JSONL request log."""
    option = "--request-log"
    p, text = _read_text(path, option)
    rows: list[tuple[int, dict]] = []
    stripped = text.lstrip()
    if stripped.startswith("{"):
        for n, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except RecursionError:
                raise DraftfitError(f"{p.name} line {n} nests too deeply to be a log row",
                                    fix='one flat JSON object per line, e.g. {"prompt_len": 512, "output_len": 200}') \
                    from None
            except ValueError:
                raise DraftfitError(f"{p.name} line {n} is not JSON",
                                    fix='one JSON object per line, e.g. {"prompt_len": 512, "output_len": 200}') from None
            if not isinstance(row, dict):
                raise DraftfitError(f"{p.name} line {n} is not a JSON object",
                                    fix='e.g. {"prompt_len": 512, "output_len": 200}')
            usage = row.get("usage") if isinstance(row.get("usage"), dict) else {}
            rows.append((n, {**usage, **row}))
    else:
        try:
            reader = csv.DictReader(io.StringIO(text))
            rows = [(n + 2, r) for n, r in enumerate(reader)]
        except csv.Error as exc:
            raise DraftfitError(f"{option} {path} is not CSV ({exc})", fix="a header row prompt_len,output_len") from None
    prompts, outputs = [], []
    for n, row in rows:
        where = f"{p.name} line {n}"
        pl = _row_len(row, _LOG_PROMPT_KEYS, where, "prompt")
        ol = _row_len(row, _LOG_OUTPUT_KEYS, where, "output")
        if pl is None or ol is None:
            raise DraftfitError(f"{where} lacks a prompt or output length",
                                fix="columns prompt_len and output_len (or prompt_tokens, completion_tokens)")
        prompts.append(pl)
        outputs.append(ol)
    if not prompts:
        raise DraftfitError(f"{option} {path} holds no rows", fix="a header prompt_len,output_len and one row a request")
    return (LengthDist("empirical", values=tuple(prompts), text=f"request log {p.name}"),
            LengthDist("empirical", values=tuple(outputs), text=f"request log {p.name}"))


def prompt_lengths_from_file(path) -> LengthDist:
    """The user's prompts file (acceptance.measure.user_prompts format): lengths estimated from characters."""
    up = load_prompts_file(path)
    lens = []
    for r in up.requests:
        msgs = list(r.messages)
        if len(msgs) > 1 and msgs[-1][0] == "assistant":  # a logged answer (rank --prompts-file), not the prompt
            msgs.pop()
        chars = len(r.prompt) if r.kind == "prompt" else sum(len(c) + 8 for _, c in msgs)
        lens.append(max(1, int(round(chars / CHARS_PER_TOKEN))))
    return LengthDist("empirical", values=tuple(lens), text=f"prompts file {up.path.name} (~{CHARS_PER_TOKEN:g} chars/token)")


def build_traffic(*, request_rate=None, concurrency=None, prompt_len="512", output_len="256", prompts_file=None,
                  request_log=None, num_requests: int = 400, seed: int = 0) -> Traffic:
    """Validate every traffic option once (one DraftfitError naming the option and the fix)."""
    if request_rate is not None and concurrency is not None:
        raise DraftfitError("--request-rate and --concurrency both given", fix="pass one: an open Poisson load "
                            "(--request-rate) or a fixed number of clients (--concurrency)")
    if request_rate is None and concurrency is None:
        raise DraftfitError("no load given", fix="pass --request-rate R[,R...] (requests/s) or --concurrency N")
    rates: tuple[float, ...] = ()
    conc = None
    auto = request_rate is not None and str(request_rate).strip().lower() == "auto"
    if request_rate is not None:
        rates = () if auto else parse_rates(request_rate)
    else:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
            raise DraftfitError(f"--concurrency {concurrency!r} is outside 1..{MAX_CONCURRENCY}",
                                fix="pass --concurrency the number of clients, e.g. 32")
        conc = concurrency
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or not 1 <= num_requests <= MAX_REQUESTS:
        raise DraftfitError(f"--num-requests {num_requests!r} is outside 1..{MAX_REQUESTS}",
                            fix="pass --num-requests 200 to 1000 (vLLM's benchmarks use 200-1000)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise DraftfitError(f"--seed {seed!r} is not a non-negative integer", fix="e.g. --seed 0")
    notes = []
    if request_log is not None and prompts_file is not None:
        raise DraftfitError("--request-log and --prompts-file both given",
                            fix="pass one: a request log holds both lengths, a prompts file only the prompts")
    if request_log is not None:
        pl, ol = read_request_log(request_log)
        notes.append(f"prompt and output lengths from {pl.text} ({len(pl.values)} rows)")
    else:
        pl = prompt_lengths_from_file(prompts_file) if prompts_file is not None else parse_length(prompt_len,
                                                                                               "--prompt-len")
        ol = parse_length(output_len, "--output-len")
        if prompts_file is not None:
            notes.append(f"prompt lengths from {pl.text}: estimated, not tokenized; a request log gives exact ones")
    return Traffic(rates=rates, concurrency=conc, prompt_len=pl, output_len=ol, num_requests=num_requests, seed=seed,
                   notes=tuple(notes), auto=auto)
