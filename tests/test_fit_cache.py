"""The fitted step-cost overheads are cached on disk per fingerprint of the tables and the fitting code."""

from __future__ import annotations

import shutil

from draftfit.calibration.tables import CALIBRATION_DIR
from draftfit.speedup import stepcost


def _fresh():
    stepcost._FITTED = None
    stepcost._FITTED_BY_TABLES.clear()


def test_disk_cache_equals_a_refit_and_follows_the_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tables"
    folder.mkdir()
    for p in sorted(CALIBRATION_DIR.glob("*.json"))[:4]:
        shutil.copy(p, folder / p.name)
    _fresh()
    first = stepcost.fitted_overheads(folder)
    assert list((tmp_path / "cache" / "fitted-overheads").glob("*.json"))
    _fresh()
    assert stepcost.fitted_overheads(folder) == first  # read back from disk, exactly
    # a changed table is another fingerprint: refit, not the stale file
    victim = sorted(folder.glob("*.json"))[0]
    victim.unlink()
    _fresh()
    refit = stepcost.fitted_overheads(folder)
    assert refit != first
    assert len(list((tmp_path / "cache" / "fitted-overheads").glob("*.json"))) == 2
    # a damaged cache file means a refit, never an error
    for f in (tmp_path / "cache" / "fitted-overheads").glob("*.json"):
        f.write_text("{garbage")
    _fresh()
    assert stepcost.fitted_overheads(folder) == refit
