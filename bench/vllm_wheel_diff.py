"""Diff two vLLM wheels over the files draftfit mirrors, and say which rules each change touches (issue 38).

    python bench/vllm_wheel_diff.py 0.33.0 0.34.0            # versions (downloaded once) or paths to .whl files
    python bench/vllm_wheel_diff.py 0.33.0 0.34.0 --write    # also into docs/VLLM_VERSIONS.md ("Wheel diff ...")

A new vLLM release should cost a day, not a week: this reads only the files listed in MIRRORED (each mapped to the
VllmRules fields and draftfit code it feeds: draftfit/engine/rules.py), straight from the two wheels (zip members;
nothing is installed or imported), and prints
- per changed, added or removed file: the rules fields it feeds, its changed-line count, and the changed lines that
  touch a known keyword (a rule-oriented summary, not a diff dump);
- the --speculative-config keys added and removed (SpeculativeConfig's dataclass fields, read with ast; a
  field(init=False) is not a key) and every changed default of SpeculativeConfig, CacheConfig and the module
  constants of the config files;
- `vllm serve` flags added and removed (bench/vllm_flags.py's extractor on the same files), spec-decode metric
  names, and VLLM_* environment variables added and removed.
Wheels come from `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
manylinux_2_28_x86_64 vllm==X` into --cache (a wheel already in --cache or in the GPU campaign's download folder is
reused). Static reading only: what a change does at run time is for a lease to show.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DOC = ROOT / "docs" / "VLLM_VERSIONS.md"
SECTION = "Wheel diff"
# Where wheels may already lie (the GPU campaign downloads 0.34.0 there); a version not found is downloaded.
KNOWN_WHEEL_DIRS = (Path("/work/main/.gpu034/dl"),)

# The files draftfit mirrors, each with what it feeds (VllmRules fields unless a path says otherwise) and the
# words that make a changed line worth showing. fnmatch patterns over the wheel's member paths ("*" crosses "/").
MIRRORED: list[tuple[str, str, tuple[str, ...]]] = [
    ("vllm/config/speculative.py",
     "VllmRules.methods, removed_spec_keys, suffix_needs_arctic_inference, refuses_vocab_mismatch; "
     "engine/methods.py speculative_config; vllm_flags speculative_config_keys",
     ("method", "Literal", "vocab", "suffix", "arctic", "init=False", "deprecated", "raise", "max_model_len",
      "num_speculative_tokens", "draft_tensor_parallel_size", "prompt_lookup")),
    ("vllm/config/cache.py", "VllmRules.default_util, default_block_size, kv_sizing",
     ("gpu_memory_utilization", "block_size", "DEFAULT", "extensible", "kv_cache_memory")),
    ("vllm/config/vllm.py",
     "VllmRules.runner, async_scheduling, capture_sizes, draft_len_lowers_target, env_errors, v1_runner_selectable",
     ("v2_model_runner", "V1", "async", "max_concurrent_batches", "cudagraph", "capture", "max_model_len",
      "extensible", "raise", "draft")),
    ("vllm/config/compilation.py", "VllmRules.capture_sizes; memory/plan.py capture_sizes",
     ("capture", "cudagraph", "max_", "spec_decode")),
    ("vllm/engine/arg_utils.py",
     "vllm_flags serve_flags; VllmRules.serve_16384_from_gib, a100_small_defaults, default_util",
     ("add_argument", "max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization", "a100", "GiB",
      "default_")),
    ("vllm/entrypoints/*/cli_args.py", "vllm_flags serve_flags (frontend dataclasses)", ("add_argument", ": ")),
    ("vllm/entrypoints/cli/serve.py", "engine/command.py argv form (`vllm serve MODEL`)", ("model_tag", "add_argument")),
    ("vllm/envs.py", "VllmRules.env_errors, v1_runner_selectable",
     ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_V1", "VLLM_MEMORY_PROFILER", "VLLM_ALLOW_LONG")),
    ("vllm/v1/worker/gpu_worker.py",
     "VllmRules.kv_sizing, v2_reserves_cudagraph, log_format; memory/plan.py plan_memory, parse_vllm_memory_log",
     ("logger.", "Available KV cache", "cudagraph", "profile", "requested_memory", "non_torch", "extensible")),
    ("vllm/v1/worker/extensible_kv_cache.py", "VllmRules.kv_sizing, log_format; memory/plan.py kv_budget",
     ("MARGIN", "logger.", "margin", "reserve", "requested")),
    ("vllm/v1/worker/gpu_model_runner.py", "VllmRules.runner (the V1 model runner)", ("cudagraph", "spec")),
    ("vllm/v1/worker/gpu/*",
     "VllmRules.runner, drafter_cudagraphs, first_draft_pass_hidden, capture_sizes, v2_reserves_cudagraph, "
     "methods; memory/plan.py _cudagraph_bytes, _drafter_cudagraph_bytes",
     ("cudagraph", "CudaGraph", "capture", "eager", "async_scheduling", "class ", "profile")),
    ("vllm/v1/spec_decode/*",
     "VllmRules.runner (V1 proposers), draft_model_multi_group, drafter_cudagraphs; engine/metrics.py",
     ("kv cache group", "cudagraph", "vllm:", "class ", "assert")),
    ("vllm/v1/metrics/loggers.py", "engine/metrics.py counter names", ("vllm:", "spec_decode")),
    ("vllm/v1/core/kv_cache_utils.py",
     "memory/plan.py logged_kv_tokens, parse_vllm_memory_log; VllmRules.log_format",
     ("logger.", "KV cache size", "concurrency", "block_size")),
    ("vllm/v1/core/kv_cache_config_builder.py", "memory/plan.py kv_cache_groups", ("group", "Spec")),
    ("vllm/v1/core/kv_cache_planning.py", "VllmRules.kv_sizing; memory/plan.py kv_budget", ("extensible", "block")),
    ("vllm/platforms/interface.py", "VllmRules.default_block_size; memory/plan.py _mamba_aligned_groups",
     ("block_size", "align", "V2_MODEL_RUNNER")),
    ("vllm/utils/mem_utils.py", "memory/plan.py non-KV terms (weights, non-torch, peak)", ("peak", "non_torch")),
    ("vllm/model_executor/layers/vocab_parallel_embedding.py", "memory/plan.py VOCAB_PADDING", ("PADDING",)),
    ("vllm/model_executor/layers/fused_moe/configs/E=*.json",
     "vllm_flags fused_moe_configs (the untuned-MoE-kernel note)", ()),
]
# Words that make any changed line in a mirrored file worth showing.
KEYWORDS = ("default", "DEFAULT", "deprecated", "Deprecated", "removed", "no longer", "raise ", "ValueError")
SPEC_FILE = "vllm/config/speculative.py"
DEFAULT_CLASSES = {"vllm/config/speculative.py": ("SpeculativeConfig",), "vllm/config/cache.py": ("CacheConfig",),
                   "vllm/config/scheduler.py": ("SchedulerConfig",)}
MAX_LINES_PER_FILE = 5


# ----------------------------------------------------------------------------------------------- pure parts

def feeds(path: str) -> list[str]:
    """The MIRRORED entries (what they feed) that `path`, a wheel member, falls under; [] if draftfit mirrors none."""
    return [what for pattern, what, _ in MIRRORED if fnmatch.fnmatchcase(path, pattern)]


def keywords_for(path: str) -> tuple[str, ...]:
    out: tuple[str, ...] = KEYWORDS
    for pattern, _, words in MIRRORED:
        if fnmatch.fnmatchcase(path, pattern):
            out += words
    return out


def dataclass_defaults(source: str, classes: tuple[str, ...]) -> dict[str, str]:
    """{field: default as source text ('' when none)} of the named dataclasses' init fields; `x = field(default=..)`
    and `default_factory` are read through; field(init=False) is left out (vLLM computes it: not a key a user
    may pass)."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ClassDef) and node.name in classes):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            name, ann = item.target.id, ast.unparse(item.annotation)
            if name.startswith("_") or "ClassVar" in ann or "InitVar" in ann:
                continue
            value = item.value
            if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "field":
                kws = {k.arg: k.value for k in value.keywords}
                if isinstance(kws.get("init"), ast.Constant) and kws["init"].value is False:
                    continue
                value = kws.get("default", kws.get("default_factory"))
            out[name] = ast.unparse(value) if value is not None else ""
    return out


def module_constants(source: str) -> dict[str, str]:
    """UPPER_CASE constants assigned at module or class level ({NAME or Class.NAME: value source})."""
    out: dict[str, str] = {}

    def take(body, prefix):
        for item in body:
            targets = (item.targets if isinstance(item, ast.Assign) else
                       [item.target] if isinstance(item, ast.AnnAssign) and item.value is not None else [])
            for t in targets:
                if isinstance(t, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]+", t.id):
                    out[prefix + t.id] = ast.unparse(item.value)
            if isinstance(item, ast.ClassDef):
                take(item.body, item.name + ".")

    take(ast.parse(source).body, "")
    return out


def compare(old: dict[str, str], new: dict[str, str]) -> tuple[list[str], list[str], list[tuple[str, str, str]]]:
    """(added, removed, changed [(name, old, new)]) between two {name: value} maps."""
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = [(k, old[k], new[k]) for k in sorted(set(old) & set(new)) if old[k] != new[k]]
    return added, removed, changed


def touching_lines(old_text: str, new_text: str, words: tuple[str, ...], limit: int = MAX_LINES_PER_FILE
                   ) -> tuple[int, int, list[str]]:
    """(lines added, lines removed, up to `limit` changed lines that contain one of `words`, '+'/'-' prefixed)."""
    plus = minus = 0
    hits: list[str] = []
    for line in difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), lineterm="", n=0):
        if line.startswith(("+++", "---", "@@")):
            continue
        plus += line.startswith("+")
        minus += line.startswith("-")
        body = line[1:].strip()
        if body and not body.startswith("#") and any(w in body for w in words) and len(hits) < limit:
            hits.append(line[0] + " " + (body if len(body) <= 150 else body[:147] + "..."))
    return plus, minus, hits


def metric_names(text: str) -> set[str]:
    return set(re.findall(r'"(vllm:[a-z0-9_]+)"', text))


def env_names(text: str) -> set[str]:
    return set(re.findall(r'^\s*"(VLLM_[A-Z0-9_]+)"\s*:', text, flags=re.M))


# ----------------------------------------------------------------------------------------------- wheels

def wheel_path(spec: str, cache: Path) -> Path:
    """A .whl path as given, else the wheel of version `spec` in `cache` or a known folder, else downloaded."""
    p = Path(spec)
    if p.suffix == ".whl" and p.exists():
        return p
    pattern = f"vllm-{spec}-*.whl"
    for folder in (cache / spec, cache, *KNOWN_WHEEL_DIRS):
        found = sorted(folder.glob(pattern)) if folder.is_dir() else []
        if found:
            return found[0]
    dest = cache / spec
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--platform", "manylinux_2_28_x86_64", f"vllm=={spec}", "-d", str(dest)], check=True)
    return sorted(dest.glob(pattern))[0]


def mirrored_members(whl: Path) -> dict[str, str]:
    """{member path: text} of the wheel's files that draftfit mirrors (nothing else is read)."""
    with zipfile.ZipFile(whl) as z:
        return {n: z.read(n).decode("utf-8", "replace") for n in z.namelist() if feeds(n)}


@dataclass
class WheelDiff:
    old: str
    new: str
    files: list[dict] = field(default_factory=list)  # {path, status, feeds, plus, minus, lines}
    spec_keys: tuple = ((), (), [])
    defaults: list[tuple[str, str, str]] = field(default_factory=list)
    constants: list[tuple[str, str, str]] = field(default_factory=list)
    flags: tuple = ((), ())
    metrics: tuple = ((), ())
    envs: tuple = ((), ())
    moe_configs: tuple = ((), ())


def diff_wheels(old_files: dict[str, str], new_files: dict[str, str], old: str, new: str,
                max_lines: int = MAX_LINES_PER_FILE) -> WheelDiff:
    out = WheelDiff(old=old, new=new)
    json_moe = lambda files: {Path(p).name[:-5] for p in files if p.endswith(".json")}  # noqa: E731
    for path in sorted(set(old_files) | set(new_files)):
        if path.endswith(".json"):
            continue  # MoE configs: counted below
        a, b = old_files.get(path), new_files.get(path)
        if a == b:
            continue
        status = "added" if a is None else "removed" if b is None else "changed"
        plus, minus, lines = touching_lines(a or "", b or "", keywords_for(path), max_lines) if status == "changed" else (
            (b or "").count("\n"), (a or "").count("\n"), [])
        out.files.append({"path": path, "status": status, "feeds": feeds(path), "plus": plus, "minus": minus,
                          "lines": lines})
    if SPEC_FILE in old_files and SPEC_FILE in new_files:
        o = dataclass_defaults(old_files[SPEC_FILE], ("SpeculativeConfig",))
        n = dataclass_defaults(new_files[SPEC_FILE], ("SpeculativeConfig",))
        out.spec_keys = compare(o, n)
    for path, classes in DEFAULT_CLASSES.items():
        if path in old_files and path in new_files and path != SPEC_FILE:
            _, _, changed = compare(dataclass_defaults(old_files[path], classes),
                                    dataclass_defaults(new_files[path], classes))
            out.defaults += [(f"{classes[0]}.{k}", a, b) for k, a, b in changed]
    for path in ("vllm/config/cache.py", "vllm/config/vllm.py", "vllm/config/speculative.py",
                 "vllm/v1/worker/extensible_kv_cache.py", "vllm/engine/arg_utils.py"):
        if path in old_files or path in new_files:
            a, r, c = compare(module_constants(old_files.get(path, "")), module_constants(new_files.get(path, "")))
            out.constants += [(f"{Path(path).name} {k}", "", module_constants(new_files[path])[k]) for k in a]
            out.constants += [(f"{Path(path).name} {k}", module_constants(old_files[path])[k], "") for k in r]
            out.constants += [(f"{Path(path).name} {k}", x, y) for k, x, y in c]
    out.flags = _flag_diff(old_files, new_files)
    m_old = set().union(*(metric_names(t) for p, t in old_files.items() if "metric" in p or "spec_decode" in p))
    m_new = set().union(*(metric_names(t) for p, t in new_files.items() if "metric" in p or "spec_decode" in p))
    out.metrics = (sorted(m_new - m_old), sorted(m_old - m_new))
    e_old, e_new = env_names(old_files.get("vllm/envs.py", "")), env_names(new_files.get("vllm/envs.py", ""))
    out.envs = (sorted(e_new - e_old), sorted(e_old - e_new))
    mo, mn = json_moe(old_files), json_moe(new_files)
    out.moe_configs = (sorted(mn - mo), sorted(mo - mn))
    return out


def _flag_diff(old_files: dict[str, str], new_files: dict[str, str]) -> tuple[list[str], list[str]]:
    """`vllm serve` flags added and removed, by bench/vllm_flags.py's extractor on the mirrored files."""
    from vllm_flags import extract

    sets = []
    for files in (old_files, new_files):
        with tempfile.TemporaryDirectory() as tmp:
            for path, text in files.items():
                if path.endswith(".py"):
                    dest = Path(tmp) / path
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_text(text)
            try:
                sets.append(set(extract(Path(tmp) / "vllm")["serve_flags"]))
            except (OSError, KeyError):
                sets.append(set())
    return sorted(sets[1] - sets[0]), sorted(sets[0] - sets[1])


# ----------------------------------------------------------------------------------------------- report

def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def render(d: WheelDiff) -> str:
    added, removed, changed = d.spec_keys
    out = [f"vLLM {d.old} -> {d.new}: {len(d.files)} mirrored files differ "
           f"({sum(f['status'] == 'changed' for f in d.files)} changed, "
           f"{sum(f['status'] == 'added' for f in d.files)} added, {sum(f['status'] == 'removed' for f in d.files)} "
           "removed).", "",
           "**--speculative-config keys** (SpeculativeConfig init fields): added "
           + (", ".join(f"`{k}`" for k in added) or "none") + "; removed "
           + (", ".join(f"`{k}`" for k in removed) or "none") + ".",
           "", "**Changed defaults** (dataclass fields and module constants):", ""]
    rows = [(f"SpeculativeConfig.{k}", a, b) for k, a, b in changed] + d.defaults + d.constants
    if rows:
        out += ["| what | " + d.old + " | " + d.new + " |", "|---|---|---|"]
        out += [f"| {k} | `{_short(a) or '(none)'}` | `{_short(b) or '(none)'}` |" for k, a, b in rows]
    else:
        out.append("none")
    fa, fr = d.flags
    named = [e for e in d.envs[0] if e in _draftfit_text()]
    out += ["", f"**`vllm serve` flags**: added {', '.join(f'`{f}`' for f in fa) or 'none'}; removed "
            f"{', '.join(f'`{f}`' for f in fr) or 'none'}.",
            f"**Metric names** (`vllm:*`): added {', '.join(d.metrics[0]) or 'none'}; removed "
            f"{', '.join(d.metrics[1]) or 'none'}.",
            f"**Environment variables** (`vllm/envs.py`): removed {', '.join(d.envs[1]) or 'none'}; "
            f"{len(d.envs[0])} added" + (f", of which draftfit's code names {', '.join(named)}" if named else
                                          ", none of which draftfit's code names") + ".",
            f"**Fused-MoE configs**: {len(d.moe_configs[0])} added, {len(d.moe_configs[1])} removed.", "",
            "**Files, by what they feed** (changed lines that touch a rule's keywords; `+` new, `-` old):", ""]
    by_feed: dict[str, list[dict]] = {}
    for f in d.files:
        by_feed.setdefault(" | ".join(f["feeds"]), []).append(f)
    for what, files in by_feed.items():
        out.append(f"- feeds {what}:")
        gone = [f["path"] for f in files if f["status"] == "removed"]
        new = [f["path"] for f in files if f["status"] == "added"]
        if gone:
            out.append(f"  - removed ({len(gone)}): " + ", ".join(f"`{p[5:]}`" for p in gone[:12])
                       + (f" and {len(gone) - 12} more" if len(gone) > 12 else ""))
        if new:
            out.append(f"  - added ({len(new)}): " + ", ".join(f"`{p[5:]}`" for p in new[:12])
                       + (f" and {len(new) - 12} more" if len(new) > 12 else ""))
        quiet = []
        for f in files:
            if f["status"] != "changed":
                continue
            if not f["lines"]:
                quiet.append(f"`{f['path'][5:]}` +{f['plus']}/-{f['minus']}")
                continue
            out.append(f"  - `{f['path'][5:]}` +{f['plus']}/-{f['minus']}:")
            out += [f"    - `{line}`" for line in f["lines"]]
        if quiet:
            out.append("  - changed, no rule keyword in the changed lines: " + ", ".join(quiet))
    return "\n".join(out)


def _draftfit_text() -> str:
    """draftfit's own source (to say which new environment variables it already names)."""
    return "\n".join(p.read_text() for p in (ROOT / "draftfit").rglob("*.py"))


def write_doc(body: str, command: str, old: str, new: str) -> None:
    title = f"### {SECTION} {'.'.join(old.split('.')[:2])} -> {'.'.join(new.split('.')[:2])}"
    start, end = f"<!-- bench:wheel-diff-{old}-{new} -->", f"<!-- /bench:wheel-diff-{old}-{new} -->"
    block = (f"{start}\n{title}\n\nCommand: `{command}` (static reading of the two wheels; the VllmRules fields each "
             f"file feeds are listed in bench/vllm_wheel_diff.py MIRRORED).\n\n{body}\n{end}")
    text = DOC.read_text()
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="vLLM version (e.g. 0.33.0) or a .whl path")
    ap.add_argument("new", help="vLLM version (e.g. 0.34.0) or a .whl path")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "vllm-wheels"),
                    help="folder for downloaded wheels (reused)")
    ap.add_argument("--max-lines", type=int, default=MAX_LINES_PER_FILE,
                    help="changed lines shown per file (those touching a rule's keywords)")
    ap.add_argument("--write", action="store_true", help="also write the summary into docs/VLLM_VERSIONS.md")
    a = ap.parse_args(argv)
    cache = Path(a.cache)
    w_old, w_new = wheel_path(a.old, cache), wheel_path(a.new, cache)
    name = lambda w, s: re.sub(r"^vllm-([^-]+)-.*", r"\1", w.name) if w.suffix == ".whl" else s  # noqa: E731
    d = diff_wheels(mirrored_members(w_old), mirrored_members(w_new), name(w_old, a.old), name(w_new, a.new),
                    max_lines=a.max_lines)
    body = render(d)
    print(body)
    if a.write:
        write_doc(body, f"python bench/vllm_wheel_diff.py {a.old} {a.new} --max-lines {a.max_lines} --write",
                  d.old, d.new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
