"""Where draftfit finds its embedded data and where it caches downloads.

The catalogs (`draftfit/catalogs/*.yaml`) and the data read at run time (`draftfit/data/`: calibration tables
and configs, reference runs, prompts, the trained model, predictions) are package data, so an installed wheel
finds them wherever it runs. DRAFTFIT_HOME=<folder> points both at `<folder>/catalogs` and `<folder>/data`
instead (a checkout with edited catalogs, a test fixture).

Raw GPU campaign files (data/calibration/raw/, read only by bench/ and tests) stay in the repository, outside
the package: RAW_CALIBRATION_DIR.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from draftfit.errors import DraftfitError

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


def read_json(path: Path):
    """A cache file's JSON, or None when it is absent or unreadable (the caller recomputes)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, obj) -> None:
    """Write a cache file under a temporary name, then rename: a concurrent reader sees the old file or the whole
    new one. A read-only folder only costs the recomputation, so OSError is swallowed (and the temporary removed)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def default_store_path() -> Path:
    """The SQLite measurement store (overridable per command with --store)."""
    env = os.environ.get("DRAFTFIT_STORE")
    if env is not None and not env.strip():
        raise DraftfitError("DRAFTFIT_STORE is set but empty", fix="unset it (`unset DRAFTFIT_STORE`) or set it to a "
                            "file path, e.g. ~/.cache/draftfit/measurements.sqlite")
    return Path(env) if env is not None else cache_dir() / "measurements.sqlite"
