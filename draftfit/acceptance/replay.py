"""Engine-free acceptance of n-gram prompt lookup: replay vLLM's n-gram proposer over the target's own outputs.

Greedy speculative decoding emits exactly the target's greedy tokens, so once those tokens are known (from one
measurement run, or the user's logged completions) every setting of the proposer (prompt_lookup_min/max, K) can
be replayed without an engine: at each step the proposer looks at prompt + tokens emitted so far, proposes up to
K tokens, the target accepts the prefix that equals its own next tokens, and emits one more. The counters it
produces are the ones vLLM's spec-decode metrics report (num_drafts, num_draft_tokens, num_accepted_tokens and
accepted per position), so result_from_counts() turns them into an AcceptanceResult like a measured run.

The proposer is vLLM's own rule (vllm/v1/spec_decode/ngram_proposer.py,
_find_longest_matched_ngram_and_propose_tokens, vLLM 0.26-0.33): the longest n-gram with prompt_lookup_min <= n <=
prompt_lookup_max that ends the context and also occurs earlier in it; among equally long matches the earliest
occurrence; the K tokens after it (fewer near the end of the context, none past max_model_len). A test checks
proposals against vLLM's function on random sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftfit.acceptance.curve import AcceptanceResult, result_from_counts
from draftfit.errors import DraftfitError

# vLLM's default when neither prompt_lookup_min nor _max is given (config/speculative.py: both 5).
DEFAULT_LOOKUP = (5, 5)


def propose_ngram(context: list[int], *, min_n: int, max_n: int, k: int, max_model_len: int = 1 << 30) -> list[int]:
    """The tokens vLLM's n-gram proposer drafts after `context` (a list of token ids)."""
    total = len(context)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    # The same KMP walk as vLLM over the reversed context: the longest prefix of the reversed context (the
    # context's suffix) that reappears, capped at max_n; ">=" keeps the latest reversed position, i.e. the
    # earliest occurrence in the original order.
    tokens = context[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if tokens[prev] == tokens[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    k = min(k, total - start)
    return context[start:start + k]


def accepted_prefix(proposal: list[int], output: list[int], t: int) -> int:
    """How many drafted tokens the greedy target accepts: the prefix of `proposal` equal to output[t:]. vLLM
    drafts the full K even near max_tokens (bench/ngram_replay.py: 114 drafts, 456 draft tokens at K=4); tokens
    past the request's end cannot be checked, so they count as rejected."""
    accepted = 0
    for j, tok in enumerate(proposal):
        if t + j >= len(output) or output[t + j] != tok:
            break
        accepted += 1
    return accepted


@dataclass
class ReplayCounts:
    """Spec-decode counters of one replayed setting, summed over requests, with per-request groups (the
    bootstrap's unit)."""

    k: int
    min_n: int
    max_n: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    per_position_accepted: list[int] = field(default_factory=list)
    steps: int = 0  # target steps taken (with or without a draft)
    output_tokens: int = 0
    groups: list[dict] = field(default_factory=list)

    def add_request(self, g: dict, index: int) -> None:
        """Fold one request's counters (a group) into the totals; the group is kept for the bootstrap."""
        self.num_drafts += g["num_drafts"]
        self.num_draft_tokens += g["num_draft_tokens"]
        self.num_accepted += g["num_accepted"]
        self.steps += g["steps"]
        self.output_tokens += g["output_tokens"]
        self.per_position_accepted = [a + b for a, b in zip(self.per_position_accepted, g["per_position_accepted"])]
        self.groups.append({**g, "prompts": [index]})


def replay_request(prompt: list[int], output: list[int], *, k: int, min_n: int, max_n: int,
                   max_model_len: int = 1 << 30) -> dict:
    """Counters of one request: the target emitted `output` after `prompt`."""
    drafts = draft_tokens = accepted_total = steps = 0
    per_pos = [0] * k
    t = 0
    context = list(prompt)
    # vLLM drafts from the first decode step on: the prefill emits the first token without a proposal.
    if output:
        context.append(output[0])
        t = 1
        steps = 1
    while t < len(output):
        proposal = propose_ngram(context, min_n=min_n, max_n=max_n, k=k, max_model_len=max_model_len)
        accepted = accepted_prefix(proposal, output, t)
        if proposal:
            drafts += 1
            draft_tokens += len(proposal)
            accepted_total += accepted
            for j in range(accepted):
                per_pos[j] += 1
        emitted = output[t:t + accepted + 1]
        context.extend(emitted)
        t += len(emitted)
        steps += 1
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted": accepted_total,
            "per_position_accepted": per_pos, "steps": steps, "output_tokens": len(output)}


def replay(requests: list[tuple[list[int], list[int]]], *, k: int, min_n: int = DEFAULT_LOOKUP[0],
           max_n: int = DEFAULT_LOOKUP[1], max_model_len: int = 1 << 30) -> ReplayCounts:
    """Counters over many (prompt token ids, output token ids) requests for one setting."""
    if not 1 <= min_n <= max_n:
        raise DraftfitError(f"prompt_lookup_min {min_n} / max {max_n} are not 1 <= min <= max",
                            fix="e.g. prompt_lookup_min 2, prompt_lookup_max 5")
    if k < 1:
        raise DraftfitError(f"K {k} is not a positive number of speculative tokens", fix="e.g. K 4")
    out = ReplayCounts(k=k, min_n=min_n, max_n=max_n, per_position_accepted=[0] * k)
    for i, (prompt, output) in enumerate(requests):
        out.add_request(replay_request(list(prompt), list(output), k=k, min_n=min_n, max_n=max_n,
                                       max_model_len=max_model_len), i)
    return out


def replay_result(requests, *, k: int, min_n: int = DEFAULT_LOOKUP[0], max_n: int = DEFAULT_LOOKUP[1],
                  workload: str = "", temperature: float = 0.0) -> AcceptanceResult:
    """The replay as an AcceptanceResult (backend 'replay'), comparable with a measured vLLM run."""
    c = replay(requests, k=k, min_n=min_n, max_n=max_n)
    return result_from_counts(per_position_accepted=c.per_position_accepted, num_drafts=c.num_drafts,
                              num_draft_tokens=c.num_draft_tokens, num_accepted=c.num_accepted, k=k,
                              temperature=temperature, workload=workload, backend="replay", groups=c.groups)


def replay_grid(requests, *, ks=(1, 2, 3, 4, 5, 6, 7, 8), lookups=((1, 3), (2, 4), (2, 5), (3, 5), (5, 5))) -> dict:
    """Every (prompt_lookup_min, prompt_lookup_max, K) from the same outputs: {(min, max, k): ReplayCounts}."""
    return {(lo, hi, k): replay(requests, k=k, min_n=lo, max_n=hi) for lo, hi in lookups for k in ks}
