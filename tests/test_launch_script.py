"""launch-script: hostile values never execute, every value reaches its command as the literal given, bad values
are refused before a script is written, and the script passes `bash -n` and shellcheck.

The generated script is run for real with bash, with `vllm`, `python`, `python3`, `curl`, `nvidia-smi` and
`draftfit` replaced by stubs first on PATH that record the argv they receive (NUL-separated) and do nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.engine import resolve_target
from draftfit.cli import cli
from draftfit.errors import DraftfitError
from draftfit.launch.script import launch_script, validate_host
from draftfit.engine.command import serve_command

TARGET, DRAFT = "Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B"
STUBS = ("vllm", "python", "python3", "curl", "nvidia-smi", "draftfit")
SERVERS = ("vllm", "python", "python3")

# Each hostile value, if it were ever evaluated by a shell, would create the file named by its marker (in the
# script's working folder). None holds a "/", so each can also be a file name (the log).
HOSTILE = {
    "PWNED_dollar": "$(touch PWNED_dollar)",
    "PWNED_tick": "`touch PWNED_tick`",
    "PWNED_semi": "x; touch PWNED_semi; #",
    "PWNED_amp": "x && touch PWNED_amp || touch PWNED_amp",
    "PWNED_sq": "it's'; touch PWNED_sq; '",
    "PWNED_dq": 'say "hi"; touch PWNED_dq; "',
    "PWNED_brace": "${IFS}$(touch${IFS}PWNED_brace)",
    "PWNED_arith": "a[$(touch PWNED_arith)]",
    "PWNED_redirect": "x > PWNED_redirect",
    "PWNED_unicode": "模型-é ☃ \u202e $(touch PWNED_unicode) %s %n \\n @HOST@ @CMD@",
}
NEWLINE = "line one\ntouch PWNED_newline\n$(touch PWNED_newline)"
MARKERS = [*HOSTILE, "PWNED_newline"]

_STUB = r"""#!/bin/bash
# Record this call's argv (written whole, then renamed, so a reader never sees half of it).
f=$(mktemp "$STUB_CALLS/.@NAME@.XXXXXX")
printf '%s\0' "$@" > "$f"
mv "$f" "$STUB_CALLS/@NAME@.${f##*.}"
case @NAME@ in
  vllm|python|python3) touch "$STUB_CALLS/.server_ready"; exec sleep 30 ;;  # the "server", until stopped
  curl)
    for a in "$@"; do
      case $a in
        */health)  # healthy once the server stub has recorded its argv
          for _ in $(seq 1 200); do [ -e "$STUB_CALLS/.server_ready" ] && exit 0; sleep 0.05; done; exit 1 ;;
        */v1/completions) printf '{"choices": [{"text": "ok"}]}'; exit 0 ;;
        */metrics) printf 'vllm:spec_decode_num_drafts_total 1\n'; exit 0 ;;
      esac
    done ;;
esac
exit 0
"""


@pytest.fixture()
def stubbed(tmp_path):
    """(bin folder, calls folder, working folder, env) with every external command stubbed."""
    bin_dir, calls, work = tmp_path / "bin", tmp_path / "calls", tmp_path / "work"
    for d in (bin_dir, calls, work):
        d.mkdir()
    for name in STUBS:
        p = bin_dir / name
        p.write_text(_STUB.replace("@NAME@", name))
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "STUB_CALLS": str(calls), "HOME": str(work),
           "LANG": "C.UTF-8"}
    return bin_dir, calls, work, env


def _calls(calls: Path, name: str) -> list[list[str]]:
    out = []
    for f in sorted(calls.glob(f"{name}.*"), key=lambda p: p.stat().st_mtime_ns):
        raw = f.read_bytes()
        out.append(raw.decode("utf-8", "surrogateescape").split("\0")[:-1] if raw else [])
    return out


def _run(script_text: str, work: Path, env: dict, extra_env: dict | None = None, timeout: float = 60):
    script = work.parent / "launch.sh"
    script.write_text(script_text, encoding="utf-8")
    return subprocess.run(["bash", str(script)], cwd=work, env={**env, **(extra_env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def _assert_nothing_injected(root: Path) -> None:
    found = [p for p in root.rglob("PWNED*")]
    # The log may legitimately be a file whose *name* holds a hostile value; a marker file is never created.
    assert not [p for p in found if p.name in MARKERS], found
    for m in MARKERS:
        assert not (root / "work" / m).exists() and not Path("/tmp", m).exists()


def _spec(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


# ------------------------------------------------------------------------------------------ running it

@pytest.mark.parametrize("launcher", ["cli", "module", "sglang"])
@pytest.mark.parametrize("marker", sorted(HOSTILE))
def test_hostile_values_reach_commands_as_literals(stubbed, marker, launcher):
    bin_dir, calls, work, env = stubbed
    value = HOSTILE[marker]
    t_path, d_path = f"/models/{value}/target", f"/models/{value}\n/draft"
    served = f"served {value}"
    engine = "sglang" if launcher == "sglang" else "vllm"
    cmd = serve_command(TARGET, DRAFT, k=4, server=engine, engine=resolve_target("0.32.0"), target_path=t_path,
                        draft_path=d_path, dtype="float32", launcher="module" if launcher == "module" else "cli",
                        extra_args=None if engine == "sglang" else ["--served-model-name", served])
    log = f"log {value}"  # relative: lands in the working folder
    text = launch_script(cmd, target_arg=t_path, draft_arg=d_path, gpu=f"gpu {value}", tp=1, k=4,
                         max_model_len=512, util=0.5, host="127.0.0.1", port=8123, timeout_s=30, log=log,
                         warmup_prompt=f"def f():\n    return {value!r} + {NEWLINE!r}", warmup_tokens=7)
    run = _run(text, work, env)
    assert run.returncode == 0, run.stdout + run.stderr
    _assert_nothing_injected(work.parent)

    # The server got exactly the serve command, plus --host/--port.
    servers = [c for name in SERVERS for c in _calls(calls, name)]
    assert servers == [cmd.argv[1:] + ["--host", "127.0.0.1", "--port", "8123"]]
    if engine == "vllm":
        assert _spec(servers[0])["model"] == d_path
    # preflight and monitor (the draftfit stub) got the literal paths, GPU name and base URL.
    assert _calls(calls, "draftfit") == [
        ["preflight", t_path, d_path, "--tp", "1", "--k", "4", "--gpu", f"gpu {value}", "--max-model-len", "512",
         "--util", "0.5"],
        ["monitor", "http://127.0.0.1:8123", "--once"],
    ]
    # The warm-up completion: a JSON body naming the served model and holding the prompt, both literal.
    completion = [c for c in _calls(calls, "curl") if any(a.endswith("/v1/completions") for a in c)]
    assert len(completion) == 1
    body = json.loads(completion[0][completion[0].index("-d") + 1])
    assert body["model"] == (served if engine == "vllm" else t_path)
    assert body["prompt"] == f"def f():\n    return {value!r} + {NEWLINE!r}" and body["max_tokens"] == 7
    # The log went to the file literally named, in the working folder.
    assert (work / log).exists() and (work / f"{log}.completion.json").exists()
    assert "healthy" in run.stdout and "completion: " in run.stdout


def test_newlines_in_paths_stay_data(stubbed):
    bin_dir, calls, work, env = stubbed
    cmd = serve_command(TARGET, DRAFT, k=2, engine=resolve_target("0.33.0"), target_path=NEWLINE, draft_path=NEWLINE,
                        launcher="cli", extra_args=["--served-model-name", NEWLINE])
    cmd.env["VLLM_LOGGING_LEVEL"] = "DEBUG"
    text = launch_script(cmd, target_arg=NEWLINE, draft_arg=NEWLINE, k=2, port=8124, timeout_s=30)
    assert "export VLLM_LOGGING_LEVEL=DEBUG" in text
    run = _run(text, work, env)
    assert run.returncode == 0, run.stdout + run.stderr
    _assert_nothing_injected(work.parent)
    assert _calls(calls, "vllm") == [cmd.argv[1:] + ["--host", "127.0.0.1", "--port", "8124"]]
    assert _calls(calls, "draftfit")[0][:3] == ["preflight", NEWLINE, NEWLINE]


@pytest.mark.parametrize("var, value, expect", [
    ("HOST", "$(touch PWNED_dollar)", "HOST must be a host name"),
    ("HOST", "127.0.0.1; touch PWNED_semi", "HOST must be a host name"),
    ("PORT", "a[$(touch PWNED_arith)]", "PORT must be a number"),  # bash arithmetic would run it
    ("PORT", "70000", "PORT must be a number"),
    ("PORT", "0", "PORT must be a number"),
    ("HEALTH_TIMEOUT_S", "x[$(touch PWNED_arith)]", "HEALTH_TIMEOUT_S must be a whole number"),
    ("HEALTH_TIMEOUT_S", "1+1", "HEALTH_TIMEOUT_S must be a whole number"),
])
def test_environment_overrides_are_data(stubbed, var, value, expect):
    bin_dir, calls, work, env = stubbed
    cmd = serve_command(TARGET, DRAFT, k=4, engine=resolve_target("0.32.0"), launcher="cli")
    run = _run(launch_script(cmd, target_arg=TARGET, draft_arg=DRAFT), work, env, {var: value})
    assert run.returncode == 2 and expect in run.stderr, run.stderr
    _assert_nothing_injected(work.parent)
    assert not any(_calls(calls, n) for n in STUBS)  # refused before anything ran


def test_environment_overrides_used_verbatim(stubbed):
    bin_dir, calls, work, env = stubbed
    cmd = serve_command(TARGET, DRAFT, k=4, engine=resolve_target("0.32.0"), launcher="cli")
    log = "env log $(touch PWNED_dollar) `touch PWNED_tick`"
    run = _run(launch_script(cmd, target_arg=TARGET, draft_arg=DRAFT), work, env,
               {"LOG": log, "HOST": "::1", "PORT": "08125", "HEALTH_TIMEOUT_S": "30"})
    assert run.returncode == 0, run.stdout + run.stderr
    _assert_nothing_injected(work.parent)
    assert (work / log).exists()
    assert _calls(calls, "vllm")[0][-4:] == ["--host", "::1", "--port", "8125"]
    assert _calls(calls, "draftfit")[-1] == ["monitor", "http://[::1]:8125", "--once"]
    # A hostile DRAFTFIT is a (missing) program name, not code: preflight fails and nothing starts.
    for f in calls.iterdir():
        f.unlink()
    run = _run(launch_script(cmd, target_arg=TARGET, draft_arg=DRAFT), work, env,
               {"DRAFTFIT": "$(touch PWNED_dollar)"})
    assert run.returncode == 2 and "preflight found blockers" in run.stderr
    _assert_nothing_injected(work.parent)
    assert not _calls(calls, "vllm")


# ------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("host", ["$(touch PWNED)", "a;b", "a b", "", "-x", "a..b", "é.example", "x" * 64 + ".com",
                                  "127.0.0.1\n", "`id`", "h:80", "[::1]"])
def test_bad_hosts_refused(host):
    cmd = serve_command(TARGET, DRAFT, k=4, engine=resolve_target("0.32.0"), launcher="cli")
    with pytest.raises(DraftfitError) as info:
        launch_script(cmd, target_arg=TARGET, draft_arg=DRAFT, host=host)
    assert "invalid host" in info.value.one_line() and "\n" not in info.value.one_line()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1%eth0",
                                  "gpu-node-7.cluster.example.com", "host."])
def test_good_hosts_accepted(host):
    assert validate_host(host) == host


@pytest.mark.parametrize("kwargs, what", [
    ({"port": 0}, "port"), ({"port": 65536}, "port"), ({"port": -1}, "port"), ({"port": "8000"}, "port"),
    ({"port": True}, "port"), ({"port": 80.5}, "port"),
    ({"log": "a\nb"}, "log path"), ({"log": "a\rb"}, "log path"), ({"log": "a\0b"}, "log path"), ({"log": ""}, "log"),
    ({"target_arg": "a\0b"}, "target"), ({"draft_arg": ""}, "draft"), ({"gpu": "H100\n"}, "GPU"),
    ({"draftfit_bin": "draftfit\nrm"}, "draftfit executable"), ({"warmup_prompt": "\0"}, "warm-up prompt"),
    ({"timeout_s": 0}, "health timeout"), ({"k": 0}, "K"), ({"tp": 0}, "tensor parallel"),
    ({"util": float("nan")}, "utilization"), ({"util": 1.5}, "utilization"),
    ({"max_model_len": -5}, "max model length"), ({"warmup_tokens": 0}, "warm-up tokens"),
])
def test_bad_values_refused(kwargs, what):
    cmd = serve_command(TARGET, DRAFT, k=4, engine=resolve_target("0.32.0"), launcher="cli")
    base = {"target_arg": TARGET, "draft_arg": DRAFT}
    with pytest.raises(DraftfitError) as info:
        launch_script(cmd, **{**base, **kwargs})
    assert what in info.value.one_line() and "\n" not in info.value.one_line()


def test_serve_command_with_nul_or_host_or_bad_env_refused():
    cmd = serve_command(TARGET, DRAFT, k=4, engine=resolve_target("0.32.0"), launcher="cli", extra_args=["--x", "a\0b"])
    with pytest.raises(DraftfitError):
        launch_script(cmd, target_arg=TARGET, draft_arg=DRAFT)
    cmd = serve_command(TARGET, DRAFT, k=4, engine=resolve_target("0.32.0"), launcher="cli", host="h", port=1)
    with pytest.raises(DraftfitError, match="already carries --host"):
        launch_script(cmd, target_arg=TARGET, draft_arg=DRAFT)
    cmd = serve_command(TARGET, DRAFT, k=4, engine=resolve_target("0.32.0"), launcher="cli")
    cmd.env["A=B; touch PWNED"] = "1"
    with pytest.raises(DraftfitError, match="environment variable name"):
        launch_script(cmd, target_arg=TARGET, draft_arg=DRAFT)


def test_cli_refuses_hostile_host_and_port(tmp_path):
    out = tmp_path / "launch.sh"
    for extra, expect in ((["--host", "$(touch /tmp/pwned)"], "invalid host"), (["--port", "70000"], "port")):
        res = CliRunner().invoke(cli, ["launch-script", TARGET, DRAFT, "--k", "4", "-o", str(out), *extra])
        assert res.exit_code == 2 and expect in res.output and "Traceback" not in res.output, res.output
        assert not out.exists()


def test_cli_hostile_log_runs_clean(stubbed):
    bin_dir, calls, work, env = stubbed
    out = work.parent / "cli.sh"
    log = HOSTILE["PWNED_dollar"] + HOSTILE["PWNED_tick"]
    res = CliRunner().invoke(cli, ["launch-script", TARGET, DRAFT, "--k", "4", "--launcher", "cli",
                                   "--vllm-version", "0.32.0", "--log", log, "--port", "8126",
                                   "--warmup-prompt", HOSTILE["PWNED_sq"], "-o", str(out)])
    assert res.exit_code == 0, res.output
    run = subprocess.run(["bash", str(out)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    _assert_nothing_injected(work.parent)
    assert (work / log).exists() and _calls(calls, "vllm")[0][-2:] == ["--port", "8126"]


# ------------------------------------------------------------------------------------ bash -n, shellcheck

def _variants() -> dict[str, str]:
    hostile = HOSTILE["PWNED_unicode"] + HOSTILE["PWNED_sq"] + HOSTILE["PWNED_dq"]
    v = {}
    for launcher in ("cli", "module"):
        for version in ("0.26.0", "0.33.0", "0.34.0"):
            cmd = serve_command(TARGET, DRAFT, k=3, tp=2, engine=resolve_target(version), launcher=launcher,
                                target_path=f"/m/{hostile}", draft_path=NEWLINE, max_model_len=1024, util=0.9,
                                extra_args=["--served-model-name", hostile])
            v[f"{launcher}-{version}"] = launch_script(
                cmd, target_arg=f"/m/{hostile}", draft_arg=NEWLINE, gpu="H100-80GB", tp=2, k=3, max_model_len=1024,
                util=0.9, host="::1", port=65535, log=f"l {hostile}", draftfit_bin=f"/opt/{hostile}/draftfit",
                warmup_prompt=hostile + NEWLINE, keep_running=version == "0.34.0")
    sg = serve_command(TARGET, DRAFT, k=4, server="sglang", target_path=hostile, draft_path=hostile)
    v["sglang-nopreflight"] = launch_script(sg, target_arg=hostile, draft_arg=hostile, preflight=False)
    v["defaults"] = launch_script(serve_command(TARGET, DRAFT, engine=resolve_target("0.32.0")), target_arg=TARGET,
                                  draft_arg=DRAFT)
    return v


def test_every_variant_passes_bash_n(tmp_path):
    for name, text in _variants().items():
        p = tmp_path / f"{name}.sh"
        p.write_text(text, encoding="utf-8")
        res = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert res.returncode == 0, (name, res.stderr)


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not installed (Debian: apt-get install -y shellcheck)")
def test_every_variant_is_shellcheck_clean(tmp_path):
    for name, text in _variants().items():
        p = tmp_path / f"{name}.sh"
        p.write_text(text, encoding="utf-8")
        res = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(p)], capture_output=True,
                             text=True)
        assert res.returncode == 0 and not res.stdout.strip(), (name, res.stdout + res.stderr)
