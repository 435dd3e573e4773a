"""The proxy: serves LLM APIs to harnesses from inference engines and records every call.

`server.serve(wire.ProxyLaunch)` runs the process (`python -m polar_hpc proxy LAUNCH`). API adapters:
`openai_chat`, `openai_responses`, `anthropic` (each body <-> the API-neutral `calls.Call` /
`calls.Outcome`). Capture modes: `tito` (render with the model's tokenizer, /generate, drift-free
history; `tool_parsers`) and `passthrough` (the engine's chat route). `routing` picks engines;
`engine_client` is the pooled HTTP client; `gateway_link` the ZeroMQ link to the gateway.
"""
