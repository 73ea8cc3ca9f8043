"""The spec-decode metric names vLLM exports, read by measure (acceptance/measure/vllm.py), monitor
(launch/monitor.py), the launch script (launch/script.py) and the calibration worker. Counters are declared in
vllm/v1/spec_decode/metrics.py (byte-identical in 0.26, 0.33 and 0.34); prometheus_client suffixes a counter with
`_total` on /metrics. The two gauges are the V0 engine's (read only when the counters are absent)."""

from __future__ import annotations

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SPEC_DECODE_PREFIX = "vllm:spec_decode"
GENERATION_TOKENS = "vllm:generation_tokens"
V0_RATE = "vllm:spec_decode_draft_acceptance_rate"
V0_EFFICIENCY = "vllm:spec_decode_efficiency"
COUNTER_SUFFIX = "_total"  # prometheus_client's text exposition of a Counter
