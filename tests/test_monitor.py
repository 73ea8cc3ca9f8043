"""monitor: Prometheus parsing of vLLM's spec-decode counters, K advice, and the CLI against a live HTTP endpoint."""

from __future__ import annotations

import http.server
import json
import threading
import time
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
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
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


# ----------------------------------------------------------------------------- V0 gauge, bounds, checks

V0_SAMPLE = DATA / "vllm_v0_spec_decode_metrics_synthetic.prom"


def test_v0_gauge_read_when_counters_absent():
    gauge_only = "\n".join(l for l in V0_SAMPLE.read_text().splitlines() if "_total" not in l) + "\n"
    r = monitor.reading_from_counters(monitor.counters_from_text(gauge_only), url="u", window="cumulative")
    assert r.acceptance_rate == pytest.approx(0.6125) and r.acceptance_source == "v0_gauge"
    assert r.advice is None and any("V0 engine" in n for n in r.notes)
    # V0 also had accepted/draft-token counters (no drafts counter): the counters win, and agree with the gauge.
    r = monitor.reading_from_counters(monitor.counters_from_text(V0_SAMPLE.read_text()), url="u",
                                      window="cumulative")
    assert r.acceptance_source == "counters" and r.acceptance_rate == pytest.approx(490 / 800)
    assert r.mean_acceptance_length is None and r.v0_acceptance_rate == pytest.approx(0.6125)


@pytest.mark.parametrize("text, expect", [
    ('vllm:spec_decode_num_drafts_total{engine="0"} NaN\n', "not a finite number"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} +Inf\n', "not a finite number"),
    ('vllm:spec_decode_num_accepted_tokens_total{engine="0"} -3\n', "negative"),
    ('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="5000000"} 1\n', "position label"),
    ('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="-1"} 1\n', "position label"),
    ('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1e3"} 1\n', "position label"),
    (f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{monitor.MAX_POSITIONS}"}} 1\n',
     "position label"),
    ('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0"} 1\n', "without a position label"),
    ("vllm:spec_decode_num_draft_tokens_total 40\nvllm:spec_decode_num_accepted_tokens_total 90\n",
     "90 accepted tokens but only 40 drafted"),
    ('vllm:spec_decode_num_drafts_total 100\nvllm:spec_decode_num_draft_tokens_total 400\n'
     'vllm:spec_decode_num_accepted_tokens_total 200\n'
     'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 50\n'
     'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 90\n', "position 1 accepted more often"),
    ("vllm:spec_decode_draft_acceptance_rate 2.5\n", "above 1"),
])
def test_absurd_counters_are_one_line_errors(text, expect):
    with pytest.raises(monitor.DraftfitError) as info:
        monitor.counters_from_text(text)
    line = info.value.one_line()
    assert expect in line and "\n" not in line


def test_largest_position_accepted_and_small_race_tolerated():
    top = monitor.MAX_POSITIONS - 1
    c = monitor.counters_from_text(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{top}"}} 0\n')
    assert len(c.accepted_per_pos) == monitor.MAX_POSITIONS
    # A scrape during an update: accepted one step ahead of drafted, within the tolerance.
    c = monitor.counters_from_text("vllm:spec_decode_num_draft_tokens_total 4000\n"
                                   "vllm:spec_decode_num_accepted_tokens_total 4004\n")
    r = monitor.reading_from_counters(c, url="u", window="cumulative")
    assert r.acceptance_rate == 1.0


def test_parser_is_linear_on_hostile_lines():
    import time

    hostile = "\n".join([
        "x{" + 'a="}",' * 20000 + " 1",  # many closing braces, no end
        "x{" + 'a="' + "\\" * 50000,  # an endless escape run
        "x " + "9" * 100000,  # a very long number
        "y{" + "}" * 100000 + " 1",
    ] * 5)
    t = time.monotonic()
    samples = monitor.parse_prometheus(hostile)
    assert time.monotonic() - t < 2.0
    assert [s.name for s in samples] == ["x"] * 5  # only the long number parses (to a float)
    assert monitor.parse_prometheus('x{a="\\N\\x\\u12"} 1\n')[0].labels == {"a": "\\N\\x\\u12"}  # no crash


def test_watch_survives_a_counter_reset(monkeypatch):
    pages = iter([SYNTHETIC, SYNTHETIC.replace("} 100.0", "} 1.0").replace("} 400.0", "} 4.0")
                  .replace("} 200.0", "} 2.0").replace("} 160.0", "} 1.0")
                  .replace('"0"} 80.0', '"0"} 1.0').replace('"0"} 70.0', '"0"} 1.0')
                  .replace('"1"} 60.0', '"1"} 0.0').replace('"1"} 50.0', '"1"} 0.0')
                  .replace('"2"} 40.0', '"2"} 0.0').replace('"2"} 30.0', '"2"} 0.0')
                  .replace('"3"} 20.0', '"3"} 0.0').replace('"3"} 10.0', '"3"} 0.0')])
    monkeypatch.setattr(monitor, "fetch_metrics", lambda url, timeout_s=10.0: next(pages))
    (r,) = list(monitor.watch("http://h:1", 0.0, count=1))
    assert r.num_drafts == 2 and "restarted" in r.notes[0] and r.acceptance_rate is not None


def test_metrics_url_rejects_other_schemes():
    for bad in ("file:///etc/passwd", "gopher://h/", "http://h/\nx", ""):
        with pytest.raises(monitor.DraftfitError):
            monitor.metrics_url(bad)


# --------------------------------------------------------- a hostile /metrics server on 127.0.0.1

_STOP = threading.Event()


def _metrics_page(extra: str = "") -> bytes:
    return (SYNTHETIC + extra).encode()


class _HostileHandler(http.server.BaseHTTPRequestHandler):
    """Each first path segment is one malformation: GET /<case>/metrics."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: bytes, ctype: str | None = "text/plain; version=0.0.4", length=True,
              headers: dict | None = None):
        self.send_response(code)
        if ctype:
            self.send_header("Content-Type", ctype)
        if length is True:
            self.send_header("Content-Length", str(len(body)))
        elif length is not None:
            self.send_header("Content-Length", str(length))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if length is None:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _trickle(self, data: bytes, pause: float = 0.05) -> None:
        try:
            while not _STOP.is_set():
                for ch in data:
                    if _STOP.is_set():
                        return
                    self.wfile.write(bytes([ch]))
                    self.wfile.flush()
                    time.sleep(pause)
        except OSError:
            return

    def do_GET(self):  # noqa: N802 - http.server API
        case = self.path.strip("/").split("/")[0]
        port = self.server.server_address[1]
        if case == "ok":
            return self._send(200, _metrics_page())
        if case == "v0":
            return self._send(200, V0_SAMPLE.read_bytes())
        if case == "real":
            return self._send(200, REAL_SAMPLE.read_bytes())
        if case == "garbage":
            return self._send(200, b"<html><body><h1>Welcome to nginx!</h1>\n</body></html>\n", "text/html")
        if case == "binary":
            return self._send(200, bytes(range(256)) * 64, "text/plain")
        if case == "nul":
            return self._send(200, b"vllm:x 1\n\0\0\0\n")
        if case == "nan":
            return self._send(200, _metrics_page('vllm:spec_decode_num_draft_tokens_total{engine="2"} NaN\n'))
        if case == "position":
            return self._send(200, _metrics_page(
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="5000000"} 1.0\n'))
        if case == "accepted_gt_drafted":
            return self._send(200, b"vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 40\n"
                                   b"vllm:spec_decode_num_accepted_tokens_total 90\n")
        if case == "slow_body":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.flush()
            return self._trickle(b"# trickle\n")
        if case == "slow_headers":
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            return self._trickle(b"X-Slow: a\r\n")
        if case == "silent":
            _STOP.wait(30)
            return None
        if case == "redirect_off_host":
            return self._send(302, b"", headers={"Location": f"http://localhost:{port}/ok/metrics"})
        if case == "redirect_same_host":
            return self._send(302, b"", headers={"Location": "/ok/metrics"})
        if case == "redirect_loop":
            return self._send(302, b"", headers={"Location": f"/redirect_loop/metrics?{time.monotonic_ns()}"})
        if case == "close":
            self.close_connection = True
            self.connection.shutdown(2)
            return None
        if case == "huge":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Connection", "close")
            self.end_headers()
            line = b"# " + b"x" * 1022 + b"\n"
            try:
                for _ in range(64 * 1024):  # 64 MiB if nobody stops reading
                    if _STOP.is_set():
                        return None
                    self.wfile.write(line)
            except OSError:
                return None
            return None
        if case == "huge_length":
            return self._send(200, b"", length=10**12)
        if case == "truncated":
            self.close_connection = True
            return self._send(200, b"vllm:x 1\n", length=10000)
        if case == "not_found":
            return self._send(404, b"not here", "text/plain")
        if case == "server_error":
            return self._send(500, b"boom", "text/plain")
        if case == "empty":
            return self._send(200, b"")
        if case == "json":
            return self._send(200, b'{"acceptance": 0.9}', "application/json")
        return self._send(404, b"unknown case")


@pytest.fixture()
def hostile_server():
    _STOP.clear()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HostileHandler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    _STOP.set()
    srv.shutdown()
    srv.server_close()


MALFORMED = {
    "garbage": "no Prometheus samples",
    "binary": "not UTF-8",
    "nul": "NUL bytes",
    "nan": "not a finite number",
    "position": "position label 5000000",
    "accepted_gt_drafted": "90 accepted tokens but only 40 drafted",
    "slow_body": "timed out after 1.5s",
    "slow_headers": "timed out after 1.5s",
    "silent": "timed out after 1.5s",
    "redirect_off_host": "to another host",
    "redirect_loop": "HTTP 302",
    "close": "cannot read",
    "huge": "larger than 8 MiB",
    "huge_length": "larger than 8 MiB",
    "truncated": "closed",
    "not_found": "HTTP 404",
    "server_error": "HTTP 500",
    "empty": "empty",
    "json": "Content-Type application/json",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_cli_malformed_metrics_one_line_nonzero_no_hang(hostile_server, case):
    t0 = time.monotonic()
    res = CliRunner().invoke(cli, ["monitor", f"{hostile_server}/{case}", "--once", "--timeout", "1.5"])
    elapsed = time.monotonic() - t0
    _assert_one_error_line(res, MALFORMED[case])
    assert res.stdout.strip() == ""
    assert elapsed < 5.0, f"{case} took {elapsed:.1f}s"


def _assert_one_error_line(res, expect: str) -> None:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code != 0, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # no uncaught exception
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert expect in lines[0], lines[0]
    assert "Traceback" not in res.output and "internal error" not in res.output


def test_cli_interval_mode_fails_the_same_way(hostile_server):
    for extra in ([], ["--json"]):
        res = CliRunner().invoke(cli, ["monitor", f"{hostile_server}/position", "--interval", "0.05", "--count", "1",
                                       *extra])
        _assert_one_error_line(res, "position label 5000000")


def test_cli_same_host_redirect_and_v0_server(hostile_server):
    res = CliRunner().invoke(cli, ["monitor", f"{hostile_server}/redirect_same_host", "--once", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["num_drafts"] == 200
    res = CliRunner().invoke(cli, ["monitor", f"{hostile_server}/v0", "--once"])
    assert res.exit_code == 0, res.output
    assert "acceptance rate 0.613 (490/800 draft tokens)" in res.output and "V0 gauge" in res.output
    if REAL_SAMPLE.exists():  # the real vllm-cpu page passes every check
        res = CliRunner().invoke(cli, ["monitor", f"{hostile_server}/real", "--once", "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["num_accepted"] == 49


@pytest.mark.parametrize("case", ["position", "slow_body", "redirect_off_host"])
def test_subprocess_monitor_malformed(hostile_server, case):
    """The real process: one line on stderr, exit non-zero, within the timeout."""
    import subprocess
    import sys

    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "draftfit", "monitor", f"{hostile_server}/{case}", "--once",
                          "--timeout", "1.5"], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: "), run.stderr
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr and time.monotonic() - t0 < 15


def test_position_label_with_trailing_newline_refused():
    with pytest.raises(monitor.DraftfitError, match="position label"):
        monitor.counters_from_text('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1\\n"} 1\n')
