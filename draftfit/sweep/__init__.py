"""`draftfit sweep`: many measurement or calibration cells as Ray tasks (a local Ray by default, a cluster by
address), each result filed as it lands, resumable through the store. See docs/SWEEP.md."""

from draftfit.sweep.plan import (CalibrationCell, MeasureCell, Placement, measure_provenance, plan_calibration_cells,
                                 plan_measure_cells, plan_placement)
from draftfit.sweep.run import CellOutcome, SweepProgress, SweepResult, run_sweep

__all__ = ["CalibrationCell", "CellOutcome", "MeasureCell", "Placement", "SweepProgress", "SweepResult",
           "measure_provenance", "plan_calibration_cells", "plan_measure_cells", "plan_placement", "run_sweep"]
