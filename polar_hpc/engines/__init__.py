"""Inference engines speaking SGLang's HTTP API; `scripted` is the deterministic CPU test engine."""
