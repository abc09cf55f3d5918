"""The sweep: a YAML file's trials run through a runner, each one a row as it ends.

`command.py` is `python -m raybench.sweep` (options, the embedded Ray, the run directory, the
exit code); `loop.py` the one sweep loop every runner shares; `search.py` the largest-batch
search that loop runs through any runner.
"""
