"""`draftfit sweep`: cells planned, placed and run as Ray tasks, filed as they land, resumed after a kill.

Fast tests plan cells and placements, build the engine arguments a multi-node cell gets (checked against vLLM's
own EngineArgs), and run real Ray tasks whose cells fail before any engine (retries, failure filing, calibration
lanes). The resume test sweeps the Qwen2.5-Coder pair and ngram through one local Ray on the fake engine
(draftfit.acceptance.measure.fake: the same worker process driver, seconds instead of minutes), kills the sweep
after its first cell lands, resumes it, and compares each run's counters with a direct `draftfit measure`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.assets.models import DRAFT, TARGET, is_ready
from draftfit.errors import DraftfitError

NEEDS_PAIR = pytest.mark.skipif(not (is_ready(TARGET) and is_ready(DRAFT)),
                                reason="the real Qwen2.5-Coder pair is not converted: run `make models`")


def _gpu_nodes(*gpus, cpus=32):
    return [{"Alive": True, "Resources": {"CPU": cpus, "GPU": g}} for g in gpus]


# ------------------------------------------------------------------------------------------ placement
def test_cpu_cells_take_a_whole_node_each():
    from draftfit.sweep import plan_placement

    p = plan_placement([{"Alive": True, "Resources": {"CPU": 2.0}}])
    assert (p.device, p.num_cpus, p.num_gpus, p.slots, p.engine_args) == ("cpu", 2.0, 0, 1, {})
    # Mixed nodes: each cell asks for the largest node's CPUs, so no machine ever runs two engines.
    p = plan_placement([{"CPU": 16}, {"CPU": 16}, {"CPU": 8}, {"Alive": False, "Resources": {"CPU": 64}}])
    assert (p.num_cpus, p.slots) == (16, 2)
    with pytest.raises(DraftfitError, match="needs GPUs"):
        plan_placement([{"CPU": 16}], tp=2)


def test_gpu_cells_ask_for_their_tp_and_pack_nodes():
    from draftfit.sweep import plan_placement

    p = plan_placement(_gpu_nodes(8, 8), tp=4)
    assert (p.device, p.num_gpus, p.slots, p.multi_node) == ("gpu", 4, 4, False)
    assert p.engine_args == {"tensor_parallel_size": 4, "pipeline_parallel_size": 1, "dtype": "auto"}
    assert "distributed_executor_backend" not in p.engine_args  # one node: vLLM's default multiprocessing executor
    p = plan_placement(_gpu_nodes(8, 4), tp=2, pp=2)
    assert (p.num_gpus, p.slots) == (4, 3)


def test_a_target_larger_than_a_node_runs_vllms_ray_executor():
    from draftfit.sweep import plan_placement

    p = plan_placement(_gpu_nodes(8, 8, 8, 8), tp=8, pp=2)
    assert p.multi_node and p.world_size == 16
    assert p.engine_args == {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "dtype": "auto",
                             "distributed_executor_backend": "ray"}
    # The task holds no GPU: vLLM's engine reserves its 16 in its own placement group; two engines fit 32 GPUs.
    assert (p.num_gpus, p.num_cpus, p.slots) == (0, 1, 2)
    with pytest.raises(DraftfitError, match="16 GPUs per engine, but the Ray cluster has 8"):
        plan_placement(_gpu_nodes(4, 4), tp=8, pp=2)


def test_engine_arguments_are_vllm_engineargs_fields_and_reach_the_engine():
    """Every key draftfit builds is a field of the installed vLLM's EngineArgs (a renamed field fails here),
    with a value of the kind vLLM takes; and the measure worker passes them to vllm.LLM last."""
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    import dataclasses

    from draftfit.acceptance.measure.vllm import MeasureRequest
    from draftfit.sweep import plan_placement

    fields = {f.name: f for f in dataclasses.fields(arg_utils.EngineArgs)}
    for nodes, tp, pp in ((_gpu_nodes(8, 8), 8, 2), (_gpu_nodes(8), 4, 1)):
        args = plan_placement(nodes, tp=tp, pp=pp).engine_args
        assert set(args) <= set(fields), set(args) - set(fields)
        assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (tp, pp)
    # ...and of the types vLLM declares for them (EngineArgs() would resolve a model: not needed to check names).
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        assert fields[name].type in (int, "int"), fields[name].type
    assert "ray" in str(fields["distributed_executor_backend"].type)
    assert "auto" in str(fields["dtype"].type) or fields["dtype"].default == "auto"
    assert MeasureRequest(target="t", draft="d", workload="code", temperatures=[0.0],
                          engine_args={"tensor_parallel_size": 2}).engine_args == {"tensor_parallel_size": 2}
    src = Path(__import__("draftfit.acceptance.measure.vllm", fromlist=["x"]).__file__).read_text()
    assert "kwargs.update(req.engine_args or {})" in src  # after speculative_config: the sweep's layout wins


# ------------------------------------------------------------------------------------------ planning
@NEEDS_PAIR
def test_cells_are_drafts_by_workloads_by_temperatures_with_measures_provenance(tmp_path):
    from draftfit.acceptance.measure.prompts import prompt_set_hash
    from draftfit.sweep import plan_measure_cells

    cells = plan_measure_cells(TARGET, [DRAFT, "ngram", "ngram"], ["code", "chat"], [0, 0.7], k=4, num_prompts=2,
                               max_tokens=16)
    assert len(cells) == 2 * 2 * 2  # duplicates dropped
    assert [c.label for c in cells[:2]] == [f"{DRAFT} code T=0", f"{DRAFT} code T=0.7"]
    c = cells[-1]
    assert c.provenance["draft"] == "ngram" and c.provenance["draft_hash"] == ""
    assert c.provenance["prompt_set_hash"] == prompt_set_hash("chat", 2) and len(c.provenance["target_hash"]) == 64
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def f(x):"}\n{"prompt": "class A:"}\n')
    cells = plan_measure_cells(TARGET, ["ngram"], ["code"], [0], k=4, num_prompts=5, max_tokens=16, prompts_file=str(f))
    assert cells[0].provenance["num_prompts"] == 2 and cells[0].provenance["prompt_set_hash"].startswith("file:")
    with pytest.raises(DraftfitError, match="replaces the built-in workloads"):
        plan_measure_cells(TARGET, ["ngram"], ["code", "chat"], [0], k=4, num_prompts=2, max_tokens=16,
                           prompts_file=str(f))
    with pytest.raises(DraftfitError):  # a draft without weights here: refused before any Ray or engine
        plan_measure_cells(TARGET, ["Llama-3.2-1B"], ["code"], [0], k=4, num_prompts=2, max_tokens=16)


def test_calibration_cells_are_calibrates_engines(tmp_path):
    from draftfit.calibration.tables import engine_specs, model_spec
    from draftfit.sweep import plan_calibration_cells
    from draftfit.sweep.tasks import calibration_lane, cell_dict

    cells = plan_calibration_cells("Llama-3.1-8B", ["Llama-3.2-1B"], [1, 2, 4], batches=[1, 8], tp=1)
    assert [c.k for c in cells] == [0, 1, 2, 4] and cells[0].label == "Llama-3.1-8B baseline"
    assert len({c.cell_id for c in cells}) == 4
    again = plan_calibration_cells("Llama-3.1-8B", ["Llama-3.2-1B"], [1, 2, 4], batches=[1, 8], tp=1)
    assert [c.cell_id for c in again] == [c.cell_id for c in cells]  # a rerun finds its lane files
    other = plan_calibration_cells("Llama-3.1-8B", ["Llama-3.2-1B"], [1], batches=[1, 16])
    assert other[1].cell_id != cells[1].cell_id  # other settings, other file
    # The lane a cell runs holds exactly the engine spec draftfit calibrate builds for that K.
    lane = calibration_lane(cell_dict(cells[2]), tmp_path / "a")
    want = engine_specs(model_spec("Llama-3.1-8B"), model_spec("Llama-3.2-1B"), ks=[2], batches=[1, 8], tp=1,
                        acceptance=0.8, config_root=tmp_path / "b", include_baseline=False)
    strip = lambda s: {k: v for k, v in s.items() if k not in ("target_dir", "draft_dir", "synthetic")}  # noqa: E731
    assert [strip(s) for s in lane["configs"]] == [strip(s) for s in want]
    assert json.loads((Path(lane["configs"][0]["target_dir"]) / "config.json").read_text())
    with pytest.raises(DraftfitError, match="vocab_size"):
        plan_calibration_cells("Llama-3.1-8B", ["Qwen2.5-0.5B"], [1], batches=[1])


# ------------------------------------------------------------------------------------------ store seams
def test_find_runs_and_copy_run(tmp_path):
    from draftfit.acceptance.curve import result_from_counts
    from draftfit.acceptance.store import MeasurementStore, RunRecord, now_iso

    prov = dict(backend="vllm", target="T", draft="D", workload="code", temperature=0.0, k=2, seed=0,
                target_hash="a" * 64, draft_hash="b" * 64, num_prompts=2, max_tokens=8, prompt_set_hash="h")
    res = result_from_counts(per_position_accepted=[5, 3], num_drafts=6, num_draft_tokens=12, num_accepted=8, k=2,
                             temperature=0.0, workload="code", backend="vllm",
                             groups=[{"num_drafts": 3, "per_position_accepted": [3, 2]},
                                     {"num_drafts": 3, "per_position_accepted": [2, 1]}])
    with MeasurementStore(tmp_path / "a.sqlite") as a, MeasurementStore(tmp_path / "b.sqlite") as b:
        a.record_run(RunRecord(**prov, started_at=now_iso(), extra={"max_model_len": 2048}), res)
        a.record_run(RunRecord(**prov, started_at=now_iso(), status="failed", error="boom",
                               extra={"max_model_len": 2048}))
        rows = a.runs()
        new = [b.copy_run(r) for r in rows]
        copied = b.runs()
        for r, c in zip(rows, copied):
            assert {k: v for k, v in c.items() if k != "id"} == {k: v for k, v in r.items() if k != "id"}
        assert [r["id"] for r in b.find_runs(prov, extra_match={"max_model_len": 2048, "top_p": None})] == [new[0]]
        assert b.find_runs(prov, extra_match={"max_model_len": 4096}) == []
        assert b.find_runs({**prov, "temperature": 0.7}) == []
        assert b.find_runs(prov, extra_match={"engine_args": {"tensor_parallel_size": 2}}) == []
        assert [r["status"] for r in b.find_runs(prov, statuses=("failed",))] == ["failed"]
        with pytest.raises(ValueError):
            b.find_runs({"id; DROP TABLE runs": 1})
        tp2 = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "dtype": "auto"}
        rid = b.record_run(RunRecord(**{**prov, "k": 3}, started_at=now_iso(), extra={"engine_args": tp2}), res)
        assert [r["id"] for r in b.find_runs({**prov, "k": 3}, extra_match={"engine_args": dict(reversed(tp2.items()))})] \
            == [rid]


def test_a_missing_ray_is_one_line_naming_the_extra(monkeypatch):
    from draftfit.sweep import MeasureCell, run_sweep

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    cell = MeasureCell(target="t", draft="ngram", workload="code", temperature=0.0, k=2, num_prompts=1, max_tokens=8)
    with pytest.raises(DraftfitError) as info:
        run_sweep([cell])
    assert info.value.fix == "pip install 'draftfit[ray]'" and info.value.exit_code == 3


def test_the_cli_imports_no_ray_until_a_sweep_runs():
    out = subprocess.run([sys.executable, "-c", "import sys; from draftfit.cli import main\n"
                          "try: main(['sweep', '--help'])\nexcept SystemExit: pass\n"
                          "print('RAY', 'ray' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert "RAY False" in out.stdout and "--ray-address" in out.stdout


def test_an_unreachable_ray_address_is_one_line_in_seconds(tmp_path):
    t0 = time.monotonic()
    res = CliRunner().invoke(__import__("draftfit.cli", fromlist=["cli"]).cli,
                             ["sweep", "Llama-3.1-8B", "--calibrate", "--drafts", "Llama-3.2-1B", "--k", "2",
                              "--ray-address", "127.0.0.1:9", "--lanes-dir", str(tmp_path), "--json"])
    assert res.exit_code == 2 and "no Ray head answers at 127.0.0.1:9" in res.stderr
    assert json.loads(res.stdout)["fix"].startswith("pass the head's GCS address")
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------------------------------------ real Ray, no engine
@NEEDS_PAIR
def test_a_failing_cell_is_filed_and_retried_through_real_ray(ray_session, tmp_path):
    """A prompts file that vanishes after planning: every attempt of the cell fails in its Ray task (before any
    engine), each failure is a stored failed run with its error, attempts = 1 + --retries, exit 1."""
    from draftfit.acceptance.store import MeasurementStore

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def f(x):"}\n')
    store = tmp_path / "s.sqlite"
    from draftfit.sweep import plan_measure_cells, run_sweep

    cells = plan_measure_cells(TARGET, ["ngram"], ["code"], [0.0], k=2, num_prompts=1, max_tokens=8,
                               prompts_file=str(f))
    f.unlink()
    result = run_sweep(cells, store_path=str(store), retries=2)
    assert result.backend == "ray" and result.device == "cpu" and not result.started_local_ray
    (cell,) = result.cells
    assert (cell.status, cell.attempts, len(cell.run_ids)) == ("failed", 3, 3)
    assert "prompts" in cell.error.lower()
    with MeasurementStore(store) as s:
        rows = s.runs()
    assert [r["status"] for r in rows] == ["failed"] * 3 and [r["extra"]["sweep"]["attempt"] for r in rows] == [1, 2, 3]
    assert rows[0]["draft"] == "ngram" and rows[0]["prompt_set_hash"].startswith("file:")


def test_calibration_cells_through_real_ray_file_lanes_and_resume(ray_session, tmp_path):
    """Calibration cells as Ray tasks (a real vLLM calibration does not fit CI on CPU): each task runs
    calibrate_worker.run_lane; a budget too short for any engine makes run_lane skip it, which the sweep files
    as a failed lane and retries. A cell whose lane file says ok is skipped, and the ok lanes are ingested into a
    step-cost table as `draftfit calibrate --ingest` does."""
    from test_calibrate import _lane_file

    from draftfit.cli import cli
    from draftfit.sweep import plan_calibration_cells

    lanes = tmp_path / "lanes"
    argv = ["sweep", "Llama-3.1-8B", "--calibrate", "--drafts", "Llama-3.2-1B", "--k", "2,4", "--batch", "1,32",
            "--budget-s", "1", "--retries", "0", "--lanes-dir", str(lanes), "--json"]
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)  # one object: the sweep, with error and fix
    assert "3 of 3 sweep cells failed" in out["error"] and out["fix"]
    assert [ln for ln in res.stderr.splitlines() if ln.strip()] == [f"error: {out['error']} — {out['fix']}"]
    assert out["backend"] == "ray" and out["kind"] == "calibrate"
    assert [c["status"] for c in out["cells"]] == ["failed"] * 3 and {c["attempts"] for c in out["cells"]} == {1}
    assert "skipped" in out["cells"][0]["error"]
    cells = plan_calibration_cells("Llama-3.1-8B", ["Llama-3.2-1B"], [2, 4], batches=[1, 32], budget_s=1)
    assert sorted(p.name for p in lanes.glob("*.json")) == sorted(f"{c.cell_id}.json" for c in cells)
    # Put real lane results in place of three finished engines (the CPU run of the worker in test_calibrate).
    campaign = json.loads(_lane_file(tmp_path).read_text())["configs"]
    for cell, entry in zip(cells, campaign):
        (lanes / f"{cell.cell_id}.json").write_text(json.dumps({"configs": [entry]}))
    tables = tmp_path / "tables"
    res = CliRunner().invoke(cli, [*argv[:-1], "--tables-dir", str(tables)])  # the text view this time
    assert res.exit_code == 0, res.output
    assert "3 skipped (already stored), 0 failed" in " ".join(res.stdout.split())
    assert "Llama-3.1-8B + Llama-3.2-1B K=4" in res.stdout and "skipped" in res.stdout
    (written,) = tables.glob("*.json")
    assert f"table written: {written}" in res.stdout.replace("\n", "")
    table = json.loads(written.read_text())
    assert table["target"] == "Llama-3.1-8B" and table["draft"] == "Llama-3.2-1B"


# ------------------------------------------------------------------------------------------ kill and resume
def _sweep_cmd(store, address, *extra):
    return [sys.executable, "-m", "draftfit", "sweep", TARGET, "--drafts", f"{DRAFT},ngram", "--prompts", "2",
            "--max-tokens", "24", "--k", "4", "--store", str(store), "--ray-address", address, *extra]


_WORKERS = (b"draftfit.acceptance.measure.vllm", b"draftfit.acceptance.measure.fake")


def _measure_workers(tag: str) -> list[int]:
    """Measure workers alive on this machine that run this test's fake engine (`tag`, its ready_file path, is in
    the spec in their environment): the engine tests and tests/test_measure_fake.py may run workers of their own
    at the same time on the other xdist worker."""
    from draftfit.acceptance.measure.base import FAKE_ENV

    prefix, tag_b = f"{FAKE_ENV}=".encode(), tag.encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            if not (any(w in cmd for w in _WORKERS) and b"--worker" in cmd and not zombie):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError):
            continue
        if any(e.startswith(prefix) and tag_b in e for e in env):
            found.append(int(pid))
    return found


def _ok_runs(store: Path) -> list[dict]:
    from draftfit.acceptance.store import MeasurementStore

    if not store.exists():
        return []
    with MeasurementStore(store) as s:
        return [r for r in s.runs() if r["status"] == "ok"]


COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted", "per_position_accepted")


@NEEDS_PAIR
def test_sweep_killed_after_its_first_cell_resumes_and_matches_direct_measures(ray_session, fake_engine, tmp_path):
    """The pair and ngram, greedy, 2 prompts x 24 tokens, K=4, through one local Ray, on the fake engine:
    1. `draftfit sweep` (a subprocess joining the session's Ray) is SIGKILLed as soon as its first cell's run
       is stored; its other engine dies with it;
    2. the same sweep again runs only the missing cell (JSON: one skipped, one done, backend ray);
    3. both runs' counters equal a direct `measure` of the same cell, and the resume key is measure's provenance;
    4. a third sweep runs nothing (all skipped, no new run)."""
    from draftfit.acceptance.store import MeasurementStore
    from draftfit.cli import cli
    from draftfit.acceptance.measure.run import run_measurement

    # Slow enough that the second cell is running at the kill; the ready_file makes the spec this test's own.
    tag = str(tmp_path / "fake-engine-up")
    fake_engine(batch_s=2.0, curves={"ngram": (0.5, 0.3)}, ready_file=tag)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    store = tmp_path / "s.sqlite"
    proc = subprocess.Popen(_sweep_cmd(store, ray_session, "--json"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 300
        seen = False  # this test's engines found running: the scan after the kill can fail
        while time.monotonic() < deadline and proc.poll() is None and not _ok_runs(store):
            seen = seen or bool(_measure_workers(tag))
            time.sleep(0.2)
        assert seen, "no measure worker of this sweep was found while it ran: the scan below would pass vacuously"
        assert _ok_runs(store), f"no cell landed (exit {proc.poll()}: {proc.stderr.read()[-2000:] if proc.poll() is not None else ''})"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    for _ in range(300):  # Ray ends a dead driver's tasks; the engine dies with its task (PR_SET_PDEATHSIG)
        if not _measure_workers(tag):
            break
        time.sleep(0.2)
    assert not _measure_workers(tag), "an engine of the killed sweep kept running"
    first = _ok_runs(store)
    assert len(first) == 1 and first[0]["vllm_version"] == "fake"

    res = subprocess.run(_sweep_cmd(store, ray_session, "--json"), capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["backend"] == "ray" and out["device"] == "cpu"
    status = {c["cell"]["draft"]: c["status"] for c in out["cells"]}
    assert sorted(status.values()) == ["done", "skipped"] and status[first[0]["draft"]] == "skipped"
    runs = {r["draft"]: r for r in _ok_runs(store)}
    assert sorted(runs) == sorted([DRAFT, "ngram"])

    direct = run_measurement(TARGET, DRAFT, workload="code", temperatures=[0.0], k=4, num_prompts=2, max_tokens=24,
                             store_path=str(tmp_path / "direct.sqlite"), progress=False)[0]
    ngram_direct = run_measurement(TARGET, "ngram", workload="code", temperatures=[0.0], k=4, num_prompts=2,
                                   max_tokens=24, store_path=str(tmp_path / "direct.sqlite"), progress=False)[0]
    assert direct.num_accepted != ngram_direct.num_accepted  # two drafts, two curves: a swap would show
    for draft, d in ((DRAFT, direct), ("ngram", ngram_direct)):
        for key in COUNTERS:
            assert runs[draft][key] == getattr(d, key), (draft, key)
    with MeasurementStore(tmp_path / "direct.sqlite") as d:
        direct_rows = {r["draft"]: r for r in d.runs()}
    # The sweep's resume key is draftfit measure's own provenance (a drift here would rerun every cell).
    for draft in (DRAFT, "ngram"):
        for key in ("target", "draft", "target_hash", "draft_hash", "prompt_set_hash", "num_prompts", "max_tokens",
                    "k"):
            assert runs[draft][key] == direct_rows[draft][key], (draft, key)

    n_before = len(MeasurementStore(store).runs())
    again = CliRunner().invoke(cli, _sweep_cmd(store, ray_session, "--json")[3:])
    assert again.exit_code == 0, again.output
    assert [c["status"] for c in json.loads(again.stdout)["cells"]] == ["skipped", "skipped"]
    assert len(MeasurementStore(store).runs()) == n_before
