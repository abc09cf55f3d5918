"""`python -m raybench.rebuild RUN_DIR`: a damaged results table written again from the run's
trial files, at the name the README has always given it (`raybench rebuild`, the same
command). The rebuild is results/rebuild.py's."""

import sys

from raybench.results.rebuild import main

if __name__ == "__main__":
    sys.exit(main())
