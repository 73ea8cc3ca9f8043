#!/usr/bin/env bash
# (copied into .gpu034/tools by bench/prepare_vllm034.sh; docs/VLLM_0.34_INSTALL.md; the 0.33 script with its env file)
# resume.sh PHASES BUDGET_S: runs the campaign phases, skipping every engine a previous call on this machine
# finished (status ok, no batch skipped), keeps each call's lane files in /root/res, logs tarred into $OUT.
set -u
. /root/env034.sh
T=$(cd "$(dirname "$0")" && pwd)
mkdir -p /root/res
[ -f /root/res/seed.json ] || cp "$T/seed_done.json" /root/res/seed.json
SKIP=$(python3 - <<'PY'
import json, glob
done = set()
for f in glob.glob('/root/res/*.json'):
    try:
        for c in json.load(open(f)).get('configs', []):
            r = c.get('result') or {}
            if c.get('status') == 'ok' and not any('skipped' in (v or {}) for v in (r.get('batches') or {}).values()):
                done.add(c['id'])
    except Exception:
        pass
print(','.join(sorted(done)))
PY
)
echo "[resume] skip: $SKIP"
N=$(ls /root/res | wc -l)
python3 "$T/gpu_campaign.py" --phase "$1" --skip "$SKIP" --out "$OUT" --work-dir /root/camp --budget-s "$2" 2>&1 | grep -v "^W1" | tail -40
for f in "$OUT"/*_gpu0.json; do [ -f "$f" ] && cp "$f" "/root/res/$(basename "$f" .json).n$N.json"; done
cd /root/camp && tar czf "$OUT/logs_n$N.tgz" $(ls -d */ 2>/dev/null | sed 's,/$,/*.log,') 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
