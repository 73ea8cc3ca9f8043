"""The fitted step-cost overheads are cached on disk per fingerprint of the tables and the fitting code."""

from __future__ import annotations

import shutil
from pathlib import Path

from draftfit.calibration.tables import CALIBRATION_DIR
from draftfit.speedup import stepcost


LEGACY_CODE = Path(__file__).parent / "data" / "reference" / "legacy_code_96tok.json"


def _fresh():
    stepcost._FITTED = {}
    stepcost._FITTED_BY_TABLES.clear()


def _four_tables(tmp_path, monkeypatch):
    """A table folder of four shipped tables, a fresh disk cache beside it and no fit in memory."""
    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tables"
    folder.mkdir()
    for p in sorted(CALIBRATION_DIR.glob("*.json"))[:4]:
        shutil.copy(p, folder / p.name)
    _fresh()
    return folder


def test_disk_cache_equals_a_refit_and_follows_the_tables(tmp_path, monkeypatch):
    folder = _four_tables(tmp_path, monkeypatch)
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


def test_method_replay_disk_cache_equals_a_fresh_replay(tmp_path, monkeypatch):
    """The ngram/suffix priors' replay counters are kept on disk; read back they give the same prior, and a
    damaged file means a replay, never an error."""
    from draftfit.acceptance import method_prior as mp

    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path / "cache"))
    # The small legacy reference (6 outputs of 96 tokens) as the code reference: the cache logic is under test, and a
    # replay of the 64 full-length shipped outputs costs ~50 s. No shipped summaries, else rank reads those.
    refs = tmp_path / "ngram"
    refs.mkdir()
    shutil.copy(LEGACY_CODE, refs / "code.json")
    monkeypatch.setattr(mp, "NGRAM_DIR", refs)
    monkeypatch.setattr(mp, "REPLAY_DIR", tmp_path / "no-shipped-summaries")
    mp._records.cache_clear()
    mp.method_acceptance.cache_clear()
    fresh = {m: mp.method_acceptance(m, "code") for m in ("ngram", "suffix")}
    files = list((tmp_path / "cache" / "method-replay").glob("*.json"))
    assert len(files) == 2
    mp.method_acceptance.cache_clear()
    cached = {m: mp.method_acceptance(m, "code") for m in ("ngram", "suffix")}
    assert cached == fresh
    assert fresh["suffix"].alpha != fresh["ngram"].alpha  # two methods, two keys: not one file read twice
    for f in files:
        f.write_text("{garbage")
    mp.method_acceptance.cache_clear()
    assert {m: mp.method_acceptance(m, "code") for m in ("ngram", "suffix")} == fresh
    mp.method_acceptance.cache_clear()
    mp._records.cache_clear()  # the next test reads the shipped references again


def test_a_cached_fit_of_another_term_list_is_never_read(tmp_path, monkeypatch):
    """The disk key names the fitted terms, and a cached fit whose terms are not today's (one of a removed term, such
    as draft_seq_ms before the ablation of docs/benchmarks.md speedup-ablation) is refitted, not read back."""
    folder = _four_tables(tmp_path, monkeypatch)
    fresh = stepcost.fitted_overheads(folder)
    key = stepcost._disk_key(folder, "0.26")
    monkeypatch.setattr(stepcost, "PRIOR_OVERHEADS", {**stepcost.PRIOR_OVERHEADS, "draft_seq_ms": 0.01})
    assert stepcost._disk_key(folder, "0.26") != key  # another term list, another file
    monkeypatch.undo()
    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path / "cache"))
    stale = dict(fresh, draft_seq_ms=0.5, spec_ms=99.0)
    stepcost._write_disk_fit(key, stale)  # a stale file under today's key, as an old build could have left
    _fresh()
    assert stepcost._read_disk_fit(key) is None
    assert stepcost.fitted_overheads(folder) == fresh
