"""Extract the `vllm serve` flags and --speculative-config keys of one vLLM release from its wheel's source.

    pip download --no-deps vllm==0.33.0 -d /tmp/v033 && cd /tmp/v033 && unzip -q vllm-*.whl 'vllm/*'
    .venv/bin/python bench/vllm_flags.py /tmp/v033/vllm 0.33.0

writes draftfit/data/vllm_flags/vllm-<major.minor>.json, which draftfit.engine.flags reads to keep serve-cmd and
launch-script to the flags that version has. Static reading only (the wheel is never imported):
- engine/arg_utils.py: every `add_argument("--flag", ...)` (EngineArgs.add_cli_args);
- the frontend dataclasses (entrypoints/openai/cli_args.py in 0.26, entrypoints/common/cli_args.py in 0.33):
  each field becomes `--field-name` (FrontendArgs.add_cli_args: f"--{key.replace('_', '-')}");
- config/speculative.py: the fields of class SpeculativeConfig (the keys --speculative-config accepts);
- model_executor/layers/fused_moe/configs/: the names of the tuned fused-MoE kernel configs it ships.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent.parent / "draftfit" / "data" / "vllm_flags"


def _dataclass_fields(path: Path, classes: tuple[str, ...]) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    ann = ast.unparse(item.annotation)
                    # field(init=False) is computed by vLLM, not a key a user may pass (0.34's SpeculativeConfig
                    # declares several): passing one is an error, so it is not listed.
                    no_init = (isinstance(item.value, ast.Call) and ast.unparse(item.value.func).endswith("field")
                               and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                                       for k in item.value.keywords))
                    if not name.startswith("_") and "ClassVar" not in ann and "InitVar" not in ann and not no_init:
                        out.append(name)
    return out


def extract(src: Path) -> dict:
    arg_utils = (src / "engine" / "arg_utils.py").read_text()
    flags = set(re.findall(r'add_argument\(\s*"(--[a-z0-9][a-z0-9-]*)"', arg_utils))
    frontends = [p for p in (src / "entrypoints" / "openai" / "cli_args.py", src / "entrypoints" / "common" / "cli_args.py")
                 if p.exists()]
    for p in frontends:
        flags |= {"--" + f.replace("_", "-") for f in _dataclass_fields(p, ("BaseFrontendArgs", "FrontendArgs"))}
        flags |= set(re.findall(r'add_argument\(\s*"(--[a-z0-9][a-z0-9-]*)"', p.read_text()))
    spec_keys = _dataclass_fields(src / "config" / "speculative.py", ("SpeculativeConfig",))
    # The tuned fused-MoE Triton configs the release ships (fused_moe.py get_config_file_name:
    # E=<experts>,N=<intermediate per rank>,device_name=<GPU>[,dtype=..][,block_shape=..].json); an MoE layer
    # without one runs vLLM's default config ("Using default MoE config. Performance might be sub-optimal!").
    moe_dir = src / "model_executor" / "layers" / "fused_moe" / "configs"
    moe_configs = sorted(p.name[:-len(".json")] for p in moe_dir.glob("E=*.json"))
    return {"serve_flags": sorted(flags), "speculative_config_keys": sorted(set(spec_keys)),
            "fused_moe_configs": moe_configs,
            "sources": ["engine/arg_utils.py", *[str(p.relative_to(src)) for p in frontends], "config/speculative.py",
                        "model_executor/layers/fused_moe/configs/"]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    src, version = Path(argv[0]), argv[1]
    data = {"vllm_version": version, **extract(src),
            "command": f"pip download --no-deps vllm=={version} -d /tmp/v && unzip -q /tmp/v/vllm-*.whl 'vllm/*' "
                       f"-d /tmp/v && .venv/bin/python bench/vllm_flags.py /tmp/v/vllm {version}"}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    minor = ".".join(version.split(".")[:2])
    out = OUT_DIR / f"vllm-{minor}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{out}: {len(data['serve_flags'])} serve flags, {len(data['speculative_config_keys'])} speculative_config keys")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
