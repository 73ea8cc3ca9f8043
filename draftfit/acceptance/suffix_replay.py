"""Engine-free acceptance of suffix decoding: replay vLLM's `method: suffix` proposer over the target's own outputs.

vLLM's suffix proposer (vllm/v1/spec_decode/suffix_decoding.py, vLLM 0.26-0.33) drives arctic-inference's
SuffixDecodingCache (arctic_inference/suffix_decoding/cache.py and csrc/suffix_decoding/suffix_tree.cc, 0.3.0):
- a per-request suffix tree over the request's prompt and the tokens emitted so far;
- a global suffix tree over the outputs (not the prompts) of up to suffix_decoding_max_cached_requests requests,
  earlier and concurrent ones, FIFO-evicted; a request's tokens enter it as they are emitted;
- every step, for each match length 1 .. len(pattern)-1 of the pattern (the last max_tree_depth tokens), the
  matched node's most frequent continuation, each token's probability the product of count(child)/count(parent)
  along the path, stopping below min_token_prob and after min(K, max_spec_factor * match_length) tokens; the draft
  with the highest score (sum of probabilities; ties to the longer match) wins, the per-request tree's on a tie
  with the global tree's.

SuffixTree and SuffixCache below are a pure-Python port of those two classes with the same float32 arithmetic and
the same order among children of equal count (the one thing that decides a tie between continuations), so a
replay does not need the compiled package. tests/test_suffix_replay.py checks every proposal equal to the real
SuffixDecodingCache's on the shipped outputs and on random sequences when arctic-inference is installed; pass
`cache_factory=real_cache_factory` to replay through the real one.

The replay itself is the one ngram uses (draftfit.acceptance.replay): greedy speculative decoding emits exactly the
target's greedy tokens, so each step proposes from the context, accepts the prefix that equals the target's next
tokens and emits one more, and the counters are vLLM's spec-decode counters.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

from draftfit.acceptance.curve import AcceptanceResult, result_from_counts
from draftfit.acceptance.replay import ReplayCounts, accepted_prefix
from draftfit.errors import DraftfitError


@dataclass(frozen=True)
class SuffixConfig:
    """vLLM's suffix-decoding settings, with its defaults (config/speculative.py, vLLM 0.26-0.33)."""

    max_tree_depth: int = 24  # suffix_decoding_max_tree_depth: depth of both trees, and the pattern length
    max_cached_requests: int = 10000  # suffix_decoding_max_cached_requests: 0 switches the global tree off
    max_spec_factor: float = 1.0  # suffix_decoding_max_spec_factor: draft length <= factor x match length
    min_token_prob: float = 0.1  # suffix_decoding_min_token_prob: stop where the path probability falls below

    def __post_init__(self):
        if self.max_tree_depth < 1:
            raise DraftfitError(f"suffix_decoding_max_tree_depth {self.max_tree_depth} is not >= 1", fix="e.g. 24")
        if self.max_cached_requests < 0:
            raise DraftfitError(f"suffix_decoding_max_cached_requests {self.max_cached_requests} is not >= 0",
                                fix="e.g. 10000 (0 switches the global tree off)")
        if self.max_spec_factor < 0:
            raise DraftfitError(f"suffix_decoding_max_spec_factor {self.max_spec_factor} is not >= 0", fix="e.g. 1.0")
        if not 0 <= self.min_token_prob <= 1:
            raise DraftfitError(f"suffix_decoding_min_token_prob {self.min_token_prob} is not in [0, 1]",
                                fix="e.g. 0.1")


_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    """x rounded to float32: the C++ tree computes probabilities and scores in float. One +, * or / of two float32
    values done in double and rounded once is the float32 result, so this reproduces its arithmetic exactly."""
    return _F32.unpack(_F32.pack(x))[0]


class _Node:
    __slots__ = ("count", "token", "children", "order")

    def __init__(self, token: int):
        self.count = 0
        self.token = token
        self.children: dict[int, _Node] = {}
        self.order: list[_Node] = []  # children by decreasing count; equal counts in the C++ sibling-list order


def _increment(parent: _Node, node: _Node) -> None:
    """count += 1 where the C++ _increment_count puts it among its siblings: a node whose previous sibling already
    has count + 1 becomes the first of that group, otherwise the last of it (suffix_tree.cc, the two branches of
    the move: insert before the head of the previous sibling's group)."""
    order, c = parent.order, node.count
    j = order.index(node)
    if j > 0 and order[j - 1].count in (c, c + 1):
        same = order[j - 1].count
        h = j - 1
        while h > 0 and order[h - 1].count == same:
            h -= 1
        del order[j]
        order.insert(h, node)
    node.count = c + 1


def _decrement(parent: _Node, node: _Node) -> None:
    """count -= 1 where the C++ _decrement_count puts it: right after the last sibling that still has the old
    count or more (the head of the lower group)."""
    order, c = parent.order, node.count
    del order[order.index(node)]
    h = 0
    while h < len(order) and order[h].count >= c:
        h += 1
    order.insert(h, node)
    node.count = c - 1


@dataclass
class Draft:
    token_ids: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class SuffixTree:
    """arctic-inference's SuffixTree (csrc/suffix_decoding/suffix_tree.cc) as an uncompressed trie: every node is
    one token, its count the number of occurrences of its path (substrings of at most max_depth tokens) over the
    sequences. The C++ tree compresses single-child chains of equal count; a walk through such a chain multiplies
    the probability by count/count = 1, so the proposals are the same."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node(-1)
        self._seqs: dict[int, list[int]] = {}
        self._active: dict[int, deque] = {}  # per sequence: the nodes where its last <= max_depth suffixes end
        self._tail_nodes: deque | None = None

    def extend(self, seq_id: int, tokens) -> None:
        for tok in tokens:
            self.append(seq_id, int(tok))

    def append(self, seq_id: int, token: int) -> None:
        seq = self._seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, deque())
        active.append(self.root)  # the suffix that starts at the new token
        self.root.count += 1
        if len(active) > self.max_depth:  # the oldest suffix is max_depth tokens long: it stops growing
            active.popleft()
        seq.append(token)
        for i, node in enumerate(active):
            child = node.children.get(token)
            if child is None:  # a new continuation: count 1, last among its siblings (C++ inserts after the tail)
                child = _Node(token)
                child.count = 1
                node.children[token] = child
                node.order.append(child)
            else:
                _increment(node, child)
            active[i] = child

    def remove(self, seq_id: int) -> None:
        """Drop a sequence (the global tree's FIFO eviction): every suffix of it leaves the counts."""
        seq = self._seqs.pop(seq_id, [])
        self._active.pop(seq_id, None)
        for start in range(len(seq)):
            node = self.root
            node.count -= 1
            for tok in seq[start:start + self.max_depth]:
                child = node.children.get(tok)
                if child is None:
                    break
                if child.count > 1:
                    _decrement(node, child)
                else:  # the only occurrence: the whole subtree was this suffix's
                    del node.children[tok]
                    node.order.remove(child)
                    break
                node = child

    def _match(self, pattern) -> _Node | None:
        # The per-request tree is matched against its own tail every step: the nodes where the sequence's last
        # suffixes end are already at hand (the active deque, shortest last), which saves a walk from the root.
        tails = self._tail_nodes
        if tails is not None and len(pattern) <= len(tails):
            return tails[-len(pattern)]
        node = self.root
        for tok in pattern:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                  min_token_prob: float = 0.1) -> Draft:
        """SuffixTree::speculate with use_tree_spec off (vLLM's setting): the best single path."""
        factor, offset, min_prob = _f32(max_spec_factor), _f32(max_spec_offset), _f32(min_token_prob)
        context = [int(t) for t in context]
        n = len(context)
        self._tail_nodes = None
        if len(self._seqs) == 1:  # one sequence (a per-request tree): is the context its tail?
            (sid, seq), = self._seqs.items()
            if n <= len(seq) and seq[len(seq) - n:] == context:
                self._tail_nodes = self._active[sid]
        best = Draft()
        for match_len in range(1, n):  # the C++ loop stops before the whole context (match_len < size)
            node = self._match(context[n - match_len:])
            if node is None:
                break
            # static_cast<int>(match_len * factor + offset + 1e-6): float products, then a double sum, truncated
            cap = int(_f32(_f32(match_len * factor) + offset) + 1e-6)
            draft = self._path(node, max(min(max_spec_tokens, cap), 0), min_prob)
            if draft.score >= best.score:
                draft.match_len = match_len
                best = draft
        return best

    @staticmethod
    def _path(node: _Node, max_tokens: int, min_prob: float) -> Draft:
        out = Draft()
        prob, score = 1.0, 0.0
        while len(out.token_ids) < max_tokens and prob >= min_prob:
            if not node.order:
                break
            child = node.order[0]
            prob = _f32(prob * _f32(child.count / node.count))
            node = child
            if prob < min_prob:
                break
            out.token_ids.append(child.token)
            out.probs.append(prob)
            score = _f32(score + prob)
        out.score = score
        return out


class SuffixCache:
    """arctic-inference's SuffixDecodingCache (suffix_decoding/cache.py): the per-request trees and the global one,
    with the same method names, so the replay drives this port and the real class alike."""

    def __init__(self, max_tree_depth: int = 64, max_cached_requests: int = -1):
        self._depth = max_tree_depth
        self._max_cached = max_cached_requests
        self._global = SuffixTree(max_tree_depth)
        self._local: dict = {}
        self._seq_of: dict = {}  # request -> its sequence id in the global tree, in insertion (FIFO) order
        self._next_seq = 0

    @property
    def active_requests(self):
        return self._local.keys()

    @property
    def cached_requests(self):
        return self._seq_of.keys()

    def start_request(self, req_id, prompt_token_ids) -> None:
        if req_id in self._local:
            raise ValueError(f"Request '{req_id}' is already active")
        tree = SuffixTree(self._depth)
        tree.extend(0, prompt_token_ids)
        self._local[req_id] = tree
        if self._max_cached != 0:
            if req_id in self._seq_of:
                self.evict_cached_response(req_id)
            self._seq_of[req_id] = self._next_seq
            self._next_seq += 1
            if self._max_cached > 0:
                while len(self._seq_of) > self._max_cached:  # FIFO, never the request just added
                    self.evict_cached_response(next(r for r in self._seq_of if r != req_id))

    def stop_request(self, req_id) -> None:
        del self._local[req_id]

    def add_active_response(self, req_id, token_ids) -> None:
        self._local[req_id].extend(0, token_ids)
        if req_id in self._seq_of:
            self._global.extend(self._seq_of[req_id], token_ids)

    def evict_cached_response(self, req_id) -> None:
        self._global.remove(self._seq_of.pop(req_id))

    def speculate(self, req_id, context, max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1) -> Draft:
        context = list(context)[-self._depth:]
        d1 = self._local[req_id].speculate(context, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob)
        d2 = self._global.speculate(context, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob)
        return d1 if d1.score >= d2.score else d2


def port_cache_factory(config: SuffixConfig) -> SuffixCache:
    return SuffixCache(max_tree_depth=config.max_tree_depth, max_cached_requests=config.max_cached_requests)


def real_cache_factory(config: SuffixConfig):
    """arctic-inference's own SuffixDecodingCache, as vLLM builds it (imported here, never at draftfit's start)."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise DraftfitError(f"arctic-inference is not installed ({exc})",
                            fix="pip install arctic-inference, or replay with the built-in port") from None
    return SuffixDecodingCache(max_tree_depth=config.max_tree_depth, max_cached_requests=config.max_cached_requests)


SCHEDULES = ("sequential", "batch")


def replay_suffix(requests, *, k: int, config: SuffixConfig = SuffixConfig(), schedule: str = "sequential",
                  cache_factory=port_cache_factory, max_model_len: int = 1 << 30,
                  proposals: list | None = None) -> ReplayCounts:
    """Counters over (prompt token ids, output token ids) requests for one K, as vLLM's suffix proposer would
    count them.

    schedule 'sequential': one request after the other, each seeing the global tree of all earlier outputs (a
    server whose requests do not overlap). 'batch': every request at once in lockstep, as vLLM's offline
    LLM.generate runs them (all fit in one batch); within a step requests go in order, each adding its emitted
    tokens to the trees before it proposes (SuffixDecodingProposer.propose), so later ones already see them.
    `proposals`, when a list, receives (request, step, draft token ids) for every proposal (the equality test)."""
    if k < 1:
        raise DraftfitError(f"K {k} is not a positive number of speculative tokens", fix="e.g. K 4")
    if schedule not in SCHEDULES:
        raise DraftfitError(f"unknown schedule {schedule!r}", fix=f"one of {', '.join(SCHEDULES)}")
    reqs = [(list(map(int, p)), list(map(int, o))) for p, o in requests]
    cache = cache_factory(config)
    state = [{"context": list(p), "t": 0, "step": 0, "g": _group(k)} for p, _ in reqs]

    def advance(i: int) -> bool:
        """One engine step of request i; False once it has finished."""
        prompt, output = reqs[i]
        s = state[i]
        if s["t"] == 0:  # the prefill emits the first token without a proposal
            if not output:
                return False
            cache.start_request(i, prompt)
            emitted = output[:1]
        else:
            draft = s.pop("draft")
            acc = accepted_prefix(draft, output, s["t"])
            _count(s["g"], draft, acc)
            emitted = output[s["t"]:s["t"] + acc + 1]
        s["context"].extend(emitted)
        s["t"] += len(emitted)
        s["g"]["steps"] += 1
        cache.add_active_response(i, emitted)
        if s["t"] >= len(output):
            cache.stop_request(i)
            return False
        n = len(s["context"])
        pattern = s["context"][max(0, n - config.max_tree_depth):]
        d = cache.speculate(i, pattern, max_spec_tokens=min(k, max_model_len - n - 1),
                            max_spec_factor=config.max_spec_factor, min_token_prob=config.min_token_prob)
        s["draft"] = [int(x) for x in d.token_ids]
        if proposals is not None:
            proposals.append((i, s["step"], list(s["draft"])))
        s["step"] += 1
        return True

    if schedule == "sequential":
        for i in range(len(reqs)):
            while advance(i):
                pass
    else:
        live = list(range(len(reqs)))
        while live:
            live = [i for i in live if advance(i)]
    out = ReplayCounts(k=k, min_n=0, max_n=0, per_position_accepted=[0] * k)
    for i, s in enumerate(state):
        g = s["g"]
        g["output_tokens"] = len(reqs[i][1])
        out.add_request(g, i)
    return out


def _group(k: int) -> dict:
    return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted": 0, "per_position_accepted": [0] * k,
            "steps": 0, "output_tokens": 0}


def _count(g: dict, draft: list[int], accepted: int) -> None:
    """vLLM's counters for one proposal: a step with an empty draft is no draft (scheduler.py counts a draft only
    when it has tokens)."""
    if not draft:
        return
    g["num_drafts"] += 1
    g["num_draft_tokens"] += len(draft)
    g["num_accepted"] += accepted
    for j in range(accepted):
        g["per_position_accepted"][j] += 1


def replay_suffix_result(requests, *, k: int, config: SuffixConfig = SuffixConfig(), schedule: str = "sequential",
                         workload: str = "", temperature: float = 0.0) -> AcceptanceResult:
    """The replay as an AcceptanceResult (backend 'replay'), comparable with a measured vLLM run."""
    c = replay_suffix(requests, k=k, config=config, schedule=schedule)
    return result_from_counts(per_position_accepted=c.per_position_accepted, num_drafts=c.num_drafts,
                              num_draft_tokens=c.num_draft_tokens, num_accepted=c.num_accepted, k=k,
                              temperature=temperature, workload=workload, backend="replay", groups=c.groups)
