"""Gateway: runs sessions on one node (sandboxes, harnesses, the proxy) and writes shards."""
