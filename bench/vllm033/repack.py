#!/usr/bin/env python3
"""Repack wheels into one tar stream (written to stdout) of site-packages content (issue 17, vLLM 0.33).
Used by bench/prepare_vllm033.sh: torch, triton and vLLM shrink from 1139 MB of wheels to 326 MB of xz.
Drops members matching DROP patterns; zeroes fatbin entries that an sm_90 GPU never loads
(ELF cubins for other SM, PTX newer than compute_90) in the .so files named by PRUNE.
Also used for vLLM 0.26 (bench/prepare_vllm026.sh, issue 16) with REPACK_PROFILE=026: nothing dropped, only the
GPU code of vLLM's own extensions pruned (torch 2.11 is already on the H200 image).
usage: repack.py WHEEL [WHEEL...] > out.tar"""
import sys, zipfile, tarfile, struct, fnmatch, io, time

DROP = [
    'torch/lib/libtorch_cuda_linalg.so', 'torch/bin/protoc*',
    'triton/backends/nvidia/lib/cupti-blackwell/*', 'triton/backends/nvidia/bin/ptxas-blackwell',
    'triton/backends/nvidia/lib/cupti/*.a', 'triton/backends/nvidia/lib/cupti/libnvperf_host.so',
    'triton/instrumentation/libGPUInstrumentationTestLib.so',
    'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so', 'vllm/_moe_C_stable_libtorch.abi3.so', 'vllm/vllm-rs',
]
PRUNE = ['torch/lib/libtorch_cuda.so', 'torch/lib/libc10_cuda.so', 'torch/lib/libtorch_nvshmem.so',
         'vllm/_C_stable_libtorch.abi3.so', 'vllm/_flashmla_C.abi3.so', 'vllm/_deepselect_C.abi3.so',
         'vllm/_flashkda_C.abi3.so', 'vllm/third_party/deep_gemm/_C_extension.abi3.so', 'vllm/_qutlass_C.abi3.so']
import os
if os.environ.get('REPACK_PROFILE') == '026':
    DROP = []
    PRUNE = ['vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so', 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so',
             'vllm/_C_stable_libtorch.abi3.so', 'vllm/_moe_C_stable_libtorch.abi3.so']
MAG = struct.pack('<I', 0xBA55ED50)
KEEP_SM = 90

def prune(buf: bytearray):
    pos = 0; zeroed = kept = 0
    while True:
        i = buf.find(MAG, pos)
        if i < 0: break
        ver, hs, fs = struct.unpack_from('<HHQ', buf, i + 4)
        if ver != 1 or hs != 16 or i + hs + fs > len(buf): pos = i + 4; continue
        e = i + hs; end = e + fs
        while e < end:
            kind, ev, ehs, pps = struct.unpack_from('<HHIQ', buf, e)
            sm = struct.unpack_from('<I', buf, e + 28)[0]
            if ehs == 0: break
            drop = (kind == 2 and sm != KEEP_SM) or (kind == 1 and sm > KEEP_SM)
            if drop:
                buf[e + ehs:e + ehs + pps] = bytes(pps); zeroed += pps
            else:
                kept += pps
            e += ehs + pps
        pos = end
    return zeroed, kept

def main():
    out = tarfile.open(fileobj=sys.stdout.buffer, mode='w|', format=tarfile.PAX_FORMAT)
    for w in sys.argv[1:]:
        z = zipfile.ZipFile(w)
        for info in z.infolist():
            n = info.filename
            if n.endswith('/'): continue
            if any(fnmatch.fnmatch(n, p) for p in DROP):
                print(f'drop {n}', file=sys.stderr); continue
            data = z.read(info)
            if n in PRUNE:
                b = bytearray(data); zr, kp = prune(b); data = bytes(b)
                print(f'prune {n}: zeroed {zr/1e6:.1f} MB, kept {kp/1e6:.1f} MB', file=sys.stderr)
            ti = tarfile.TarInfo(n); ti.size = len(data)
            mode = (info.external_attr >> 16) & 0o777
            ti.mode = mode if mode else 0o644
            ti.mtime = 1_700_000_000  # fixed: the stream's bytes do not depend on the builder's time zone
            out.addfile(ti, io.BytesIO(data))
    out.close()

if __name__ == '__main__':
    main()
