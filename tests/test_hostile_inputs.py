"""Hostile inputs: every command and numeric option, broken files, a garbage /metrics server (tests/hostile_corpus.py).

Each case must exit non-zero (2 for bad input), print exactly one line starting with `error:` (with `--json`:
stdout is one JSON object with "error" and "fix"), show no traceback and finish within its timeout. Cases run
in-process through click's CliRunner under a SIGALRM timeout; a few run as `python -m draftfit` subprocesses.
measure/calibrate cases also fail when a hostile input gets as far as importing torch/transformers/vllm or
starting a subprocess: input must be rejected before the heavy work starts.

Set DRAFTFIT_HOSTILE_REPORT=/path/to/file to get one line per failing case (id | command | what went wrong).
Then property-based tests (hypothesis): random config.json dicts and random numbers for numeric options.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hub ids in the corpus must fail fast, offline

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from draftfit.cli import cli

sys.path.insert(0, str(Path(__file__).parent))
import hostile_corpus as hc  # noqa: E402

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
CASES = hc.build_cases(root=IS_ROOT)
HEAVY_MODULES = ("torch", "transformers", "vllm")
REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------- running


class _CaseTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so that neither CliRunner nor draftfit swallows it."""


class _HeavyWork(BaseException):
    pass


class _HeavyFinder:
    """A meta-path finder that stops the first import of a heavy package (the case's input was accepted)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY_MODULES:
            raise _HeavyWork(f"import {name}")
        return None


@contextmanager
def _heavy_guard(active: bool):
    if not active:
        yield
        return
    finder = _HeavyFinder()
    real_popen = subprocess.Popen

    class GuardPopen(real_popen):  # draftfit's measure/calibrate workers are subprocesses
        def __init__(self, args, *a, **kw):
            raise _HeavyWork(f"subprocess {' '.join(map(str, args))[:80] if isinstance(args, (list, tuple)) else args}")

    # Earlier tests in the same process may have imported the heavy packages: hide them for the case, so that
    # the command's own import of them reaches the finder, and put them back afterwards.
    hidden = {k: m for k, m in sys.modules.items() if k.split(".")[0] in HEAVY_MODULES}
    for k in hidden:
        del sys.modules[k]
    sys.meta_path.insert(0, finder)
    subprocess.Popen = GuardPopen
    try:
        yield
    finally:
        subprocess.Popen = real_popen
        sys.meta_path.remove(finder)
        sys.modules.update(hidden)


@contextmanager
def _alarm(seconds: float):
    def on_alarm(signum, frame):
        raise _CaseTimeout()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _describe(exc: BaseException, tb) -> str:
    frames = traceback.extract_tb(tb)
    where = ""
    for fr in reversed(frames):
        if "draftfit" in fr.filename:
            where = f" ({'/'.join(Path(fr.filename).parts[-2:])}:{fr.lineno})"
            break
    msg = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {msg}{where}"


def run_case(case: hc.Case, argv: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Run one case; returns exit_code, stdout, stderr, exception, timed_out, heavy, elapsed."""
    t0 = time.monotonic()
    res = dict(exit_code=None, stdout="", stderr="", exception="", timed_out=False, heavy="")
    if case.subprocess:
        # The package under test (this checkout), not whichever draftfit the interpreter has installed.
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                    **env}
        try:
            p = subprocess.run([sys.executable, "-m", "draftfit", *argv], capture_output=True, text=True,
                               errors="replace", timeout=case.timeout, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL)
            res.update(exit_code=p.returncode, stdout=p.stdout, stderr=p.stderr)
        except subprocess.TimeoutExpired:
            res["timed_out"] = True
    else:
        runner = CliRunner()
        try:
            with _alarm(case.timeout), _heavy_guard(case.guard_heavy):
                r = runner.invoke(cli, argv, env=env, catch_exceptions=True, prog_name="draftfit")
            res.update(exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr)
            if r.exception is not None and not isinstance(r.exception, SystemExit):
                res["exception"] = _describe(r.exception, r.exc_info[2] if r.exc_info else None)
        except _CaseTimeout:
            res["timed_out"] = True
        except _HeavyWork as exc:
            res["heavy"] = str(exc)
    res["elapsed"] = round(time.monotonic() - t0, 2)
    return res


# ------------------------------------------------------------------------------------------- fixtures


_FAILURES: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _failure_report():
    yield
    path = os.environ.get("DRAFTFIT_HOSTILE_REPORT")
    if path:
        Path(path).write_text("".join(line + "\n" for line in _FAILURES))


@pytest.fixture(scope="module")
def metrics_server():
    with hc.MetricsServer() as srv:
        yield srv


def _prepare(case: hc.Case, tmp_path: Path, srv_url: str) -> tuple[list[str], dict[str, str]]:
    for name in case.files:
        hc.build_file(name, tmp_path, REPO)
    argv = [hc.expand(a, tmp_path, srv_url) for a in case.argv]
    env = {"DRAFTFIT_STORE": str(tmp_path / "default-store.sqlite"), "HF_HUB_OFFLINE": "1",
           **{k: hc.expand(v, tmp_path, srv_url) for k, v in case.env}}
    return argv, env


# ------------------------------------------------------------------------------------------- the corpus


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case: hc.Case, tmp_path, monkeypatch, request):
    srv_url = request.getfixturevalue("metrics_server").url if case.server else ""
    argv, env = _prepare(case, tmp_path, srv_url)
    monkeypatch.chdir(tmp_path)  # stray outputs (launch.sh, plots) land in the scratch folder
    res = run_case(case, argv, env, tmp_path)
    found = hc.problems(case, **res)
    if found:
        cmd = "draftfit " + " ".join(shlex.quote(a) for a in argv).replace(str(tmp_path), "$TMP")
        _FAILURES.append(f"{case.id} | {cmd} | {'; '.join(found)} | {res['elapsed']}s")
    assert not found, (f"{'; '.join(found)}\nexit={res['exit_code']} elapsed={res['elapsed']}s\n"
                       f"--- stdout (tail)\n{res['stdout'][-1500:]}\n--- stderr (tail)\n{res['stderr'][-1500:]}")


def test_corpus_size_and_ids():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 300
    commands = {c.argv[0] for c in CASES if c.argv}
    assert {"rank", "check", "memory", "measure", "runs", "speedup", "calibrate", "serve-cmd",
            "launch-script", "preflight", "monitor", "catalog", "fixtures"} <= commands


def test_chmod_000_case_is_not_silently_dropped():
    ids = {c.id for c in CASES}
    if IS_ROOT:
        pytest.skip("running as root: chmod 000 does not stop reads, so the unreadable-file cases are replaced by "
                    "directory-for-file, file-for-directory and dangling-symlink cases")
    assert "rank-target-cfg-unreadable" in ids


# The base command lines the corpus mutates must themselves work: otherwise a case "passes" for the wrong reason.
CONTROLS = [
    ("rank", ["rank", "--target", hc.M_T, "--gpu", hc.GPU], (0,)),
    ("memory", ["memory", hc.M_T, "--gpu", hc.GPU, "--draft", hc.M_D], (0,)),
    ("memory-cpu", ["memory", hc.M_T, "--gpu", "cpu"], (0,)),
    ("speedup", ["speedup", "--alpha", "0.7", "--k", "4", "--c", "0.1"], (0,)),
    ("speedup-full", ["speedup", "--target", hc.M_T, "--draft", hc.M_D, "--gpu", "H200", "--alpha", "0.7"], (0,)),
    ("speedup-prior", ["speedup", "--target", hc.M_T, "--draft", hc.M_D, "--gpu", "H200", "-w", "code"], (0,)),
    ("serve-cmd", ["serve-cmd", hc.M_T, hc.M_D], (0,)),
    ("launch-script", ["launch-script", hc.M_T, hc.M_D, "-o", "{tmp}/launch.sh"], (0,)),
    ("preflight", ["preflight", hc.M_T, hc.M_D, "--gpu", "H200"], (0, 1)),  # 1: a warning, not a failure
    ("check-folders", ["check", "{tmp}/good-model", "{tmp}/good-draft"], (0,)),
    ("rank-folder", ["rank", "--target", "{tmp}/good-model"], (0,)),
    ("memory-folder", ["memory", "{tmp}/good-model", "--gpu", hc.GPU], (0,)),
    ("runs-list", ["runs", "list", "--store", "{tmp}/store-dir/s.sqlite"], (0,)),
    ("monitor", ["monitor", "{srv}/good", "--once"], (0,)),
    ("monitor-layout", ["monitor", "{srv}/good", "--once", "--target", hc.M_T, "--draft", hc.M_D, "--gpu", "H200"],
     (0,)),
    ("catalog-show", ["catalog", "show", hc.M_T], (0,)),
]


@pytest.mark.parametrize("argv,ok", [(a, ok) for _, a, ok in CONTROLS], ids=[n for n, _, _ in CONTROLS])
def test_control(argv, ok, tmp_path, monkeypatch, metrics_server):
    for name in ("good-model", "good-draft", "store-dir"):
        hc.build_file(name, tmp_path, REPO)
    monkeypatch.chdir(tmp_path)
    case = hc.Case(id="control", argv=tuple(argv))
    argv = [hc.expand(a, tmp_path, metrics_server.url) for a in argv]
    res = run_case(case, argv, {"DRAFTFIT_STORE": str(tmp_path / "s.sqlite")}, tmp_path)
    assert not res["timed_out"] and not res["exception"], res
    assert res["exit_code"] in ok, res["stderr"][-800:]


# ------------------------------------------------------------------------------------------- properties


def _one_line_or_success(res: dict) -> str | None:
    """None when the run either succeeded or failed with exactly one `error:` line; else what is wrong."""
    if res["timed_out"]:
        return "hang"
    if res["exception"]:
        return f"traceback: {res['exception']}"
    if "internal error" in res["stdout"] + res["stderr"]:  # the CLI's catch-all: a bug, however politely put
        return "internal error"
    if "Traceback (most recent call last)" in res["stdout"] + res["stderr"]:
        return "traceback in output"
    if res["exit_code"] == 0:
        return None
    lines = [line for line in res["stderr"].splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("error:"):
        return f"exit {res['exit_code']} without one 'error:' line: {lines[-3:]}"
    return None


_json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.sampled_from([0, -1, 1, 2, 32, 4096, 10**15]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
)
_json_value = st.recursive(_json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3)),
                           max_leaves=6)
CONFIG_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "num_experts",
               "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "sliding_window", "torch_dtype",
               "architectures", "model_type", "text_config"]
_config = st.one_of(
    # a real config with a few fields replaced by anything
    st.dictionaries(st.sampled_from(CONFIG_KEYS), _json_value, max_size=5).map(lambda d: {**hc.GOOD_CONFIG, **d}),
    # anything at all under the known keys
    st.dictionaries(st.sampled_from(CONFIG_KEYS), _json_value, max_size=10),
)
PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                             phases=[Phase.explicit, Phase.generate],  # no shrinking: bounded runtime
                             suppress_health_check=list(HealthCheck))


def _run_quick(argv: list[str], timeout: float = 20.0) -> dict:
    with tempfile.TemporaryDirectory() as d:
        return run_case(hc.Case(id="prop", argv=tuple(argv), timeout=timeout), argv,
                        {"DRAFTFIT_STORE": str(Path(d) / "s.sqlite")}, Path(d))


@PROPERTY_SETTINGS
@given(config=_config, command=st.sampled_from(["rank", "memory"]))
def test_property_config_json(config, command):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "model"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config, allow_nan=True))
        argv = ["rank", "--target", str(folder)] if command == "rank" else ["memory", str(folder), "--gpu", hc.GPU]
        res = run_case(hc.Case(id="prop", argv=tuple(argv)), argv, {"DRAFTFIT_STORE": str(Path(d) / "s.sqlite")},
                       Path(d))
    problem = _one_line_or_success(res)
    assert problem is None, f"{command} on config.json {json.dumps(config, allow_nan=True)[:400]}: {problem}"


def _num_text(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


_number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**13), 10**13),
                    st.sampled_from([0, -1, 1, 0.0, -0.0, 1.0, 1.5, float("nan"), float("inf"), float("-inf")]))


def _finite(v) -> bool:
    return isinstance(v, int) or math.isfinite(v)


def _is_int(v) -> bool:
    return isinstance(v, int)


# What counts as in range (a judgment, kept loose): TP must divide Llama-3.1-8B's 32 heads; K up to 32 (vLLM has
# no hard cap, but K > 16 is never useful and `measure` already caps K_max at 16); contexts up to the model's
# 131072 positions. Values outside must exit 2; values inside must succeed or fail with one `error:` line.
TP_32_HEADS = (1, 2, 4, 8, 16, 32)
MAX_K = 32
# option -> (base argv, predicate "this value is valid")
NUMERIC_OPTIONS = {
    ("rank", "--util"): (["rank", "--target", hc.M_T, "--gpu", hc.GPU], lambda v: _finite(v) and 0 < v <= 1),
    ("rank", "--temperature"): (["rank", "--target", hc.M_T, "--gpu", hc.GPU], lambda v: _finite(v) and v >= 0),
    ("rank", "--tp"): (["rank", "--target", hc.M_T, "--gpu", hc.GPU], lambda v: _is_int(v) and v in TP_32_HEADS),
    ("rank", "--max-model-len"): (["rank", "--target", hc.M_T, "--gpu", hc.GPU],
                                  lambda v: _is_int(v) and 1 <= v <= 131072),
    ("rank", "--top"): (["rank", "--target", hc.M_T, "--gpu", hc.GPU], lambda v: _is_int(v) and v >= 1),
    ("memory", "--util"): (["memory", hc.M_T, "--gpu", hc.GPU], lambda v: _finite(v) and 0 < v <= 1),
    ("memory", "--tp"): (["memory", hc.M_T, "--gpu", hc.GPU], lambda v: _is_int(v) and v in TP_32_HEADS),
    ("memory", "--max-model-len"): (["memory", hc.M_T, "--gpu", hc.GPU], lambda v: _is_int(v) and 1 <= v <= 131072),
    ("memory", "--max-num-seqs"): (["memory", hc.M_T, "--gpu", hc.GPU], lambda v: _is_int(v) and 1 <= v <= 10**6),
    ("memory", "--num-speculative-tokens"): (["memory", hc.M_T, "--gpu", hc.GPU, "--draft", hc.M_D],
                                             lambda v: _is_int(v) and 1 <= v <= MAX_K),
    ("memory", "--kvcache-space"): (["memory", hc.M_T, "--gpu", "cpu"], lambda v: _finite(v) and 0 < v <= 4096),
    ("speedup", "--alpha"): (["speedup", "--k", "4", "--c", "0.1"], lambda v: _finite(v) and 0 <= v <= 1),
    ("speedup", "--c"): (["speedup", "--alpha", "0.7", "--k", "4"], lambda v: _finite(v) and v >= 0),
    ("speedup", "--k"): (["speedup", "--alpha", "0.7", "--c", "0.1"], lambda v: _is_int(v) and 1 <= v <= MAX_K),
    ("speedup", "--tp"): (["speedup", "--target", hc.M_T, "--draft", hc.M_D, "--gpu", "H200", "--alpha", "0.7"],
                          lambda v: _is_int(v) and v in TP_32_HEADS),
    ("speedup", "--context-len"): (["speedup", "--target", hc.M_T, "--draft", hc.M_D, "--gpu", "H200", "--alpha",
                                    "0.7"], lambda v: _is_int(v) and 1 <= v <= 131072),
    ("speedup", "--temperature"): (["speedup", "--target", hc.M_T, "--draft", hc.M_D, "--gpu", "H200"],
                                   lambda v: _finite(v) and v >= 0),
}


@PROPERTY_SETTINGS
@given(option=st.sampled_from(sorted(NUMERIC_OPTIONS)), value=_number)
def test_property_numeric_options(option, value):
    base, valid = NUMERIC_OPTIONS[option]
    argv = [*base, option[1], _num_text(value)]
    res = _run_quick(argv)
    problem = _one_line_or_success(res)
    assert problem is None, f"{' '.join(argv)}: {problem}"
    if not valid(value):  # out of the option's real range: must be refused, as bad input
        assert res["exit_code"] == 2, f"{' '.join(argv)}: nonsense accepted (exit {res['exit_code']})"


@pytest.mark.parametrize("text, want", [("1,8, 32", (1, 8, 32)), ("1..4", (1, 2, 3, 4)), ("1..3,6", (1, 2, 3, 6)),
                                        ("4", (4,))])
def test_int_lists_take_ranges_like_calibrate_does(text, want):
    from draftfit.layout import parse_int_list

    assert parse_int_list(text, "--k") == want


@pytest.mark.parametrize("text", ["", "1,,2", "3..1", "a..b", "1..2..3", "1.5", "0..1000000"])
def test_bad_int_lists_are_one_error_with_the_options_example(text):
    from draftfit.errors import DraftfitError
    from draftfit.layout import parse_int_list

    with pytest.raises(DraftfitError) as e:
        parse_int_list(text, "--k", "1,2,4")
    assert "--k" in str(e.value) and e.value.fix == "e.g. --k 1,2,4"


# ------------------------------------------------------------------------------------------- coverage


def _leaf_commands(cmd, path):
    import click

    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(None):
            yield from _leaf_commands(cmd.get_command(None, name), [*path, name])
    else:
        yield path, cmd


def test_every_option_of_every_command_has_a_hostile_case():
    """A new option without a hostile case fails here: each option of each (sub)command must appear in the argv of
    at least one corpus case for that command (flags with a hostile companion input)."""
    import click

    from draftfit.cli import COMMANDS

    missing = []
    for name in COMMANDS:
        for path, cmd in _leaf_commands(cli.get_command(None, name), [name]):
            argvs = [c.argv for c in CASES if list(c.argv[:len(path)]) == path]
            assert argvs, f"no hostile case for `draftfit {' '.join(path)}`"
            for p in cmd.params:
                if isinstance(p, click.Option) and not any(o in a for a in argvs for o in p.opts + p.secondary_opts):
                    missing.append(f"{' '.join(path)} {p.opts[0]}")
    assert not missing, "options with no hostile case in tests/hostile_corpus.py: " + ", ".join(missing)


def test_internal_error_counts_as_a_failure():
    """The CLI's catch-all turns a bug into one `error: internal error: ...` line; the corpus must not take that
    for a handled input."""
    case = hc.Case(id="x", argv=("rank",))
    found = hc.problems(case, exit_code=1, stdout="", stderr="error: internal error: KeyError: 'x' — please report it")
    assert found and found[0].startswith("internal error")
    assert _one_line_or_success({"timed_out": False, "exception": "", "exit_code": 1, "stdout": "",
                                 "stderr": "error: internal error: ValueError: y"}) == "internal error"
