"""The rank side: what every rank runs, whatever runner started it.

`entry.py` is the one rank entry (`run_trials`) and the `RankSide` a runner hands it; `loop.py`
the timed loop of one trial (warmup, a window loop per `measure.sync`, the profiled steps),
which makes the trial's step clock (`raybench/clock.py`, a leaf: workloads time their phases
through it); `epochs.py` whole epochs; `record.py` a rank's `RankRecord`; `host.py` the process's
CPU, faults and run-queue wait over a window; `launched.py` the side of a rank started with
torchrun's variables (the local runner's spawned ranks, torchrun's). Ray's side is
runners/on_ray/ranks.py. Nothing here imports Ray.
"""
