#!/bin/bash
# The reference fix (run by `harness: oracle`), from the repository's root.
python3 - <<'EOF'
from pathlib import Path
path, old, new = Path('text.py'), 're.sub(r"[^a-z0-9]", "-", title.lower())', 're.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")'
assert old in path.read_text(), "already fixed?"
path.write_text(path.read_text().replace(old, new))
EOF
