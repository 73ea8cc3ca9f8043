#!/usr/bin/env bash
# Rebuilds, here, the four folders that carry vLLM 0.26.0 (+ the 20 small wheels of ../shared/gpu/wheels.txt) to the
# lent H200 in five device calls instead of seven (issue 16; docs/archive/GPU_CAMPAIGN.md "Seventh session"). A call carries at
# most 64 MiB, the working tree included (16.1 MiB on 2026-12-02, 19.4 MiB on 2026-12-03, when 46,800,000-byte parts
# no longer fitted beside it: "the working tree is larger than 64 MiB"), so a part is 37,640,000 bytes (CHUNK_BYTES),
# five parts with py-spy's wheel in the last folder; the tree may grow by about 8 MiB more:
#   DEST/x1..x4   one tar stream of the 21 wheels' site-packages content, GPU code for other than sm_90 zeroed in
#                 vLLM's extensions (bench/vllm033/repack.py, REPACK_PROFILE=026), xz -6, parts of CHUNK_BYTES;
#                 the last folder also holds all.sha256
# usage, from the repo root:  echo /.gpu/ >> .git/info/exclude; bench/prepare_vllm026.sh [DEST]   (~6 min on 2 cores)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DEST=${1:-.gpu}
XZ_THREADS=${XZ_THREADS:-2}
CHUNK_BYTES=${CHUNK_BYTES:-37640000}
mkdir -p "$DEST/dl" "$DEST/stream"
grep -v '^#' "$here/../../shared/gpu/wheels.txt" > "$DEST/wheels.txt"  # ../shared beside the project folder
while read -r req; do
  [ -n "$req" ] || continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$DEST/dl" "$req" 2>&1 \
    | grep -v "WARNING: Location" || true
done < "$DEST/wheels.txt"
n=$(ls "$DEST"/dl/*.whl | wc -l); [ "$n" -ge 21 ] || { echo "only $n wheels downloaded (want 21)"; exit 4; }
REPACK_PROFILE=026 python3 "$here/vllm033/repack.py" "$DEST"/dl/*.whl 2> "$DEST/stream/repack.log" \
  | xz -T"$XZ_THREADS" -6 > "$DEST/stream/all.bin"
cd "$DEST"
rm -rf x[0-9]* split && mkdir split && (cd split && split -b "$CHUNK_BYTES" -d -a 1 ../stream/all.bin part.)
i=1; for p in split/part.*; do mkdir -p "x$i"; mv "$p" "x$i/"; last=$i; i=$((i+1)); done; rmdir split
sha256sum stream/all.bin | awk '{print $1"  all.bin"}' > "x$last/all.sha256"
cd - >/dev/null
# py-spy (2.9 MB) rides in the last folder: calibrate_worker's `pyspy` specs look for <site>/bin/py-spy, and the
# 21 wheels do not include it (phase M2T of 2026-12-03 recorded "py-spy not installed").
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST/x$last" py-spy 2>&1 | grep -v "WARNING: Location" || true
echo "[prepare] stream $(stat -c %s "$DEST/stream/all.bin") bytes, sha256 $(cut -d' ' -f1 "$DEST/x$last/all.sha256"); chunks: $(ls -d "$DEST"/x[0-9]* | tr '\n' ' ')"
# The wheel's one file that matters is its binary (py_spy-X.data/scripts/py-spy); unzipped by the standard library
# into <site>/bin, so the install needs no pip on the lent machine, and a missing wheel only leaves py-spy out.
PYSPY_UNPACK="import glob,os,zipfile; w=glob.glob('py_spy-*.whl'); z=w and zipfile.ZipFile(w[0]); n=z and [x for x in z.namelist() if x.endswith('/scripts/py-spy')]; os.makedirs('/root/site/bin',exist_ok=True); n and open('/root/site/bin/py-spy','wb').write(z.read(n[0])); n and os.chmod('/root/site/bin/py-spy',0o755); print('[install] py-spy', 'unpacked' if n else 'not carried')"
cat <<EOT
Device calls, back to back (a machine goes back 30 s after a call):
  call 1..$((last-1)): carry ["$DEST/xN"]   command: mkdir -p /root/parts && cp $DEST/xN/* /root/parts/
  call $last: carry ["$DEST/x$last"]  command:
    mkdir -p /root/parts /root/site && cp $DEST/x$last/* /root/parts/ && cd /root/parts && cat part.* | sha256sum | cut -c1-64 | diff - <(cut -c1-64 all.sha256) && cat part.* | xz -dc -T0 | tar -xi -C /root/site && python3 -c "$PYSPY_UNPACK" && cd - && export PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 && python3 bench/gpu_campaign.py --phase ... --out \$OUT --budget-s 530
EOT
