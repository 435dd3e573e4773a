#!/bin/bash
# Writes no reward: Harbor counts that as an error, whatever the exit code.
test -f done.txt
