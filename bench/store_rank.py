"""`draftfit rank` with a large measurement store: 10,000 stored runs must keep rank under 0.5 s.

Builds a store of N runs (default 10,000) in a temporary folder, points the CLI at it with DRAFTFIT_STORE and
times `draftfit rank --target Llama-3.1-8B` as a user runs it (a fresh subprocess each time, median of 5, one
warm-up run first), beside the same command on an empty store. The warm-up run fits the acceptance prior and
caches it beside the store (`<store>.prior-fit.json`), as the first rank after any new measurement does; the
timed runs read that cache, and a second series with DRAFTFIT_PRIOR_CACHE=0 times the refit (cache miss).
Cached and refitted output must be identical (the "ranked ... in N s" line aside), else the bench fails. The
1-minute load average before and after each series goes into the table: other jobs share this machine.
Writes the table into docs/benchmarks.md between
`<!-- store-rank:start -->` and `<!-- store-rank:end -->` under "## Rank with a large store" (other sections of
that file are left alone).

The runs: 5 catalog pairs (Llama-3.1-8B with Llama-3.2-1B and -3B, Llama-3.1-70B + Llama-3.1-8B, Qwen3-8B +
Qwen3-0.6B, Qwen2.5-Coder-1.5B + -0.5B) and 5% local-folder names the catalog does not know, over 3 workloads,
T in {0, 0.7}, K 1-8, seeds, backends hf (cpu) and vllm (cuda); per-position counts for every run.

    .venv/bin/python bench/store_rank.py [--runs 10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from draftfit.acceptance.store import MeasurementStore  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- store-rank:start -->", "<!-- store-rank:end -->"
HEADING = "## Rank with a large store"
COMMAND = ".venv/bin/python bench/store_rank.py"
TARGET = "Llama-3.1-8B"
BUDGET_S = 0.5
PAIRS = [("Llama-3.1-8B", "Llama-3.2-1B"), ("Llama-3.1-8B", "Llama-3.2-3B"), ("Llama-3.1-70B", "Llama-3.1-8B"),
         ("Qwen3-8B", "Qwen3-0.6B"), ("Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B")]


def build_store(path: Path, n: int, seed: int = 0) -> None:
    MeasurementStore(path).close()  # the schema, as draftfit creates it
    rng = random.Random(seed)
    runs, positions = [], []
    for i in range(1, n + 1):
        if rng.random() < 0.05:
            target, draft = f"/models/local-target-{i % 17}", f"/models/local-draft-{i % 5}"
        else:
            target, draft = rng.choice(PAIRS)
        k, drafts = rng.randint(1, 8), rng.randint(50, 400)
        alpha = rng.uniform(0.55, 0.85)
        per_pos = [int(drafts * alpha ** (p + 1)) for p in range(k)]
        backend, device = rng.choice([("hf", "cpu x86_64 (bench)"), ("vllm", "cuda H200 (bench)")])
        runs.append((i, backend, target, draft, rng.choice(["code", "chat", "math"]), rng.choice([0.0, 0.7]), k,
                     i % 7, device, "2026-12-01T00:00:00+00:00", "2026-12-01T00:01:00+00:00", drafts, drafts * k,
                     sum(per_pos), sum(per_pos) / (drafts * k), 1 + sum(per_pos) / drafts))
        positions += [(i, p, c) for p, c in enumerate(per_pos)]
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            "INSERT INTO runs (id, status, backend, target, draft, workload, temperature, k, seed, device, started_at, "
            "ended_at, num_drafts, num_draft_tokens, num_accepted, acceptance_rate, mean_acceptance_length) "
            "VALUES (?, 'ok', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)
        conn.executemany("INSERT INTO run_positions (run_id, position, accepted) VALUES (?, ?, ?)", positions)
    conn.close()


def time_rank(store: Path, repeats: int, *, cache: bool = True) -> tuple[float, list[float], str]:
    # As a user runs it: compiled modules cached (the warm-up writes __pycache__ unless a sandbox forbids it).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(DRAFTFIT_STORE=str(store), DRAFTFIT_PRIOR_CACHE="1" if cache else "0")
    cmd = [sys.executable, "-m", "draftfit", "rank", "--target", TARGET]
    times, last = [], ""
    for i in range(repeats + 1):  # the first warms the OS file cache and is not counted
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), check=True)
        if i:
            times.append(time.perf_counter() - t0)
        last = out.stdout
    return statistics.median(times), times, last


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def _without_timing(out: str) -> str:
    return "\n".join(line for line in out.splitlines() if not line.startswith("ranked "))


def write_doc(body: str) -> None:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    block = (f"{START}\n{HEADING}\n\n{body}\n\n_Generated by `{COMMAND}` on {stamp}, {platform.machine()}, "
             f"Python {platform.python_version()}._\n{END}")
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print the table, leave docs/benchmarks.md alone")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="draftfit-store-rank-") as tmp:
        for n in (0, a.runs):
            store = Path(tmp) / f"store_{n}.sqlite"
            t0 = time.perf_counter()
            build_store(store, n)
            build_s = time.perf_counter() - t0
            load0 = _load()
            median, times, out = time_rank(store, a.repeats)
            load1 = _load()
            cold, cold_times, cold_out = time_rank(store, a.repeats, cache=False)
            load2 = _load()
            if _without_timing(out) != _without_timing(cold_out):
                raise SystemExit(f"{n} runs: rank's output with the cached prior differs from a refit")
            used = sum(1 for line in out.splitlines() if "measured run" in line or "measured:" in line)
            rows.append([f"{n:,}", f"{store.stat().st_size / 1e6:.1f} MB", f"{median:.3f}",
                         " / ".join(f"{t:.3f}" for t in times), "yes" if median < BUDGET_S else "**no**",
                         f"{cold:.3f}", "yes" if used else "no", f"{load0} / {load1} / {load2}"])
            print(f"{n:>6} runs (built in {build_s:.1f} s): median {median:.3f} s over {times}; refit median "
                  f"{cold:.3f} s over {cold_times}; load {load0} / {load1} / {load2}", flush=True)
    header = ["stored runs", "store size", "median wall (s)", f"each of {a.repeats} runs (s)",
              f"< {BUDGET_S} s", "median, prior refit (cache miss) (s)", "rank shows a stored run",
              f"load avg 1 min ({os.cpu_count()} CPUs): before / between / after"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    body = (f"`draftfit rank --target {TARGET}` as a fresh process (interpreter start included), "
            f"DRAFTFIT_STORE pointing at a store of N runs (5 catalog pairs and 5% unknown local models, 3 workloads, "
            f"T 0 / 0.7, K 1-8, per-position counts). Rank's store lookups read one precomputed per-process view "
            f"(one query over the ranked workload's runs); the prior's fit (runs pooled per configuration, leave-one-out refits) is cached beside the "
            f"store keyed by a fingerprint of its inputs (store content version, shipped catalogs and reference runs, "
            f"the fitting code), so only the first rank after a new measurement pays the refit (the cache-miss "
            f"column, DRAFTFIT_PRIOR_CACHE=0: the code path before the cache); cached and refitted output are "
            f"identical. Each series: one warm-up, then {a.repeats} timed "
            f"fresh processes.\n\n" + "\n".join(lines))
    if not a.no_write:
        write_doc(body)
        print(f"wrote {DOC.relative_to(ROOT)}")
    else:
        print(body)
    return 0 if all(r[4] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
