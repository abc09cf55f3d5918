"""Node health: is every GPU of a machine or cluster healthy and as fast as it should be?

`command.py` is `python -m raybench.validate`: the versioned suite (`suites/<version>/`, one
sweep file per probe) through the sweep loop, its page and JSON; `verdict.py` the judgement of
the probe rows and each node's facts (pure); `suites/` the sweep files, shipped as package data.
"""
