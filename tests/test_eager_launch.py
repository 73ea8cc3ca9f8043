"""Forward passes without CUDA graphs (issue 16, phases GX/GX3/GX4): bench/eager_launch.py's derivation and scoring,
the GX4 pre-registration (the library's prediction, written before the phase ran), and the script's hostile inputs."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import eager_launch  # noqa: E402
from draftfit.speedup.stepcost import EAGER_HOST_LAYER_MS  # noqa: E402



def test_every_probe_step_is_scored_and_the_constants_come_from_batch_one():
    text, figures = eager_launch.render()
    steps = eager_launch.probe_steps(eager_launch._files())
    assert len(steps) >= 28  # GX: 7 + 4 + 7 batch sizes, GX3: 2 + 3 + 2 + 3
    assert sum(s["mode"] == "eager" for s in steps) >= 8
    # The six batch-1 steps of the three models behind the constants set them; every other step is a check.
    assert figures["checks"] == len(steps) - 6
    assert text.count("sets a constant") == 6
    for kind, ms in EAGER_HOST_LAYER_MS.items():
        assert f"| {kind} |" in text and f"| {ms:.2f} |" in text
    # Qwen1.5-MoE-A2.7B's eager steps over 128-640 sequences, none used for a constant, are within 10 %.
    qm = [s for s in steps if s["model"] == "Qwen1.5-MoE-A2.7B" and s["mode"] == "eager" and s["batch"] > 1]
    for s in qm:
        assert abs(eager_launch.predicted_step_ms(s["model"], "eager", s["batch"]) / s["step_ms"] - 1) < 0.10


def test_gx4_prediction_is_the_library_path_and_was_written_before_its_raw_file():
    rec = json.loads(eager_launch.PREDICTION.read_text())
    assert rec["eager_host_layer_ms"] == EAGER_HOST_LAYER_MS
    wanted = {(m, mode, b) for m, mode, batches in eager_launch.GX4 for b in batches}
    assert {(p["model"], p["mode"], p["batch"]) for p in rec["predictions"]} == wanted
    # With the overheads fitted when it was written (stored beside it: later tables move the fit a little).
    for p in rec["predictions"]:
        assert eager_launch.predicted_step_ms(p["model"], p["mode"], p["batch"], rec["overheads"]) \
            == pytest.approx(p["step_ms"], abs=1e-3)
    # The models GX4 measures set no constant.
    assert not {m for m, _, _ in eager_launch.GX4} & eager_launch.SETS_CONSTANT
    # Phase GX4 ran its two eager engines (the graphed Qwen3-8B engine had no device time left): four steps scored
    # against the committed numbers, which stay as written.
    text, figures = eager_launch.render()
    assert figures["preregistered"] == 4 and figures["preregistered_within_25"] == 2
    assert text.count("| pre-registered |") == 4 and "The constants were not changed after this score" in text
