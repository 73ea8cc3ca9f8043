"""The published-speedup data (draftfit/data/reference/speedup_published.yaml) and its bench: every row says where it
was read and what was read, none comes from the held-out SpecDecode-Bench, and the bench scores them through the CLI's
own prediction path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import published_speedups as ps  # noqa: E402

ROWS = ps.load_rows(ps.DATA)
METHODS = {"draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"}


def test_enough_rows_from_independent_sources():
    assert len(ROWS) >= 20
    assert len({r["source"] for r in ROWS}) >= 4


@pytest.mark.parametrize("row", ROWS, ids=[str(r.get("id")) for r in ROWS])
def test_each_row_is_sourced_and_complete(row):
    for key in ("id", "source", "url", "gpu", "target", "drafter", "method", "k", "load", "speedup", "speedup_of",
                "excerpt"):
        assert key in row, f"{row.get('id')}: no {key}"
    assert row["url"].startswith("https://")
    assert row["method"] in METHODS
    assert isinstance(row["speedup"], (int, float)) and 0 < row["speedup"] < 20
    assert row["excerpt"].strip(), "say what was read"
    # arXiv 2601.11580 (SpecDecode-Bench) stays an external check: never data here
    assert "2601.11580" not in row["url"] and "specdecode-bench" not in str(row).lower()


def test_ids_are_unique():
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))


def test_a_catalog_row_is_scored_and_an_unstated_load_is_not():
    row = {"id": "x", "gpu": "H100", "tp": 1, "target": "meta-llama/Llama-3.1-8B-Instruct",
           "drafter": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "method": "eagle3", "k": 3, "workload": "chat",
           "temperature": 0, "load": {"batch_size": 1}, "speedup": 2.0}
    args, why = ps.case_of(row)
    assert why == "" and args["target"] == "Llama-3.1-8B" and args["draft"] == "EAGLE3-Llama-3.1-8B"
    assert args["gpu"] == "H100-80GB" and args["batch"] == 1
    pred = ps._speedup(args)
    assert pred["speedup"] > 1 and pred["low"] <= pred["speedup"] <= pred["high"]
    args, why = ps.case_of(dict(row, load="not stated"))
    assert args is None and "load" in why
    args, why = ps.case_of(dict(row, target="some-org/NotAModel-9B"))
    assert args is None and "target" in why


def test_the_scored_share_is_not_empty():
    """A data file whose rows the bench cannot map (names, GPUs, loads) would score nothing and say nothing."""
    scored = [r for r in ROWS if ps.case_of(r)[0] is not None]
    assert len(scored) >= 10
