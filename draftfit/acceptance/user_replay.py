"""The user's own traffic, replayed: n-gram and suffix acceptance from logged prompts and their completions.

Greedy speculative decoding emits the target's own tokens whatever the drafter, and at T > 0 a model-free draft
(one token, probability 1) is kept exactly when the sampled token equals it, so the outputs a server already logged
say how n-gram prompt lookup or suffix decoding would have fared on them, without an engine: `rank` and `speedup`
with `--prompts-file F` replay them (draftfit.acceptance.replay / suffix_replay) in the target's token ids, and the
counters become the same mixture as the built-in references and measured runs (acceptance.curve.Mixture).

A JSONL file, one request per line, each with its prompt (the shapes measure/user_prompts.py reads) and its output:
  {"prompt": "...", "completion": "..."}             ("output" / "response" / "text" also name the completion)
  {"messages": [..., {"role": "assistant", "content": "..."}]}   the last assistant turn is the output
  an OpenAI batch-output or request-log row: the request under "body"/"request"/"params" and the answer under
  "response" (its "body" or itself: choices[0].message.content or choices[0].text)
A row without an output is refused with its line number: measuring needs the engine (`draftfit measure`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from draftfit.acceptance.measure.user_prompts import (MAX_FILE_BYTES, UserPrompts, UserRequest, _request_from,
                                                      encode_requests)
from draftfit.acceptance.method_prior import NGRAM_LOOKUP, replay_estimate, replay_runs
from draftfit.assets.tokenizers import tokenizer_dir
from draftfit.errors import DraftfitError, require

OUTPUT_KEYS = ("completion", "output", "response", "text")
# Each K is replayed on its own (8 replays per method, pure Python, ~1-2 s per K for 64 requests of 400 tokens): a
# few hundred requests already pin the mixture down (the band is their spread), so longer logs are cut here and the
# cut is said.
MAX_REPLAY_REQUESTS = 256
MIN_OUTPUT_TOKENS = 2  # one token is the prefill's: no decode step to draft on


@dataclass(frozen=True)
class LoggedRequest:
    request: UserRequest
    output: str
    line: int


@dataclass(frozen=True)
class LoggedTraffic:
    path: Path
    requests: tuple[LoggedRequest, ...]
    sha256: str
    rows_in_file: int  # requests in the file (more than `requests` when cut at MAX_REPLAY_REQUESTS)


def _choice_text(resp, where: str) -> str | None:
    if not isinstance(resp, dict):
        return None
    body = resp.get("body") if isinstance(resp.get("body"), dict) else resp
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    msg = c.get("message")
    if isinstance(msg, dict) and isinstance(msg.get("content"), str):
        return msg["content"]
    if isinstance(c.get("text"), str):
        return c["text"]
    raise DraftfitError(f"{where}: the response's first choice has no text (message.content or text)",
                        fix="log the completion text, or add \"completion\": \"...\" to the row")


def _split_row(row, where: str, line: int) -> LoggedRequest:
    """One row -> (the request as the engine would have seen it, the output it produced)."""
    if not isinstance(row, dict):
        raise DraftfitError(f"{where} is a JSON {type(row).__name__}, not an object",
                            fix='each line is {"prompt": "...", "completion": "..."}')
    output = None
    if "response" in row and not isinstance(row["response"], str):
        output = _choice_text(row["response"], where)
        if output is None:
            raise DraftfitError(f"{where}: \"response\" holds no choices[0].message.content or choices[0].text",
                                fix="log the completion text, or add \"completion\": \"...\" to the row")
    inner = row
    for key in ("body", "request", "params"):
        if isinstance(row.get(key), dict) and ("prompt" in row[key] or "messages" in row[key]):
            inner = row[key]
            break
    if output is None:
        for key in OUTPUT_KEYS:
            if key in row:
                output = row[key]
                if not isinstance(output, str):
                    raise DraftfitError(f"{where}: \"{key}\" is a {type(output).__name__}, not text",
                                        fix=f'e.g. "{key}": "the model\'s answer"')
                break
    if output is None and isinstance(inner.get("messages"), list) and inner["messages"]:
        last = inner["messages"][-1]
        if isinstance(last, dict) and last.get("role") == "assistant":
            req = _request_from({"messages": inner["messages"][:-1]}, where, line) if len(inner["messages"]) > 1 \
                else None
            if req is None:
                raise DraftfitError(f"{where}: the only message is the assistant's: no prompt to replay it after",
                                    fix="keep the user turn before the assistant's answer")
            content = last.get("content")
            if not isinstance(content, str):
                raise DraftfitError(f"{where}: the assistant's answer is not text", fix='"content": "..."')
            return _checked(LoggedRequest(req, content, line), where)
    if output is None and "prompt" not in inner and "messages" not in inner:
        _request_from(inner, where, line)  # one line saying the row has neither prompt nor messages
    if output is None:
        raise DraftfitError(f"{where} has a prompt but no output to replay",
                            fix='add the logged answer ("completion": "..." or a last assistant message); without '
                                "outputs, measure through the engine: `draftfit measure TARGET ngram --prompts-file F`")
    return _checked(LoggedRequest(_request_from(inner, where, line), output, line), where)


def _checked(r: LoggedRequest, where: str) -> LoggedRequest:
    if not r.output.strip():
        raise DraftfitError(f"{where}: the output is empty", fix="drop the row, or log the completion's text")
    return r


def load_logged_traffic(path: str | Path) -> LoggedTraffic:
    """Parse and check the file once, at the boundary (the first MAX_REPLAY_REQUESTS rows are replayed)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DraftfitError(f"--prompts-file {path} is not a file",
                            fix='pass a JSONL file of logged requests, e.g. {"prompt": "...", "completion": "..."}')
    if path.stat().st_size > MAX_FILE_BYTES:
        raise DraftfitError(f"--prompts-file {path} is larger than {MAX_FILE_BYTES >> 20} MiB",
                            fix="take a sample of your traffic (a few hundred requests are plenty)")
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DraftfitError(f"--prompts-file {path} is not readable UTF-8 text ({type(exc).__name__})",
                            fix="pass a UTF-8 JSONL file") from None
    rows: list[LoggedRequest] = []
    total = 0
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        total += 1
        if len(rows) >= MAX_REPLAY_REQUESTS:
            continue  # counted, not parsed: the replay uses the first MAX_REPLAY_REQUESTS
        where = f"{path.name} line {n}"
        try:
            row = json.loads(raw)
        except RecursionError:
            raise DraftfitError(f"{where} nests too deeply to be a request",
                                fix='one flat JSON object per line, e.g. {"prompt": "...", "completion": "..."}') from None
        except ValueError as exc:
            raise DraftfitError(f"{where} is not JSON ({str(exc).splitlines()[0][:80]})",
                                fix="one JSON object per line (JSONL)") from None
        rows.append(_split_row(row, where, n))
    if not rows:
        raise DraftfitError(f"--prompts-file {path} holds no requests",
                            fix='add lines like {"prompt": "...", "completion": "..."}')
    digest = hashlib.sha256(json.dumps([(r.request.kind, r.request.prompt, r.request.messages, r.output)
                                        for r in rows]).encode()).hexdigest()
    return LoggedTraffic(path=path, requests=tuple(rows), sha256=digest, rows_in_file=total)


def tokenizer_folder(target) -> Path:
    """The target's tokenizer files (a local folder's own, else the fetched fixture of its family): the replay
    matches token ids, so it needs the target's exact tokenizer, never a stand-in."""
    candidates = []
    tok = str(getattr(target, "tokenizer", "") or "")
    if tok.startswith("local:"):
        candidates.append(Path(tok[len("local:"):]))
    if getattr(target, "local_path", ""):
        candidates.append(Path(target.local_path))
    elif tok and not tok.startswith("local:"):
        found = tokenizer_dir(tok)
        if found is not None:
            candidates.append(found)
    for c in candidates:
        if (c / "tokenizer.json").is_file():
            return c
    raise DraftfitError(f"no tokenizer files for {target.name} here (family {tok or 'unknown'}): the replay of "
                        "--prompts-file counts the target's own tokens",
                        fix="fetch them with `draftfit fixtures tokenizers`, or pass --target a local model folder "
                            "(config.json + tokenizer files)")


def encode_traffic(folder: Path, traffic: LoggedTraffic) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, output ids) per request: prompts as vLLM's OpenAI server builds them (measure/user_prompts'
    encode_requests: raw prompts with special tokens, messages through the chat template), outputs as the plain
    token ids of their text (what the server emitted, less the end-of-turn token)."""
    tokenizers = require("tokenizers")
    prompts = UserPrompts(path=traffic.path, requests=tuple(r.request for r in traffic.requests),
                          sha256=traffic.sha256)
    prompt_ids = encode_requests(folder, prompts)
    exact = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [(p, exact.encode(r.output, add_special_tokens=False).ids) for p, r in zip(prompt_ids, traffic.requests)]


def _encoded(path: str, target) -> tuple[LoggedTraffic, list]:
    """The file checked, then the target's tokenizer found, then the encoding: once per (file, target) in a
    process (rank prices n-gram and suffix from the same requests)."""
    traffic = load_logged_traffic(path)
    folder = tokenizer_folder(target)
    key = (traffic.sha256, str(folder))
    if key not in _ENCODED:
        _ENCODED[key] = encode_traffic(folder, traffic)
    return traffic, _ENCODED[key]


_ENCODED: dict = {}


def user_acceptance(method: str, target, prompts_file: str | Path):
    """The n-gram / suffix acceptance of the user's logged traffic, as rank and speedup price it: one replay per K
    with the settings draftfit serves (method_prior.replay_runs), as an AcceptanceEstimate carrying the mixture."""
    if method not in ("ngram", "suffix"):
        raise DraftfitError(f"--prompts-file replays n-gram and suffix decoding, not {method}",
                            fix=f"measure {method} on your prompts with `draftfit measure TARGET DRAFT --prompts-file F`")
    traffic, requests = _encoded(str(Path(prompts_file).expanduser()), target)
    short = sum(len(o) < MIN_OUTPUT_TOKENS for _, o in requests)
    if short == len(requests):
        raise DraftfitError(f"--prompts-file {traffic.path}: every output is shorter than {MIN_OUTPUT_TOKENS} tokens",
                            fix="log whole completions: a one-token answer has no decode step to draft on")
    lo, hi = NGRAM_LOOKUP
    label = f"ngram {lo}-{hi}" if method == "ngram" else "suffix"
    runs, groups = replay_runs(method, requests)
    notes = ["your logged outputs replayed at their own sampling temperature (a model-free draft is kept exactly "
             "when the emitted token equals it)"]
    if traffic.rows_in_file > len(traffic.requests):
        notes.append(f"the first {len(traffic.requests)} of {traffic.rows_in_file} requests replayed")
    name = traffic.path.name
    return replay_estimate(
        method, runs, groups, basis=f"replay of your --prompts-file {name} ({len(requests)} requests)",
        source=f"replay:{label} on {name}",
        citation=(f"--prompts-file {traffic.path} (sha256 {traffic.sha256[:12]}): {len(requests)} logged "
                  f"completions in {target.name}'s tokens, replayed with the settings serve-cmd writes"),
        notes=notes)
