"""bench/vllm_wheel_diff.py's pure parts on small inline sources: which rules a file feeds, the speculative-config
keys and defaults read with ast, and the rule-oriented line filter (issue 38, deliverable 4)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import vllm_wheel_diff as wd  # noqa: E402

OLD_SPEC = '''
from dataclasses import field
class SpeculativeConfig:
    ENOUGH: ClassVar[int] = 3
    method: SpeculativeMethod | None = None
    num_speculative_tokens: int = None
    use_heterogeneous_vocab: bool = False
    disable_padded_drafter_batch: bool = False
    parallel_drafting: bool = False
    draft_model_config: ModelConfig = field(default=None, init=True)
    _private: int = 0
'''
NEW_SPEC = '''
from dataclasses import field
class SpeculativeConfig:
    ENOUGH: ClassVar[int] = 3
    method: SpeculativeMethod | None = None
    num_speculative_tokens: int = None
    parallel_drafting: bool | None = None
    draft_model_config: ModelConfig = field(default=None, init=True)
    custom_method: str | None = field(default=None, init=False)
    suffix_decoding_corpus_tokens: int = 1 << 20
    speculator_options: dict = field(default_factory=dict)
'''


def test_spec_keys_added_removed_and_defaults_changed():
    old = wd.dataclass_defaults(OLD_SPEC, ("SpeculativeConfig",))
    new = wd.dataclass_defaults(NEW_SPEC, ("SpeculativeConfig",))
    assert "custom_method" not in new and "_private" not in old and "ENOUGH" not in old  # not keys a user passes
    added, removed, changed = wd.compare(old, new)
    assert added == ["speculator_options", "suffix_decoding_corpus_tokens"]
    assert removed == ["disable_padded_drafter_batch", "use_heterogeneous_vocab"]
    assert changed == [("parallel_drafting", "False", "None")]
    assert new["suffix_decoding_corpus_tokens"] == "1 << 20" and new["speculator_options"] == "dict"


def test_module_and_class_constants():
    old = "DEFAULT_X = 1\nclass CacheConfig:\n    DEFAULT_BLOCK_SIZE: ClassVar[int] = 16\n    y: int = 2\n"
    new = "class CacheConfig:\n    DEFAULT_BLOCK_SIZE: ClassVar[int] = 64\n    DEFAULT_GPU_MEMORY_UTILIZATION = 0.92\n"
    added, removed, changed = wd.compare(wd.module_constants(old), wd.module_constants(new))
    assert added == ["CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION"] and removed == ["DEFAULT_X"]
    assert changed == [("CacheConfig.DEFAULT_BLOCK_SIZE", "16", "64")]


def test_each_mirrored_file_names_the_rules_it_feeds():
    assert any("default_block_size" in f for f in wd.feeds("vllm/config/cache.py"))
    assert any("drafter_cudagraphs" in f for f in wd.feeds("vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py"))
    assert any("serve_flags" in f for f in wd.feeds("vllm/entrypoints/common/cli_args.py"))
    assert wd.feeds("vllm/model_executor/models/llama.py") == []  # not mirrored: never read from the wheel
    for _, what, _ in wd.MIRRORED:  # every entry says what it feeds, in draftfit's own names
        assert "VllmRules." in what or "/" in what or "vllm_flags" in what


def test_only_changed_lines_that_touch_a_rule_are_shown():
    old = "x = 1\nDEFAULT_BLOCK_SIZE = 16\n# a comment about default\nunrelated = 3\n"
    new = "x = 1\nDEFAULT_BLOCK_SIZE = 64\n# a comment about defaults\nunrelated = 4\n"
    plus, minus, lines = wd.touching_lines(old, new, ("DEFAULT",))
    assert (plus, minus) == (3, 3)
    assert lines == ["- DEFAULT_BLOCK_SIZE = 16", "+ DEFAULT_BLOCK_SIZE = 64"]  # comments and other lines left out


def test_diff_wheels_on_tiny_trees():
    old = {"vllm/config/speculative.py": OLD_SPEC, "vllm/v1/worker/gpu_model_runner.py": "class GPUModelRunner: ...\n",
           "vllm/envs.py": 'environment_variables = {\n    "VLLM_USE_V2_MODEL_RUNNER": lambda: 1,\n}\n'}
    new = {"vllm/config/speculative.py": NEW_SPEC, "vllm/v1/worker/extensible_kv_cache.py": "KV_CACHE_MARGIN_FRACTION = 0.75\n",
           "vllm/envs.py": "environment_variables = {\n}\n"}
    d = wd.diff_wheels(old, new, "0.33.0", "0.34.0")
    status = {f["path"]: f["status"] for f in d.files}
    assert status == {"vllm/config/speculative.py": "changed", "vllm/v1/worker/gpu_model_runner.py": "removed",
                      "vllm/v1/worker/extensible_kv_cache.py": "added", "vllm/envs.py": "changed"}
    assert d.envs == ([], ["VLLM_USE_V2_MODEL_RUNNER"])
    assert ("extensible_kv_cache.py KV_CACHE_MARGIN_FRACTION", "", "0.75") in d.constants
    text = wd.render(d)
    assert "removed `disable_padded_drafter_batch`, `use_heterogeneous_vocab`" in text
    assert "VllmRules.runner (the V1 model runner)" in text
