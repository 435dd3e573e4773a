#!/bin/bash
# The reference fix (run by `harness: oracle`), from the repository's root.
python3 - <<'EOF'
from pathlib import Path
path, old, new = Path('roman.py'), '(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")', '(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"),\n            (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")'
assert old in path.read_text(), "already fixed?"
path.write_text(path.read_text().replace(old, new))
EOF
