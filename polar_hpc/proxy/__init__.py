"""The proxy: serves LLM APIs to harnesses from an inference engine and records every call.

`server.serve(ProxyOptions)` runs the process (`python -m polar_hpc.proxy --help`); `openai_chat`
adapts OpenAI Chat Completions; `engine_client` is the pooled HTTP client to the engine.
"""
