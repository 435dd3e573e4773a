#!/bin/bash
# The reference fix (run by `harness: oracle`), from the repository's root.
set -euo pipefail
cat > roman.py <<'EOF'
"""Roman numerals."""

NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
            (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(number):
    if not 0 < number < 4000:
        raise ValueError("Roman numerals cover 1 to 3999")
    out = []
    for value, letters in NUMERALS:
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)
EOF
