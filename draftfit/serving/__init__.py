"""Stage: serving load (after speedup, before the decision). At the user's traffic (a request rate or a number of
concurrent clients, prompt and output lengths), a model of vLLM's scheduler over draftfit's step costs and
acceptance predicts TTFT, TPOT and ITL percentiles, throughput and goodput with and without speculation, the K (or
per-batch-size K schedule) and drafter that maximise goodput, and the rate where speculation stops paying.

    traffic.py  Traffic, LengthDist: the traffic options, validated once; sample_requests (seeded)
    steps.py    StepSurface: step time per (decoding batch, K, prefill tokens, context) from speedup.stepcost
    sim.py      simulate(): the scheduler, step by step (why a hand-written loop: its docstring)
    load.py     serving_load(layout, target, drafters, traffic) -> ServingLoad, the stage's result
"""

from draftfit.serving.load import AUTO_RATE_SHARES, ServingLoad, saturation_rate, serving_load  # noqa: F401
from draftfit.serving.traffic import Traffic, build_traffic, parse_length, parse_rates  # noqa: F401
