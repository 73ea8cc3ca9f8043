"""What a cell's Ray task runs, on whichever node Ray chose. Plain functions (ray.remote wraps them in
run.py), so that they run and are tested without Ray too.

A measurement task runs draftfit measure's own library path (run_measurement) into a store of its own in a
temporary folder, and returns that store's rows: the driver files them in the user's store (the node may not
see the driver's disk, and one writer keeps the sweep's bookkeeping in one place). A calibration task runs
draftfit calibrate's lane driver (calibration.worker.run_lane) on one engine spec and returns the lane report.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from draftfit.errors import DraftfitError
from draftfit.acceptance.store import MeasurementStore
from draftfit.calibration import tables as cal
from draftfit.calibration import worker
from draftfit.acceptance.measure.run import run_measurement


def measure_task(cell: dict, engine_args: dict, env: dict) -> dict:
    """One MeasureCell (as a dict) -> {'status': 'ok'|'failed', 'error', 'rows', 'node', 'wall_s'}.

    A failure that draftfit measure knows (the engine died: out of KV space, out of memory, a crash) comes
    back as its failed runs with the error line; anything else raises, and the driver records it."""

    os.environ.update({k: str(v) for k, v in env.items()})
    if engine_args.get("distributed_executor_backend") == "ray":
        # The engine runs in a subprocess of this task: point vLLM's Ray executor at this task's cluster.
        import ray

        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="draftfit-sweep-cell-") as tmp:
        store_path = Path(tmp) / "cell.sqlite"
        status, error = "ok", None
        try:
            run_measurement(cell["target"], cell["draft"], workload=cell["workload"],
                            temperatures=[float(cell["temperature"])], k=int(cell["k"]),
                            num_prompts=int(cell["num_prompts"]), max_tokens=int(cell["max_tokens"]),
                            seed=int(cell["seed"]), store_path=str(store_path), progress=False,
                            max_model_len=int(cell["max_model_len"]), prompts_file=cell.get("prompts_file"),
                            engine_args=engine_args or None)
        except DraftfitError as exc:  # stored as failed runs in the cell's store, with the engine's error line
            status, error = "failed", exc.one_line()
        with MeasurementStore(store_path) as store:
            rows = store.runs()
    return {"status": status, "error": error, "rows": rows, "node": socket.gethostname(),
            "wall_s": round(time.monotonic() - t0, 1)}


def calibration_lane(cell: dict, config_root: Path) -> dict:
    """The one-engine lane draftfit calibrate would run for this CalibrationCell (its engine_specs)."""

    target, draft = cal.model_spec(cell["target"]), cal.model_spec(cell["draft"])
    k = int(cell["k"])
    specs = cal.engine_specs(target, draft, ks=[k] if k else [], batches=cell["batches"], tp=int(cell["tp"]),
                             acceptance=float(cell["acceptance"]), config_root=config_root,
                             max_tokens=int(cell["max_tokens"]), repeats=int(cell["repeats"]),
                             engine_kwargs=dict(cell.get("engine_kwargs") or {}), include_baseline=k == 0)
    for spec in specs:
        spec["synthetic"] = bool(cell.get("synthetic", True))
    # cuda_visible_devices None: the worker keeps the CUDA_VISIBLE_DEVICES Ray set for this task's GPUs.
    return {"name": cell.get("cell_id", "sweep"), "deadline_unix": time.time() + float(cell["budget_s"]),
            "configs": specs, "cuda_visible_devices": None}


def calibrate_task(cell: dict, env: dict) -> dict:
    """One CalibrationCell (as a dict, with its cell_id) -> the lane report calibrate_worker.run_lane writes
    (status, timings, counters and memory lines of its engine), plus the node it ran on."""

    os.environ.update({k: str(v) for k, v in env.items()})
    with tempfile.TemporaryDirectory(prefix="draftfit-sweep-cal-") as tmp:
        lane = calibration_lane(cell, Path(tmp) / "configs")
        report = worker.run_lane(lane, str(Path(tmp) / "lane.json"), str(Path(tmp) / "engines"))
    report["node"] = socket.gethostname()
    return report


def cell_dict(cell) -> dict:
    d = asdict(cell)
    if hasattr(cell, "cell_id"):
        d["cell_id"] = cell.cell_id
    return d
