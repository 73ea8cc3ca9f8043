"""Fast acceptance estimator with transformers (no vLLM engine): teacher-forced scoring of the draft on
text the target generated.

The target generates max_tokens + K for all prompts in one batch (greedy, or sampled at T); then one forward pass of the
target and one of the draft over prompt + output give, at every output position t, the target's
distribution p_t and the draft's q_t on the same context. Per-token acceptance:
  * T = 0: accept_t = [argmax q_t == the target's token at t] (exact for greedy verification);
  * T > 0, `draft_sample='greedy'` (vLLM 0.32's default `draft_sample_method`): the draft proposes
    argmax q_t and the rejection sampler keeps it with probability p_t(argmax q_t);
  * T > 0, `draft_sample='probabilistic'`: sum_x min(p_t(x), q_t(x)) (Leviathan et al. 2023).
Then vLLM's step loop is replayed over the output (prefill emits token 0; each step drafts K tokens from
position s, keeps the accepted prefix and one more token): greedy deterministically, sampled as
Bernoulli chains with a seeded RNG (`replicates` per prompt), which yields integer counts shaped like
vLLM's counters. Approximation: after a sampled acceptance the context is the target's sample, not the
draft's token. bench/acceptance.py measures the gap to vLLM.
"""

from __future__ import annotations

import random
import time

from draftfit.errors import require


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


def estimate_hf(target_dir: str, draft_dir: str, *, workload: str, temperatures: list[float], k: int = 8,
                num_prompts: int = 6, max_tokens: int = 48, seed: int = 0, replicates: int = 32,
                draft_sample: str = "greedy", progress: bool = True) -> dict:
    """Returns {'per_temperature': {T: {'groups': [...], 'output_tokens', 'seconds', 'extra'}},
    'transformers_version', 'startup_s'} in the same shape as measure_vllm.run_vllm."""
    torch = require("torch")
    transformers = require("transformers")
    from draftfit.prompts import encode_chat, load_prompts

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
            rng = random.Random(seed)
            groups, out_tokens, t1 = [], 0, time.monotonic()
            # All prompts in one left-padded batch (memory-bound on CPU: a batch costs about one sequence).
            # k extra tokens so that chains near the end are judged as vLLM judges them (see replay_steps).
            n_gen = max_tokens + k
            width = max(len(p) for p in ids)
            pad = target.config.pad_token_id if target.config.pad_token_id is not None else 0
            x = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
            gen_kwargs = dict(max_new_tokens=n_gen, min_new_tokens=n_gen, pad_token_id=pad, attention_mask=mask)
            if temperature > 0:
                torch.manual_seed(seed)
                gen_kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            else:
                gen_kwargs.update(do_sample=False)
            with torch.inference_mode():
                seq = target.generate(x, **gen_kwargs)
                full_mask = torch.cat([mask, torch.ones(len(ids), n_gen, dtype=mask.dtype)], dim=1)
                positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
                # Logits at position j predict token j+1: output token t is predicted at width-1+t.
                sl = slice(width - 1, seq.shape[1] - 1)
                lt_all = target(seq, attention_mask=full_mask, position_ids=positions).logits[:, sl].float()
                ld_all = draft(seq, attention_mask=full_mask, position_ids=positions).logits[:, sl].float()
            if bar is not None:
                bar.update(task, advance=len(ids) // 2)
            for pi in range(len(ids)):
                out = seq[pi, width:]
                lt, ld = lt_all[pi], ld_all[pi]
                out_tokens += max_tokens
                if temperature == 0:
                    accept = (ld.argmax(-1) == out).float().tolist()
                    drafts, per_pos = replay_steps(accept, k, deterministic=True, max_tokens=max_tokens)
                else:
                    p = torch.softmax(lt / temperature, -1)
                    if draft_sample == "probabilistic":
                        q = torch.softmax(ld / temperature, -1)
                        accept = torch.minimum(p, q).sum(-1).tolist()
                    else:
                        accept = p.gather(-1, ld.argmax(-1, keepdim=True)).squeeze(-1).tolist()
                    drafts, per_pos = 0, [0] * k
                    for _ in range(replicates):
                        d, pp = replay_steps(accept, k, rng=rng, max_tokens=max_tokens)
                        drafts += d
                        per_pos = [a + b for a, b in zip(per_pos, pp)]
                groups.append({"num_drafts": drafts, "per_position_accepted": per_pos,
                               "num_draft_tokens": drafts * k, "num_accepted": sum(per_pos),
                               "prompts": [pi], "output_tokens": max_tokens})
            if bar is not None:
                bar.update(task, completed=len(ids) * (temperatures.index(temperature) + 1))
            per_temperature[temperature] = {"groups": groups, "output_tokens": out_tokens,
                                            "seconds": round(time.monotonic() - t1, 2),
                                            "extra": {"draft_sample": draft_sample,
                                                      "replicates": replicates if temperature > 0 else 1}}
    finally:
        if bar is not None:
            bar.stop()
    return {"per_temperature": per_temperature, "transformers_version": transformers.__version__,
            "startup_s": round(startup_s, 1)}
