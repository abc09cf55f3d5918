"""The Ray wing: everything of raybench that imports Ray Train or Ray Tune.

`runner.py` is the `ray` runner (the Tune grid, the rows it hands back, inference trials from
the driver); `trial.py` the driver side of one worker group in Tune's function trial (its Ray
Train run); `mailbox.py` the actors and references between driver and ranks; `ranks.py` a Ray
Train rank's `RankSide`; `process_group.py` the ranks' torch.distributed backend; `plan.py`
placement, concurrency and worker groups; `cluster.py` which Ray and its nodes; `artifacts.py` a
trial's files from rank 0's node; `private.py` every use of Ray beyond its public API.
"""
