"""Quick check of the carried torch 2.14 / triton 3.8 / vLLM 0.33 on the GPU (pruned fatbins included)."""
import time, os, sys
t = time.time()
import torch
print("[check] torch", torch.__version__, torch.__file__, "cuda", torch.version.cuda, "avail", torch.cuda.is_available(), flush=True)
print("[check] nccl", torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else "?", flush=True)
try:  # the image has cuDNN 9.19, torch 2.14 was built with 9.24: needs PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
    print("[check] cudnn", torch.backends.cudnn.version(), "enabled", torch.backends.cudnn.is_available(), flush=True)
except Exception as exc:
    print("[check] cudnn check failed:", exc, flush=True)
d = "cuda"
a = torch.randn(512, 512, device=d, dtype=torch.bfloat16)
r = {"mm": (a @ a).float().sum().item(), "softmax": torch.softmax(a.float(), -1).sum().item(),
     "cumsum": torch.cumsum(a.float(), 0)[-1, 0].item(), "sort": torch.sort(a.float(), -1)[0][0, 0].item(),
     "topk": torch.topk(a.float(), 5)[0].sum().item(), "emb": torch.nn.functional.embedding(torch.arange(8, device=d), a).sum().item(),
     "index": a[torch.tensor([1, 3], device=d)].sum().item(), "argmax": torch.argmax(a).item(),
     "multinomial": torch.multinomial(torch.softmax(a.float(), -1), 1).sum().item(),
     "sdpa": torch.nn.functional.scaled_dot_product_attention(a[None, None], a[None, None], a[None, None]).float().sum().item()}
torch.cuda.synchronize(); print("[check] ops ok", {k: round(v, 3) for k, v in r.items()}, flush=True)
import triton, triton.language as tl
@triton.jit
def _add(x, y, o, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B); m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)
x = torch.randn(4096, device=d); o = torch.empty_like(x)
_add[(4,)](x, x, o, 4096, B=1024); torch.cuda.synchronize()
print("[check] triton", triton.__version__, "kernel ok", bool(torch.allclose(o, 2 * x)), flush=True)
import vllm
print("[check] vllm", vllm.__version__, vllm.__file__, flush=True)
import vllm._C_stable_libtorch
from vllm.vllm_flash_attn import flash_attn_interface as fai
print("[check] fa2", fai.FA2_AVAILABLE, "fa3", fai.FA3_AVAILABLE, fai.FA3_UNAVAILABLE_REASON, flush=True)
from vllm import LLM, SamplingParams
import vllm.v1.worker.gpu.model_runner
print("[check] imports ok in %.1fs" % (time.time() - t), flush=True)
