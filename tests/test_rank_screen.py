"""rank's default screen against goldens captured in a real terminal (tmux, 80 and 200 columns).

The goldens are what a person sees: tests/data/rank_screen/capture.sh regenerates them with tmux. Here the same
command runs in a fresh process at those widths (COLUMNS) and must match line for line; only the timing varies.
Both use an empty measurement store, so the screen depends on the repository alone (and a fresh process, so no
state another test left in this one leaks in).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

GOLDENS = Path(__file__).parent / "data" / "rank_screen"
REGEN = "bash tests/data/rank_screen/capture.sh .venv/bin/python"


def _normalise(text: str) -> list[str]:
    text = re.sub(r"ranked (\d+) drafts in \d+\.\d+s", r"ranked \1 drafts in <t>s", text)
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _render(width: int, *extra: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "COLUMNS": str(width), "DRAFTFIT_STORE": str(Path(tmp) / "store.sqlite")}
        env.pop("LINES", None)
        res = subprocess.run([sys.executable, "-m", "draftfit", "rank", "--target", "Llama-3.1-70B", *extra],
                             capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("width", [80, 200])
def test_screen_matches_terminal_golden(width):
    got = _normalise(_render(width))
    want = _normalise((GOLDENS / f"llama70b_{width}col.txt").read_text())
    assert got == want, f"rank's screen at {width} columns changed; look at it, then regenerate: {REGEN}"


def test_winner_and_command_in_first_25_lines_at_80_columns():
    head = _normalise((GOLDENS / "llama70b_80col.txt").read_text())[:25]
    assert any(line.startswith("Winner: Llama-3.2-1B") for line in head), head
    assert any(line.startswith("vllm serve ") for line in head), head
    text = " ".join(head)  # rich wraps long lines at spaces
    assert "draftfit measure" in text and "draftfit calibrate" in text  # what would narrow the band
    # the band is on the winner's line: "Winner: D (...): 1.23x [0.45-6.78] at batch 1"
    import re

    assert re.search(r"Winner: .*?: [0-9.]+x \[[0-9.]+-[0-9.]+\] at batch", text.split("Serve it")[0]), head


def test_80_columns_fit_except_the_copyable_command():
    for line in _normalise(_render(80)):
        assert len(line) <= 80 or line.startswith("vllm serve "), line


def test_default_hides_incompatible_and_all_lists_them():
    out = _render(200)
    assert "Qwen2.5-0.5B" not in out and "36 more drafts not shown (36 incompatible); `--all` lists them" in out
    out_all = _render(200, "--all")
    assert "Qwen2.5-0.5B" in out_all and "not shown" not in out_all
