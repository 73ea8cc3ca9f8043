#!/usr/bin/env bash
# (copied into .gpu034/tools by bench/prepare_vllm034.sh) Checks draftfit's serve commands (serve_commands.json,
# written here by bench/serve_commands.py) with vLLM 0.34's own `vllm serve` parser, EngineArgs and SpeculativeConfig,
# starting no engine; the report goes to $OUT/serve_check_vllm-0.34.json (the golden for
# tests/test_serve_commands_golden.py: copy it to data/reference/serve_check/vllm-0.34.json). About 20-40 s.
T=$(cd "$(dirname "$0")" && pwd)
. /root/env034.sh
timeout 150 python3 "$T/parse_commands.py" "${1:-$T/serve_commands.json}" "$OUT/serve_check_vllm-0.34.json" 2> "$OUT/serve_check.log" | tail -20
[ -s "$OUT/serve_check_vllm-0.34.json" ] || { echo "[serve-check] no report; last lines of its log:"; grep -v "^W1\|DEBUG" "$OUT/serve_check.log" | tail -5; }
