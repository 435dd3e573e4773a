"""`python -m polar_hpc.engines.tiny OUT_DIR`: build the tiny model (see build.py)."""

import sys

from polar_hpc.engines.tiny.build import main

sys.exit(main(sys.argv[1:]))
