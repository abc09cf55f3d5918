"""`python -m raybench.validate`: see command.py."""

from raybench import cli
from raybench.validate.command import main

cli.exit(main())
