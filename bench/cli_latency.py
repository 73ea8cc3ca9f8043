"""CLI start-up latency: wall time of common commands as a user runs them, and what they import.

    python bench/cli_latency.py [--runs 5] [--no-readme]

Each command runs `--runs` times as a fresh subprocess (the installed `draftfit` script); the table shows
the median and the spread. A second run of each under a tiny wrapper lists which heavy packages
(torch, transformers, vllm, sklearn, tokenizers, matplotlib) got imported. Commands that this build does
not have yet are reported as skipped. Also times `compat.catalog_verdict`, which `rank` calls per candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._readme import markdown_table, write_section  # noqa: E402

HEAVY = ("torch", "transformers", "vllm", "sklearn", "tokenizers", "matplotlib")
COMMANDS = [
    ["--help"],
    ["catalog", "list"],
    ["check", "Llama-3.1-70B", "Llama-3.2-1B", "--catalog-only"],
    ["check", "Qwen2.5-7B", "Qwen2.5-0.5B"],
    ["rank", "--target", "Llama-3.1-70B"],
    ["memory", "Llama-3.1-70B", "--draft", "Llama-3.2-1B", "--gpu", "H100-80GB", "--tp", "2"],
]


# As a user runs it: Python caches compiled modules (__pycache__). Some sandboxes set PYTHONDONTWRITEBYTECODE, which
# makes every start recompile draftfit's ~40 modules (about 0.09 s on 2 cores); the warm-up run writes the cache.
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def entry_point() -> list[str]:
    script = Path(sys.executable).parent / "draftfit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "draftfit"]


def run_once(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(entry_point() + argv, capture_output=True, text=True, env=USER_ENV)
    return time.perf_counter() - start, proc


def heavy_imports(argv: list[str]) -> list[str]:
    code = ("import atexit, json, sys\n"
            f"atexit.register(lambda: print('HEAVY=' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]), "
            "file=sys.stderr))\n"
            "from draftfit.cli import main\n"
            f"main({argv!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        if line.startswith("HEAVY="):
            return json.loads(line[len("HEAVY="):])
    return ["?"]


def not_available(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode != 0 and "not available in this build" in proc.stderr


def time_catalog_verdict() -> tuple[float, int]:
    from draftfit.catalog.specs import load_models, resolve_model
    from draftfit.compat.tokenizers import catalog_verdict

    target = resolve_model("Llama-3.1-70B")
    models = load_models()
    catalog_verdict(target, models[0])  # loads draftfit/catalogs/tokenizers.yaml once
    per_round = []
    for _ in range(5):
        start = time.perf_counter()
        for m in models:
            catalog_verdict(target, m)
        per_round.append((time.perf_counter() - start) / len(models))
    return statistics.median(per_round), len(models)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-readme", action="store_true", help="print the table only")
    args = ap.parse_args()

    rows = []
    for argv in COMMANDS:
        shown = "draftfit " + " ".join(argv)
        _, first = run_once(argv)  # warms the page cache; not counted
        if not_available(first):
            rows.append([f"`{shown}`", "skipped (not in this build)", "", "", ""])
            print(f"{shown}: skipped")
            continue
        times = [run_once(argv)[0] for _ in range(args.runs)]
        heavy = heavy_imports(argv)
        rows.append([f"`{shown}`", f"{statistics.median(times):.3f}", f"{min(times):.3f}–{max(times):.3f}",
                     first.returncode, ", ".join(heavy) or "none"])
        print(f"{shown}: median {statistics.median(times):.3f} s, rc {first.returncode}, heavy imports: {heavy or 'none'}")

    per_call_s, n = time_catalog_verdict()
    print(f"compat.catalog_verdict: {per_call_s * 1e3:.3f} ms per call over {n} catalog drafts")
    body = markdown_table(["command", f"median wall s ({args.runs} runs)", "min–max s", "exit", "heavy imports"], rows)
    body += (f"\n\n`compat.catalog_verdict` (what `rank` runs per candidate): {per_call_s * 1e3:.3f} ms per call "
             f"(median of 5 rounds over {n} catalog models; budget 5 ms).")
    if not args.no_readme:
        write_section("cli-latency", body, command="python bench/cli_latency.py")
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
