"""`python -m raybench.sweep SWEEP.yaml`: see command.py."""

from raybench import cli
from raybench.sweep.command import main

cli.exit(main())
