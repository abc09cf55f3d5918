"""inference.cuda_graphs: the sizes captured, where the setting is refused, trial keys kept,
and (GPU only) replayed predictions equal to the eager forward's for every call size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from raybench.grid import expand
from raybench.spec import SpecError, load_sweep, validate_sweep
from raybench.workloads._graphs import GraphedForward, ladder, padded
from tests.conftest import ROOT

H200_RUN = ROOT / "docs/results/2026-11-26_h200_ray"


def test_ladder_covers_every_call_size_with_the_next_captured_one():
    assert ladder(1) == [1]
    assert ladder(8) == [1, 2, 4, 8]
    assert ladder(12) == [1, 2, 4, 8, 12]
    sizes = ladder(256)
    assert [padded(sizes, n) for n in (1, 2, 3, 5, 129, 256)] == [1, 2, 4, 8, 256, 256]
    for bad in (0, 257):
        with pytest.raises(ValueError, match="graphs hold 1 to 256"):
            padded(sizes, bad)


def raw(workload: dict | None = None, hardware: dict | None = None, **inference) -> dict:
    return {"name": "g", "system": {"label": "x"},
            "workload": workload or {"name": "resnet", "depth": 18, "batch_size": 8},
            "hardware": {"num_gpus": 1, **(hardware or {})},
            "inference": {"scenario": "server", "rate_qps": 10, "cuda_graphs": True,
                          **inference}}


@pytest.mark.parametrize("workload, hardware, problem", [
    ({"name": "vit_tiles", "size": "tiny", "tile": 64}, None, "serves its forward eagerly"),
    (None, {"num_gpus": 0}, "need a GPU replica"),
    (None, {"compile": True}, "torch.compile captures graphs of its own"),
])
def test_refused_where_it_cannot_apply(workload, hardware, problem):
    with pytest.raises(SpecError, match=problem) as e:
        expand(validate_sweep(raw(workload, hardware)))
    assert "inference.cuda_graphs" in str(e.value)


def test_refused_in_the_grid_combination_that_has_no_gpu():
    spec = raw(hardware={"num_gpus": 0}, cuda_graphs=False)
    spec["grid"] = {"inference.cuda_graphs": [False, True]}
    with pytest.raises(SpecError, match="grid combination.*cuda_graphs.*True"):
        expand(validate_sweep(spec))


def test_inference_keys_stay_those_recorded_before_the_setting():
    # the lent H200's Offline row (run2) under today's code: resume and history still find it
    (t,) = expand(load_sweep(H200_RUN / "sweeps/inference.yaml",
                             ["grid={scenario: [offline]}"]))
    recorded = pd.read_csv(H200_RUN / "run2/offline_ray/results.csv")["trial_key"].iloc[0]
    assert t.key == recorded
    (graphed,) = expand(load_sweep(H200_RUN / "sweeps/inference.yaml",
                                   ["grid={scenario: [offline]}", "inference.cuda_graphs=true"]))
    assert graphed.key != t.key


def test_a_server_trial_keeps_its_key_under_the_old_rule_and_gets_a_new_one_under_mlperfs():
    """The lent H200's Server rows (run3, before the search required early stopping and
    confirmed its answer): the same trial with the rule it ran under keeps its key, so resume
    and the history still find it; under MLPerf's rule (the default now) it is another
    measurement, with a key of its own, so the history never compares the two rules' rates."""
    sweep = H200_RUN / "sweeps3/server_graphs.yaml"
    recorded = pd.read_csv(H200_RUN / "run3/server_local/results.csv")["trial_key"].iloc[0]
    (old,) = expand(load_sweep(sweep, ["grid={inference.cuda_graphs: [false]}",
                                       "inference.early_stopping=false",
                                       "inference.confirm_runs=0"]))
    assert old.key == recorded
    (now,) = expand(load_sweep(sweep, ["grid={inference.cuda_graphs: [false]}"]))
    assert now.key != recorded


def test_a_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match="need a GPU replica"):
        GraphedForward(lambda x: x, torch.zeros(3), 4)


@pytest.mark.gpu
def test_replayed_predictions_equal_eager_ones_for_every_call_size(tmp_path: Path):
    from raybench.scenarios.replica import Replica

    spec = raw({"name": "resnet", "depth": 50, "batch_size": 16},
               {"precision": "fp32", "channels_last": True}, max_batch_queries=4)
    eager, graphed = (Replica(t) for t in expand(validate_sweep(
        {**spec, "grid": {"inference.cuda_graphs": [False, True]}})))
    assert graphed.workload._graphed.sizes == [1, 2, 4, 8, 16]
    for n in (1, 3, 16, 5):  # 5 after 16: the padded rows hold the last call's images
        ids = np.arange(100, 100 + n)
        a, b = eager.workload.serve(eager.cls.serving_inputs(eager.trial.workload, ids)), \
            graphed.workload.serve(graphed.cls.serving_inputs(graphed.trial.workload, ids))
        assert (a["pred"] == b["pred"]).all(), n  # fp32: a padded call runs the same math
    assert graphed.flops == eager.flops  # counted on the eager forward, before capture
