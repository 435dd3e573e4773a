"""vLLM (`engine.kind: vllm`): how servers are launched, how the proxy talks to them, how their weights are updated."""
