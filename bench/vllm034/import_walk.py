#!/usr/bin/env python3
"""Static walk of the module-level imports vLLM's engine path reaches (issue 38 item 3), to find which third-party
packages 0.34 needs beyond what ran under 0.33 on the H200 image, without a CUDA torch here (a CPU import test
would need torch 2.14's ~3 GB of CUDA wheels). Follows `import`/`from` statements at module level and in class
bodies (they run at import), recursing into vllm.* modules and their parent packages; skips imports under
`if TYPE_CHECKING:` and inside `try:` blocks that catch ImportError/ModuleNotFoundError/Exception (guarded), and
everything inside function bodies (lazy: a function-local import reached at run time is what patch_vllm034.py
handles for the warmups). Prints the third-party top-level names each version reaches, and the difference.

usage: python3 import_walk.py SRC_0.33/ SRC_0.34/   (the unzipped wheels' top folders, holding vllm/)"""
import ast
import os
import sys

ROOTS = ["vllm", "vllm.engine.arg_utils", "vllm.utils.argparse_utils", "vllm.config.speculative",
         "vllm.v1.engine.core", "vllm.v1.engine.llm_engine", "vllm.v1.worker.gpu_worker",
         "vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu.spec_decode.speculator",
         "vllm.v1.worker.gpu.spec_decode.eagle.speculator", "vllm.v1.worker.gpu.spec_decode.ngram.speculator",
         "vllm.v1.worker.gpu.spec_decode.suffix.speculator", "vllm.model_executor.warmup.kernel_warmup",
         "vllm.model_executor.models.llama", "vllm.model_executor.models.qwen3",
         "vllm.model_executor.models.llama_eagle3", "vllm.entrypoints.llm",
         "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
         "vllm.model_executor.layers.quantization.fp8", "vllm.entrypoints.common.cli_args",
         "vllm.entrypoints.openai.cli_args", "vllm.entrypoints.cli.serve", "vllm.v1.executor.uniproc_executor",
         "vllm.v1.executor.multiproc_executor", "vllm.v1.worker.gpu_model_runner"]
GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "OSError", "RuntimeError"}


def _file(src, mod):
    p = os.path.join(src, *mod.split("."))
    for f in (p + ".py", os.path.join(p, "__init__.py")):
        if os.path.isfile(f):
            return f
    return None


def _guarded(handler_types, guards=GUARDS):
    """A try whose handlers catch one of `guards` (a bare except counts): its imports are optional."""
    return any(isinstance(h, ast.ExceptHandler) and (h.type is None or any(
        n in guards for n in ([getattr(e, "id", getattr(e, "attr", "")) for e in h.type.elts]
                              if isinstance(h.type, ast.Tuple) else [getattr(h.type, "id", getattr(h.type, "attr", ""))])))
        for h in handler_types)


def _imports(tree, modname, is_pkg):
    out = []

    def visit(nodes):
        for n in nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                visit(n.orelse)
                continue
            if isinstance(n, ast.Try) and _guarded(n.handlers):
                continue
            if isinstance(n, ast.Import):
                out.extend(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = modname.split(".")
                    parts = parts if is_pkg else parts[:-1]
                    parts = parts[:len(parts) - (n.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                out.append(base)
                out.extend(f"{base}.{a.name}" for a in n.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                if isinstance(n, (ast.ClassDef, ast.If, ast.Try, ast.With, ast.For, ast.While)) and hasattr(n, field):
                    visit(getattr(n, field))
    visit(tree.body)
    return out


def walk(src):
    seen, ext, todo = set(), {}, list(ROOTS)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        for i in range(1, len(parts)):
            todo.append(".".join(parts[:i]))
        f = _file(src, m)
        if f is None:
            continue
        try:
            tree = ast.parse(open(f, encoding="utf-8").read())
        except SyntaxError:
            continue
        for imp in _imports(tree, m, f.endswith("__init__.py")):
            top = imp.split(".")[0]
            if top == "vllm":
                if _file(src, imp):
                    todo.append(imp)
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                ext.setdefault(top, m)
    return ext, seen


if __name__ == "__main__":
    a, b = sys.argv[1], sys.argv[2]
    ea, sa = walk(a)
    eb, sb = walk(b)
    print(f"0.33: {len(sa)} vllm modules, third-party: {' '.join(sorted(ea))}")
    print(f"0.34: {len(sb)} vllm modules, third-party: {' '.join(sorted(eb))}")
    new = sorted(set(eb) - set(ea))
    print("new in 0.34:", ", ".join(f"{n} (first from {eb[n]})" for n in new) or "none")
    print("gone in 0.34:", ", ".join(sorted(set(ea) - set(eb))) or "none")
