#!/bin/bash
# Runs what the agent installed: present in the agent's own environment, not in a fresh one.
if [ "$(PATH="$HOME/.local/bin:$PATH" greet 2>/dev/null)" = ok ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
