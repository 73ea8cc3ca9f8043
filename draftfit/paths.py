"""Where draftfit finds its embedded data and where it caches downloads.

The catalogs (`draftfit/catalogs/*.yaml`) and the data read at run time (`draftfit/data/`: calibration tables
and configs, reference runs, prompts, the trained model, predictions) are package data, so an installed wheel
finds them wherever it runs. DRAFTFIT_HOME=<folder> points both at `<folder>/catalogs` and `<folder>/data`
instead (a checkout with edited catalogs, a test fixture).

Raw GPU campaign files (data/calibration/raw/, read only by bench/ and tests) stay in the repository, outside
the package: RAW_CALIBRATION_DIR.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

# The installed package folder (a plain folder for a wheel or an editable install; draftfit is not zip-safe).
PACKAGE_DIR = Path(str(resources.files("draftfit")))
_HOME = os.environ.get("DRAFTFIT_HOME")
CATALOG_DIR = Path(_HOME) / "catalogs" if _HOME else PACKAGE_DIR / "catalogs"
DATA_DIR = Path(_HOME) / "data" if _HOME else PACKAGE_DIR / "data"
# The source checkout (bench/, tests/, raw campaign files); meaningless for an installed wheel.
PROJECT_ROOT = PACKAGE_DIR.parent
RAW_CALIBRATION_DIR = PROJECT_ROOT / "data" / "calibration" / "raw"


def cache_dir() -> Path:
    """Downloads and converted models, keyed by hash; shared by every clone of the repo."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "draftfit"
    path = Path(os.environ.get("DRAFTFIT_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_store_path() -> Path:
    """The SQLite measurement store (overridable per command with --store)."""
    return Path(os.environ.get("DRAFTFIT_STORE", cache_dir() / "measurements.sqlite"))
