"""Quick check of the carried torch 2.14 / triton 3.8 / vLLM 0.34 on the GPU, run by setup034.sh. First 0.33's GPU
checks (check033_gpu.py, a copy of bench/vllm033/check033.py: torch ops on the pruned fatbins, a triton kernel,
vLLM + FA3, LLM, the V2 model runner); then the modules the campaign and the serve-command check import under 0.34:
engine args and the `vllm serve` parser, the V1 engine core, the GPU worker, the V2 runner's speculators (draft
model / EAGLE, n-gram, suffix), kernel warmups, the Llama/Qwen3/EAGLE-3 models, quantization. Prints
"[check] imports ok" last only when all of them imported (setup034.sh's caller greps for it); just before it, a
non-fatal "[check] serve imports ok" / "[check] serve imports FAILED: <error>" for `vllm serve` / `vllm bench serve`."""
import importlib, os, runpy, sys, time
t = time.time()
here = os.path.dirname(os.path.abspath(__file__))
# a file, not exec'd text: triton's @jit reads the kernel's source back from it (prepare_vllm034.sh renamed its
# "imports ok" line to "GPU checks passed")
runpy.run_path(os.path.join(here, "check033_gpu.py"), run_name="__check__")
import vllm
mods = ["vllm.engine.arg_utils", "vllm.entrypoints.common.cli_args", "vllm.utils.argparse_utils",
        "vllm.config.speculative", "vllm.v1.engine.core", "vllm.v1.engine.llm_engine", "vllm.v1.worker.gpu_worker",
        "vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu.spec_decode.speculator",
        "vllm.v1.worker.gpu.spec_decode.eagle.speculator", "vllm.v1.worker.gpu.spec_decode.ngram.speculator",
        "vllm.v1.worker.gpu.spec_decode.suffix.speculator", "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "vllm.model_executor.warmup.kernel_warmup", "vllm.model_executor.models.llama",
        "vllm.model_executor.models.qwen3", "vllm.model_executor.models.llama_eagle3",
        "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
        "vllm.model_executor.layers.quantization.fp8"]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001 - report every failing module, then fail once
        print(f"[check] import {m} FAILED: {e!r}", flush=True)
        bad.append(m)
try:  # the serve parser's top route (server dependencies); parse_commands.py falls back when it is missing
    importlib.import_module("vllm.entrypoints.cli.serve")
    print("[check] vllm.entrypoints.cli.serve imports", flush=True)
except Exception as e:  # noqa: BLE001
    print(f"[check] vllm.entrypoints.cli.serve does not import ({e!r}); parse_commands.py uses make_arg_parser", flush=True)
import huggingface_hub, transformers, tokenizers, filelock
print(f"[check] vllm {vllm.__version__}; image hub {huggingface_hub.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}, filelock {filelock.__version__} (below 0.34's metadata floors; not needed "
      "on this path: docs/VLLM_0.34_INSTALL.md)", flush=True)
SERVE_MODS = ["vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.benchmark.serve", "vllm.benchmarks.serve",
              "vllm.benchmarks.datasets", "vllm.entrypoints.serve.instrumentator.metrics",
              "vllm.entrypoints.serve.sagemaker.api_router"]


def serve_check():
    """Non-fatal: `vllm serve` (OpenAI server, its startup routers) and `vllm bench serve` (client, random dataset)
    import with the extra wheels (uvicorn, orjson, watchfiles, prometheus-fastapi-instrumentator,
    model-hosting-container-standards + jmespath, supervisor: bench/vllm034/serve_import_closure.py)."""
    try:
        for m in SERVE_MODS:
            importlib.import_module(m)
        print("[check] serve imports ok", flush=True)
    except BaseException as e:  # noqa: BLE001 - never fails the setup
        print(f"[check] serve imports FAILED: {e!r}", flush=True)


if bad or not vllm.__version__.startswith("0.34"):
    # (no "imports ok" text on this path: setup034.sh's caller greps for it)
    print("[check] serve imports FAILED: not tried, engine imports failed", flush=True)
    print(f"[check] FAILED: {len(bad)} imports", flush=True)
    sys.exit(7)
serve_check()
print("[check] imports ok in %.1fs" % (time.time() - t), flush=True)
