"""The user's own prompts file: every row shape users have, malformed rows named by line, real tokenizer."""

from __future__ import annotations

import json

import pytest

from draftfit.acceptance.measure.user_prompts import encode_requests, load_prompts_file
from draftfit.errors import DraftfitError

ROWS = [
    {"prompt": "def fibonacci(n):"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]},
    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "x", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}},
    {"request": {"model": "x", "prompt": ["import os\n"]}},
]


def _write(tmp_path, rows, name="p.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return f


def test_every_row_shape(tmp_path):
    up = load_prompts_file(_write(tmp_path, ROWS + [""]))
    assert [r.kind for r in up.requests] == ["prompt", "messages", "messages", "prompt"]
    assert up.requests[2].messages == (("user", "Hi"),) and up.requests[3].prompt == "import os\n"
    assert load_prompts_file(_write(tmp_path, ROWS), max_prompts=2).kinds == {"prompt": 1, "messages": 1}
    assert load_prompts_file(_write(tmp_path, ROWS)).sha256 != load_prompts_file(_write(tmp_path, ROWS[:3])).sha256


@pytest.mark.parametrize("bad,what", [("{not json", "line 2 is not JSON"), ("[1, 2]", "line 2 is a JSON list"),
                                      ('{"text": "x"}', "neither 'prompt' nor 'messages'"),
                                      ('{"messages": []}', "non-empty list"),
                                      ('{"messages": [{"role": "wizard", "content": "x"}]}', "role one of"),
                                      ('{"prompt": 42}', "not a non-empty string")])
def test_a_malformed_row_names_its_line(tmp_path, bad, what):
    f = _write(tmp_path, [ROWS[0], bad])
    with pytest.raises(DraftfitError) as exc:
        load_prompts_file(f)
    assert what in exc.value.message and exc.value.fix


def test_not_a_file_or_empty(tmp_path):
    with pytest.raises(DraftfitError, match="not a file"):
        load_prompts_file(tmp_path)
    with pytest.raises(DraftfitError, match="no requests"):
        load_prompts_file(_write(tmp_path, ["", "  "]))
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DraftfitError, match="UTF-8"):
        load_prompts_file(tmp_path / "bin.jsonl")


def test_encoding_with_the_real_qwen_tokenizer(tmp_path):
    from draftfit.assets.tokenizers import tokenizer_dir

    src = tokenizer_dir("qwen2.5")
    if src is None:
        pytest.skip("qwen2.5 tokenizer not fetched (make fixtures)")
    ids = encode_requests(src, load_prompts_file(_write(tmp_path, ROWS)))
    assert len(ids) == 4 and all(ids)
    # a chat row carries the template's markers; a raw prompt does not
    im_start = 151644
    assert im_start in ids[1] and im_start not in ids[0]
