"""`python -m raybench.history ROOT --csv FILE`: the history's CSV export, at the name the README
has always given it (`raybench history`, the same command). The history is
results/history.py's."""

import sys

from raybench.results.history import main

if __name__ == "__main__":
    sys.exit(main())
