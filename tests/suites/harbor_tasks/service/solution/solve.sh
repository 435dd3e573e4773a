#!/bin/bash
mkdir -p site && echo ready > site/status.txt
nohup python3 -m http.server 8765 --bind 127.0.0.1 --directory site > /dev/null 2>&1 &
