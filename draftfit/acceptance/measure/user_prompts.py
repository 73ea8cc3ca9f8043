"""The user's own prompts, for measuring acceptance on their traffic instead of the built-in sets.

A JSONL file, one request per line, in any of the shapes users already have:
  {"prompt": "..."}                          sent as a raw completion prompt, as /v1/completions would
  {"messages": [{"role": ..., "content": ...}, ...]}   the target's chat template applied, as /v1/chat/completions
  an OpenAI-compatible request log or batch file: the request body under "body", "request" or "params"
  (e.g. {"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [...]}})
Blank lines are skipped. A malformed row is one error naming its line number. The file's sha256 and the rows
used go into the store's provenance (prompt_set_hash), so two runs on the same prompts are comparable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from draftfit.errors import DraftfitError, require

MAX_FILE_BYTES = 256 * 1024 * 1024  # a request log of this size is already far more than a measurement needs
ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(frozen=True)
class UserRequest:
    kind: str  # 'prompt' (raw completion) | 'messages' (chat)
    prompt: str = ""
    messages: tuple = ()  # ((role, content), ...)
    line: int = 0


@dataclass(frozen=True)
class UserPrompts:
    path: Path
    requests: tuple[UserRequest, ...]
    sha256: str  # of the rows used, in order (not of the whole file: --max-prompts takes a prefix)

    @property
    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.requests:
            out[r.kind] = out.get(r.kind, 0) + 1
        return out


def _content_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in ("text", "input_text")]
        if parts and all(isinstance(t, str) for t in parts):
            return "".join(parts)
    raise DraftfitError(f"{where}: message content is neither text nor a list of text parts",
                        fix='use {"role": "user", "content": "..."}')


def _request_from(row, where: str, line: int) -> UserRequest:
    if not isinstance(row, dict):
        raise DraftfitError(f"{where} is a JSON {type(row).__name__}, not an object",
                            fix='each line is {"prompt": "..."} or {"messages": [...]}')
    for key in ("body", "request", "params"):  # request logs and batch files wrap the body
        if isinstance(row.get(key), dict) and ("prompt" in row[key] or "messages" in row[key]):
            row = row[key]
            break
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DraftfitError(f"{where}: messages is not a non-empty list", fix='e.g. "messages": [{"role": "user", '
                                                                                 '"content": "..."}]')
        out = []
        for m in msgs:
            if not isinstance(m, dict) or m.get("role") not in ROLES or "content" not in m:
                raise DraftfitError(f"{where}: a message is not {{role, content}} with role one of {', '.join(ROLES)}",
                                    fix='e.g. {"role": "user", "content": "..."}')
            out.append((m["role"], _content_text(m["content"], where)))
        return UserRequest(kind="messages", messages=tuple(out), line=line)
    if "prompt" in row:
        p = row["prompt"]
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):  # the completions API accepts a list
            p = p[0]
        if not isinstance(p, str) or not p:
            raise DraftfitError(f"{where}: prompt is not a non-empty string", fix='e.g. {"prompt": "def f(x):"}')
        return UserRequest(kind="prompt", prompt=p, line=line)
    raise DraftfitError(f"{where} has neither 'prompt' nor 'messages'",
                        fix='each line is {"prompt": "..."} or {"messages": [...]} (or a request log row with a body)')


def load_prompts_file(path: str | Path, max_prompts: int | None = None) -> UserPrompts:
    """Parse and check the file once, at the boundary; the first `max_prompts` requests are used."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DraftfitError(f"--prompts-file {path} is not a file", fix="pass a JSONL file of prompts or messages")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise DraftfitError(f"--prompts-file {path} is larger than {MAX_FILE_BYTES >> 20} MiB",
                            fix="take a sample of your traffic (a few hundred requests are plenty)")
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DraftfitError(f"--prompts-file {path} is not readable UTF-8 text ({type(exc).__name__})",
                            fix="pass a UTF-8 JSONL file") from None
    requests: list[UserRequest] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{path.name} line {n}"
        try:
            row = json.loads(raw)
        except RecursionError:  # json's parser recurses per bracket: no real request nests thousands deep
            raise DraftfitError(f"{where} nests too deeply to be a request",
                                fix='one flat JSON object per line, e.g. {"prompt": "..."}') from None
        except ValueError as exc:
            raise DraftfitError(f"{where} is not JSON ({str(exc).splitlines()[0][:80]})",
                                fix="one JSON object per line (JSONL)") from None
        requests.append(_request_from(row, where, n))
        if max_prompts and len(requests) >= max_prompts:
            break
    if not requests:
        raise DraftfitError(f"--prompts-file {path} holds no requests", fix='add lines like {"prompt": "..."}')
    digest = hashlib.sha256(json.dumps([(r.kind, r.prompt, r.messages) for r in requests]).encode()).hexdigest()
    return UserPrompts(path=path, requests=tuple(requests), sha256=digest)


def encode_requests(model_dir: str | Path, prompts: UserPrompts) -> list[list[int]]:
    """Token ids as vLLM's OpenAI server would build them: a raw prompt tokenized with the tokenizer's special
    tokens (what /v1/completions does), messages rendered with the target's chat template and the generation
    prompt (what /v1/chat/completions does). Encoded by `tokenizers` directly, as encode_chat does."""
    require("transformers")
    tokenizers = require("tokenizers")
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    exact = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    out = []
    for r in prompts.requests:
        if r.kind == "prompt":
            out.append(exact.encode(r.prompt, add_special_tokens=True).ids)
        else:
            rendered = tok.apply_chat_template([{"role": role, "content": c} for role, c in r.messages],
                                               tokenize=False, add_generation_prompt=True)
            out.append(exact.encode(rendered, add_special_tokens=False).ids)
    return out
