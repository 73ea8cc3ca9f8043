#!/usr/bin/env bash
# Rebuilds, here (any x86-64 Linux with pip, xz, gcc, network to PyPI), the folders that carry vLLM 0.33.0 to the
# lent H200 (issue 17; recipe and what failed: docs/VLLM_0.33_INSTALL.md):
#   DEST/c1..c7    the xz stream of torch 2.14.0 + triton 3.8.0 + vLLM 0.33.0 + 23 small wheels, repacked
#                  (bench/vllm033/repack.py: files the runs never load dropped, GPU code for other than sm_90
#                  zeroed) and split into parts of 50,000,000 bytes; c7 also holds all.sha256
#   DEST/tools     setup033.sh, check033.py, sitecustomize.py, libnccl_shim.so, extra_whl/ (compressed-tensors,
#                  loguru), patched copies of the campaign worker + driver, model configs
# usage, from the repo root:  echo /.gpu033/ >> .git/info/exclude; bench/prepare_vllm033.sh [DEST]   (~15 min,
# most of it xz on 2 cores; with more cores set XZ_THREADS)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)/vllm033
DEST=${1:-.gpu033}
XZ_THREADS=${XZ_THREADS:-2}
PART_BYTES=${PART_BYTES:-50000000}
mkdir -p "$DEST/dl/deps" "$DEST/tools/extra_whl" "$DEST/stream"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any"
grep -v '^#' "$here/wheels.txt" | while read -r req group sha file; do
  [ -n "$req" ] || continue
  case "$req" in torch==*|triton==*|vllm==*) d="$DEST/dl";; *) d="$DEST/dl/deps";; esac
  [ "$group" = extra ] && d="$DEST/tools/extra_whl"
  if [ ! -f "$d/$file" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
      -d "$d" "$req" 2>&1 | grep -v "WARNING: Location" || true
  fi
  got=$(sha256sum "$d/$file" | cut -d' ' -f1)
  [ "$got" = "$sha" ] || { echo "sha256 mismatch for $file: $got (want $sha)"; exit 4; }
done
echo "[prepare] 28 wheels downloaded and checked"
cd "$DEST"
for w in dl/torch-2.14.0-*.whl dl/triton-3.8.0-*.whl dl/vllm-0.33.0-*.whl; do
  b=$(basename "$w" .whl)
  [ -s "stream/$b.tar.xz" ] || python3 "$here/repack.py" "$w" 2> "stream/$b.log" | xz -T"$XZ_THREADS" -6 > "stream/$b.tar.xz"
done
[ -s stream/zdeps.tar.xz ] || python3 "$here/repack.py" dl/deps/*.whl 2>/dev/null | xz -T"$XZ_THREADS" -6 > stream/zdeps.tar.xz
cat stream/torch-*.tar.xz stream/triton-*.tar.xz stream/vllm-*.tar.xz stream/zdeps.tar.xz > stream/all.bin
rm -rf c[0-9]* split && mkdir split && (cd split && split -b "$PART_BYTES" -d -a 1 ../stream/all.bin part.)
i=1; for p in split/part.*; do mkdir -p "c$i"; mv "$p" "c$i/"; last=$i; i=$((i+1)); done; rmdir split
sha256sum stream/all.bin | awk '{print $1"  all.bin"}' > "c$last/all.sha256"
cd - >/dev/null
cp "$here/setup033.sh" "$here/check033.py" "$here/sitecustomize.py" "$here/patch_vllm033.py" "$here/nccl_shim.c" \
   "$here/resume.sh" "$here/seed_done.json" "$DEST/tools/"
gcc -O2 -shared -fPIC -o "$DEST/tools/libnccl_shim.so" "$here/nccl_shim.c"
python3 "$here/patch_tools.py" "$DEST/tools"
echo "[prepare] stream $(stat -c %s "$DEST/stream/all.bin") bytes, sha256 $(cut -d' ' -f1 "$DEST/c$last/all.sha256"); chunks: $(ls -d "$DEST"/c[0-9]* | tr '\n' ' ')"
cat <<EOT
Device calls, back to back (a machine goes back 30 s after a call; keep each call's reply short):
  call 1..$((last-1)): carry ["$DEST/cN"]   command: mkdir -p /root/parts && cp $DEST/cN/* /root/parts/ && ls /root/parts
  call $last: carry ["$DEST/c$last", "$DEST/tools"]  command:
    T0=\$(date +%s); mkdir -p /root/parts && cp $DEST/c$last/* /root/parts/ && bash $DEST/tools/setup033.sh 2>&1 | tee \$OUT/setup.log | grep -v "^W1201"; . /root/env033.sh; grep -q "imports ok" \$OUT/setup.log || exit 5; python3 $DEST/tools/gpu_campaign.py --phase M033 --out \$OUT --work-dir /root/camp --budget-s \$((560 - \$(date +%s) + T0)) 2>&1 | grep -v "^W1201" | tail -60; cd /root/camp && tar czf \$OUT/logs_M033.tgz M033_gpu0/*.log
  next: carry ["$DEST/tools"]  command: bash $DEST/tools/resume.sh S033 565   (skips what earlier calls on this machine finished)
EOT
