#!/bin/bash
echo "$ANSWER $GREETING" > answer.txt
