"""Grid expansion and placement: deterministic, keyed, and honest about what fits."""

from __future__ import annotations

import pytest

from raybench.grid import expand, resolve_key
from raybench.runners.on_ray.plan import placement
from raybench.spec import SpecError, load_sweep


def test_expansion_order_and_overrides(write_sweep):
    spec = load_sweep(write_sweep(), ["grid.cpu_workers=[1, 2]", "grid.precision=[fp32, bf16]"])
    trials = expand(spec)
    assert len(trials) == 8
    assert [t.index for t in trials] == list(range(8))
    # last key varies fastest
    assert [t.hardware.precision for t in trials[:2]] == ["fp32", "bf16"]
    assert trials[0].overrides == {"workload.batch_size": 4, "hardware.cpu_workers": 1,
                                   "hardware.precision": "fp32"}
    assert trials[-1].workload.batch_size == 8 and trials[-1].hardware.world_size == 2


def test_keys_are_stable_and_distinct(write_sweep):
    a = [t.key for t in expand(load_sweep(write_sweep()))]
    b = [t.key for t in expand(load_sweep(write_sweep()))]
    assert a == b
    assert len(set(a)) == len(a)
    # the key hashes the resolved config, not how it was written
    c = [t.key for t in expand(load_sweep(write_sweep(), ["grid={workload.batch_size: [4, 8]}"]))]
    assert c == a


def test_key_changes_with_any_config_value(write_sweep):
    base = expand(load_sweep(write_sweep()))[0].key
    other = expand(load_sweep(write_sweep(), ["measure.measure_steps=4"]))[0].key
    assert base != other


def test_short_and_dotted_keys(write_sweep):
    spec = load_sweep(write_sweep())
    assert resolve_key("batch_size", spec) == "workload.batch_size"
    assert resolve_key("precision", spec) == "hardware.precision"
    assert resolve_key("measure.repeats", spec) == "measure.repeats"
    with pytest.raises(SpecError, match="not a workload, hardware or measure field"):
        resolve_key("hardware.depth", spec)


def test_trials_cross_processes_validated_once(write_sweep, monkeypatch):
    """Tune, Train workers and spawned ranks get the expanded TrialSpec pickled: it arrives
    equal, and no section model validates again on the way (validation happens at load and
    expansion only)."""
    import pickle

    from raybench.spec import HardwareSpec, MeasureSpec

    trials = expand(load_sweep(write_sweep()))
    blob = pickle.dumps(trials)

    class Refuse:
        def __getattr__(self, name):
            raise AssertionError(f"validated again ({name})")

    for model in {type(trials[0].workload), HardwareSpec, MeasureSpec}:
        monkeypatch.setattr(model, "__pydantic_validator__", Refuse())
    with pytest.raises(AssertionError, match="validated again"):  # the probe sees validation
        HardwareSpec(num_gpus=0)
    assert pickle.loads(blob) == trials


def test_resources_per_trial(write_sweep):
    t = expand(load_sweep(write_sweep(), ["hardware.num_gpus=4", "hardware.cpus_per_worker=8"]))[0]
    assert t.resources() == {"workers": 4, "per_worker": {"CPU": 8.0, "GPU": 1},
                             "total": {"CPU": 32.0, "GPU": 4}}


def test_ranks_sharing_a_gpu_ask_for_its_share_and_talk_over_gloo(write_sweep):
    t = expand(load_sweep(write_sweep(), ["hardware.num_gpus=2", "hardware.ranks_per_gpu=2"]))[0]
    assert t.hardware.world_size == 4 and t.hardware.backend == "gloo"
    assert not t.hardware.nccl_between_ranks  # gloo: no NCCL debug file to read back
    assert t.resources() == {"workers": 4, "per_worker": {"CPU": 1.0, "GPU": 0.5},
                             "total": {"CPU": 4.0, "GPU": 2.0}}
    assert placement(t, [{"CPU": 4.0, "GPU": 2.0}]) is None  # two ranks on each GPU
    assert "GPU=2 in all" in placement(t, [{"CPU": 4.0, "GPU": 1.0}])
    # three shares of one GPU stay within it in Ray's 1e-4 units
    three = expand(load_sweep(write_sweep(), ["hardware.num_gpus=1",
                                              "hardware.ranks_per_gpu=3"]))[0]
    assert three.resources()["per_worker"]["GPU"] == 0.3333
    assert placement(three, [{"CPU": 3.0, "GPU": 1.0}]) is None
    one = expand(load_sweep(write_sweep(), ["hardware.num_gpus=1"]))[0].hardware
    assert (one.world_size, one.backend, one.gpu_share) == (1, "nccl", 1)
    assert not one.nccl_between_ranks  # one rank talks to no one
    two = expand(load_sweep(write_sweep(), ["hardware.num_gpus=2"]))[0].hardware
    assert two.nccl_between_ranks


def test_derived_trials_are_validated_and_rekeyed_only_when_asked(write_sweep):
    from pydantic import ValidationError

    from raybench.trials import derive

    t = expand(load_sweep(write_sweep()))[0]
    probe = derive(t, rekey=True, index=7, workload={"batch_size": 64})
    assert (probe.index, probe.workload.batch_size, probe.hardware) == (7, 64, t.hardware)
    assert probe.key != t.key and probe.overrides == t.overrides
    assert probe.key == expand(load_sweep(write_sweep(), ["grid.batch_size=[64]"]))[0].key
    resized = derive(t, rekey=False, workload={"batch_size": 1})
    assert (resized.key, resized.index) == (t.key, t.index)
    with pytest.raises(ValidationError, match="batch_size"):
        derive(t, rekey=False, workload={"batch_size": 0})
    with pytest.raises(ValidationError, match="batch_sise"):
        derive(t, rekey=False, workload={"batch_sise": 8})


def test_no_section_is_changed_without_validation():
    """Trials and sections change through trials.derive / sections.revalidated only."""
    from tests.conftest import ROOT

    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "raybench").rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if ".model_copy(" in line and not line.lstrip().startswith("#")]
    assert not hits, f"model_copy skips validation: {hits}"


def test_placement_totals_and_per_node(write_sweep):
    spec = load_sweep(write_sweep(), ["hardware.num_gpus=8", "hardware.cpus_per_worker=4"])
    t = expand(spec)[0]
    dgx = [{"CPU": 128.0, "GPU": 8.0}]
    assert placement(t, dgx) is None
    two_nodes = [{"CPU": 64.0, "GPU": 4.0}, {"CPU": 64.0, "GPU": 4.0}]
    assert placement(t, two_nodes) is None  # spread over nodes
    assert "GPU=8 in all" in placement(t, [{"CPU": 128.0, "GPU": 4.0}])
    assert "cluster has GPU=0" in placement(t, [{"CPU": 256.0}])
    # totals suffice but no node holds a 4-CPU+1-GPU worker on the GPU-less node
    lopsided = [{"CPU": 4.0, "GPU": 8.0}, {"CPU": 64.0}]
    assert "hold only 1 such workers" in placement(t, lopsided)


def test_preprocess_grid_needs_fresh(write_sweep, tmp_path):
    from raybench.grid import stage_variants

    path = write_sweep(f"""
        name: p
        system: {{label: a}}
        preprocess: {{scenes: {tmp_path}/s, labels: {tmp_path}/l.csv,
                      generate: {{scenes: 1}}}}
        grid: {{preprocess.cpus: [1, 2]}}
        """)
    spec = load_sweep(path)
    assert expand(spec) == []  # no workload: a stage-only sweep
    with pytest.raises(SpecError, match=r"preprocess.fresh=False: .*measure nothing.*fresh: true"):
        stage_variants(spec)
    spec = load_sweep(path, ["preprocess.fresh=true"])
    assert [v.cpus for v in stage_variants(spec)] == [1, 2]


def test_preprocess_inputs_must_exist_without_generate(write_sweep, tmp_path):
    path = write_sweep(f"name: p\nsystem: {{label: a}}\n"
                       f"preprocess: {{scenes: {tmp_path}/none, labels: {tmp_path}/l.csv}}\n")
    with pytest.raises(SpecError, match=r"preprocess=.*scenes directory .* does not exist"):
        load_sweep(path)


def test_trials_that_use_no_new_field_keep_their_recorded_keys():
    """Keys as the previous version (416f4e0) recorded them for the shipped sweeps: a field
    added since (hardware.env, grad_accum_steps, activation_checkpointing) left at its neutral
    value must not re-key a trial, or resume and the history's regressions lose it."""
    from tests.conftest import ROOT

    recorded = {"local_cpu": ["22bfe469e39a", "b880cb1c3d38", "48d95ef86402"],
                "tiles_cpu": ["c9cf7f05ad63", "c07c5c249357", "84ab8a2af0ce"],
                "efficientnet_cpu": ["50a881db7c53", "b14eb8adda37"]}
    # local_cpu.yaml measures three windows since 2026-11-24, up to five with its batches made
    # in the rank since 2026-11-25, and windows of 8 steps (up to six) later that day (different
    # measurements, so other keys, rightly); with its old settings its trials keep their old keys
    then = {"local_cpu": ["measure.repeats=1", "measure.max_repeats=null",
                          "measure.measure_steps=10", "hardware.dataloader_workers=1"]}
    for name, keys in recorded.items():
        got = [t.key for t in expand(load_sweep(ROOT / "sweeps" / f"{name}.yaml",
                                                then.get(name, [])))]
        assert got[:len(keys)] == keys, name
    # a trial that does use one is another trial
    changed = expand(load_sweep(ROOT / "sweeps" / "local_cpu.yaml",
                                [*then["local_cpu"], "hardware.grad_accum_steps=2"]))[0].key
    assert changed != recorded["local_cpu"][0]


@pytest.mark.parametrize("grid, axis", [
    ("{batch_size: [8, 8]}", "batch_size"),  # a value listed twice
    ("{batch_size: [4, 8], lr: [1, 1.0]}", "lr"),  # an int and a float of a float field
    ("{env.X: [1, true]}", "env.X"),  # two spellings of one environment value
])
def test_two_combinations_that_are_one_trial_are_refused(write_sweep, grid, axis):
    """They would share a key, a row and a trial file; a run killed and resumed kept one row
    of two (issue 63, item 1)."""
    spec = load_sweep(write_sweep(), [f"grid={grid}"])
    with pytest.raises(SpecError, match=rf"grid\.{axis}=.*one value once validated.*list each "
                                        rf"value of grid\.{axis} once"):
        expand(spec)
