"""Patch the unpacked vLLM 0.33.0 in /root/site2 so its kernel warmups survive the hidden torchvision (issue 17).

sitecustomize.py makes torchvision look absent (the image's build is for torch 2.11). vLLM 0.33's
kernel_warmup() imports or runs warmups for other models (MiniMax-M3, Qwen-VL, Step5) for every model, and
each of them reaches a torchvision import. These three edits were made by hand on the H200 on 2026-12-01
(session 2, device calls 9, 11 and 13) and let dense Llama/Qwen3 starts finish; they change nothing for a
model whose warmup does not need torchvision. Idempotent.

    python3 patch_vllm033.py /root/site2
"""
import re
import sys

MARK = "draftfit issue 17: torchvision hidden"


def patch(site: str) -> list[str]:
    done = []
    # 1. minimax_m3 processor: the module-level torchvision import, reached by kernel_warmup's first import.
    p = f"{site}/vllm/transformers_utils/processors/minimax_m3.py"
    s = open(p).read()
    old = "from torchvision.transforms import InterpolationMode\n"
    if MARK not in s and old in s:
        new = ("try:\n    from torchvision.transforms import InterpolationMode\n"
               f"except ImportError:  # {MARK}\n    import enum\n\n"
               "    class InterpolationMode(enum.Enum):\n"
               "        NEAREST = 'nearest'; BILINEAR = 'bilinear'; BICUBIC = 'bicubic'\n"
               "        BOX = 'box'; HAMMING = 'hamming'; LANCZOS = 'lanczos'\n")
        open(p, "w").write(s.replace(old, new, 1))
        done.append(p)
    # 2./3. kernel_warmup: qwen_vl_triton_warmup, step5_dsa_warmup and minimax_m3_msa_warmup skip on ImportError.
    p = f"{site}/vllm/model_executor/warmup/kernel_warmup.py"
    s = open(p).read()
    if MARK not in s:
        n = 0

        def rep(m):
            nonlocal n
            n += 1
            i = m.group(1)
            return (f"\n{i}try:\n{i}    {m.group(2)}\n{i}except ImportError as _e:  # {MARK}\n"
                    f"{i}    logger.info('%s skipped: %r', {m.group(3)!r}, _e)\n")

        s = re.sub(r"\n( +)(((?:qwen_vl_triton|step5_dsa|minimax_m3_msa)_warmup)\([^\n]*\))\n", rep, s)
        if n:
            open(p, "w").write(s)
            done.append(f"{p} ({n} calls)")
    return done


if __name__ == "__main__":
    for line in patch(sys.argv[1] if len(sys.argv) > 1 else "/root/site2"):
        print("[patch]", line)
