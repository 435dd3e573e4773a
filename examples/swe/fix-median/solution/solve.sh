#!/bin/bash
# The reference fix (run by `harness: oracle`), from the repository's root.
python3 - <<'EOF'
from pathlib import Path
path, old, new = Path('stats.py'), '    return ordered[middle]\n', '    if len(ordered) % 2 == 0:\n        return (ordered[middle - 1] + ordered[middle]) / 2\n    return ordered[middle]\n'
assert old in path.read_text(), "already fixed?"
path.write_text(path.read_text().replace(old, new))
EOF
