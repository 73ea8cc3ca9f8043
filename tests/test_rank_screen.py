"""rank's default screen against goldens captured in a real terminal (tmux, 80 and 200 columns).

The goldens are what a person sees: tests/data/rank_screen/capture.sh regenerates them with tmux. Here the same
command renders through click at those widths (COLUMNS) and must match line for line; only the timing varies.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.cli import cli

GOLDENS = Path(__file__).parent / "data" / "rank_screen"
REGEN = "bash tests/data/rank_screen/capture.sh .venv/bin/python"


def _normalise(text: str) -> list[str]:
    text = re.sub(r"ranked (\d+) drafts in \d+\.\d+s", r"ranked \1 drafts in <t>s", text)
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _render(width: int) -> str:
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-70B"], env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    return res.output


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
    assert "[0.84-2.02]" in text.split("Serve it")[0]  # the band is on the winner's line


def test_80_columns_fit_except_the_copyable_command():
    for line in _normalise(_render(80)):
        assert len(line) <= 80 or line.startswith("vllm serve "), line


def test_default_hides_incompatible_and_all_lists_them():
    out = _render(200)
    assert "Qwen2.5-0.5B" not in out and "36 more drafts not shown (36 incompatible); `--all` lists them" in out
    res = CliRunner().invoke(cli, ["rank", "--target", "Llama-3.1-70B", "--all"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "Qwen2.5-0.5B" in res.output and "not shown" not in res.output
