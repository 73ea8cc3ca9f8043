"""An ordinary install works: build the wheel and sdist, install the wheel into a fresh venv, run from elsewhere.

Slow-ish (~30-60 s: a build and a venv) but part of the suite: the catalogs and the runtime data must be package
data, found through the installed package, never through a source checkout beside it.
"""

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("build")


def _run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_wheel_installed_into_a_fresh_venv_runs_rank_from_another_folder(tmp_path):
    dist = tmp_path / "dist"
    # --no-isolation: the venv's setuptools builds it (no index needed); the warning check covers the license.
    built = _run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "-o", str(dist), str(ROOT)],
                 cwd=tmp_path)
    log = built.stdout + built.stderr
    assert "SetuptoolsDeprecationWarning" not in log and "License classifiers are deprecated" not in log
    assert "is absent from the `packages` configuration" not in log
    wheel = next(dist.glob("draftfit-*.whl"))
    sdist = next(dist.glob("draftfit-*.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    for need in ("draftfit/catalogs/models.yaml", "draftfit/catalogs/gpus.yaml", "draftfit/catalogs/tokenizers.yaml",
                 "draftfit/catalogs/acceptance_priors.yaml", "draftfit/data/prompts/code.jsonl",
                 "draftfit/data/reference/acceptance/code_T0.json"):
        assert need in names, need
    assert any(n.startswith("draftfit/data/calibration/") and n.endswith("__tp1.json") for n in names)
    assert any(n.startswith("draftfit/data/calibration/configs/") for n in names)
    assert not any("/raw/" in n for n in names)  # raw GPU campaign files stay in the repository
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Classifier: License" not in meta
    assert any(m.endswith("draftfit/catalogs/models.yaml") for m in tarfile.open(sdist).getnames())

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, clear=True)
    py = env_dir / "bin" / "python"
    # The light dependencies from the index (or the local wheel folder); nothing from this checkout.
    _run([str(py), "-m", "pip", "install", "-q", "--find-links", str(dist), str(wheel)], cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DRAFTFIT_HOME", "VIRTUAL_ENV")}
    env["DRAFTFIT_STORE"] = str(tmp_path / "store.sqlite")
    exe = env_dir / "bin" / "draftfit"
    where = _run([str(py), "-c", "import draftfit.paths as p; print(p.CATALOG_DIR)"], cwd=elsewhere, env=env)
    assert str(env_dir) in where.stdout and str(ROOT) not in where.stdout
    rank = _run([str(exe), "rank", "--target", "Llama-3.1-70B"], cwd=elsewhere, env=env)
    assert "Llama-3.2-1B" in rank.stdout and "vllm serve" in rank.stdout
    listing = _run([str(exe), "catalog", "list"], cwd=elsewhere, env=env)
    assert "Llama-3.1-70B" in listing.stdout and "Qwen3-8B" in listing.stdout
