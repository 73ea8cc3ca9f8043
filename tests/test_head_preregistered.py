"""The pre-registered head-drafter checks (issue 16): MTP (phase HS) and EAGLE-3 (phase HE). Each committed
prediction is what the library predicts from the tables it names, the shipped raw engines score against it, and no
fit sees them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import preregister_head  # noqa: E402
from draftfit.calibration.tables import tables_digest  # noqa: E402

MTP = preregister_head.CASES["mtp"]
EAGLE3 = preregister_head.CASES["eagle3"]
EAGLE3_QWEN3 = preregister_head.CASES["eagle3-qwen3"]
CASES = [MTP, EAGLE3, EAGLE3_QWEN3]
RAW = [ROOT / "data" / "calibration" / "raw" / "2026-12-02" / f"{n}_gpu0.json" for n in ("HS", "HS2", "HSR", "HS4")]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_prediction_was_written_before_any_table_of_its_head_and_is_the_library_path(case):
    """A superseded record (the model changed after it was scored) is frozen: the library now predicts otherwise."""
    rec = json.loads(case.out.read_text())
    assert not any("MTP" in name or "Qwen3-Next" in name or "EAGLE" in name for name in rec["calibration_tables"])
    names, sha = tables_digest()
    if sha != rec["calibration_tables_sha256"]:
        pytest.skip("calibration tables changed since the prediction was written; the file is the frozen record")
    now = preregister_head.predict(case)
    if case.superseded:
        assert any(now["batches"][b]["per_k"][k]["speedup"] != pytest.approx(pk["speedup"], abs=1e-3)
                   for b, row in rec["prediction"]["batches"].items() for k, pk in row["per_k"].items())
        return
    for b, row in rec["prediction"]["batches"].items():
        assert now["batches"][b]["best_k"] == row["best_k"]
        for k, pk in row["per_k"].items():
            assert now["batches"][b]["per_k"][k]["speedup"] == pytest.approx(pk["speedup"], abs=1e-4)


def _speedup_rows(text: str) -> list[str]:
    """The scored points of a score section: table rows that start with a batch size (the KV rows start with an
    engine name, header and rule rows with letters and dashes)."""
    return [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]


def test_the_measured_engines_score_every_pre_registered_point():
    text, figures = preregister_head.score(MTP, RAW)
    assert figures["advice_cases"] == 4
    assert len(_speedup_rows(text)) == 12  # batch 1/8/32/128 x K 1-3, each measured
    assert 0 <= figures["within_15"] <= 1 and figures["mean_abs"] > 0
    assert "K=4 (measured, not pre-registered)" in text


def test_the_eagle3_checks_score_on_the_shipped_engines():
    """Phase HE (built on) and HQ (the pre-registered check: K=3 in the thirteenth session, K 1, 2, 4 and the
    baseline again in HQ2): every measured point is scored, the memory of every engine too."""
    raw = ROOT / "data" / "calibration" / "raw" / "2026-12-02"
    text, figures = preregister_head.score(EAGLE3, [raw / f"{n}_gpu0.json" for n in ("HE", "HE2", "HER")])
    assert figures["advice_cases"] == 4 and figures["kv_records"] == 10
    assert "Today's model on these engines (built on them, so not a held-out score)" in text
    text, figures = preregister_head.score(EAGLE3_QWEN3, [raw / "HQ_gpu0.json"])
    assert figures["kv_records"] == 2 and figures["kv_within_1"] == 2
    # Superseded since the graph-miss change of 2026-12-03: today's model is shown beside the frozen score.
    assert "judged on speculate-or-not only" in text and EAGLE3_QWEN3.superseded and "Today's model" in text
    text, figures = preregister_head.score(EAGLE3_QWEN3, [raw / "HQ_gpu0.json", raw / "HQ2_gpu0.json"])
    assert figures["kv_records"] == 6 and figures["advice_cases"] == 4
    assert "judged on speculate-or-not only" not in text  # K 1-4 measured: best K is judged
    assert len(_speedup_rows(text)) == 16  # batch 1/8/32/128 x K 1-4


def test_head_engines_enter_no_fit():
    """vLLM 0.26's timed heads (HE, HQ) stay out of draftfit/data/calibration; a later version's head or n-gram table
    (0.34's EAGLE-3 and n-gram K=3 on the H100, issue 38) serves its own layout, but no overhead fit or leave-one-out
    sees it (stepcost.calibration_points scores draft_model pairs only)."""
    from draftfit.calibration.tables import load_tables
    from draftfit.speedup.stepcost import calibration_points

    heads = [t for t in load_tables() if "EAGLE" in t.draft or t.draft in ("ngram", "suffix")]
    assert heads and all(t.modelled_vllm != "0.26" for t in heads)
    assert not list(calibration_points(heads, include_held_out=True))


def test_mtp_engines_enter_no_calibration_table():
    assert not list((ROOT / "draftfit" / "data" / "calibration").glob("*Qwen3-Next*.json"))


@pytest.mark.parametrize("case", ["other_pair", "missing", "not_json"])
def test_score_refuses_files_without_the_mtp_table_in_one_line(tmp_path, case):
    path = {"other_pair": ROOT / "data" / "calibration" / "raw" / "2026-12-02" / "M2c_gpu0.json",
            "missing": tmp_path / "nope.json", "not_json": tmp_path / "bad.json"}[case]
    if case == "not_json":
        path.write_text("{bad")
    res = subprocess.run([sys.executable, "bench/preregister_head.py", "--case", "mtp", "--no-readme", "--score", str(path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode != 0 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert ("expected one" if case == "other_pair" else "cannot read") in res.stderr


def test_head_drafters_say_the_prior_ran_pessimistic_on_the_one_head_measured():
    from draftfit.speedup.stepcost import step_cost_model

    head = step_cost_model("Qwen3-Next-80B-A3B", "Qwen3-Next-80B-A3B-MTP", "H200", batches=(1,), k_values=(2,))
    assert any(n.startswith("mtp drafter on vLLM's V1 model runner") for n in head.notes)
    pair = step_cost_model("Llama-3.1-70B", "Llama-3.2-1B", "H200", batches=(1,), k_values=(2,), tp=2)
    assert not any("head drafter" in n for n in pair.notes)


def test_rank_carries_the_head_note_on_the_head_row_only():
    res = subprocess.run([sys.executable, "-m", "draftfit", "rank", "--target", "Qwen3-Next-80B-A3B", "--gpu", "H200",
                          "--tp", "2", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    rows = {c["draft"]: c for c in json.loads(res.stdout)["candidates"]}
    assert any("head drafter timed" in n for n in rows["Qwen3-Next-80B-A3B-MTP"]["speedup_notes"])
    assert not any("head drafter" in n for name, c in rows.items() if name != "Qwen3-Next-80B-A3B-MTP"
                   for n in c["speedup_notes"])


@pytest.mark.parametrize("args", [["--case", "mtp", "--write"], ["--case", "eagle3", "--write"],
                                  ["--case", "mtp", "--no-readme"], ["--case", "mtp", "--write", "--score", "x.json"],
                                  ["--case", "mtp", "--bogus"], ["--write"], ["--case", "medusa"]],
                         ids=["write_over_mtp", "write_over_eagle3", "no_readme_alone", "write_and_score",
                              "unknown_option", "no_case", "unknown_case"])
def test_preregister_refuses_nonsense_in_one_line(args):
    # --write never rewrites the committed pre-registration; options that do nothing together are refused.
    before = {c.name: c.out.read_bytes() for c in CASES}
    res = subprocess.run([sys.executable, "bench/preregister_head.py", *args], capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("preregister_head.py: error: ") or last in (
        f"{c.out} exists: a pre-registration is never rewritten" for c in CASES)
    assert {c.name: c.out.read_bytes() for c in CASES} == before


@pytest.mark.parametrize("case", [EAGLE3, EAGLE3_QWEN3], ids=["eagle3", "eagle3-qwen3"])
def test_eagle3_pre_registration_covers_every_engine_of_its_phase(case):
    """The speedups at K 1-4 and batch 1-128 and the KV tokens of the baseline and each K; the head's folder is the
    catalog entry's published shapes, so the engines measure the head users get from the catalog."""
    from draftfit.catalog.specs import resolve_model

    rec = json.loads(case.out.read_text())
    assert set(rec["prediction"]["batches"]) == {"1", "8", "32", "128"}
    assert all(set(r["per_k"]) == {"1", "2", "3", "4"} for r in rec["prediction"]["batches"].values())
    assert [m["num_speculative_tokens"] for m in rec["memory"]] == [0, 1, 2, 3, 4]
    assert all(m["kv_tokens_band"][0] <= m["kv_tokens"] <= m["kv_tokens_band"][1] for m in rec["memory"])
    folder = resolve_model(str(case.head_dir), allow_hub=False)
    entry = resolve_model(case.head_dir.name, allow_hub=False)
    for field in ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "draft_vocab_size", "max_position_embeddings", "method"):
        assert getattr(folder, field) == getattr(entry, field), field


def test_score_refuses_engines_without_a_pre_registered_k(tmp_path):
    """Phase HE files that hold only the baseline score nothing: one line, non-zero exit, no traceback."""
    src = json.loads((ROOT / "data" / "calibration" / "raw" / "2026-12-02" / "HS_gpu0.json").read_text())
    src["configs"] = [c for c in src["configs"] if not c["spec"].get("k")]
    path = tmp_path / "HE_gpu0.json"
    path.write_text(json.dumps(src))
    res = subprocess.run([sys.executable, "bench/preregister_head.py", "--case", "eagle3", "--no-readme", "--score",
                          str(path)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode != 0 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_heads_on_the_v2_runner_pay_a_plain_steps_overhead_and_the_rest_keep_the_draft_model_fit():
    """vLLM 0.26 runs an EAGLE head of a dense target on its V2 runner (async, CUDA-graphed passes) and the hybrid
    Qwen3-Next's MTP layer on V1; 0.33 runs hybrids on V2 too. The V2 step at K=1 is the plain step plus the head's
    pass (5.4 ms measured at batch 1 for Llama-3.1-8B, phase HE), well under the draft_model fit's fixed cost."""
    from draftfit.catalog.specs import mtp_drafter, resolve_gpu, resolve_model
    from draftfit.speedup.stepcost import (HEAD_ASYNC_NOTE, fitted_overheads, head_on_async_runner, prior_step_cost,
                                           step_cost_model)
    from draftfit.engine.rules import VLLM_RULES

    l8, e3 = resolve_model("Llama-3.1-8B", allow_hub=False), resolve_model("EAGLE3-Llama-3.1-8B", allow_hub=False)
    qn = resolve_model("Qwen3-Next-80B-A3B", allow_hub=False)
    assert head_on_async_runner(l8, e3, VLLM_RULES["0.26"])
    assert not head_on_async_runner(qn, mtp_drafter(qn), VLLM_RULES["0.26"])
    assert head_on_async_runner(qn, mtp_drafter(qn), VLLM_RULES["0.33"])
    assert not head_on_async_runner(l8, resolve_model("Llama-3.2-1B", allow_hub=False), VLLM_RULES["0.26"])
    ov = fitted_overheads()
    sc = prior_step_cost(l8, e3, resolve_gpu("H200"), batch=1, k_values=[1, 4], context_len=112, overheads=ov)
    assert sc.base_step_ms < sc.spec_step_ms[1] < sc.base_step_ms + 1.0 < sc.spec_step_ms[4]
    notes = step_cost_model("Llama-3.1-8B", "EAGLE3-Llama-3.1-8B", "H200", batches=(1,), k_values=(2,)).notes
    assert any(n == HEAD_ASYNC_NOTE.format(method="eagle3") for n in notes)


def test_dummy_weights_leave_an_eagle3_head_without_its_own_lm_head():
    """vLLM 0.26 keeps a head's lm_head only when load_weights saw one; the campaign's dummy engines load nothing, so
    the head drafts with the target's lm_head: 15.55 GiB loaded for Llama-3.1-8B + its EAGLE-3 head (HE logs)."""
    from draftfit.catalog.specs import resolve_gpu, resolve_model
    from draftfit.engine.rules import VLLM_RULES
    from draftfit.memory.plan import plan_memory

    l8, e3 = resolve_model("Llama-3.1-8B", allow_hub=False), resolve_model("EAGLE3-Llama-3.1-8B", allow_hub=False)
    kw = dict(tp=1, util=0.85, max_model_len=2048, max_num_seqs=128, num_speculative_tokens=3, entrypoint="llm",
              rules=VLLM_RULES["0.26"])
    served = plan_memory(l8, e3, resolve_gpu("H200"), **kw)
    dummy = plan_memory(l8, e3, resolve_gpu("H200"), load_format="dummy", **kw)
    lm_head_gib = 32000 * 4096 * 2 / 2**30
    assert served.draft_weights_gib - dummy.draft_weights_gib == pytest.approx(lm_head_gib, abs=0.005)
    assert dummy.weights_gib == pytest.approx(15.55, abs=0.02)
    assert dummy.kv_tokens > served.kv_tokens
