#!/bin/bash
# The reference fix (run by `harness: oracle`), from the repository's root.
set -euo pipefail
cat > stats.py <<'EOF'
"""Small statistics helpers."""


def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of an empty sequence")
    middle = len(ordered) // 2
    if len(ordered) % 2 == 0:
        return (ordered[middle - 1] + ordered[middle]) / 2
    return ordered[middle]
EOF
