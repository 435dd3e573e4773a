#!/bin/bash
# The reference fix (run by `harness: oracle`), from the repository's root.
set -euo pipefail
cat > text.py <<'EOF'
"""Text helpers."""

import re


def slugify(title):
    """`Hello, World!` -> `hello-world`."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
EOF
