"""The rank side: what every rank runs, whatever runner started it.

`entry.py` is the one rank entry (`run_trials`) and the `RankSide` a runner hands it; `loop.py`
the timed loop of one trial (warmup, windows or epochs, the rank's record); `clock.py` the step
clock that loop owns (step and phase times, own compute inside DDP); `launched.py` the side of
a rank started with torchrun's variables (the local runner's spawned ranks, torchrun's). Ray's
side is runners/on_ray/ranks.py. Nothing here imports Ray.
"""
