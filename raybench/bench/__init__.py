"""Benchmarks of raybench itself, beside the product they measure.

`command.py` is `python -m raybench.bench` (and `bench run`, the in-process sweep's short
name); `overhead.py` a trial through Ray and torchrun against its workload's bare twin
(`twins.py`); `forward.py` a forward-only trial against torch.utils.benchmark; `chips.py` Ray
Data chipping against the reference's serial chipping; `history.py` the history's append and
read costs; `comparison.py` compare's time against a run's configurations; `verdicts.py`
compare's rule on simulated windows. Nothing here is imported by the product.
"""
