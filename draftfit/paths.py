"""Where draftfit finds its embedded data and where it caches downloads."""

from __future__ import annotations

import os
from pathlib import Path

# The repo root: catalogs/ and data/ sit beside the package (editable install), or DRAFTFIT_HOME.
PROJECT_ROOT = Path(os.environ.get("DRAFTFIT_HOME", Path(__file__).resolve().parent.parent))
CATALOG_DIR = PROJECT_ROOT / "catalogs"
DATA_DIR = PROJECT_ROOT / "data"


def cache_dir() -> Path:
    """Downloads and converted models, keyed by hash; shared by every clone of the repo."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "draftfit"
    path = Path(os.environ.get("DRAFTFIT_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_store_path() -> Path:
    """The SQLite measurement store (overridable per command with --store)."""
    return Path(os.environ.get("DRAFTFIT_STORE", cache_dir() / "measurements.sqlite"))
