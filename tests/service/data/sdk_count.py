"""A harness of one chat call through the proxy with the official openai SDK; `stream` as argv[1]
says ("stream" or not)."""

import sys

from openai import OpenAI

client = OpenAI(max_retries=0, timeout=300)  # OPENAI_BASE_URL / OPENAI_API_KEY from the session
messages = [{"role": "user", "content": "Count to ten."}]
if sys.argv[1:] == ["stream"]:
    chunks = client.chat.completions.create(model="m", messages=messages, max_tokens=64, stream=True)
    print("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
else:
    print(client.chat.completions.create(model="m", messages=messages, max_tokens=64).choices[0].message.content)
