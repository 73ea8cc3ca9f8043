"""Patch the unpacked vLLM 0.34.0 in /root/site2 so its kernel warmups survive the hidden torchvision (issue 38).

sitecustomize.py makes torchvision look absent (the image's build is for torch 2.11; it does not import under
torch 2.14). bench/vllm033/patch_vllm033.py made three edits for 0.33 (docs/VLLM_0.33_INSTALL.md, Failures 6).
Walking 0.34's kernel_warmup() (vllm/model_executor/warmup/kernel_warmup.py) for function-local imports:
- minimax_m3 processor: `from torchvision.transforms import InterpolationMode` is still at module level; the
  warmup module is now imported inside `if current_platform.is_cuda():` (so on every H200 start) -> stand-in enum,
  and the import+call block is wrapped.
- qwen_vl_triton_warmup(): `_warm_vision` still imports vllm.model_executor.models.qwen3_vl unconditionally
  (transformers' qwen2_vl image processor -> torchvision.transforms.v2) -> wrapped.
- step5_dsa_warmup(): 0.34 returns before its function-local step5 import unless model_type is "step5"; wrapped
  anyway (cheap, and the same edit as 0.33).
- new in 0.34 and checked: kimi_k3_triton_warmup / qwen4_exp_qsa_triton_warmup look the model modules up in
  sys.modules (no import); replayssm_lifecycle_warmup returns unless use_flashinfer_replayssm; the FlashInfer
  autotune paths (deepseek_v41 import) run only with flashinfer installed (not brought); the ROCm and
  PCIe-IPC branches are off on an H200. They are left alone.
Each wrapped call catches ImportError only and logs `... skipped` at WARNING, so a real failure of the served
model's own warmup still shows in the log. Idempotent; exits 3 if a target string is gone (0.34 source changed).

    python3 patch_vllm034.py /root/site2
"""
import re
import sys

MARK = "draftfit issue 38: torchvision hidden"


def patch(site: str) -> list[str]:
    done = []
    p = f"{site}/vllm/transformers_utils/processors/minimax_m3.py"
    s = open(p).read()
    old = "from torchvision.transforms import InterpolationMode\n"
    if MARK not in s:
        if old not in s:
            sys.exit(f"[patch] {p}: torchvision import line not found; adapt patch_vllm034.py")
        new = ("try:\n    from torchvision.transforms import InterpolationMode\n"
               f"except ImportError:  # {MARK}\n    import enum\n\n"
               "    class InterpolationMode(enum.Enum):\n"
               "        NEAREST = 'nearest'; BILINEAR = 'bilinear'; BICUBIC = 'bicubic'\n"
               "        BOX = 'box'; HAMMING = 'hamming'; LANCZOS = 'lanczos'\n")
        open(p, "w").write(s.replace(old, new, 1))
        done.append(p)

    p = f"{site}/vllm/model_executor/warmup/kernel_warmup.py"
    s = open(p).read()
    if MARK in s:
        return done
    n = 0

    def skip(indent, name):
        return (f"{indent}except ImportError as _e:  # {MARK}\n"
                f"{indent}    logger.warning('%s skipped: %r', {name!r}, _e)\n")

    # the MiniMax-M3 block: local import (parenthesised, several lines) + call, inside `if current_platform.is_cuda():`
    m = re.search(r"\n( +)(from vllm\.model_executor\.warmup\.minimax_m3_msa_warmup import \(\n(?:.*\n)*?\1\)\n)"
                  r"\n?(\1minimax_m3_msa_warmup\(worker\)\n)", s)
    if m:
        i = m.group(1)
        body = "".join("    " + ln + "\n" if ln.strip() else "\n" for ln in (i + m.group(2) + m.group(3)).splitlines())
        s = s[:m.start()] + f"\n{i}try:\n{body}" + skip(i, "minimax_m3_msa_warmup") + s[m.end():]
        n += 1

    def rep(mm):
        nonlocal n
        n += 1
        i = mm.group(1)
        return f"\n{i}try:\n{i}    {mm.group(2)}\n" + skip(i, mm.group(3))

    s = re.sub(r"\n( +)(((?:qwen_vl_triton|step5_dsa)_warmup)\([^\n]*\))\n", rep, s)
    if n != 3:
        sys.exit(f"[patch] {p}: wrapped {n} of 3 warmups; adapt patch_vllm034.py")
    compile(s, p, "exec")
    open(p, "w").write(s)
    done.append(f"{p} ({n} warmups)")
    return done


if __name__ == "__main__":
    for line in patch(sys.argv[1] if len(sys.argv) > 1 else "/root/site2"):
        print("[patch]", line)
