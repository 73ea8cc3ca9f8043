"""draftfit: pick, size and tune a draft model for vLLM speculative decoding."""

__version__ = "0.1.0"
