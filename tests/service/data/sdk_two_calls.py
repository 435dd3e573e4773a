"""A harness of two chat turns through the proxy with the official openai SDK and its retries."""

import os

from openai import OpenAI

client = OpenAI(max_retries=8, timeout=300)  # OPENAI_BASE_URL / OPENAI_API_KEY from the session
messages = [{"role": "user", "content": "What is 2 + 2?"}]
for follow_up in ("And 3 + 3?", None):
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=32)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    if follow_up:
        messages.append({"role": "user", "content": follow_up})
print(messages[-1]["content"], os.environ.get("POLAR_SESSION_ID", ""))
