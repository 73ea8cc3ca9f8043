#!/usr/bin/env python3
"""Writes the `vllm serve` commands draftfit's serve-cmd emits for a fixed set of cases, as the JSON list that
bench/vllm034/parse_commands.py checks on the device against vLLM 0.34's own parser (issue 38 item 3).

The commands come from the real CLI path (`draftfit serve-cmd ... --json`, run in-process through click), so a
change anywhere in draftfit's launch stage shows up here. Each entry: id, command (the shell text), argv, and
"models": hub id -> the calibration config folder (draftfit/data/calibration/configs/<name>) that stands in for it
on the offline GPU machine. tests/test_serve_commands_golden.py compares these with the golden of commands that
parsed on the device (GOLDEN: parse_commands.py's report from an H200 lease under vLLM 0.34, copied there by the
integrator).

usage: python bench/serve_commands.py [--out FILE] [--vllm-version 0.34.0]     (FILE '-' = stdout; CPU, ~5 s)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

VLLM_VERSION = "0.34.0"
# The device's report (bench/vllm034/parse_commands.py OUT.json), kept as the golden of commands vLLM 0.34 accepted.
GOLDEN = os.path.join(ROOT, "data", "reference", "serve_check", "vllm-0.34.json")
LLAMA8, LLAMA1, QWEN8, QWEN06 = "Llama-3.1-8B", "Llama-3.2-1B", "Qwen3-8B", "Qwen3-0.6B"
# (id, target, draft, extra serve-cmd options). --force: the command is wanted even where draftfit would advise
# against the pair (no GPU is given, so no speedup is predicted); the flags are the same either way.
CASES = [
    ("draft-llama-k4", LLAMA8, LLAMA1, ["--k", "4"]),
    ("draft-llama-k2-mml8192", LLAMA8, LLAMA1, ["--k", "2", "--max-model-len", "8192"]),
    ("draft-llama-k4-fp8", LLAMA8, LLAMA1, ["--k", "4", "--quantization", "fp8"]),
    ("draft-llama-k4-kvfp8", LLAMA8, LLAMA1, ["--k", "4", "--kv-cache-dtype", "fp8"]),
    ("draft-llama-k3-fp8-kvfp8-mml16384", LLAMA8, LLAMA1,
     ["--k", "3", "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--max-model-len", "16384"]),
    ("draft-llama-k4-util0.8", LLAMA8, LLAMA1, ["--k", "4", "--util", "0.8"]),
    ("draft-qwen-k4", QWEN8, QWEN06, ["--k", "4"]),
    ("draft-qwen-k4-fp8-mml4096", QWEN8, QWEN06, ["--k", "4", "--quantization", "fp8", "--max-model-len", "4096"]),
    ("ngram-llama-k4", LLAMA8, "ngram", ["--k", "4"]),
    ("ngram-llama-k3-kvfp8", LLAMA8, "ngram", ["--k", "3", "--kv-cache-dtype", "fp8"]),
    ("suffix-llama-k4", LLAMA8, "suffix", ["--k", "4"]),
    ("suffix-qwen-k6-mml8192", QWEN8, "suffix", ["--k", "6", "--max-model-len", "8192"]),
    ("eagle3-llama-k4", LLAMA8, "EAGLE3-Llama-3.1-8B", ["--k", "4"]),
    ("eagle3-llama-k3-fp8", LLAMA8, "EAGLE3-Llama-3.1-8B", ["--k", "3", "--quantization", "fp8"]),
    ("eagle3-llama-k4-mml8192-kvfp8", LLAMA8, "EAGLE3-Llama-3.1-8B",
     ["--k", "4", "--max-model-len", "8192", "--kv-cache-dtype", "fp8"]),
    ("eagle3-qwen-k4", QWEN8, "EAGLE3-Qwen3-8B", ["--k", "4"]),
]


def _hub_map(names: list[str]) -> dict[str, str]:
    """hub id -> catalog name (= calibration config folder) for the models the cases name."""
    from draftfit.catalog.specs import resolve_model
    out = {}
    for n in names:
        if n in ("ngram", "suffix"):
            continue
        spec = resolve_model(n)
        if spec.hub_id:
            out[spec.hub_id] = n
    return out


def serve_commands(vllm_version: str = VLLM_VERSION) -> list[dict]:
    """The commands, one per case, from draftfit's serve-cmd (in-process; exit code checked)."""
    from click.testing import CliRunner

    from draftfit.cli import cli
    runner = CliRunner()
    out = []
    for cid, target, draft, extra in CASES:
        args = ["serve-cmd", target, draft, "--vllm-version", vllm_version, "--force", "--json", *extra]
        r = runner.invoke(cli, args, catch_exceptions=False)
        if r.exit_code != 0:
            raise SystemExit(f"serve_commands: `draftfit {' '.join(args)}` exited {r.exit_code}: {r.output[-400:]}")
        d = json.loads(r.stdout if hasattr(r, "stdout") else r.output)
        hub = _hub_map([target, draft])
        out.append({"id": cid, "command": d["text"], "argv": d["argv"], "env": d["env"],
                    "models": {ref: name for ref, name in hub.items() if ref in d["argv"] or ref in d["text"]},
                    "serve_cmd_args": args[1:]})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="-")
    ap.add_argument("--vllm-version", default=VLLM_VERSION)
    a = ap.parse_args(argv)
    text = json.dumps(serve_commands(a.vllm_version), indent=1) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)
        print(f"serve_commands: {len(CASES)} commands -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
