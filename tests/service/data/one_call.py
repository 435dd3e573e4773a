"""A harness that makes one chat call through the proxy (stdlib only) and prints the answer."""

import json
import os
import urllib.request

body = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 24}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
    {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
print(json.load(urllib.request.urlopen(request, timeout=300))["choices"][0]["message"]["content"])
