#!/bin/bash
# Harbor's conventions: the tests at /tests, the rewards to /logs/verifier/reward.json.
mkdir -p /logs/verifier
greeting=0 agent_log=0
[ "$(cat greeting.txt 2>/dev/null)" = "hello, world" ] && greeting=1
[ -s /logs/agent/oracle.log ] && agent_log=1
printf '{"reward": %d, "greeting": %d, "agent_log": %d, "checked_by": "%s"}\n' \
  "$greeting" "$greeting" "$agent_log" "$(basename "$0")" > /logs/verifier/reward.json
