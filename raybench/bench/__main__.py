"""`python -m raybench.bench`: see command.py."""

from raybench import cli
from raybench.bench.command import main

cli.exit(main())
