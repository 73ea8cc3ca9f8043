#!/bin/bash
# vLLM 0.34 on the H200 image (issue 38 item 3; the 0.33 recipe, docs/VLLM_0.33_INSTALL.md). Runs ON THE GPU MACHINE, from the repo root, once part.0..part.N
# and all.sha256 (the chunk folders made by bench/prepare_vllm034.sh) are copied into /root/parts:
#   bash .gpu034/tools/setup034.sh
# Joins and checks the stream, unpacks it into /root/site2, pip-installs the extra wheels there, writes
# /root/env034.sh (source it before every vLLM command) and runs check034.py. About 45 s (13 s + imports).
# Never export VLLM_USE_V2_MODEL_RUNNER here: 0.34 raises on any value but 1.
TOOLS=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s)
cd /root/parts || exit 2
got=$(cat part.* | sha256sum | cut -d' ' -f1); want=$(cut -d' ' -f1 all.sha256)
echo "[setup] stream sha256 $got (want $want)"; [ "$got" = "$want" ] || { echo "[setup] SHA MISMATCH"; exit 3; }
mkdir -p /root/site2
if command -v xz >/dev/null; then
  cat part.* | xz -dc -T0 | tar -xi -C /root/site2
else
  cat part.* | python3 -c "import lzma,sys,shutil; shutil.copyfileobj(lzma.LZMAFile(sys.stdin.buffer), sys.stdout.buffer, 1<<24)" | tar -xi -C /root/site2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site2 "$TOOLS"/extra_whl/*.whl 2>&1 | grep -v "already exists" | tail -2
cp "$TOOLS/sitecustomize.py" /root/site2/ && cp "$TOOLS/libnccl_shim.so" /root/
python3 "$TOOLS/patch_vllm034.py" /root/site2 || echo "[setup] WARNING: patch_vllm034.py failed: starts may fail in kernel_warmup on the hidden torchvision"  # kernel warmups vs the hidden torchvision
echo "[setup] unpacked in $(( $(date +%s) - T0 ))s: $(du -sh /root/site2 | cut -f1)"
cat > /root/env034.sh <<'EOT'
export PYTHONPATH=/root/site2 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
unset VLLM_USE_V2_MODEL_RUNNER  # 0.34: any value but 1 is a start-up error
EOT
. /root/env034.sh
if ! python3 -c "import torch" > /tmp/imp.err 2>&1; then
  tail -1 /tmp/imp.err
  if grep -q "undefined symbol: nccl" /tmp/imp.err; then
    echo "[setup] image NCCL lacks symbols torch 2.14 links: LD_PRELOAD=/root/libnccl_shim.so"
    echo "export LD_PRELOAD=/root/libnccl_shim.so" >> /root/env034.sh
  fi
fi
. /root/env034.sh
python3 "$TOOLS/check034.py"
echo "[setup] total $(( $(date +%s) - T0 ))s"
