#!/usr/bin/env bash
# Rebuilds, here (any x86-64 Linux with pip, xz, gcc, network to PyPI), the folders that carry vLLM 0.34.0 to the
# lent H200 (issue 38 item 3; the 0.33 recipe it adapts, and what failed there: docs/VLLM_0.33_INSTALL.md;
# what differs for 0.34: docs/VLLM_0.34_INSTALL.md):
#   DEST/c1..cN    the xz stream of torch 2.14.0 + triton 3.8.0 + vLLM 0.34.0 + 23 small wheels, repacked by
#                  bench/vllm033/repack.py (shared: same torch/triton, same drops and sm_90 pruning) and split into
#                  parts of 50,000,000 bytes; the last chunk also holds all.sha256
#   DEST/tools     setup034.sh, check034.py, patch_vllm034.py, sitecustomize.py, libnccl_shim.so, extra_whl/ (group
#                  'extra' of wheels.txt, pip-installed --no-deps into /root/site2 by setup034.sh: compressed-tensors,
#                  loguru, and the `vllm serve`/`vllm bench serve` ones, ~1.2 MB),
#                  resume.sh, parse_commands.py, patched copies of the campaign worker + driver, model configs
# usage, from the root of the repo whose campaign tools should travel (the integrator's tree):
#   echo /.gpu034/ >> .git/info/exclude; bench/prepare_vllm034.sh [DEST]          (~12 min, xz on 2 cores)
#   bench/prepare_vllm034.sh --tools-only [DEST]    (seconds: recopy + repatch gpu_campaign.py/worker into DEST/tools
#                                                    after a merge; the chunks are left as they are)
set -euo pipefail
TOOLS_ONLY=0
if [ "${1:-}" = "--tools-only" ]; then TOOLS_ONLY=1; shift; fi
here=$(cd "$(dirname "$0")" && pwd)/vllm034
repack=$(cd "$(dirname "$0")" && pwd)/vllm033/repack.py
DEST=${1:-.gpu034}
XZ_THREADS=${XZ_THREADS:-2}
# Each device call carries the working tree beside one part, 64 MiB in all: parts are as large as what the tree
# (tracked and untracked-not-ignored files, as the device copies it) leaves, less 4 MB of margin.
TREE_BYTES=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
PART_BYTES=${PART_BYTES:-$(( 64 * 1048576 - TREE_BYTES - 4000000 ))}
mkdir -p "$DEST/tools/extra_whl"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any"
fetch() {  # fetch GROUP-FILTER: download (or reuse) and sha256-check the wheels of wheels.txt in those groups
  grep -v '^#' "$here/wheels.txt" | while read -r req group sha file; do
    [ -n "$req" ] || continue
    case " $1 " in *" $group "*) ;; *) continue;; esac
    case "$req" in torch==*|triton==*|vllm==*) d="$DEST/dl";; *) d="$DEST/dl/deps";; esac
    [ "$group" = extra ] && d="$DEST/tools/extra_whl"
    mkdir -p "$d"
    # the vLLM 0.34.0 wheel may already sit in /work/dl (downloaded for the source notes): reuse it
    [ -f "$d/$file" ] || [ ! -f "${VLLM_WHEEL_DIR:-/work/dl}/$file" ] || cp "${VLLM_WHEEL_DIR:-/work/dl}/$file" "$d/"
    if [ ! -f "$d/$file" ]; then
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
        -d "$d" "$req" 2>&1 | grep -v "WARNING: Location" || true
    fi
    got=$(sha256sum "$d/$file" | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { echo "sha256 mismatch for $file: $got (want $sha)"; exit 4; }
  done
}
if [ $TOOLS_ONLY = 0 ]; then
  fetch stream
  echo "[prepare] stream wheels downloaded and checked"
  mkdir -p "$DEST/stream"
  (
    cd "$DEST"
    for w in dl/torch-2.14.0-*.whl dl/triton-3.8.0-*.whl dl/vllm-0.34.0-*.whl; do
      b=$(basename "$w" .whl)
      [ -s "stream/$b.tar.xz" ] || { python3 "$repack" "$w" 2> "stream/$b.log" | xz -T"$XZ_THREADS" -6 > "stream/$b.tar.xz.tmp" && mv "stream/$b.tar.xz.tmp" "stream/$b.tar.xz"; }
    done
    [ -s stream/zdeps.tar.xz ] || { python3 "$repack" dl/deps/*.whl 2>/dev/null | xz -T"$XZ_THREADS" -6 > stream/zdeps.tar.xz.tmp && mv stream/zdeps.tar.xz.tmp stream/zdeps.tar.xz; }
    cat stream/torch-*.tar.xz stream/triton-*.tar.xz stream/vllm-*.tar.xz stream/zdeps.tar.xz > stream/all.bin
    rm -rf c[0-9]* split && mkdir split && (cd split && split -b "$PART_BYTES" -d -a 1 ../stream/all.bin part.)
    i=1; for p in split/part.*; do mkdir -p "c$i"; mv "$p" "c$i/"; i=$((i+1)); done; rmdir split
    last=$(ls -d c[0-9]* | sed 's/^c//' | sort -n | tail -1)
    sha256sum stream/all.bin | awk '{print $1"  all.bin"}' > "c$last/all.sha256"
  )
fi
fetch extra
cp "$here/setup034.sh" "$here/check034.py" "$here/patch_vllm034.py" "$here/parse_commands.py" "$here/resume.sh" \
   "$here/check_serve.sh" "$here/seed_done.json" "$here/../vllm033/sitecustomize.py" "$here/../vllm033/nccl_shim.c" \
   "$DEST/tools/"
# check034.py runs 0.33's GPU checks first; its closing line renamed, so that only check034.py says "imports ok"
sed 's/\[check\] imports ok in/[check] GPU checks passed in/' "$here/../vllm033/check033.py" > "$DEST/tools/check033_gpu.py"
gcc -O2 -shared -fPIC -o "$DEST/tools/libnccl_shim.so" "$here/../vllm033/nccl_shim.c"
python3 "$here/patch_tools.py" "$DEST/tools"
# draftfit's serve commands for the device check (the tree's own serve-cmd path; needs the project's venv)
${PYTHON:-.venv/bin/python} "$here/../serve_commands.py" --out "$DEST/tools/serve_commands.json"
last=$(ls -d "$DEST"/c[0-9]* 2>/dev/null | sed 's/.*\/c//' | sort -n | tail -1)
[ -n "$last" ] || { echo "[prepare] no chunks in $DEST yet: run without --tools-only first"; exit 6; }
echo "[prepare] stream $(stat -c %s "$DEST/stream/all.bin") bytes, sha256 $(cut -d' ' -f1 "$DEST/c$last/all.sha256"); chunks: $(ls -d "$DEST"/c[0-9]* | tr '\n' ' ')"
echo "[prepare] sizes (MiB, each call also carries the $((TREE_BYTES / 1048576)) MiB tree; limit 64): $(du -sm "$DEST"/c[0-9]* "$DEST/tools" | awk '{printf "%s=%s ", $2, $1}')"
cat <<EOT
Device calls, back to back (a machine goes back 30 s after a call; keep each call's reply short; if one fails, send
the next, even 'sleep 20; ls \$OUT', at once and think while it runs):
  call 1..$((last-1)): carry ["$DEST/cN"]   command: mkdir -p /root/parts && cp $DEST/cN/* /root/parts/ && ls /root/parts
  call $last: carry ["$DEST/c$last", "$DEST/tools"]  command:
    T0=\$(date +%s); mkdir -p /root/parts && cp $DEST/c$last/* /root/parts/ && bash $DEST/tools/setup034.sh 2>&1 | tee \$OUT/setup.log | grep -v "^W1" | tail -14; grep -q "imports ok" \$OUT/setup.log || exit 5; bash $DEST/tools/check_serve.sh; bash $DEST/tools/resume.sh M034,S034 \$((575 - \$(date +%s) + T0))
  next: carry ["$DEST/tools"]  command: bash $DEST/tools/resume.sh S034 565   (skips what earlier calls on this machine finished)
Phase names: whatever the tools copy of gpu_campaign.py defines (python3 $DEST/tools/gpu_campaign.py --help lists them).
EOT
