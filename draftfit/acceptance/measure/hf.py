"""Fast acceptance estimator with transformers (no vLLM engine).

T = 0: the target generates max_tokens + K for all prompts in one batch (greedy); one forward pass of the
target and one of the draft over prompt + output give, at every output position t, the draft's argmax on
the target's context; accept_t = [argmax q_t == the target's token at t] (exact for greedy verification,
the text is the same whatever the draft proposes). vLLM's step loop is then replayed over that output
(prefill emits token 0; each step drafts K tokens from position s, keeps the accepted prefix and one more
token), which gives integer counts shaped like vLLM's counters.

T > 0: the text depends on the draft (accepted draft tokens become the context), so teacher forcing on the
target's own samples reads low (-14% mean acceptance length at T=0.7 on the Qwen2.5-Coder pair). Instead
`speculative_replay` runs vLLM's draft_model loop itself with KV caches: the draft proposes K tokens
(argmax for vLLM 0.32's default `draft_sample_method='greedy'`, the draft probabilities then treated as
one-hot; sampled at T for 'probabilistic'), the target verifies them in one forward with vLLM's rejection
rule and residual resampling, and the counters are counted per step as vLLM counts them. Each prompt runs
`replicates` independent seeded chains in one batch (prompt-major rows); per-prompt groups sum them.
bench/acceptance.py measures the gap to vLLM.
"""
from __future__ import annotations

import random
import time

from draftfit.errors import require
from draftfit.acceptance.measure.base import MeasureRequest, RawCounts
from draftfit.acceptance.measure.prompts import encode_chat, load_prompts


def replay_steps(accept_prob: list[float], k: int, *, rng: random.Random | None = None,
                 deterministic: bool = False, max_tokens: int | None = None) -> tuple[int, list[int]]:
    """vLLM's step loop over one output: (num_drafts, per-position accepted counts at k).
    accept_prob[t] is the acceptance probability of a draft token at output position t. Steps start while
    fewer than `max_tokens` tokens are out (default: all of accept_prob); a chain may look past max_tokens,
    as vLLM verifies a full draft and trims the output afterwards, so score k extra tokens."""
    n = len(accept_prob)
    stop = n if max_tokens is None else min(max_tokens, n)
    drafts, per_pos = 0, [0] * k
    s = 1  # token 0 comes from prefill, before any draft
    while s < stop:
        drafts += 1
        accepted = 0
        while accepted < k and s + accepted < n:
            p = accept_prob[s + accepted]
            ok = p >= 0.5 if deterministic else (rng.random() < p)
            if not ok:
                break
            per_pos[accepted] += 1
            accepted += 1
        s += accepted + 1
    return drafts, per_pos


def _row_seed(seed: int, prompt: int, replicate: int) -> int:
    # Independent of batch composition, so a row's draws do not depend on which rows run beside it.
    return (seed * 1_000_003 + prompt * 7_919 + replicate) % (2**63)


def speculative_replay(target, draft, ids: list[list[int]], *, k: int, temperature: float, max_tokens: int,
                       replicates: int = 1, seed: int = 0, draft_sample: str = "greedy") -> list[dict]:
    """vLLM's draft_model speculative loop at T > 0, run with transformers on both models (KV caches, all
    prompts x replicates in one batch). Per row: the target samples token 0 at prefill; then each step the
    draft proposes K tokens from the current context (argmax, or sampled at T for 'probabilistic'), the
    target scores context + proposals in one forward, proposal i is kept when u_i <= p_T(x_i)/q(x_i)
    (q = 1, one-hot, for greedy drafts, as vLLM's rejection sampler), the first rejected one is replaced by
    a sample of the residual (p_T without x_i, or max(p_T - q_T, 0), renormalised) and a fully accepted
    draft adds a bonus token from p_T. The emitted text (accepted drafts included) is the next context, as
    in vLLM. Counts as vLLM's counters: one draft per step started while fewer than max_tokens tokens
    are out, position i accepted when the step kept more than i tokens. Returns one dict per row
    (prompt-major: row = prompt * replicates + r) with num_drafts and per_position_accepted."""
    import torch

    n_rows = len(ids) * replicates
    width = max(len(p) for p in ids)
    pad = target.config.pad_token_id if target.config.pad_token_id is not None else 0
    x = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    gens = []
    for pi in range(len(ids)):
        for r in range(replicates):
            g = torch.Generator()
            g.manual_seed(_row_seed(seed, pi, r))
            gens.append(g)
    with torch.inference_mode():
        # Prefill once per prompt, then copy each prompt's caches to its replicates.
        t_out = target(x, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        d_out = draft(x, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        t_cache, d_cache = t_out.past_key_values, d_out.past_key_values
        if replicates > 1:
            t_cache.batch_repeat_interleave(replicates)
            d_cache.batch_repeat_interleave(replicates)
        first = torch.softmax(t_out.logits[:, -1].float() / temperature, -1).repeat_interleave(replicates, 0)
        last = torch.stack([torch.multinomial(first[b], 1, generator=gens[b]) for b in range(n_rows)]).view(-1)
        t_mask = mask.repeat_interleave(replicates, 0)
        d_mask = t_mask.clone()
        lens = torch.tensor([len(p) for p in ids]).repeat_interleave(replicates)
        t_valid, d_valid = lens.clone(), lens.clone()  # valid tokens in each cache (next position id)
        pending = [[int(t)] for t in last]  # context tokens the draft cache has not seen
        emitted = [1] * n_rows  # token 0 came from prefill
        rows = list(range(n_rows))  # global row of each batch slot still running
        stats = [{"num_drafts": 0, "per_position_accepted": [0] * k} for _ in range(n_rows)]
        while rows:
            b = len(rows)
            # Draft: feed what it has not seen (left-filled with masked slots), then K-1 single tokens.
            plen = max(len(p) for p in pending)
            d_in = torch.tensor([[pad] * (plen - len(p)) + p for p in pending])
            d_new_mask = torch.tensor([[0] * (plen - len(p)) + [1] * len(p) for p in pending])
            d_pos = d_valid.view(-1, 1) + (d_new_mask.cumsum(-1) - 1).clamp(min=0)
            d_mask = torch.cat([d_mask, d_new_mask], 1)
            d_valid = d_valid + d_new_mask.sum(-1)
            proposals, q_rows = [], []
            for j in range(k):
                logits = draft(d_in, attention_mask=d_mask, position_ids=d_pos, past_key_values=d_cache,
                               use_cache=True, logits_to_keep=1).logits[:, -1].float()
                if draft_sample == "probabilistic":
                    q = torch.softmax(logits / temperature, -1)
                    tok = torch.stack([torch.multinomial(q[i], 1, generator=gens[rows[i]]) for i in range(b)]).view(-1)
                    q_rows.append(q)
                else:
                    tok = logits.argmax(-1)
                proposals.append(tok)
                if j < k - 1:
                    d_in = tok.view(-1, 1)
                    d_pos = d_valid.view(-1, 1)
                    d_mask = torch.cat([d_mask, torch.ones(b, 1, dtype=d_mask.dtype)], 1)
                    d_valid = d_valid + 1
            props = torch.stack(proposals, 1)  # [b, k]
            # Target: last emitted token + the K proposals, one forward.
            t_in = torch.cat([last.view(-1, 1), props], 1)
            t_pos = t_valid.view(-1, 1) + torch.arange(k + 1)
            t_mask = torch.cat([t_mask, torch.ones(b, k + 1, dtype=t_mask.dtype)], 1)
            t_logits = target(t_in, attention_mask=t_mask, position_ids=t_pos, past_key_values=t_cache,
                              use_cache=True).logits.float()
            p = torch.softmax(t_logits / temperature, -1)  # [b, k+1, V]
            new_last, keep = [], []
            for i in range(b):
                row, g = rows[i], gens[rows[i]]
                u = torch.rand(k, generator=g, dtype=torch.float64)
                xs = props[i]
                p_x = p[i, torch.arange(k), xs].double()
                if draft_sample == "probabilistic":
                    q_x = torch.stack([q_rows[j][i, xs[j]] for j in range(k)]).double()
                    ok = (q_x > 0) & (p_x / q_x.clamp(min=1e-300) >= u)
                else:
                    ok = p_x >= u
                a = int(ok.long().cumprod(0).sum())
                if a < k:
                    if draft_sample == "probabilistic":
                        res = (p[i, a] - q_rows[a][i]).clamp(min=0)
                    else:
                        res = p[i, a].clone()
                        res[xs[a]] = 0
                    tok = int(torch.multinomial(res, 1, generator=g))
                else:
                    tok = int(torch.multinomial(p[i, k], 1, generator=g))
                st = stats[row]
                st["num_drafts"] += 1
                for j in range(a):
                    st["per_position_accepted"][j] += 1
                emitted[row] += a + 1
                # Rejected proposals stay in the caches, masked out: cheaper than per-row cropping.
                if a < k:
                    t_mask[i, t_mask.shape[1] - (k - a):] = 0
                rej_d = (k - 1) - min(a, k - 1)
                if rej_d:
                    d_mask[i, d_mask.shape[1] - rej_d:] = 0
                    d_valid[i] -= rej_d
                t_valid[i] += 1 + a
                pending[i] = [tok] if a < k else [int(xs[k - 1]), tok]
                new_last.append(tok)
                if emitted[row] < max_tokens:
                    keep.append(i)
            last = torch.tensor(new_last)
            if len(keep) < b:
                idx = torch.tensor(keep, dtype=torch.long)
                if keep:
                    t_cache.batch_select_indices(idx)
                    d_cache.batch_select_indices(idx)
                t_mask, d_mask, t_valid, d_valid, last = t_mask[idx], d_mask[idx], t_valid[idx], d_valid[idx], last[idx]
                pending = [pending[i] for i in keep]
                rows = [rows[i] for i in keep]
    return stats


def estimate_hf(target_dir: str, draft_dir: str, *, workload: str, temperatures: list[float], k: int = 8,
                num_prompts: int = 6, max_tokens: int = 48, seed: int = 0, replicates: int = 4,
                draft_sample: str = "greedy", progress: bool = True) -> dict:
    """Returns {'per_temperature': {T: {'groups': [...], 'output_tokens', 'seconds', 'extra'}},
    'transformers_version', 'startup_s'} (base.RawCounts, as vllm.run_vllm)."""
    torch = require("torch")
    transformers = require("transformers")

    t0 = time.monotonic()
    torch.manual_seed(seed)
    texts = load_prompts(workload, num_prompts).prompts
    ids = encode_chat(target_dir, list(texts))
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    startup_s = time.monotonic() - t0
    bar = None
    if progress:
        from rich.console import Console
        from rich.progress import Progress

        bar = Progress(console=Console(stderr=True), transient=True)
        bar.start()
        task = bar.add_task(f"HF estimator {workload}", total=len(ids) * len(temperatures))
    per_temperature = {}
    try:
        for temperature in temperatures:
            groups, out_tokens, t1 = [], 0, time.monotonic()
            if temperature > 0:
                with torch.inference_mode():
                    stats = speculative_replay(target, draft, ids, k=k, temperature=temperature,
                                               max_tokens=max_tokens, replicates=replicates, seed=seed,
                                               draft_sample=draft_sample)
                for pi in range(len(ids)):
                    mine = stats[pi * replicates:(pi + 1) * replicates]
                    drafts = sum(s["num_drafts"] for s in mine)
                    per_pos = [sum(s["per_position_accepted"][i] for s in mine) for i in range(k)]
                    out_tokens += max_tokens
                    groups.append({"num_drafts": drafts, "per_position_accepted": per_pos,
                                   "num_draft_tokens": drafts * k, "num_accepted": sum(per_pos),
                                   "prompts": [pi], "output_tokens": max_tokens})
            else:
                # All prompts in one left-padded batch (memory-bound on CPU: a batch costs about one sequence).
                # k extra tokens so that chains near the end are judged as vLLM judges them (see replay_steps).
                n_gen = max_tokens + k
                width = max(len(p) for p in ids)
                pad = target.config.pad_token_id if target.config.pad_token_id is not None else 0
                x = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
                gen_kwargs = dict(max_new_tokens=n_gen, min_new_tokens=n_gen, pad_token_id=pad, attention_mask=mask,
                                  do_sample=False)
                with torch.inference_mode():
                    seq = target.generate(x, **gen_kwargs)
                    full_mask = torch.cat([mask, torch.ones(len(ids), n_gen, dtype=mask.dtype)], dim=1)
                    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
                    # Logits at position j predict token j+1: output token t is predicted at width-1+t.
                    sl = slice(width - 1, seq.shape[1] - 1)
                    ld_all = draft(seq, attention_mask=full_mask, position_ids=positions).logits[:, sl].float()
                if bar is not None:
                    bar.update(task, advance=len(ids) // 2)
                for pi in range(len(ids)):
                    out = seq[pi, width:]
                    ld = ld_all[pi]
                    out_tokens += max_tokens
                    accept = (ld.argmax(-1) == out).float().tolist()
                    drafts, per_pos = replay_steps(accept, k, deterministic=True, max_tokens=max_tokens)
                    groups.append({"num_drafts": drafts, "per_position_accepted": per_pos,
                                   "num_draft_tokens": drafts * k, "num_accepted": sum(per_pos),
                                   "prompts": [pi], "output_tokens": max_tokens})
            if bar is not None:
                bar.update(task, completed=len(ids) * (temperatures.index(temperature) + 1))
            per_temperature[temperature] = {"groups": groups, "output_tokens": out_tokens,
                                            "seconds": round(time.monotonic() - t1, 2),
                                            "extra": {"draft_sample": draft_sample,
                                                      "method": ("speculative replay" if temperature > 0
                                                                 else "teacher-forced greedy"),
                                                      "replicates": replicates if temperature > 0 else 1}}
    finally:
        if bar is not None:
            bar.stop()
    return {"per_temperature": per_temperature, "transformers_version": transformers.__version__,
            "startup_s": round(startup_s, 1)}


class HfBackend:
    """The transformers estimator behind the measurement seam (base.Backend): in this process, draft models only."""

    name = "hf"

    def run(self, req: MeasureRequest, *, progress: bool = True) -> RawCounts:
        return estimate_hf(req.target, req.draft, workload=req.workload, temperatures=list(req.temperatures),
                           k=req.k, num_prompts=req.num_prompts, max_tokens=req.max_tokens, seed=req.seed,
                           progress=progress)
