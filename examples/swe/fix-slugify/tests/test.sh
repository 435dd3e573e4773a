#!/bin/bash
# Hidden tests. Harbor runs them at /tests and reads /logs/verifier/reward.txt; polar-hpc copies them
# into the evaluator's fresh sandbox at $POLAR_TESTS_DIR and reads $POLAR_LOGS_DIR. cwd: the repository.
TESTS="${POLAR_TESTS_DIR:-/tests}"
LOGS="${POLAR_LOGS_DIR:-/logs/verifier}"
mkdir -p "$LOGS"
if PYTHONPATH="$PWD" python3 -B -m unittest discover -s "$TESTS" -t "$TESTS" -p 'test_*.py' -v; then
  echo 1 > "$LOGS/reward.txt"
else
  echo 0 > "$LOGS/reward.txt"
fi
