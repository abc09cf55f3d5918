"""`hardware.env`: environment variables of a trial's workers, a grid axis, checked and recorded."""

from __future__ import annotations

import os

import pytest

from raybench.context import check_env
from raybench.grid import expand
from raybench.spec import SpecError, load_sweep, validate_sweep


def test_env_is_a_grid_axis_recorded_per_variable(write_sweep):
    spec = load_sweep(write_sweep(), ["grid={batch_size: [4], env.NCCL_ALGO: [Ring, Tree]}",
                                      "hardware.env.CUDA_DEVICE_MAX_CONNECTIONS=1"])
    trials = expand(spec)
    assert [t.hardware.env for t in trials] == [
        {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_ALGO": "Ring"},  # YAML's 1 as a string
        {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_ALGO": "Tree"}]
    config = trials[1].config()
    assert config["hardware.env.NCCL_ALGO"] == "Tree"
    assert config["hardware.env.CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "hardware.env" not in config
    assert trials[0].key != trials[1].key
    assert trials[1].to_dict()["hardware"]["env"]["NCCL_ALGO"] == "Tree"  # the trial JSON
    # the long form names the same axis
    long = expand(load_sweep(write_sweep(), ["grid={batch_size: [4], "
                                             "hardware.env.NCCL_ALGO: [Ring, Tree]}",
                                             "hardware.env.CUDA_DEVICE_MAX_CONNECTIONS=1"]))
    assert [t.key for t in long] == [t.key for t in trials]


def test_a_trial_without_env_keeps_its_key(write_sweep):
    plain = expand(load_sweep(write_sweep()))
    explicit = expand(load_sweep(write_sweep(), ["hardware.env={}"]))
    assert [t.key for t in plain] == [t.key for t in explicit]


@pytest.mark.parametrize("override, path, problem", [
    ("hardware.env={1BAD: x}", "hardware.env", "not an environment variable name"),
    ("hardware.env={CUDA_VISIBLE_DEVICES: '0'}", "hardware.env", "not a sweep setting"),
    ("hardware.env={RAY_DEDUP_LOGS: '0'}", "hardware.env", "not a sweep setting"),
    ("hardware.env={OMP_NUM_THREADS: 4}", "hardware.env", "cpus_per_worker sets it"),
    ("grid.env.MASTER_PORT=[1, 2]", "grid.env.MASTER_PORT", "not a sweep setting"),
    ("grid.env.BAD-NAME=[1]", "grid.env.BAD-NAME", "not an environment variable name"),
])
def test_bad_names_are_input_errors(write_sweep, override, path, problem):
    with pytest.raises(SpecError, match=problem) as err:
        expand(load_sweep(write_sweep(), [override]))
    assert err.value.path.startswith(path)


def test_a_worker_refuses_an_env_that_did_not_reach_it(monkeypatch):
    monkeypatch.setenv("RB_TEST_ENV", "yes")
    check_env({"RB_TEST_ENV": "yes"})
    with pytest.raises(RuntimeError, match="did not reach this worker.*RB_TEST_ENV"):
        check_env({"RB_TEST_ENV": "no"})


def test_local_runner_gives_a_one_rank_trial_a_fresh_process_with_its_env(write_sweep):
    """A one-rank trial normally runs in this process; with an env it is spawned, the variable
    set before torch starts there (the rank checks it), and this process stays untouched."""
    from raybench.runners.local import run_local

    spec = load_sweep(write_sweep(), ["grid={}", "hardware.env.RB_TEST_ENV=spawned"])
    (trial,) = expand(spec)
    out = run_local(trial)
    assert out.status == "ok", out.error
    assert "RB_TEST_ENV" not in os.environ


def test_local_inference_sets_env_for_the_trial_only():
    from raybench.scenarios.run import run_trial

    raw = {"name": "t", "system": {"label": "x"},
           "workload": {"name": "fixed_service", "service_ms": 1.0, "batch_size": 4},
           "hardware": {"env": {"RB_TEST_ENV": "replicas"}},
           "inference": {"scenario": "offline", "samples": 16}}
    (trial,) = expand(validate_sweep(raw))
    out = run_trial(trial, "local")
    assert out.status == "ok", out.error  # each replica checked the variable
    assert "RB_TEST_ENV" not in os.environ
