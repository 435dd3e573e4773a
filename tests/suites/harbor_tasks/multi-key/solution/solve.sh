#!/bin/bash
# The oracle finds its files next to this script, at /solution.
cp /solution/greeting.txt greeting.txt
echo "copied /solution/greeting.txt" > /logs/agent/oracle.log
