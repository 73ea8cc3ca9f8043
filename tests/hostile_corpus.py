"""The hostile-input corpus: every command, every numeric option, broken files and a garbage /metrics server.

`build_cases()` returns the cases (importable, no pytest needed); tests/test_hostile_inputs.py runs them.
A case is an argv for `draftfit` with placeholders that the runner fills in:

    {tmp}   the case's scratch folder, where the files named in `Case.files` are built (see FILES)
    {srv}   http://127.0.0.1:PORT of the garbage /metrics server (see MetricsServer)

Every case is input a user could type that makes no sense (or points at something broken); the contract
each one checks is: exit code non-zero (2 where the input is bad), exactly one line beginning with
`error:`, no traceback, no hang. With `json=True` stdout must be one JSON object with "error" and "fix".

Only the CLI surface is used (command names, options, `draftfit.cli:cli`, `python -m draftfit`), so the
corpus does not depend on draftfit's internal module layout.
"""

from __future__ import annotations

import http.server
import json
import os
import random
import re
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

# --------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    files: tuple[str, ...] = ()  # names in FILES, built under {tmp}
    json: bool = False  # stdout must be {"error": ..., "fix": ...}
    subprocess: bool = False  # run as `python -m draftfit ...` instead of in-process
    env: tuple[tuple[str, str], ...] = ()  # extra environment ({tmp} expanded)
    expect_exit: int | None = 2  # None: any non-zero exit
    # Heavy work (import torch/transformers/vllm) counts as "the input was accepted": validation must come first.
    guard_heavy: bool = False
    timeout: float = 20.0
    server: bool = False  # needs the /metrics server
    note: str = ""

    def with_json(self) -> "Case":
        return replace(self, id=self.id + "-json", argv=self.argv + ("--json",), json=True)


# Values per option kind. Keys are short tags; the value is the literal string typed after the option.
INT_BAD = {"neg": "-1", "zero": "0", "huge": "1000000000000", "nan": "nan", "inf": "inf", "word": "x",
           "empty": "", "float": "1.5"}
FLOAT_BAD = {"neg": "-0.1", "zero": "0", "huge": "1e12", "nan": "nan", "inf": "inf", "-inf": "-inf", "word": "x",
             "empty": ""}
# Near misses of the workloads code-edit and summarization (issue 36): spellings a user may type.
NEAR_WORKLOADS = ["code_edit", "codeedit", "edit", "Summarization", "summarize", "code-edit,summarization"]
INT_LIST_BAD = ["", ",", "1,,x", "-4", "0", "1,0", "x", "1.5", "1000000000000", "nan", "1,-4", " "]


def _vid(value: str) -> str:
    """A readable test-id fragment for a typed value."""
    if value == "":
        return "empty"
    if value.strip() == "":
        return "blank"
    return re.sub(r"[^A-Za-z0-9.,:+\-_]", "_", value)


class _Builder:
    def __init__(self):
        self.cases: list[Case] = []
        self._ids: set[str] = set()

    def add(self, id: str, argv, **kw) -> Case:
        base, n = id, 2
        while id in self._ids:  # keep ids unique and readable
            id = f"{base}~{n}"
            n += 1
        self._ids.add(id)
        case = Case(id=id, argv=tuple(argv), **kw)
        self.cases.append(case)
        return case

    def option(self, cmd_id: str, base: list[str], opt: str, values, *, files=(), guard=False, tail=(), **kw):
        """One case per value of `opt` appended to a valid `base` command line."""
        name = opt.lstrip("-")
        for value in values:
            self.add(f"{cmd_id}-{name}-{_vid(value)}", [*base, opt, value, *tail], files=tuple(files),
                     guard_heavy=guard, **kw)


def _pick(table: dict[str, str], *, skip=(), extra=()) -> list[str]:
    return [v for k, v in table.items() if k not in skip] + list(extra)


# Config-folder variants (see FILES): (name, expected to be rejected by every command that reads config.json)
CFG_VARIANTS = [
    "cfg-malformed", "cfg-json-list", "cfg-json-string", "cfg-json-null", "cfg-json-number", "cfg-empty-file",
    "cfg-empty-object", "cfg-hidden-str", "cfg-heads-str", "cfg-layers-str", "cfg-vocab-str", "cfg-hidden-zero",
    "cfg-hidden-neg", "cfg-layers-neg", "cfg-layers-zero", "cfg-heads-zero", "cfg-heads-neg", "cfg-vocab-zero",
    "cfg-vocab-neg", "cfg-hidden-huge", "cfg-hidden-bigint", "cfg-hidden-float", "cfg-hidden-bool",
    "cfg-hidden-nan", "cfg-hidden-inf", "cfg-missing-hidden", "cfg-missing-layers", "cfg-missing-vocab",
    "cfg-kv-not-divisor", "cfg-kv-gt-heads", "cfg-headdim-neg", "cfg-maxpos-neg", "cfg-text-config-list",
    "cfg-text-config-str", "cfg-architectures-str", "cfg-dtype-bogus", "cfg-binary-64k", "cfg-utf16",
    "cfg-deep-nesting", "cfg-is-dir", "cfg-dangling-symlink", "cfg-devnull", "cfg-absent",
    # what vLLM/transformers refuse (issue 39): accepted with exit 0, or crashed, before
    "cfg-moe-topk-gt-experts", "cfg-layer-types-short", "cfg-rope-str", "cfg-rope-unknown-type",
    "cfg-hidden-indivisible", "cfg-rope-yarn-huge", "cfg-rope-yarn-nan", "cfg-layers-2e40", "cfg-rope-theta-inf",
]
# Paths that are not a model folder at all.
PATH_VARIANTS = ["path-is-file", "path-nonexistent", "path-dangling-symlink", "path-empty-dir"]
TOK_VARIANTS = [
    "tok-malformed", "tok-json-list", "tok-empty-object", "tok-binary-64k", "tok-is-dir", "tok-dangling-symlink",
    "tok-model-bogus", "tok-vocab-ids-str", "tok-empty-file", "tokcfg-malformed", "tokcfg-json-list",
    "tokcfg-bos-number", "tokcfg-template-number", "tokcfg-binary-64k", "tokcfg-is-dir", "jinja-is-dir",
    "jinja-binary", "tok-missing",
]
# Logged-traffic files for `rank/speedup --prompts-file` (acceptance/user_replay.py): each is refused with one line.
LOGGED_VARIANTS = ["logged-no-output", "logged-empty-output", "logged-output-number", "logged-assistant-only",
                   "logged-response-no-choices", "logged-blank", "logged-one-token-outputs", "logged-json-list"]
# (a missing store file, or a dangling symlink, is created by SQLite: not hostile)
STORE_VARIANTS = ["store-garbage", "store-text", "store-json", "store-wrong-schema", "store-empty-dir-name"]

M_T, M_D, GPU = "Llama-3.1-8B", "Llama-3.2-1B", "H100-80GB"
LONG = "{tmp}/" + "a" * 300  # one path component over the 255 bytes every Linux file system allows


def build_cases(*, root: bool | None = None) -> list[Case]:
    """All hostile cases. `root`: whether we run as root (chmod 000 does not stop root from reading)."""
    if root is None:
        root = hasattr(os, "geteuid") and os.geteuid() == 0
    b = _Builder()
    I, F = INT_BAD, FLOAT_BAD
    ABSURD_LEN = "200000"  # above Llama-3.1-8B's 131072 positions

    # ------------------------------------------------------------------ rank
    rank = ["rank", "--target", M_T, "--gpu", GPU]
    b.option("rank", rank, "--tp", _pick(I, extra=["3"]))  # 3 does not divide 32 heads
    b.option("rank", rank, "--temperature", _pick(F, skip={"zero", "huge", "neg"}, extra=["-1"]))
    b.option("rank", rank, "--batch", INT_LIST_BAD)
    b.option("rank", rank, "--top", _pick(I, skip={"huge"}))
    b.option("rank", rank, "--max-model-len", _pick(I, extra=[ABSURD_LEN]))
    b.option("rank", rank, "--util", _pick(F, extra=["1.5"]))
    b.option("rank", ["rank", "--gpu", GPU], "--target", ["NoSuchModel", "", "no-such-org/no-such-model", " "])
    # --all (a flag: every drafter, incompatible ones too) beside a bad target and a bad value for it
    b.option("rank", ["rank", "--all", "--gpu", GPU], "--target", ["NoSuchModel"])
    b.option("rank", ["rank", "--target", M_T], "--all", ["yes"])
    b.option("rank", ["rank", "--target", M_T], "--gpu", ["NoSuchGPU", "", "H100,H200"])
    b.option("rank", rank, "--explain", ["NoSuchDraft", ""])
    b.option("rank", rank, "--candidates", [",", ",,", "NoSuchModel", "{tmp}/path-nonexistent"],
             files=("path-nonexistent",))
    b.option("rank", rank, "--vllm-version", ["banana", "", "1..2", "-1", "0.0", "0.0.0", "0.6.0", "0.10.0"])
    b.option("rank", rank, "--workload", ["poetry", *NEAR_WORKLOADS])
    b.option("rank", rank, "--max-num-seqs", _pick(I, skip={"empty"}))
    b.option("rank", rank, "--quantization", ["magic", ""])
    b.option("rank", rank, "--kv-cache-dtype", ["fp4"])
    # --prompts-file (issue 36): logged requests with outputs, replayed for n-gram / suffix in the target's tokens
    b.option("rank", rank, "--prompts-file", ["{tmp}/path-nonexistent", "{tmp}/store-dir", "{tmp}/store-garbage",
                                              "{tmp}/store-json", "{tmp}/store-text", "{tmp}/prompts-deep-nesting",
                                              *(f"{{tmp}}/{v}" for v in LOGGED_VARIANTS), ""],
             files=("path-nonexistent", "store-dir", "store-garbage", "store-json", "store-text",
                    "prompts-deep-nesting", *LOGGED_VARIANTS))
    # a good file for a target whose tokenizer files are not here (no llama-3.1 fixture): the replay needs them
    b.add("rank-prompts-file-no-tokenizer", [*rank, "--prompts-file", "{tmp}/logged-good"], files=("logged-good",))

    # ------------------------------------------------------------------ memory
    mem = ["memory", M_T, "--gpu", GPU, "--draft", M_D]
    b.option("memory", mem, "--tp", _pick(I, extra=["3"]))
    b.option("memory", mem, "--util", _pick(F, extra=["1.5"]))
    b.option("memory", mem, "--max-model-len", _pick(I, skip={"inf", "empty"}, extra=[ABSURD_LEN]))
    b.option("memory", mem, "--max-num-seqs", _pick(I, skip={"inf", "empty", "nan"}))
    b.option("memory", mem, "--max-num-batched-tokens", _pick(I, skip={"inf", "empty", "nan"}))
    b.option("memory", mem, "--num-speculative-tokens", _pick(I, skip={"inf", "empty", "nan"}, extra=["100"]))
    b.option("memory", ["memory", M_T, "--gpu", "cpu"], "--kvcache-space", _pick(F, skip={"empty"}))
    b.option("memory", ["memory", M_T, "--draft", M_D], "--gpu", ["NoSuchGPU", ""])
    b.option("memory", ["memory", M_T, "--gpu", GPU], "--draft", ["NoSuchModel", ""])
    b.add("memory-target-NoSuchModel", ["memory", "NoSuchModel", "--gpu", GPU])
    b.option("memory", mem, "--dtype", ["bogus", "", "int3"])
    b.option("memory", mem, "--kv-cache-dtype", ["fp4"])
    b.option("memory", mem, "--quantization", ["magic"])
    b.option("memory", mem, "--entrypoint", ["grpc"])
    b.option("memory", mem, "--vllm-version", ["banana", "", "1..2", "0.0", "0.6.0"])

    # ------------------------------------------------------------------ measure (local folders; heavy guarded)
    meas_files = ("good-model", "good-draft", "store-dir")
    meas = ["measure", "{tmp}/good-model", "{tmp}/good-draft", "--store", "{tmp}/store-dir/s.sqlite"]
    b.option("measure", meas, "--temperature", ["", ",", "-1", "nan", "inf", "-inf", "0,x", "x", "0,-0.5"],
             files=meas_files, guard=True)
    b.option("measure", meas, "--k", ["-1", "0", "17", "100", "1000000000000", "x", "1.5"], files=meas_files,
             guard=True)
    b.option("measure", meas, "--prompts", ["-1", "0", "1000000000000", "x"], files=meas_files, guard=True)
    b.option("measure", meas, "--max-tokens", ["-1", "0", "1", "1000000000000", "x"], files=meas_files, guard=True)
    b.option("measure", meas, "--seed", ["-1", "99999999999999999999", "x"], files=meas_files, guard=True)
    b.option("measure", meas, "--workload", ["poetry", *NEAR_WORKLOADS], files=meas_files, guard=True)
    b.option("measure", meas, "--backend", ["tensorrt"], files=meas_files, guard=True)
    b.option("measure", meas, "--max-model-len", ["-1", "0", "63", "1000000000000", "x"], files=meas_files,
             guard=True)
    b.option("measure", meas, "--top-p", ["0", "-0.5", "1.5", "nan", "x"], files=meas_files, guard=True)
    b.option("measure", meas, "--prompts-file", ["{tmp}/path-nonexistent", "{tmp}/store-dir", "{tmp}/store-garbage",
                                                 "{tmp}/store-json", "{tmp}/store-text"],
             files=(*meas_files, "path-nonexistent", "store-garbage", "store-json", "store-text"), guard=True)
    b.add("measure-ngram-backend-hf", ["measure", "{tmp}/good-model", "ngram", "--backend", "hf", "--store",
                                       "{tmp}/store-dir/s.sqlite"], files=meas_files, guard_heavy=True)
    meas_nostore = ["measure", "{tmp}/good-model", "{tmp}/good-draft"]
    for s in STORE_VARIANTS:
        b.add(f"measure-store-{s}", [*meas_nostore, "--store", f"{{tmp}}/{s}"], files=("good-model", "good-draft", s),
              guard_heavy=True)
    for name in ("NoSuchModel", "{tmp}/path-nonexistent", "{tmp}/path-is-file"):
        b.add(f"measure-target-{_vid(name.replace('{tmp}/', ''))}",
              ["measure", name, "{tmp}/good-draft", "--store", "{tmp}/store-dir/s.sqlite"],
              files=("good-draft", "store-dir", "path-nonexistent", "path-is-file"), guard_heavy=True)

    # ------------------------------------------------------------------ sweep (every option checked before Ray starts)
    swp = ["sweep", "{tmp}/good-model", "--drafts", "ngram", "--store", "{tmp}/store-dir/s.sqlite"]
    swp_files = ("good-model", "store-dir")
    b.option("sweep", ["sweep", "{tmp}/good-model", "--store", "{tmp}/store-dir/s.sqlite"], "--drafts",
             ["", ",", "ngram,,x", " "], files=swp_files, guard=True)
    b.option("sweep", swp, "--workloads", ["poetry", "", "code,", "code,poetry", *NEAR_WORKLOADS[:-1],
                                     "code-edit,,summarization", "code-edit,summarize"],
             files=swp_files, guard=True)
    b.option("sweep", swp, "--temperatures", ["", ",", "-1", "nan", "inf", "0,x", "x"], files=swp_files, guard=True)
    b.option("sweep", swp, "--k", ["-1", "0", "17", "x", "1.5", "1,2", "1..4", ""], files=swp_files, guard=True)
    b.option("sweep", swp, "--prompts", ["-1", "0", "1000000000000", "x"], files=swp_files, guard=True)
    b.option("sweep", swp, "--max-tokens", ["-1", "0", "1", "1000000000000", "x"], files=swp_files, guard=True)
    b.option("sweep", swp, "--seed", ["-1", "99999999999999999999", "x"], files=swp_files, guard=True)
    b.option("sweep", swp, "--max-model-len", ["-1", "0", "63", "1000000000000", "x"], files=swp_files, guard=True)
    b.option("sweep", swp, "--tp", ["0", "-1", "65", "x"], files=swp_files, guard=True)
    b.option("sweep", swp, "--pp", ["0", "-1", "65", "x"], files=swp_files, guard=True)
    b.option("sweep", swp, "--retries", ["-1", "101", "x", "1000000000000"], files=swp_files, guard=True)
    b.option("sweep", swp, "--ray-address", ["", " ", "127.0.0.1:9"], files=swp_files, guard=True)
    b.option("sweep", swp, "--prompts-file", ["{tmp}/path-nonexistent", "{tmp}/store-dir", "{tmp}/store-garbage",
                                              "{tmp}/store-json", "{tmp}/store-text"],
             files=(*swp_files, "path-nonexistent", "store-garbage", "store-json", "store-text"), guard=True)
    b.add("sweep-target-NoSuchModel", ["sweep", "NoSuchModel", "--drafts", "ngram", "--store",
                                       "{tmp}/store-dir/s.sqlite"], files=("store-dir",), guard_heavy=True)
    b.add("sweep-draft-NoSuchModel", [*swp[:3], "NoSuchModel", *swp[4:]], files=swp_files, guard_heavy=True)
    cal_swp = ["sweep", "Llama-3.1-8B", "--calibrate", "--drafts", "Llama-3.2-1B", "--lanes-dir", "{tmp}/lanes"]
    b.option("sweep-calibrate", cal_swp, "--k", ["0", "17", "x", "4..1", "1,,2", ""], guard=True)
    b.option("sweep-calibrate", cal_swp, "--batch", ["0", "x", "", "1,-8", "1000000000000"], guard=True)
    b.option("sweep-calibrate", cal_swp, "--acceptance", ["0", "-0.5", "1.5", "nan", "x"], guard=True)
    b.option("sweep-calibrate", cal_swp, "--repeats", ["0", "-1", "1001", "x"], guard=True)
    b.option("sweep-calibrate", cal_swp, "--budget-s", ["0", "-1", "nan", "inf", "x"], guard=True)
    b.option("sweep-calibrate", cal_swp, "--tp", ["3", "0", "x"], guard=True)
    b.option("sweep-calibrate", cal_swp, "--pp", ["2"], guard=True)
    b.add("sweep-calibrate-vocab-mismatch", [*cal_swp[:4], "Qwen2.5-0.5B", *cal_swp[5:]], guard_heavy=True)
    b.add("sweep-calibrate-target-NoSuchModel", ["sweep", "NoSuchModel", *cal_swp[2:]], guard_heavy=True)

    # ------------------------------------------------------------------ runs
    st = ["--store", "{tmp}/store-dir/s.sqlite"]
    for v in ["-1", "0", "1000000000000", "99999999999999999999", "x", ""]:
        b.add(f"runs-show-id-{_vid(v)}", ["runs", "show", v, *st], files=("store-dir",))
    for s in STORE_VARIANTS:
        store_arg = "{tmp}/" + s
        for sub in ("list", "export"):
            b.add(f"runs-{sub}-store-{s}", ["runs", sub, "--store", store_arg], files=(s,))
        b.add(f"runs-show-store-{s}", ["runs", "show", "1", "--store", store_arg], files=(s,))
    b.add("runs-export-output-is-dir", ["runs", "export", "-o", "{tmp}/store-dir", *st], files=("store-dir",))
    b.add("runs-export-output-missing-dir", ["runs", "export", "-o", "{tmp}/path-nonexistent/x.csv", *st],
          files=("store-dir", "path-nonexistent"))
    b.add("runs-export-format-xml", ["runs", "export", "--format", "xml", *st], files=("store-dir",))
    b.add("runs-bogus-subcommand", ["runs", "delete-all"])

    # ------------------------------------------------------------------ speedup
    cf = ["speedup", "--alpha", "0.7", "--k", "4", "--c", "0.1"]
    b.option("speedup", ["speedup", "--k", "4", "--c", "0.1"], "--alpha", _pick(F, skip={"zero"}, extra=["1.5"]))
    b.option("speedup", ["speedup", "--alpha", "0.7", "--k", "4"], "--c", _pick(F, skip={"zero", "huge"}))
    b.option("speedup", ["speedup", "--alpha", "0.7", "--c", "0.1"], "--k",
             ["0", "-1", "100", "1000000000000", "x", "", "1,,x", "nan"])
    b.option("speedup", ["speedup", "--k", "2", "--c", "0.1"], "--acceptance-curve",
             ["", "1.5", "-0.1", "nan", "inf", "0.5,0.8", "x", "0.8,,0.6", ","])
    b.option("speedup", ["speedup", "--k", "4", "--c", "0.1"], "--run", ["-1", "0", "1000000000000", "x"])
    full = ["speedup", "--target", M_T, "--draft", M_D, "--gpu", "H200", "--alpha", "0.7"]
    b.option("speedup-full", full, "--tp", ["0", "-1", "3", "1000000000000", "x"])
    b.option("speedup-full", full, "--batch", ["", "0", "-4", "1,,x", "x", "1000000000000"])
    b.option("speedup-full", full, "--k", ["", "0", "1,,x", "-1", "100"])
    b.option("speedup-full", full, "--context-len", ["-1", "0", "1000000000000", "x"])
    b.option("speedup-full", full, "--alpha", ["1.5", "nan", "-1"])
    b.option("speedup-full", full, "--quantization", ["magic", ""])
    b.option("speedup-full", full, "--kv-cache-dtype", ["fp4"])
    b.option("speedup-full", full, "--vllm-version", ["banana", "", "1..2"])
    b.option("speedup-full", ["speedup", "--draft", M_D, "--gpu", "H200", "--alpha", "0.7"], "--target",
             ["NoSuchModel"])
    b.option("speedup-full", ["speedup", "--target", M_T, "--gpu", "H200", "--alpha", "0.7"], "--draft",
             ["NoSuchModel"])
    b.option("speedup-full", ["speedup", "--target", M_T, "--draft", M_D, "--alpha", "0.7"], "--gpu",
             ["NoSuchGPU"])
    b.add("speedup-no-acceptance", ["speedup", "--k", "4", "--c", "0.1"])
    # Prediction mode prices the pair at the acceptance prior when none is given; its options are checked.
    prior_mode = ["speedup", "--target", M_T, "--draft", M_D, "--gpu", "H200"]
    b.option("speedup-prior", prior_mode, "--temperature", ["-1", "nan", "3", "x"])
    b.option("speedup-prior", prior_mode, "--workload", ["poetry", "", *NEAR_WORKLOADS])
    b.option("speedup-prior", prior_mode + ["--alpha", "0.7"], "--workload", ["code"])
    b.add("speedup-plot-is-dir", [*cf, "--plot", "{tmp}/store-dir"], files=("store-dir",))
    b.add("speedup-plot-missing-dir", [*cf, "--plot", "{tmp}/path-nonexistent/p.png"], files=("path-nonexistent",))
    b.add("speedup-explain-closed-form", [*cf, "--explain"])  # no step terms without --target/--draft/--gpu
    qwen_ngram = ["speedup", "--target", "Qwen2.5-Coder-32B", "--draft", "ngram", "--gpu", "H200"]
    b.option("speedup-prompts", qwen_ngram, "--prompts-file",
             ["{tmp}/path-nonexistent", "{tmp}/store-dir", "{tmp}/store-garbage", "{tmp}/prompts-deep-nesting",
              *(f"{{tmp}}/{v}" for v in LOGGED_VARIANTS)],
             files=("path-nonexistent", "store-dir", "store-garbage", "prompts-deep-nesting", *LOGGED_VARIANTS))
    b.add("speedup-prompts-file-closed-form", ["speedup", "--k", "4", "--c", "0.1", "--prompts-file",
                                               "{tmp}/logged-good"], files=("logged-good",))
    b.add("speedup-prompts-file-and-alpha", [*qwen_ngram, "--alpha", "0.7", "--prompts-file", "{tmp}/logged-good"],
          files=("logged-good",))
    b.add("speedup-prompts-file-and-workload", [*qwen_ngram, "--workload", "code", "--prompts-file",
                                                "{tmp}/logged-good"], files=("logged-good",))
    b.add("speedup-prompts-file-draft-model", ["speedup", "--target", "Qwen2.5-Coder-32B", "--draft",
                                               "Qwen2.5-Coder-7B", "--gpu", "H200", "--prompts-file",
                                               "{tmp}/logged-good"], files=("logged-good",))

    # ------------------------------------------------------------------ calibrate (heavy guarded)
    cal = ["calibrate", M_T, M_D]
    b.option("calibrate", cal, "--k", ["0", "-1", "", "x", "8..1", "1..", "1..x", "1..1000000000000", "1,,x"],
             guard=True)
    b.option("calibrate", cal, "--batch", ["0", "-4", "", "1,,x", "x"], guard=True)
    b.option("calibrate", cal, "--tp", ["0", "-1", "3", "x"], guard=True)
    b.option("calibrate", cal, "--acceptance", ["0", "1.5", "nan", "x", "", "-0.5"], guard=True)
    b.option("calibrate", cal, "--max-tokens", ["0", "-1", "x"], guard=True)
    b.option("calibrate", cal, "--repeats", ["0", "-1", "x"], guard=True)
    b.option("calibrate", cal, "--budget-s", ["-1", "0", "nan", "x"], guard=True)
    b.add("calibrate-target-NoSuchModel", ["calibrate", "NoSuchModel", M_D], guard_heavy=True)
    b.add("calibrate-draft-NoSuchModel", ["calibrate", M_T, "NoSuchModel"], guard_heavy=True)
    for f in ("lane-garbage", "lane-json-list", "lane-empty-object", "lane-bad-fields"):
        b.add(f"calibrate-ingest-{f}", ["calibrate", "--ingest", f"{{tmp}}/{f}", "--out", "{tmp}/store-dir/t.json"],
              files=(f, "store-dir"), guard_heavy=True)
    b.add("calibrate-ingest-nonexistent", ["calibrate", "--ingest", "{tmp}/path-nonexistent"],
          files=("path-nonexistent",))
    b.add("calibrate-ingest-dir", ["calibrate", "--ingest", "{tmp}/store-dir"], files=("store-dir",))
    b.add("calibrate-out-is-dir", [*cal, "--out", "{tmp}/store-dir"], files=("store-dir",), guard_heavy=True)
    b.add("calibrate-show-NoSuchModel", ["calibrate", "--show", "NoSuchModel"])

    # ------------------------------------------------------------------ serve-cmd / launch-script
    for cmd in ("serve-cmd", "launch-script"):
        base = [cmd, M_T, M_D] + (["-o", "{tmp}/launch.sh"] if cmd == "launch-script" else [])
        b.option(cmd, base, "--k", ["0", "-1", "100", "1000000000000", "x", "1.5"])
        b.option(cmd, base, "--tp", ["0", "-1", "3", "1000000000000", "x"])
        b.option(cmd, base, "--max-model-len", ["-1", "0", "1000000000000", "x", ABSURD_LEN])
        b.option(cmd, base, "--util", ["1.5", "0", "-0.1", "nan", "inf", "x"])
        b.option(cmd, [cmd, M_T, M_D], "--gpu", ["NoSuchGPU"])
        b.option(cmd, base, "--dtype", ["bogus"])
        b.option(cmd, base, "--vllm-version", ["banana", ""])
        b.option(cmd, base, "--engine", ["tgi"])
        b.option(cmd, base, "--launcher", ["docker"])
        b.option(cmd, base, "--workload", ["poetry", *NEAR_WORKLOADS])
        # A --target-path that does not exist here is legitimate: it names the folder on the serving machine
        # (tests/test_launch.py serves /models/t); a path that is a file here, or a broken folder, is not.
        b.option(cmd, base, "--target-path", ["{tmp}/path-is-file", "{tmp}/path-dangling-symlink"],
                 files=("path-is-file", "path-dangling-symlink"))
        b.option(cmd, base, "--draft-path", ["{tmp}/cfg-malformed"], files=("cfg-malformed",))
        b.add(f"{cmd}-target-NoSuchModel", [cmd, "NoSuchModel", M_D])
        b.add(f"{cmd}-draft-NoSuchModel", [cmd, M_T, "NoSuchModel"])
    ls = ["launch-script", M_T, M_D, "-o", "{tmp}/launch.sh"]
    b.option("launch-script", ls, "--port", ["99999", "0", "-1", "65536", "x"])
    b.option("launch-script", ls, "--health-timeout", ["0", "-1", "x"])
    b.option("launch-script", ls, "--warmup-tokens", ["-1", "1000000000000", "x"])
    b.option("launch-script", ls, "--host", ["", "127.0.0.1; touch /tmp/pwned", "a b"])
    b.option("launch-script", ["launch-script", M_T, M_D], "--output",
             ["{tmp}/store-dir", "{tmp}/path-nonexistent/x.sh"], files=("store-dir", "path-nonexistent"))
    b.option("launch-script", ls, "--log", ["{tmp}/store-dir", ""], files=("store-dir",))

    # ------------------------------------------------------------------ preflight
    pf = ["preflight", M_T, M_D, "--gpu", "H200"]
    b.option("preflight", pf, "--tp", ["0", "-1", "3", "1000000000000", "x"])
    b.option("preflight", pf, "--workload", NEAR_WORKLOADS)
    b.option("preflight", pf, "--k", ["0", "-1", "100", "1000000000000", "x"])
    b.option("preflight", pf, "--max-model-len", ["-1", "0", "1000000000000", "x", ABSURD_LEN])
    b.option("preflight", pf, "--util", ["1.5", "0", "-0.1", "nan", "inf", "x"])
    b.option("preflight", pf, "--batch", ["0", "-1", "1000000000000", "x"])
    b.option("preflight", pf, "--temperature", ["-1", "nan", "inf", "x"])
    b.option("preflight", pf, "--quantization", ["magic", ""])
    b.option("preflight", pf, "--kv-cache-dtype", ["fp4"])
    b.option("preflight", pf, "--vllm-version", ["banana", "0.0", "0.10.0"])
    b.option("preflight", [*pf[:3]], "--gpu", ["NoSuchGPU", ""])
    b.add("preflight-target-NoSuchModel", ["preflight", "NoSuchModel", M_D])
    b.add("preflight-draft-NoSuchModel", ["preflight", M_T, "NoSuchModel"])

    # ------------------------------------------------------------------ serve-sim and the traffic options
    # (rank and preflight take the same options: a sample of each there, every one here)
    ss = ["serve-sim", "--target", M_T, "--draft", M_D, "--gpu", "H200", "--num-requests", "20"]
    rr = [*ss, "--request-rate", "1"]
    b.option("serve-sim", ss, "--request-rate", ["", ",", "0", "-1", "nan", "inf", "x", "1,,2", "1e9", "1,x"])
    b.option("serve-sim", ss, "--concurrency", _pick(I, skip={"huge"}, extra=["1000001"]))
    b.add("serve-sim-rate-and-concurrency", [*rr, "--concurrency", "4"])
    b.add("serve-sim-no-load", list(ss))
    lens = ["", "0", "-5", "x", "1.5", "nan", "inf", "300..100", "1..x", "lognormal:", "lognormal:0,1",
            "lognormal:600", "lognormal:600,-1", "lognormal:nan,1", "1e12", "20000000"]
    b.option("serve-sim", rr, "--prompt-len", lens)
    b.option("serve-sim", rr, "--output-len", lens)
    b.option("serve-sim", ss[:-2] + ["--request-rate", "1"], "--num-requests",
             _pick(I, skip={"empty"}, extra=["200001"]))
    b.option("serve-sim", rr, "--seed", ["-1", "x", "1.5", "99999999999999999999"])
    b.option("serve-sim", rr, "--slo-tpot-ms", _pick(F, skip={"huge"}))
    b.option("serve-sim", rr, "--slo-ttft-ms", _pick(F, skip={"huge"}))
    b.option("serve-sim", rr, "--request-log", ["{tmp}/log-no-columns", "{tmp}/log-negative", "{tmp}/log-words",
                                              "{tmp}/log-empty", "{tmp}/log-float", "{tmp}/log-jsonl-bad",
                                              "{tmp}/log-jsonl-list", "{tmp}/log-binary", "{tmp}/path-nonexistent",
                                              "{tmp}/store-dir"],
             files=("log-no-columns", "log-negative", "log-words", "log-empty", "log-float", "log-jsonl-bad",
                    "log-jsonl-list", "log-binary", "path-nonexistent", "store-dir"))
    b.option("serve-sim", rr, "--prompts-file", ["{tmp}/prompts-deep-nesting", "{tmp}/log-words",
                                               "{tmp}/path-nonexistent"],
             files=("prompts-deep-nesting", "log-words", "path-nonexistent"))
    b.add("serve-sim-log-and-prompts", [*rr, "--request-log", "{tmp}/log-words", "--prompts-file",
                                        "{tmp}/log-words"], files=("log-words",))
    b.option("serve-sim", rr, "--draft", ["", ",", "NoSuchModel", "a,b,c,d,e,f,g,h,i"])
    b.option("serve-sim", [rr[0], *rr[3:]], "--target", ["NoSuchModel", ""])
    b.option("serve-sim", rr, "--alpha", ["0", "1", "1.5", "-0.1", "nan", "x"])
    b.option("serve-sim", rr, "--k", ["0", "-1", "9", "x"])
    b.option("serve-sim", rr, "--tp", ["0", "3", "x"])
    b.option("serve-sim", rr, "--gpu", ["NoSuchGPU", ""])
    b.option("serve-sim", rr, "--util", ["1.5", "0", "nan"])
    b.option("serve-sim", rr, "--vllm-version", ["banana", "0.6.0"])
    b.option("serve-sim", rr, "--plot", ["{tmp}/path-nonexistent/p.png", "{tmp}/store-dir", ""],
             files=("path-nonexistent", "store-dir"))
    b.add("serve-sim-incompatible-draft", [*rr[:4], "Qwen3-0.6B", *rr[5:]], expect_exit=None)
    b.option("serve-sim", rr, "--max-model-len", ["0", "-1", "x", ABSURD_LEN])
    b.option("serve-sim", rr, "--max-num-seqs", ["0", "-1", "x", "1000000000000"])
    b.option("serve-sim", rr, "--workload", ["poetry", *NEAR_WORKLOADS[:2]])
    b.option("serve-sim", rr, "--temperature", ["-1", "nan", "3", "x"])
    b.option("serve-sim", rr, "--quantization", ["magic"])
    b.option("serve-sim", rr, "--kv-cache-dtype", ["fp4"])
    b.option("serve-sim", rr, "--explain", ["yes"])  # a flag given a value
    b.add("serve-sim-json-bad-rate", [*ss, "--request-rate", "x", "--json"], json=True)
    for cmd_id, base in (("rank-traffic", rank), ("preflight-traffic", pf)):
        b.option(cmd_id, base, "--request-rate", ["0", "x", "nan", ""])
        b.option(cmd_id, [*base, "--request-rate", "1"], "--prompt-len", ["0", "300..100", "lognormal:600"])
        b.option(cmd_id, [*base, "--request-rate", "1"], "--concurrency", ["4"])
        b.option(cmd_id, base, "--slo-tpot-ms", ["20"])  # an SLO with no load is refused, not ignored
        b.option(cmd_id, base, "--num-requests", ["0", "-1"])
        b.option(cmd_id, [*base, "--request-rate", "1"], "--request-log", ["{tmp}/log-negative"],
                 files=("log-negative",))
        b.option(cmd_id, [*base, "--request-rate", "1"], "--output-len", ["0", "x"])
        b.option(cmd_id, [*base, "--request-rate", "1"], "--prompts-file", ["{tmp}/path-nonexistent"],
                 files=("path-nonexistent",))
        b.option(cmd_id, [*base, "--request-rate", "1"], "--seed", ["-1", "x"])
        b.option(cmd_id, [*base, "--request-rate", "1"], "--slo-ttft-ms", ["0", "nan"])

    # ------------------------------------------------------------------ monitor (a garbage /metrics server)
    mk = dict(server=True, expect_exit=None, timeout=15.0)
    for path in MetricsServer.ROUTES:
        if path == "good":
            continue
        b.add(f"monitor-server-{path}", ["monitor", f"{{srv}}/{path}", "--once"], **mk)
    b.add("monitor-server-garbage-watch", ["monitor", "{srv}/garbage", "--interval", "0.1", "--count", "1"], **mk)
    good = ["monitor", "{srv}/good"]
    b.option("monitor", good, "--interval", ["-1", "0", "nan", "inf", "1e12", "x"], tail=("--count", "1"),
             server=True, timeout=15.0)
    b.option("monitor", good, "--count", ["-1", "0", "x"], tail=("--interval", "0.1"), server=True, timeout=15.0)
    b.option("monitor", [*good, "--once"], "--cost-ratio", ["-1", "nan", "inf", "-inf", "x"], server=True,
             timeout=15.0)
    lay = [*good, "--once", "--target", M_T, "--draft", M_D, "--gpu", "H200"]
    b.option("monitor", lay, "--tp", ["0", "-1", "3", "x"], server=True, timeout=15.0)
    b.option("monitor", lay, "--batch", ["0", "-1", "1000000000000", "x"], server=True, timeout=15.0)
    b.option("monitor", [*good, "--once", "--draft", M_D, "--gpu", "H200"], "--target", ["NoSuchModel"],
             server=True, timeout=15.0)
    b.option("monitor", [*good, "--once", "--target", M_T, "--draft", M_D], "--gpu", ["NoSuchGPU"], server=True,
             timeout=15.0)
    for url in ["", "not a url", "ftp://127.0.0.1/", "http://[::1", "file:///etc/passwd", "http://127.0.0.1:1",
                "http://127.0.0.1:99999"]:
        b.add(f"monitor-url-{_vid(url)}", ["monitor", url, "--once"], timeout=15.0)

    # ------------------------------------------------------------------ catalog / fixtures
    b.add("catalog-show-NoSuchModel", ["catalog", "show", "NoSuchModel"])
    b.add("catalog-show-empty", ["catalog", "show", ""])
    b.add("catalog-show-path-traversal", ["catalog", "show", "../../etc/passwd"])
    b.add("catalog-list-family-nonexistent", ["catalog", "list", "--family", "no-such-family"])
    b.add("catalog-list-unknown-option", ["catalog", "list", "--sort", "size"])
    b.add("catalog-bogus-subcommand", ["catalog", "delete"])
    b.add("fixtures-what-bogus", ["fixtures", "weights"])
    b.add("fixtures-what-empty", ["fixtures", ""])
    b.add("fixtures-extra-argument", ["fixtures", "tokenizers", "more"])
    b.add("draftfit-unknown-command", ["deploy"])

    # ------------------------------------------------------------------ broken config.json folders
    for v in CFG_VARIANTS + PATH_VARIANTS:
        p = f"{{tmp}}/{v}"
        b.add(f"rank-target-{v}", ["rank", "--target", p], files=(v,))
        b.add(f"memory-target-{v}", ["memory", p, "--gpu", GPU], files=(v,))
    sample = ["cfg-malformed", "cfg-json-list", "cfg-hidden-str", "cfg-hidden-neg", "cfg-vocab-zero",
              "cfg-binary-64k", "cfg-is-dir", "cfg-empty-object", "cfg-heads-zero", "cfg-deep-nesting"]
    for v in sample:
        p = f"{{tmp}}/{v}"
        b.add(f"check-target-{v}", ["check", p, "{tmp}/good-draft"], files=(v, "good-draft"))
        b.add(f"speedup-target-{v}", ["speedup", "--target", p, "--draft", M_D, "--gpu", "H200", "--alpha", "0.7"],
              files=(v,))
        b.add(f"serve-cmd-target-{v}", ["serve-cmd", p, M_D, "--k", "4"], files=(v,))
        b.add(f"preflight-target-{v}", ["preflight", p, M_D, "--gpu", "H200"], files=(v,))
        b.add(f"memory-draft-{v}", ["memory", M_T, "--gpu", GPU, "--draft", p], files=(v,))
        b.add(f"rank-candidates-{v}", ["rank", "--target", M_T, "--candidates", p], files=(v,))
    for v in ["cfg-malformed", "cfg-hidden-str", "cfg-binary-64k", "cfg-is-dir"]:
        b.add(f"measure-target-{v}", ["measure", f"{{tmp}}/{v}", "{tmp}/good-draft", "--store",
                                      "{tmp}/store-dir/s.sqlite"], files=(v, "good-draft", "store-dir"),
              guard_heavy=True)
        b.add(f"calibrate-target-{v}", ["calibrate", f"{{tmp}}/{v}", M_D], files=(v,), guard_heavy=True)
        b.add(f"launch-script-target-{v}", ["launch-script", f"{{tmp}}/{v}", M_D, "-o", "{tmp}/l.sh"], files=(v,))
        b.add(f"monitor-target-{v}", ["monitor", "{srv}/good", "--once", "--target", f"{{tmp}}/{v}", "--draft", M_D,
                                      "--gpu", "H200"], files=(v,), server=True, timeout=15.0)
    b.add("rank-target-cfg-fifo", ["rank", "--target", "{tmp}/cfg-fifo"], files=("cfg-fifo",))
    if not root:
        b.add("rank-target-cfg-unreadable", ["rank", "--target", "{tmp}/cfg-unreadable"], files=("cfg-unreadable",))
        b.add("check-target-tok-unreadable", ["check", "{tmp}/tok-unreadable", "{tmp}/good-draft"],
              files=("tok-unreadable", "good-draft"))

    # ------------------------------------------------------------------ broken tokenizer folders
    for v in TOK_VARIANTS:
        b.add(f"check-target-{v}", ["check", f"{{tmp}}/{v}", "{tmp}/good-draft"], files=(v, "good-draft"))
    for v in ["tok-malformed", "tok-binary-64k", "tokcfg-malformed", "tok-is-dir"]:
        b.add(f"check-draft-{v}", ["check", "Qwen2.5-7B", f"{{tmp}}/{v}"], files=(v,))
        b.add(f"rank-target-{v}", ["rank", "--target", f"{{tmp}}/{v}"], files=(v,))

    # ------------------------------------------------------------------ issue 39: crashes and silent acceptances
    for argv in (["rank", "--target", LONG], ["check", LONG, M_D], ["check", M_T, LONG], ["memory", LONG, "--gpu", GPU],
                 ["serve-cmd", LONG, M_D], ["preflight", LONG, M_D], ["catalog", "show", LONG],
                 ["launch-script", LONG, M_D, "-o", "{tmp}/l.sh"],
                 ["speedup", "--target", LONG, "--draft", M_D, "--gpu", "H200", "--alpha", "0.7"],
                 ["runs", "list", "--store", LONG + "/s.sqlite"], ["launch-script", M_T, M_D, "-o", LONG + "/l.sh"]):
        b.add(f"long-name-{'-'.join(a for a in argv[:2] if a.isalpha() or a.startswith('-'))}", argv)
    b.add("long-name-measure", ["measure", LONG, "{tmp}/good-draft", "--store", "{tmp}/store-dir/s.sqlite"],
          files=("good-draft", "store-dir"), guard_heavy=True)
    b.add("long-name-sweep", ["sweep", LONG, "--drafts", "ngram", "--store", "{tmp}/store-dir/s.sqlite"],
          files=("store-dir",), guard_heavy=True)
    b.add("measure-prompts-file-deep-nesting", [*meas, "--prompts-file", "{tmp}/prompts-deep-nesting"],
          files=(*meas_files, "prompts-deep-nesting"), guard_heavy=True)
    b.add("sweep-prompts-file-deep-nesting", [*swp, "--prompts-file", "{tmp}/prompts-deep-nesting"],
          files=(*swp_files, "prompts-deep-nesting"), guard_heavy=True)
    b.add("check-target-slowtok-only", ["check", "{tmp}/slowtok-only", "{tmp}/good-draft"],
          files=("slowtok-only", "good-draft"))
    b.add("runs-list-env-store-empty", ["runs", "list"], env=(("DRAFTFIT_STORE", ""),))
    b.add("measure-env-store-empty", ["measure", "{tmp}/good-model", "ngram"], files=("good-model",),
          env=(("DRAFTFIT_STORE", ""),), guard_heavy=True)
    # Options the chosen mode does not read are refused, not silently dropped.
    b.option("sweep-calibrate", cal_swp, "--temperatures", ["nan", "0.7"], guard=True)
    b.option("sweep-calibrate", cal_swp, "--workloads", ["poetry", "code"], guard=True)
    b.option("sweep-calibrate", cal_swp, "--prompts-file", ["{tmp}/store-garbage"], files=("store-garbage",),
             guard=True)
    b.option("sweep-calibrate", cal_swp, "--tables-dir", ["{tmp}/path-is-file"], files=("path-is-file",),
             guard=True)
    b.option("sweep", swp, "--batch", ["1,8"], files=swp_files, guard=True)
    b.option("sweep", swp, "--tables-dir", ["{tmp}/store-dir"], files=swp_files, guard=True)
    b.add("sweep-json-k-x", [*swp, "--k", "x", "--json"], files=swp_files, guard_heavy=True, json=True)
    for opt, value in (("--tp", "0"), ("--tp", "2"), ("--batch", "8"), ("--context-len", "4096"),
                       ("--quantization", "fp8"), ("--kv-cache-dtype", "fp8"), ("--vllm-version", "0.34.0")):
        b.add(f"speedup-closed-form-{opt.lstrip('-')}-{_vid(value)}", [*cf, opt, value])
    b.add("speedup-k-range-past-bound", ["speedup", "--alpha", "0.8", "--k", "1..1000", "--c", "0.1"])
    b.add("speedup-full-k-range-past-bound", [*full, "--k", "1..1000"])
    # Flags and remaining options, each with a hostile companion.
    b.add("check-catalog-only-NoSuchModel", ["check", "--catalog-only", "NoSuchModel", M_D])
    b.add("calibrate-write-configs-NoSuchModel", ["calibrate", "--write-configs", "NoSuchModel", M_D],
          guard_heavy=True)
    for cmd in ("serve-cmd", "launch-script"):
        base = [cmd, M_T, M_D] + (["-o", "{tmp}/launch.sh"] if cmd == "launch-script" else [])
        b.option(cmd, base, "--quantization", ["magic", ""])
        b.option(cmd, base, "--kv-cache-dtype", ["fp4"])
        b.add(f"{cmd}-force-k-0", [*base, "--force", "--k", "0"])
    b.option("launch-script", ls, "--draftfit-bin", ["", "draftfit\nrm -rf ~"])  # quoted in the script: ';' is safe
    b.option("launch-script", ls, "--warmup-prompt", [""])
    b.add("launch-script-no-preflight-k-0", [*ls, "--no-preflight", "--k", "0"])
    b.add("launch-script-keep-running-tp-0", [*ls, "--keep-running", "--tp", "0"])
    b.add("launch-script-enforce-eager-util-0", [*ls, "--enforce-eager", "--util", "0"])
    b.option("preflight", pf, "--workload", ["poetry", ""])
    b.option("monitor", [*good, "--once"], "--timeout", ["0", "-1", "nan", "inf", "x"], server=True, timeout=15.0)
    b.add("catalog-list-gpus-family", ["catalog", "list", "--gpus", "--family", "no-such-family"])
    b.add("catalog-list-json-family", ["catalog", "list", "--json", "--family", "no-such-family"], json=True)

    # ------------------------------------------------------------------ --json variants (a sample per command)
    by_id = {c.id: c for c in b.cases}
    json_sample = [
        "rank-util-1.5", "rank-tp-3", "rank-batch-1,,x", "rank-target-NoSuchModel", "rank-target-cfg-malformed",
        "rank-temperature-nan", "check-target-tok-malformed", "check-target-cfg-json-list",
        "memory-util-1.5", "memory-tp-0", "memory-target-cfg-hidden-str", "memory-max-num-seqs--1",
        "measure-k-0", "measure-temperature--1", "measure-store-store-garbage",
        "speedup-alpha-1.5", "speedup-full-tp-3", "speedup-k-100", "speedup-run--1",
        "calibrate-k-0", "calibrate-acceptance-1.5", "calibrate-show-NoSuchModel",
        "serve-cmd-k-0", "serve-cmd-tp-3", "serve-cmd-target-NoSuchModel", "serve-cmd-util-1.5",
        "preflight-k-100", "preflight-tp-0", "preflight-target-NoSuchModel",
        "monitor-server-garbage", "monitor-server-nan", "monitor-url-http:__127.0.0.1:1",
    ]
    for cid in json_sample:
        c = by_id[cid]
        b.add(c.id + "-json", c.argv + ("--json",), files=c.files, json=True, guard_heavy=c.guard_heavy,
              server=c.server, timeout=c.timeout, expect_exit=c.expect_exit)
    for argv, cid in [(["runs", "show", "-1", *st], "runs-show-id--1-json"),
                      (["runs", "list", "--store", "{tmp}/store-garbage"], "runs-list-store-garbage-json"),
                      (["catalog", "show", "NoSuchModel"], "catalog-show-NoSuchModel-json")]:
        files = tuple(f for f in ("store-dir", "store-garbage") if f"{{tmp}}/{f}" in " ".join(argv))
        b.add(cid, [*argv, "--json"], files=files, json=True)

    # ------------------------------------------------------------------ as subprocesses (`python -m draftfit`)
    sp = dict(subprocess=True, timeout=20.0)
    b.add("sub-monitor-server-garbage", ["monitor", "{srv}/garbage", "--once"], server=True, expect_exit=None, **sp)
    b.add("sub-monitor-server-nan", ["monitor", "{srv}/nan", "--once"], server=True, expect_exit=None, **sp)
    b.add("sub-monitor-server-slow", ["monitor", "{srv}/slow", "--once"], server=True, expect_exit=None,
          subprocess=True, timeout=15.0)
    b.add("sub-monitor-server-close", ["monitor", "{srv}/close", "--once"], server=True, expect_exit=None, **sp)
    b.add("sub-monitor-interval-nan", ["monitor", "{srv}/good", "--interval", "nan", "--count", "1"], server=True,
          **sp)
    b.add("sub-monitor-server-garbage-json", ["monitor", "{srv}/garbage", "--once", "--json"], server=True,
          expect_exit=None, json=True, **sp)
    b.add("sub-rank-util-1.5-json", ["rank", "--target", M_T, "--util", "1.5", "--json"], json=True, **sp)
    b.add("sub-rank-target-cfg-hidden-str", ["rank", "--target", "{tmp}/cfg-hidden-str"], files=("cfg-hidden-str",),
          **sp)
    b.add("sub-memory-tp-0-json", ["memory", M_T, "--gpu", GPU, "--tp", "0", "--json"], json=True, **sp)
    # Hostile environment: a file where the cache folder goes, a home without catalogs, a garbage catalog.
    b.add("sub-env-cache-is-file-check", ["check", "Qwen2.5-7B", "Qwen2.5-0.5B"], files=("path-is-file",),
          env=(("DRAFTFIT_CACHE", "{tmp}/path-is-file"),), expect_exit=None, **sp)
    b.add("sub-env-cache-is-file-fixtures", ["fixtures", "tokenizers"], files=("path-is-file",),
          env=(("DRAFTFIT_CACHE", "{tmp}/path-is-file"),), expect_exit=None, **sp)
    b.add("sub-env-store-garbage-runs-list", ["runs", "list"], files=("store-garbage",),
          env=(("DRAFTFIT_STORE", "{tmp}/store-garbage"),), **sp)
    b.add("sub-env-home-empty-rank", ["rank", "--target", M_T], files=("path-empty-dir",),
          env=(("DRAFTFIT_HOME", "{tmp}/path-empty-dir"),), expect_exit=None, **sp)
    b.add("sub-env-home-garbage-catalog-rank", ["rank", "--target", M_T], files=("home-garbage-catalog",),
          env=(("DRAFTFIT_HOME", "{tmp}/home-garbage-catalog"),), expect_exit=None, **sp)
    # garbage calibration tables: the step-cost overhead fit reads them (once `draftfit fit`, removed with the learned
    # correction; now the full speedup prediction)
    b.add("sub-env-home-garbage-calibration-speedup", full, files=("home-garbage-calibration",),
          env=(("DRAFTFIT_HOME", "{tmp}/home-garbage-calibration"),), expect_exit=None, **sp)
    return b.cases


# --------------------------------------------------------------------------------------------- files

GOOD_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128009,
}
GOOD_DRAFT_CONFIG = {**GOOD_CONFIG, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "head_dim": 64, "tie_word_embeddings": True}


def tiny_tokenizer(vocab_size: int = 64) -> dict:
    """A valid tokenizers-library tokenizer.json (WordLevel), small enough to load in milliseconds."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


TINY_TOKENIZER_CONFIG = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": None,
                         "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}


def garbage_bytes(n: int = 64 * 1024, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj))


def _model_folder(path: Path, config=None, *, config_text: str | bytes | None = None, tokenizer=True) -> None:
    path.mkdir(parents=True, exist_ok=True)
    cfg_file = path / "config.json"
    if config_text is not None:
        (cfg_file.write_bytes if isinstance(config_text, bytes) else cfg_file.write_text)(config_text)
    elif config is not None:
        _write_json(cfg_file, config)
    if tokenizer:
        _write_json(path / "tokenizer.json", tiny_tokenizer())
        _write_json(path / "tokenizer_config.json", TINY_TOKENIZER_CONFIG)


def _cfg(**changes):
    cfg = dict(GOOD_CONFIG)
    for k, v in changes.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


_DROP = object()

_CFG_OBJECTS = {
    "cfg-empty-object": {},
    "cfg-hidden-str": _cfg(hidden_size="big"),
    "cfg-heads-str": _cfg(num_attention_heads="many"),
    "cfg-layers-str": _cfg(num_hidden_layers="thirty-two"),
    "cfg-vocab-str": _cfg(vocab_size="128k"),
    "cfg-hidden-zero": _cfg(hidden_size=0),
    "cfg-hidden-neg": _cfg(hidden_size=-4096),
    "cfg-layers-neg": _cfg(num_hidden_layers=-1),
    "cfg-layers-zero": _cfg(num_hidden_layers=0),
    "cfg-heads-zero": _cfg(num_attention_heads=0),
    "cfg-heads-neg": _cfg(num_attention_heads=-32),
    "cfg-vocab-zero": _cfg(vocab_size=0),
    "cfg-vocab-neg": _cfg(vocab_size=-5),
    "cfg-hidden-huge": _cfg(hidden_size=10**15),
    "cfg-hidden-float": _cfg(hidden_size=4096.5),
    "cfg-hidden-bool": _cfg(hidden_size=True),
    "cfg-missing-hidden": _cfg(hidden_size=_DROP, head_dim=_DROP),
    "cfg-missing-layers": _cfg(num_hidden_layers=_DROP),
    "cfg-missing-vocab": _cfg(vocab_size=_DROP),
    "cfg-kv-not-divisor": _cfg(num_key_value_heads=7),
    "cfg-kv-gt-heads": _cfg(num_key_value_heads=64),
    "cfg-headdim-neg": _cfg(head_dim=-128),
    "cfg-maxpos-neg": _cfg(max_position_embeddings=-1),
    "cfg-text-config-list": _cfg(text_config=[1, 2, 3]),
    "cfg-text-config-str": _cfg(text_config="llama"),
    "cfg-architectures-str": _cfg(architectures="LlamaForCausalLM"),
    "cfg-dtype-bogus": _cfg(torch_dtype="int3"),
    "cfg-moe-topk-gt-experts": _cfg(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=8,
                                    num_experts_per_tok=64),
    "cfg-layer-types-short": _cfg(layer_types=["full_attention", "sliding_attention"], sliding_window=4096),
    "cfg-rope-str": _cfg(rope_scaling="banana"),
    "cfg-rope-unknown-type": _cfg(rope_scaling={"rope_type": "banana", "factor": 2.0}),
    "cfg-hidden-indivisible": _cfg(hidden_size=4097, head_dim=_DROP),
    "cfg-rope-yarn-huge": _cfg(rope_scaling={"rope_type": "yarn", "factor": 1e308,
                                             "original_max_position_embeddings": 4096}),
    "cfg-layers-2e40": _cfg(num_hidden_layers=2**40),
}
_CFG_TEXTS = {
    "cfg-malformed": '{"hidden_size": 4096, "num_hidden_layers": ',
    "cfg-json-list": "[4096, 32, 32]",
    "cfg-json-string": '"LlamaForCausalLM"',
    "cfg-json-null": "null",
    "cfg-json-number": "42",
    "cfg-empty-file": "",
    "cfg-hidden-bigint": json.dumps(GOOD_CONFIG).replace('"hidden_size": 4096', '"hidden_size": 1' + "0" * 400),
    "cfg-hidden-nan": json.dumps(GOOD_CONFIG).replace('"hidden_size": 4096', '"hidden_size": NaN'),
    "cfg-hidden-inf": json.dumps(GOOD_CONFIG).replace('"hidden_size": 4096', '"hidden_size": Infinity'),
    "cfg-deep-nesting": '{"text_config": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "cfg-rope-yarn-nan": json.dumps(_cfg(rope_scaling={"rope_type": "yarn", "factor": float("nan")})),
    "cfg-rope-theta-inf": json.dumps(_cfg(rope_theta=float("inf"))),
}


def _build_cfg_variant(name: str, path: Path) -> None:
    if name in _CFG_OBJECTS:
        _model_folder(path, _CFG_OBJECTS[name])
    elif name in _CFG_TEXTS:
        _model_folder(path, config_text=_CFG_TEXTS[name])
    elif name == "cfg-binary-64k":
        _model_folder(path, config_text=garbage_bytes())
    elif name == "cfg-utf16":
        _model_folder(path, config_text=json.dumps(GOOD_CONFIG).encode("utf-16"))
    elif name == "cfg-is-dir":
        _model_folder(path)
        (path / "config.json").mkdir()
    elif name == "cfg-dangling-symlink":
        _model_folder(path)
        (path / "config.json").symlink_to(path / "no-such-target.json")
    elif name == "cfg-devnull":
        _model_folder(path)
        (path / "config.json").symlink_to("/dev/null")
    elif name == "cfg-absent":
        _model_folder(path)  # tokenizer files only, no config.json
    elif name == "cfg-fifo":
        _model_folder(path)
        os.mkfifo(path / "config.json")
    elif name == "cfg-unreadable":
        _model_folder(path, GOOD_CONFIG)
        (path / "config.json").chmod(0)
    else:
        raise KeyError(name)


def _build_tok_variant(name: str, path: Path) -> None:
    _model_folder(path, GOOD_CONFIG)
    tok, tcfg, jinja = path / "tokenizer.json", path / "tokenizer_config.json", path / "chat_template.jinja"
    if name == "tok-malformed":
        tok.write_text('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0,')
    elif name == "tok-json-list":
        tok.write_text("[1, 2, 3]")
    elif name == "tok-empty-object":
        tok.write_text("{}")
    elif name == "tok-binary-64k":
        tok.write_bytes(garbage_bytes(seed=1))
    elif name == "tok-empty-file":
        tok.write_text("")
    elif name == "tok-is-dir":
        tok.unlink()
        tok.mkdir()
    elif name == "tok-dangling-symlink":
        tok.unlink()
        tok.symlink_to(path / "nowhere.json")
    elif name == "tok-model-bogus":
        t = tiny_tokenizer()
        t["model"] = {"type": "NoSuchModelType", "vocab": {}}
        _write_json(tok, t)
    elif name == "tok-vocab-ids-str":
        t = tiny_tokenizer()
        t["model"]["vocab"] = {k: str(v) for k, v in t["model"]["vocab"].items()}
        _write_json(tok, t)
    elif name == "tok-missing":
        tok.unlink()
    elif name == "tok-unreadable":
        tok.chmod(0)
    elif name == "tokcfg-malformed":
        tcfg.write_text('{"bos_token": "<s>", ')
    elif name == "tokcfg-json-list":
        tcfg.write_text('["<s>", "</s>"]')
    elif name == "tokcfg-bos-number":
        _write_json(tcfg, {**TINY_TOKENIZER_CONFIG, "bos_token": 12345, "eos_token": ["</s>"]})
    elif name == "tokcfg-template-number":
        _write_json(tcfg, {**TINY_TOKENIZER_CONFIG, "chat_template": 42})
    elif name == "tokcfg-binary-64k":
        tcfg.write_bytes(garbage_bytes(seed=2))
    elif name == "tokcfg-is-dir":
        tcfg.unlink()
        tcfg.mkdir()
    elif name == "jinja-is-dir":
        jinja.mkdir()
    elif name == "jinja-binary":
        jinja.write_bytes(garbage_bytes(seed=3))
    else:
        raise KeyError(name)


def _build_store(name: str, path: Path) -> None:
    if name == "store-garbage":
        path.write_bytes(garbage_bytes(seed=4))
    elif name == "store-text":
        path.write_text("this is not a database\n" * 100)
    elif name == "store-json":
        path.write_text(json.dumps({"runs": [{"id": 1, "k": "four"}]}))
    elif name == "store-wrong-schema":
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE runs (id TEXT, colour TEXT)")
        con.execute("INSERT INTO runs VALUES ('one', 'blue')")
        con.commit()
        con.close()
    elif name == "store-empty-dir-name":
        path.mkdir()  # a directory named like a store file: `--store` points at a folder
    else:
        raise KeyError(name)


def _build_lane(name: str, path: Path) -> None:
    if name == "lane-garbage":
        path.write_bytes(garbage_bytes(seed=5))
    elif name == "lane-json-list":
        path.write_text("[1, 2, 3]")
    elif name == "lane-empty-object":
        path.write_text("{}")
    elif name == "lane-bad-fields":
        _write_json(path, {"target": 42, "draft": None, "gpu": ["H200"], "tp": "two", "configs": "all",
                           "results": {"1": "fast"}})
    else:
        raise KeyError(name)


def _build_home(name: str, path: Path, project_root: Path) -> None:
    import shutil

    path.mkdir(parents=True)
    # catalogs/ sits at the repo root, or inside the package once it is package data
    catalogs = next((p for p in (project_root / "catalogs", project_root / "draftfit" / "catalogs") if p.is_dir()), None)
    if name == "home-garbage-catalog":
        (path / "catalogs").mkdir()
        (path / "data").mkdir()
        names = sorted(f.name for f in catalogs.glob("*.yaml")) if catalogs else []
        for n in names or ["models.yaml", "gpus.yaml", "tokenizers.yaml", "acceptance_priors.yaml"]:
            (path / "catalogs" / n).write_text("models: [: this is : not yaml\n\t- {")
    elif name == "home-garbage-calibration":
        if catalogs:
            shutil.copytree(catalogs, path / "catalogs")
        cal = path / "data" / "calibration"
        cal.mkdir(parents=True)
        (cal / "a.json").write_bytes(garbage_bytes(seed=6))
        (cal / "b.json").write_text('{"target": "Llama-3.1-8B", "spec": "none", "baseline": [1, 2]}')
    else:
        raise KeyError(name)


def build_file(name: str, root: Path, project_root: Path | None = None) -> Path:
    """Create the thing named `name` at root/name (idempotent) and return its path."""
    path = root / name
    if path.exists() or path.is_symlink():
        return path
    if project_root is None:
        project_root = Path(__file__).resolve().parent.parent
    if name == "good-model":
        _model_folder(path, GOOD_CONFIG)
    elif name == "good-draft":
        _model_folder(path, GOOD_DRAFT_CONFIG)
    elif name.startswith("cfg-"):
        _build_cfg_variant(name, path)
    elif name.startswith(("tok-", "tokcfg-", "jinja-")):
        _build_tok_variant(name, path)
    elif name.startswith("store-") and name != "store-dir":
        _build_store(name, path)
    elif name == "store-dir":
        path.mkdir()
    elif name.startswith("lane-"):
        _build_lane(name, path)
    elif name.startswith("home-"):
        _build_home(name, path, project_root)
    elif name == "path-is-file":
        path.write_text("not a model folder\n")
    elif name == "path-nonexistent":
        pass  # stays absent
    elif name == "path-dangling-symlink":
        path.symlink_to(root / "no-such-folder")
    elif name == "path-empty-dir":
        path.mkdir()
    elif name.startswith("log-"):  # request logs for --request-log
        path.write_bytes({
            "log-no-columns": b"a,b\n1,2\n", "log-negative": b"prompt_len,output_len\n100,-5\n",
            "log-words": b"prompt_len,output_len\nlong,short\n", "log-empty": b"prompt_len,output_len\n",
            "log-float": b"prompt_len,output_len\n100.5,20\n", "log-jsonl-bad": b'{"prompt_len": 1\n',
            "log-jsonl-list": b'{"prompt_len": [1], "output_len": 2}\n', "log-binary": garbage_bytes(),
        }[name])
    elif name.startswith("logged-"):
        rows = {"logged-good": [{"prompt": "def add(a, b):", "completion": "\n    return a + b\n"}],
                "logged-no-output": [{"prompt": "def add(a, b):"}],
                "logged-empty-output": [{"prompt": "def add(a, b):", "completion": "  "}],
                "logged-output-number": [{"prompt": "def add(a, b):", "completion": 42}],
                "logged-assistant-only": [{"messages": [{"role": "assistant", "content": "hello"}]}],
                "logged-response-no-choices": [{"body": {"prompt": "hi"}, "response": {"body": {"choices": []}}}],
                "logged-blank": [],
                "logged-one-token-outputs": [{"prompt": "Say yes.", "completion": "yes"}] * 3,
                "logged-json-list": [["prompt", "completion"]]}[name]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) or "\n\n")
    elif name == "prompts-deep-nesting":  # json's parser recurses per bracket: RecursionError, not a crash
        path.write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    elif name == "slowtok-only":  # GPT-2's slow format: vocab.json + merges.txt, no tokenizer.json, no config.json
        path.mkdir()
        _write_json(path / "vocab.json", {"a": 0, "b": 1, "ab": 2})
        (path / "merges.txt").write_text("#version: 0.2\na b\n")
    else:
        raise KeyError(f"no file builder for {name!r}")
    return path


def expand(text: str, tmp: Path, srv: str = "") -> str:
    return text.replace("{tmp}", str(tmp)).replace("{srv}", srv)


# --------------------------------------------------------------------------------------------- /metrics server

_GOOD_METRICS = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 20.0
"""


def _metrics(drafts="100.0", tokens="400.0", accepted="200.0", per_pos=("80.0", "60.0", "40.0", "20.0"),
             positions=None) -> str:
    lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}',
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {tokens}',
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}']
    for i, v in enumerate(per_pos):
        pos = positions[i] if positions else str(i)
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{pos}"}} {v}')
    return "\n".join(lines) + "\n"


class MetricsServer:
    """A tiny threaded HTTP server on 127.0.0.1 whose /<route>/metrics serves one kind of garbage."""

    ROUTES = {
        "good": _GOOD_METRICS,
        "garbage": "lorem ipsum dolor sit amet\n}{ not prometheus ][\n" * 50,
        "binary": None,  # random bytes
        "html": "<html><body><h1>Welcome to nginx!</h1></body></html>\n",
        "empty": "",
        "nan": _metrics(drafts="NaN", tokens="NaN", accepted="NaN", per_pos=("NaN", "NaN", "NaN", "NaN")),
        "inf": _metrics(drafts="+Inf", tokens="+Inf", accepted="1.0", per_pos=("+Inf", "1", "1", "1")),
        "pos-5000000": _metrics(per_pos=("80.0", "60.0"), positions=("0", "5000000")),
        "pos-negative": _metrics(per_pos=("80.0", "60.0"), positions=("0", "-3")),
        "pos-not-int": _metrics(per_pos=("80.0", "60.0"), positions=("0", "one")),
        "accepted-gt-drafted": _metrics(drafts="10", tokens="40", accepted="400",
                                        per_pos=("100", "100", "100", "100")),
        "negative-counters": _metrics(drafts="-100", tokens="-400", accepted="-200",
                                      per_pos=("-80", "-60", "-40", "-20")),
        "drafts-zero-tokens-nonzero": _metrics(drafts="0", tokens="400", accepted="200"),
        "huge-counters": _metrics(drafts="1e308", tokens="1e308", accepted="1e308",
                                  per_pos=("1e308", "1e308", "1e308", "1e308")),
        "bad-escape": 'vllm:spec_decode_num_drafts_total{engine="\\x\\u12"} 100\n' + _GOOD_METRICS,
        "slow": None,  # headers, then one byte every 0.5 s, forever
        "redirect": None,  # 302 to another host
        "close": None,  # closes the connection without a response
        "status-500": None,
        "status-404": None,
    }

    def __init__(self):
        routes = self.ROUTES

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                route = self.path.strip("/").split("/")[0]
                if route == "close":
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if route == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "http://127.0.0.2:9/metrics")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if route in ("status-500", "status-404"):
                    code = int(route.split("-")[1])
                    body = b"Internal Server Error\n"
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if route == "slow":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(10**9))
                    self.end_headers()
                    deadline = time.monotonic() + 120
                    try:
                        while time.monotonic() < deadline:
                            self.wfile.write(b"#")
                            self.wfile.flush()
                            time.sleep(0.5)
                    except OSError:
                        pass
                    self.close_connection = True
                    return
                if route not in routes:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = garbage_bytes(seed=7) if route == "binary" else routes[route].encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="hostile-metrics", daemon=True)

    def __enter__(self) -> "MetricsServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------------------------- checking


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def problems(case: Case, *, exit_code: int | None, stdout: str, stderr: str, exception: str = "",
             timed_out: bool = False, heavy: str = "", elapsed: float = 0.0) -> list[str]:
    """What is wrong with one run of a case (empty list: it behaves). Each item starts with a failure kind."""
    if timed_out:
        return [f"hang: no answer within {case.timeout:g}s"]
    if heavy:
        return [f"accepted: went on to heavy work ({heavy}) instead of rejecting the input"]
    out: list[str] = []
    if "internal error" in stdout + stderr:  # the CLI's catch-all for a bug: a crash in one line is still a crash
        where = stderr if "internal error" in stderr else stdout
        return [f"internal error: {next(x for x in _lines(where) if 'internal error' in x)[:200]}"]
    if exception:
        out.append(f"traceback: {exception}")
    elif "Traceback (most recent call last)" in stdout + stderr:
        tb = stderr if "Traceback" in stderr else stdout
        tb = tb[tb.rindex("Traceback (most recent call last)"):]
        # the exception line: the last unindented line (messages such as YAML's run on over indented lines)
        heads = [line for line in _lines(tb)[1:] if _EXC_LINE.match(line)]
        last = heads[-1] if heads else (_lines(tb)[-1] if _lines(tb) else "?")
        out.append(f"traceback: {last[:200]}")
    if exit_code == 0:
        out.append("exit 0: nonsense accepted")
    elif case.expect_exit is not None and exit_code != case.expect_exit and not out:
        out.append(f"exit {exit_code} (expected {case.expect_exit} for bad input)")
    if out and out[0].startswith("traceback"):
        return out
    if case.json:
        try:
            obj = json.loads(stdout)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            out.append("json: stdout is not one JSON object" + (f" (stderr: {_lines(stderr)[-1][:120]!r})"
                                                               if _lines(stderr) else " (empty)"))
        elif not {"error", "fix"} <= set(obj):
            out.append(f"json: object lacks error/fix (keys {sorted(obj)[:6]})")
        return out
    where = stderr if stderr.strip() else stdout
    lines = _lines(where)
    errors = [line for line in lines if line.startswith("error:")]
    if lines and lines[-1].startswith("Error:") and any(line.startswith("Usage:") for line in lines):
        out.append(f"click usage error ({len(lines)} lines, 'Error:'): {lines[-1][:160]}")
    elif not errors:
        out.append("no 'error:' line" + (f" (last line: {lines[-1][:120]!r})" if lines else " (no output)"))
    elif len(errors) > 1 or len(lines) > 1:
        out.append(f"multi-line error: {len(lines)} lines, {len(errors)} 'error:' lines")
    return out


if __name__ == "__main__":  # a quick census
    from collections import Counter

    cs = build_cases()
    print(len(cs), "cases")
    print(Counter(c.id.split("-")[0] for c in cs))
