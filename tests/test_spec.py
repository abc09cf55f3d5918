"""Spec validation: every error names file, dotted path, bad value and fix."""

from __future__ import annotations

import pytest

from raybench.grid import expand
from raybench.spec import SpecError, load_sweep


def test_loads_and_fills_defaults(write_sweep):
    spec = load_sweep(write_sweep())
    assert spec.name == "tiny"
    assert spec.workload_name == "resnet"
    assert spec.workload.depth == 18
    assert spec.measure.measure_steps == 3
    assert spec.hardware.precision == "fp32"


def test_unknown_top_key_suggests_closest(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\nmesure: {}\n")
    with pytest.raises(SpecError, match=r"sweep.yaml: mesure=.*unknown key.*did you mean 'measure'"):
        load_sweep(path)


def test_unknown_nested_key_names_dotted_path(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet, detph: 50}\n")
    with pytest.raises(SpecError, match=r"workload.detph=50: unknown key.*'depth'"):
        load_sweep(path)


def test_wrong_type_names_path_value_and_type(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\n"
                       "hardware: {num_gpus: two}\n")
    with pytest.raises(SpecError, match=r"hardware.num_gpus='two'.*Fix: give a value of type int"):
        load_sweep(path)


def test_literal_choice_error(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\n"
                       "hardware: {precision: fp8}\n")
    with pytest.raises(SpecError, match=r"hardware.precision='fp8'.*'fp32', 'tf32', 'amp_fp16' or 'bf16'"):
        load_sweep(path)


def test_ranks_sharing_a_gpu_need_gpus_and_no_inference(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\n"
                       "hardware: {ranks_per_gpu: 2}\n")
    with pytest.raises(SpecError, match=r"hardware=.*ranks_per_gpu \(2\) shares GPUs.*num_gpus is"
                       r" 0: set num_gpus, or cpu_workers"):
        load_sweep(path)
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\n"
                       "hardware: {num_gpus: 1, ranks_per_gpu: 2}\n"
                       "inference: {scenario: offline}\n")
    with pytest.raises(SpecError, match=r"hardware.ranks_per_gpu=2: inference replicas do not "
                       r"share a GPU.*Fix: remove hardware.ranks_per_gpu"):
        load_sweep(path)


def test_warmup_not_below_measured_steps_is_an_error(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\n"
                       "measure: {warmup_steps: 10, measure_steps: 10}\n")
    with pytest.raises(SpecError, match=r"measure=.*warmup_steps \(10\) must be < measure_steps"):
        load_sweep(path)


def test_steps_and_seconds_are_exclusive(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\n"
                       "measure: {measure_steps: 10, measure_seconds: 2}\n")
    with pytest.raises(SpecError, match="measure_steps or measure_seconds, not both"):
        load_sweep(path)


def test_max_repeats_below_repeats_is_an_input_error(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnet}\n"
                       "measure: {repeats: 3, max_repeats: 2}\n")
    with pytest.raises(SpecError, match=r"max_repeats \(2\) is below repeats \(3\)"):
        load_sweep(path)


def test_unknown_workload_lists_registered(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: resnt}\n")
    with pytest.raises(SpecError, match=r"workload.name='resnt'.*did you mean 'resnet'.*use one of \[.*'resnet'.*'vit_tiles', 'xview3_frcnn'\]"):
        load_sweep(path)


def test_malformed_yaml_gives_line(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a\nworkload: [\n")
    with pytest.raises(SpecError, match=r"<yaml>='line \d+, column \d+': malformed YAML"):
        load_sweep(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="cannot be read"):
        load_sweep(tmp_path / "nope.yaml")


def test_missing_required_section(write_sweep):
    with pytest.raises(SpecError, match=r"system=None: is required"):
        load_sweep(write_sweep("name: x\nworkload: {name: resnet}\n"))


def test_bad_grid_value_points_at_index(write_sweep):
    spec = load_sweep(write_sweep(), ["grid.batch_size=[4, 8, 0]"])
    with pytest.raises(SpecError, match=r"grid.workload.batch_size\[2\]=0: .*greater than or equal to 1"):
        expand(spec)


def test_empty_grid_axis(write_sweep):
    # refused as the file is read, with every other grid axis that is not a list of values
    with pytest.raises(SpecError, match=r"grid.batch_size=\[\]: must be a non-empty list"):
        load_sweep(write_sweep(), ["grid.batch_size=[]"])


def test_unknown_grid_key_lists_fields(write_sweep):
    spec = load_sweep(write_sweep(), ["grid.bath_size=[1]"])
    with pytest.raises(SpecError, match=r"grid.bath_size.*not a workload, hardware or measure field"):
        expand(spec)


def test_grid_combination_checked_across_fields(write_sweep):
    spec = load_sweep(write_sweep(), ["grid.warmup_steps=[1, 5]"])
    with pytest.raises(SpecError, match=r"warmup_steps \(5\) must be < measure_steps \(3\)"):
        expand(spec)


def test_set_overrides_nested_values(write_sweep):
    spec = load_sweep(write_sweep(), ["measure.measure_steps=7", "hardware.precision=bf16",
                                      "workload.depth=50"])
    assert spec.measure.measure_steps == 7
    assert spec.hardware.precision == "bf16"
    assert spec.workload.depth == 50


def test_set_needs_equals(write_sweep):
    with pytest.raises(SpecError, match="dotted.key=value"):
        load_sweep(write_sweep(), ["measure.measure_steps"])


def test_imagefolder_needs_existing_directory(write_sweep, tmp_path):
    path = write_sweep("name: x\nsystem: {label: a}\n"
                       f"workload: {{name: resnet, data: imagefolder, data_path: {tmp_path}/no}}\n")
    with pytest.raises(SpecError, match="is not a directory"):
        load_sweep(path)


def test_resolved_spec_round_trips(write_sweep, tmp_path):
    import yaml

    spec = load_sweep(write_sweep())
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(spec.to_yaml_dict()))
    assert load_sweep(again).to_yaml_dict() == spec.to_yaml_dict()
