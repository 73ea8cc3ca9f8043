#!/usr/bin/env bash
# Device side of bench/serve_bench.py (issue 40): `vllm serve` with dummy weights, driven by `vllm bench serve` at each
# planned request rate, with no speculation and with draftfit's K. Runs ON THE GPU MACHINE from the repo root, after
# vLLM 0.34 is set up there (bench/vllm034/setup034.sh writes /root/env034.sh), with bench/.servebench carried
# (`bench/serve_bench.py --stage` here first; run(..., carry=["bench/.servebench"])):
#   bash bench/serve_bench_gpu.sh CONFIG MODE [BUDGET_S]      CONFIG: llama | qwen-moe   MODE: none | spec
# One call = one server start (40-120 s) + the rates not yet done, skipping any that would not finish in BUDGET_S
# (default 540: a 10-minute call). Resumable: results stay in /root/serve_res/ for as long as the machine is held
# and every call copies all of them to $OUT/serve_bench/<GPU>/<CONFIG>/<MODE>/rate_<R>.json (plus the server log).
set -u
CONFIG=${1:?config: llama or qwen-moe}; MODE=${2:?mode: none or spec}; BUDGET=${3:-540}
T0=$(date +%s)
[ -f /root/env034.sh ] && . /root/env034.sh
export VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)/bench/.servebench
[ -f "$HERE/plan.json" ] || { echo "[serve-bench] no bench/.servebench/plan.json: stage it and carry it"; exit 2; }
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in *H200*) GPU=H200;; *H100*) GPU=H100;; *) echo "[serve-bench] unplanned GPU: $NAME"; exit 2;; esac
RES=/root/serve_res/$GPU/$CONFIG/$MODE; mkdir -p "$RES"
eval "$(python3 - "$HERE/plan.json" "$GPU" "$CONFIG" "$MODE" <<'PY'
import json, shlex, sys
plan, gpu, config, mode = sys.argv[1:]
p = next(x for x in json.load(open(plan))[gpu] if x["config"] == config)
print("SERVE=" + shlex.quote(p["serve_spec" if mode == "spec" else "serve_none"]))
print("BENCH=" + shlex.quote(p["bench"]))
print("RATES=" + shlex.quote(" ".join(f"{r:g}" for r in p["rates"])))
print("NPROMPTS=" + shlex.quote(str(p["bench"].split("--num-prompts ")[1].split()[0])))
PY
)"
cd "$HERE" || exit 2
todo=""; for r in $RATES; do [ -s "$RES/rate_$r.json" ] || todo="$todo $r"; done
echo "[serve-bench] $GPU $CONFIG $MODE: to do:${todo:- nothing}"
copy_back() { mkdir -p "$OUT/serve_bench"; cp -r /root/serve_res/* "$OUT/serve_bench/" 2>/dev/null; }
if [ -z "$todo" ]; then copy_back; exit 0; fi
PORT=8000
# the plan holds `vllm serve ...` with its JSON shell-quoted: the module takes what follows `vllm`, eval keeps the quoting
eval "exec python3 -m vllm.entrypoints.cli.main ${SERVE#vllm } --port $PORT" > "$RES/server.log" 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null; wait $SPID 2>/dev/null' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
  kill -0 $SPID 2>/dev/null || { echo "[serve-bench] server died:"; grep -v "^W1\|DEBUG" "$RES/server.log" | tail -8; copy_back; exit 3; }
  [ $(( $(date +%s) - T0 )) -gt $(( BUDGET - 60 )) ] && { echo "[serve-bench] server not up in time"; copy_back; exit 4; }
  sleep 2
done
echo "[serve-bench] server up after $(( $(date +%s) - T0 )) s"
for r in $todo; do
  # a rate's run lasts about N / rate seconds plus the drain: skip what cannot finish in the budget
  need=$(python3 -c "print(int($NPROMPTS / $r * 1.3 + 30))")
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$need" -gt "$left" ]; then echo "[serve-bench] rate $r needs ~${need}s, ${left}s left: next call"; continue; fi
  t1=$(date +%s)
  B=${BENCH/RATE/$r}; python3 -m vllm.entrypoints.cli.main ${B#vllm } --port $PORT --result-dir "$RES" \
    --result-filename "rate_$r.json.tmp" > "$RES/bench_$r.log" 2>&1 \
    && mv "$RES/rate_$r.json.tmp" "$RES/rate_$r.json"
  echo "[serve-bench] rate $r: $( [ -s "$RES/rate_$r.json" ] && echo ok || echo FAILED) in $(( $(date +%s) - t1 ))s"
  [ -s "$RES/rate_$r.json" ] || tail -5 "$RES/bench_$r.log"
done
copy_back
python3 - "$RES" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/rate_*.json")):
    d = json.load(open(f))
    print(f"{f.split('/')[-1]}: tpot p50 {d['median_tpot_ms']:.2f} p99 {d['p99_tpot_ms']:.2f} ms, "
          f"ttft p50 {d['median_ttft_ms']:.1f} ms, {d['output_throughput']:.0f} tok/s, {d['completed']} done")
PY
