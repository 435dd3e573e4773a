"""The scripted engine: a deterministic CPU stand-in for a remote SGLang server, for tests and demos.

It sits above the proxy (it answers tool calls with the proxy's `tool_parsers`); only the CLI starts
it (`polar-hpc engine --kind scripted`, `server.serve`), and no production module imports it.
"""
