#!/usr/bin/env python3
"""Static import closure of `vllm serve` and `vllm bench serve` in vLLM 0.34 (the OpenAI API server and its client),
to find the third-party packages they need that neither the H200 image nor our wheels (wheels.txt) bring.

Follows, with `ast`, the MODULE-LEVEL imports (module body, class bodies, if/with/for blocks; not function bodies,
not `if TYPE_CHECKING:`) inside the vllm package, starting from the roots below; `vllm.entrypoints.cli.main` imports
its subcommand modules inside main() and `vllm bench` imports its subcommand modules inside
_import_bench_subcommand_modules(), so those are roots too. Imports inside a `try:` whose handlers catch
ImportError/ModuleNotFoundError (or Exception) are OPTIONAL, those under a module-level `if <condition>:` (platform,
env var, has_deep_ep(), ...) are CONDITIONAL: a module reached only through such edges is listed as such.
What the image has: the H200 image's `pip list` (data/reference/memory/vllm-0.33/raw/h200_image_pip_list.txt), else
the short list below; what we bring: wheels.txt. Prints every third-party top-level module reached, with one import chain each, and the missing ones.

usage: python3 serve_import_closure.py SRC   (SRC: the unzipped vLLM 0.34.0 wheel's top folder, holding vllm/)"""
import ast
import os
import sys
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from import_walk import _file, _guarded  # noqa: E402 - the engine-path walker's module lookup and try-guard test

ROOTS = [
    "vllm.entrypoints.cli.main",
    # lazy in cli/main.py main(): every `vllm ...` command imports all of them
    "vllm.entrypoints.cli.openai", "vllm.entrypoints.cli.serve", "vllm.entrypoints.cli.launch",
    "vllm.entrypoints.cli.benchmark.main", "vllm.entrypoints.cli.collect_env", "vllm.entrypoints.cli.download_kernels",
    "vllm.entrypoints.cli.preload", "vllm.entrypoints.cli.run_batch", "vllm.entrypoints.cli.snapshot",
    "vllm.entrypoints.common.startup", "vllm.utils.argparse_utils",
    # lazy in cli/benchmark/main.py _import_bench_subcommand_modules(): every `vllm bench ...` imports all of them
    "vllm.entrypoints.cli.benchmark.forward", "vllm.entrypoints.cli.benchmark.latency",
    "vllm.entrypoints.cli.benchmark.mm_processor", "vllm.entrypoints.cli.benchmark.serve",
    "vllm.entrypoints.cli.benchmark.startup", "vllm.entrypoints.cli.benchmark.sweep",
    "vllm.entrypoints.cli.benchmark.throughput",
    # the server and the client proper
    "vllm.entrypoints.openai.api_server", "vllm.benchmarks.serve", "vllm.benchmarks.datasets",
]
# functions whose local imports run whenever the server starts (build_app, routers, ...) or `vllm bench serve` runs
# (benchmark main): their imports are followed as STARTUP (only in vllm.entrypoints.* and vllm.benchmarks.* modules)
STARTUP_FUNCS = {"cmd", "build_async_engine_client", "build_async_engine_client_from_engine_args", "build_and_serve",
                 "run_server", "run_server_worker", "build_app", "init_app_state", "register_api_routers",
                 "register_vllm_serve_api_routers", "register_instrumentator_api_routers", "attach_router",
                 "_attach_router", "serve_http", "setup_server", "main", "benchmark"}
GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}

# top-level module -> distribution, for what the image has or our wheels bring; IMAGE: used without the pip list
IMAGE = ("absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi "
         "charset-normalizer click cloudpickle filelock frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub "
         "idna jinja2 markupsafe matplotlib msgpack multidict numpy packaging pandas pillow prometheus-client propcache "
         "protobuf psutil pyarrow pygments pyyaml regex requests rich safetensors scipy sentencepiece setuptools six "
         "tiktoken tokenizers torch tqdm transformers typer typing-extensions urllib3 uvloop werkzeug wheel xxhash yarl "
         "zipp jax flax scikit-learn seaborn opencv-python-headless grpcio").split()
MOD2DIST = {"absl": "absl-py", "yaml": "pyyaml", "PIL": "pillow", "google": "protobuf", "huggingface_hub":
            "huggingface-hub", "typing_extensions": "typing-extensions", "prometheus_client": "prometheus-client",
            "charset_normalizer": "charset-normalizer", "cv2": "opencv-python-headless", "sklearn": "scikit-learn",
            "zmq": "pyzmq", "openai_harmony": "oss-harmony", "tvm_ffi": "apache-tvm-ffi",
            "annotated_types": "annotated-types", "annotated_doc": "annotated-doc", "typing_inspection":
            "typing-inspection", "partial_json_parser": "partial-json-parser", "compressed_tensors": "compressed-tensors",
            "pkg_resources": "setuptools", "_distutils_hack": "setuptools", "hf_xet": "hf-xet", "cpuinfo": "py-cpuinfo", "grpc": "grpcio",
            "dateutil": "python-dateutil", "pydantic_core": "pydantic-core", "prometheus_fastapi_instrumentator":
            "prometheus-fastapi-instrumentator", "pythonjsonlogger": "python-json-logger", "dotenv": "python-dotenv",
            "multipart": "python-multipart", "python_multipart": "python-multipart", "lmformatenforcer":
            "lm-format-enforcer", "mistral_common": "mistral-common", "outlines_core": "outlines-core"}


def norm(d):
    return d.lower().replace("_", "-")


def image_dists(repo):
    f = os.path.join(repo, "data/reference/memory/vllm-0.33/raw/h200_image_pip_list.txt")
    if os.path.isfile(f):
        return {norm(line.split("==")[0].strip()) for line in open(f, encoding="utf-8") if line.strip()}
    return {norm(d) for d in IMAGE}


def brought(wheels_txt):
    out = set()
    for line in open(wheels_txt, encoding="utf-8"):
        if line.strip() and not line.startswith("#"):
            out.add(norm(line.split()[0].split("==")[0]))
    return out


def imports(tree, modname, is_pkg, lazy=None):
    """[(imported dotted name, kind, line)] of the module-level imports of one module; kind: 0 required,
    1 startup (in a STARTUP_FUNCS function), 2 conditional (under an `if`), 3 optional (in a try guarded against
    ImportError)."""
    out = []

    def visit(nodes, opt):
        for n in nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if n.name in STARTUP_FUNCS and modname.startswith(("vllm.entrypoints", "vllm.benchmarks")):
                    visit(n.body, max(opt, 1))
                    continue
                if lazy is not None:  # function-local imports: run only when called (reported, not followed)
                    lazy.extend((a.name if isinstance(x, ast.Import) else (x.module or ""), x.lineno)
                                for x in ast.walk(n) if isinstance(x, (ast.Import, ast.ImportFrom)) and not
                                (isinstance(x, ast.ImportFrom) and x.level) for a in x.names[:1])
                continue
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                visit(n.orelse, opt)
                continue
            if isinstance(n, ast.Import):
                out.extend((a.name, opt, n.lineno) for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = modname.split(".") if is_pkg else modname.split(".")[:-1]
                    parts = parts[:len(parts) - (n.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                out.append((base, opt, n.lineno))
                out.extend((f"{base}.{a.name}", opt, n.lineno) for a in n.names if a.name != "*")
            elif isinstance(n, ast.Try):
                g = max(opt, 3) if _guarded(n.handlers, GUARDS) else opt
                visit(n.body, g)
                for h in n.handlers:
                    visit(h.body, opt)
                visit(n.orelse, g)
                visit(n.finalbody, opt)
            elif isinstance(n, ast.If):
                visit(n.body, max(opt, 2))
                visit(n.orelse, max(opt, 2))
            elif isinstance(n, (ast.ClassDef, ast.With, ast.For, ast.While)):
                visit(n.body, opt)
                visit(getattr(n, "orelse", []), opt)
    visit(tree.body, 0)
    return out


def closure(src, max_kind):
    """BFS over vllm modules; returns ({third-party top: chain}, set of vllm modules reached)."""
    parent = {r: None for r in ROOTS}
    todo, ext, cache = deque(ROOTS), {}, {}
    while todo:
        m = todo.popleft()
        f = _file(src, m)
        if f is None:
            continue
        if m not in cache:
            try:
                cache[m] = imports(ast.parse(open(f, encoding="utf-8").read()), m, f.endswith("__init__.py"))
            except SyntaxError:
                cache[m] = []
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = m.split(".")
        targets = [(".".join(parts[:i]), False, 0) for i in range(1, len(parts))] + cache[m]
        for imp, opt, line in targets:
            if opt > max_kind:
                continue
            top = imp.split(".")[0]
            if top == "vllm":
                if _file(src, imp) and imp not in parent:
                    parent[imp] = (m, line)
                    todo.append(imp)
            elif top and top not in sys.stdlib_module_names and top != "__future__" and top not in ext:
                chain, cur = [f"{imp} ({m}:{line})"], m
                while cur is not None:
                    p = parent[cur]
                    chain.append(cur if p is None else f"{cur} ({p[0]}:{p[1]})")
                    cur = p[0] if p else None
                ext[top] = list(reversed(chain))
    return ext, parent


if __name__ == "__main__":
    src = sys.argv[1] if len(sys.argv) > 1 else "/tmp/servedeps_src"
    here = os.path.dirname(os.path.abspath(__file__))
    have = image_dists(os.path.join(here, "..", "..")) | brought(os.path.join(here, "wheels.txt"))
    levels = [closure(src, k) for k in (0, 1, 2, 3)]
    print(f"vllm modules reached: {len(levels[0][1])} by module-level imports, {len(levels[1][1])} with startup "
          f"functions' ones, {len(levels[2][1])} with conditional ones, {len(levels[3][1])} with optional ones")
    names = ("required", "startup", "conditional", "optional")
    missing = []
    for top in sorted(levels[3][0], key=str.lower):
        k = next(i for i in (0, 1, 2, 3) if top in levels[i][0])
        dist = norm(MOD2DIST.get(top, top))
        ok = dist in have
        print(f"{'have' if ok else 'MISSING'} {names[k]:11} {top} [{dist}]: " + " -> ".join(levels[k][0][top]))
        if not ok:
            missing.append((k, top))
    for i, n in enumerate(names):
        print(f"missing {n}:", " ".join(t for k, t in missing if k == i) or "none")

    # function-local imports of missing packages in the reached entrypoint/benchmark/metrics modules: not needed to
    # import, but reached at run time on some path (e.g. when the server starts or a flag is given)
    lazy_missing = {}
    for m in sorted(levels[1][1]):
        if not m.startswith(("vllm.entrypoints", "vllm.benchmarks", "vllm.v1.metrics")) or not _file(src, m):
            continue
        lz = []
        imports(ast.parse(open(_file(src, m), encoding="utf-8").read()), m, False, lz)
        for imp, line in lz:
            top = imp.split(".")[0]
            if top and top != "vllm" and top not in sys.stdlib_module_names and norm(MOD2DIST.get(top, top)) not in have:
                lazy_missing.setdefault(top, []).append(f"{m}:{line}")
    print("missing, imported only inside functions of reached entrypoint/benchmark/metrics modules:")
    for top, where in sorted(lazy_missing.items()):
        print(f"  {top}: {' '.join(where[:4])}{' ...' if len(where) > 4 else ''}")
