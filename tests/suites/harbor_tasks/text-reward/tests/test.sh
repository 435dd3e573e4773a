#!/bin/bash
if [ "$(cat answer.txt 2>/dev/null)" = "$EXPECTED $GREETING" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
