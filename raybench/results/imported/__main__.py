"""`python -m raybench.results.imported`: the same command as `raybench import`."""

import sys

from raybench.results.imported import main

if __name__ == "__main__":
    sys.exit(main())
