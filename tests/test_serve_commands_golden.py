"""draftfit's serve-cmd output against the commands vLLM 0.34's own parser accepted on the H200 (issue 38 item 3).

The golden is bench/vllm034/parse_commands.py's report from a device lease (bench/serve_commands.GOLDEN). Every
command that parsed and built its EngineArgs/SpeculativeConfig there must still be what draftfit emits today: a
changed command has not been checked by vLLM 0.34 and needs the device check again (docs/VLLM_0.34_INSTALL.md)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import serve_commands as sc  # noqa: E402


def _golden() -> dict:
    if not os.path.exists(sc.GOLDEN):
        pytest.skip(f"no device golden yet: {os.path.relpath(sc.GOLDEN, ROOT)} is written from an H200 lease "
                    "(bench/vllm034/parse_commands.py under vLLM 0.34; docs/VLLM_0.34_INSTALL.md)")
    return json.load(open(sc.GOLDEN))


def compare(current: list[dict], golden: dict) -> list[str]:
    """Problems, one line each: a case the device rejected, a case whose command changed since the device check,
    a case the golden lacks."""
    by_id = {r.get("id"): r for r in golden.get("results", [])}
    problems = []
    for c in current:
        g = by_id.get(c["id"])
        if g is None:
            problems.append(f"{c['id']}: not in the golden (new case: rerun the device check)")
        elif not g.get("ok"):
            problems.append(f"{c['id']}: vLLM {golden.get('vllm')} rejected it at {g.get('stage')}: {g.get('error')}")
        elif g.get("command") != c["command"]:
            problems.append(f"{c['id']}: command changed since the device check:\n  now    {c['command']}\n"
                            f"  golden {g.get('command')}")
    return problems


def test_serve_commands_match_device_golden():
    golden = _golden()
    assert str(golden.get("vllm", "")).startswith("0.34"), golden.get("vllm")
    problems = compare(sc.serve_commands(), golden)
    assert not problems, "\n".join(problems)


def test_compare_flags_changed_rejected_and_new_cases():
    # logic check of compare() on a hand-made golden (runs while the real golden is absent)
    cur = [{"id": "a", "command": "vllm serve X --k 1"}, {"id": "b", "command": "vllm serve Y"},
           {"id": "c", "command": "vllm serve Z"}, {"id": "d", "command": "vllm serve W"}]
    gold = {"vllm": "0.34.0", "results": [
        {"id": "a", "ok": True, "command": "vllm serve X --k 1"},
        {"id": "b", "ok": True, "command": "vllm serve Y --old"},
        {"id": "c", "ok": False, "stage": "parse", "error": "argparse exit 2", "command": "vllm serve Z"}]}
    out = compare(cur, gold)
    assert [p.split(":")[0] for p in out] == ["b", "c", "d"]


def test_serve_commands_cover_each_method():
    cmds = sc.serve_commands()
    assert len(cmds) == len(sc.CASES)
    methods = {json.loads(c["argv"][c["argv"].index("--speculative-config") + 1])["method"] for c in cmds}
    assert methods == {"draft_model", "ngram", "suffix", "eagle3"}
    for c in cmds:
        assert c["command"].startswith("vllm serve ")
        # every hub id the command names has a config folder standing in for it on the offline device
        for ref, name in c["models"].items():
            assert (ROOT / "draftfit" / "data" / "calibration" / "configs" / name / "config.json").exists(), (ref, name)
