"""`python -m raybench` is `python -m raybench.sweep`."""

import sys

from raybench.sweep import main

sys.exit(main())
