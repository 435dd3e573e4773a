"""Inference engines: SGLang and vLLM (a package each: launch, weights, client; `kinds` maps
`engine.kind` to them), the engine step that runs them on a node, and `scripted`, the CPU test engine."""
