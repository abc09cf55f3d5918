"""Grid expansion: SweepSpec -> ordered list of fully resolved TrialSpecs, plus placement checks.

Pure: deterministic order (grid keys as written, values as listed, the last key varying fastest),
a stable key per trial (hash of its resolved config), every combination validated. Owns the
resources a trial asks for. Does not look at any cluster (runners/on_ray/plan.py does).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from raybench import workloads
from raybench.data.stage import PreprocessSpec
from raybench.sections import InferenceSpec, env_problem
from raybench.spec import (
    HardwareSpec,
    MeasureSpec,
    SpecError,
    SweepSpec,
    build_model,
    check_graphs,
    check_tokens,
)
from raybench.trials import TrialSpec, trial_key
from raybench.workloads import WorkloadParams

# Grid keys may be written short ("batch_size") when the name exists in one section only.
GRID_SECTIONS = ("workload", "hardware", "measure")


def resolve_key(key: str, spec: SweepSpec) -> str:
    """`batch_size` -> `workload.batch_size`; a dotted key must name a known field;
    `env.NAME` (or `hardware.env.NAME`) -> `hardware.env.NAME`, one variable of the workers."""
    models = _section_models(spec)
    if key.startswith(("env.", "hardware.env.")):
        name = key.split("env.", 1)[1]
        why = env_problem(name)
        if why:
            raise SpecError(spec.source, f"grid.{key}", None, why,
                            "sweep another variable, or the hardware field that owns it")
        return f"hardware.env.{name}"
    if "." in key:
        section, _, name = key.partition(".")
        if section in models and name in models[section].model_fields:
            return key
    else:
        owners = [s for s in models if key in models[s].model_fields]
        if len(owners) == 1:
            return f"{owners[0]}.{key}"
        if len(owners) > 1:
            raise SpecError(spec.source, f"grid.{key}", None, f"is ambiguous ({owners})",
                            f"write it in full, e.g. grid.{owners[0]}.{key}")
    known = [f"{s}.{f}" for s in models for f in models[s].model_fields]
    close = [k for k in known if k.endswith("." + key.rpartition(".")[2])]
    names = list(models)
    raise SpecError(spec.source, f"grid.{key}", None,
                    f"is not a {', '.join(names[:-1])} or {names[-1]} field",
                    f"use one of {close or known}")


def expand(spec: SweepSpec) -> list[TrialSpec]:
    """Every grid combination as a validated TrialSpec, in a deterministic order."""
    trial_axes = [(k, v) for k, v in _axes(spec) if not k.startswith("preprocess.")]
    if spec.workload is None:
        if trial_axes:
            raise SpecError(spec.source, "grid", [k for k, _ in trial_axes], "sweeps trial "
                            "fields but the sweep has no workload", "add a workload: section")
        return []
    _check_size(spec, trial_axes)
    axes = [(resolve_key(key, spec), values) for key, values in trial_axes]
    searching = spec.search is not None and spec.search.largest_batch is not None
    if searching and any(k == "workload.batch_size" for k, _ in axes):
        raise SpecError(spec.source, "grid.batch_size", dict(axes)["workload.batch_size"],
                        "search.largest_batch chooses the batch size itself",
                        "remove batch_size from the grid")
    _check_axis_values(spec, axes)
    trials, combos = [], []
    for combo in itertools.product(*(range(len(values)) for _, values in axes)):
        overrides = {key: values[i] for (key, values), i in zip(axes, combo, strict=True)}
        trials.append(_resolve(spec, len(trials), overrides))
        combos.append(combo)
    _refuse_one_trial_twice(spec, [k for k, _ in trial_axes], trials, combos)
    return trials


def _refuse_one_trial_twice(spec: SweepSpec, names: list[str], trials: list[TrialSpec],
                            combos: list[tuple[int, ...]]) -> None:
    """Two grid combinations that validate into one trial (a value listed twice, `1` and
    `1.0` for a float, `1` and `true` for a text field) would share its key: its row, its
    trial file, and on `--resume` one would pass for the other (a run killed and resumed kept
    one row of two). Refused, naming the axis whose values coincide."""
    seen: dict[str, tuple[int, ...]] = {}
    for trial, combo in zip(trials, combos, strict=True):
        first = seen.setdefault(trial.key, combo)
        if first is combo:
            continue
        axis = next(i for i, (a, b) in enumerate(zip(first, combo, strict=True)) if a != b)
        values = spec.grid[names[axis]]
        raise SpecError(spec.source, f"grid.{names[axis]}", values,
                        f"lists {values[first[axis]]!r} and {values[combo[axis]]!r}, which are "
                        "one value once validated: two combinations would be one trial",
                        f"list each value of grid.{names[axis]} once")


def stage_variants(spec: SweepSpec) -> list[PreprocessSpec]:
    """The preprocess stage once per combination of `grid.preprocess.*` axes, in order."""
    if spec.preprocess is None:
        if any(k.startswith("preprocess.") for k in spec.grid):
            raise SpecError(spec.source, "grid", list(spec.grid), "sweeps preprocess fields "
                            "but the sweep has no preprocess section", "add a preprocess: section")
        return []
    axes = [(k.partition(".")[2], v) for k, v in _axes(spec) if k.startswith("preprocess.")]
    _check_size(spec, axes)
    if axes and not spec.preprocess.fresh:
        raise SpecError(spec.source, "preprocess.fresh", False, "a swept stage would hit its "
                        "own cache after the first variant and measure nothing",
                        "set preprocess.fresh: true")
    base = spec.preprocess.model_dump()
    variants = []
    for combo in itertools.product(*(values for _, values in axes)):
        data = {**base, **{name: v for (name, _), v in zip(axes, combo, strict=True)}}
        where = f"grid combination {[v for v in combo]}"
        try:
            variants.append(build_model(PreprocessSpec, data, "preprocess", spec.source))
        except SpecError as e:
            raise SpecError(spec.source, f"{e.path} ({where})", e.value, e.problem, e.fix) from None
    return variants


def _axes(spec: SweepSpec) -> list[tuple[str, list[Any]]]:
    for key, values in spec.grid.items():
        if not isinstance(values, list) or not values:
            raise SpecError(spec.source, f"grid.{key}", values, "must be a non-empty list",
                            f"write grid.{key}: [value, ...]")
    return list(spec.grid.items())


def _check_size(spec: SweepSpec, axes: list[tuple[str, list[Any]]]) -> None:
    size = math.prod(len(values) for _, values in axes)
    if size > spec.execution.max_trials:
        lengths = " x ".join(f"{key} {len(values)}" for key, values in axes)
        raise SpecError(spec.source, "grid", f"{size} combinations ({lengths})",
                        f"expands to more than execution.max_trials={spec.execution.max_trials}",
                        "shorten the axes, or raise execution.max_trials if the sweep is meant "
                        "to be that large")


def _section_models(spec: SweepSpec) -> dict[str, type]:
    models = {"workload": type(spec.workload), "hardware": HardwareSpec, "measure": MeasureSpec}
    return {**models, "inference": InferenceSpec} if spec.inference else models


def _base(spec: SweepSpec, section: str) -> dict[str, Any]:
    """What the sweep file set in this section: a field a validator derives from others (the
    default window, a variant's resolution) is derived again for each combination, so it
    follows the axes instead of keeping the value derived for the sweep's own settings."""
    return getattr(spec, section).model_dump(exclude_unset=True)


def _check_axis_values(spec: SweepSpec, axes: list[tuple[str, list[Any]]]) -> None:
    """Each value alone, so an error points at grid.key[i] rather than at a combination."""
    models = _section_models(spec)
    for key, values in axes:
        section, _, name = key.partition(".")
        for i, value in enumerate(values):
            data = _with(_base(spec, section), name, value)
            try:
                build_model(models[section], data, section, spec.source)
            except SpecError as e:
                if e.path != f"{section}.{name}":
                    continue  # a cross-field problem: reported for the combination below
                raise SpecError(spec.source, f"grid.{key}[{i}]", value, e.problem, e.fix) from None


def _with(data: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """A section's data with one axis value set: a field, or `env.NAME` inside `env`."""
    if name.startswith("env."):
        return {**data, "env": {**data.get("env", {}), name[4:]: value}}
    return {**data, name: value}


def _resolve(spec: SweepSpec, index: int, overrides: dict[str, Any]) -> TrialSpec:
    models = _section_models(spec)
    resolved = {}
    for section in models:
        data = _base(spec, section)
        for k, v in overrides.items():
            if k.startswith(section + "."):
                data = _with(data, k.partition(".")[2], v)
        if section == "measure":
            data = _with_workload_defaults(spec, resolved["workload"], data)
        where = f"grid combination {overrides}" if overrides else section
        try:
            resolved[section] = build_model(models[section], data, section, spec.source)
        except SpecError as e:
            raise SpecError(spec.source, f"{e.path} in {where}", e.value, e.problem,
                            "change the grid so every combination is valid") from None
    problem = workloads.get(spec.workload_name).unsupported(resolved["workload"],
                                                            resolved["hardware"])
    if problem:
        where = f" in grid combination {overrides}" if overrides else ""
        fix = problem[2] if len(problem) > 2 else (
            f"remove {problem[0]} for workload {spec.workload_name}")
        raise SpecError(spec.source, problem[0] + where, None, problem[1], fix)
    if resolved.get("inference") is not None:
        where = f" in grid combination {overrides}" if overrides else ""
        if resolved["hardware"].node:
            raise SpecError(spec.source, "hardware.node" + where, resolved["hardware"].node,
                            "an inference trial's replicas are placed by Ray, not pinned",
                            "remove hardware.node (it pins training trials' workers)")
        check_graphs(spec.workload_name, resolved["hardware"], resolved["inference"],
                     spec.source, where)
        check_tokens(spec.workload_name, resolved["workload"], resolved["inference"],
                     spec.source, where)
    key = trial_key(spec.workload_name, resolved)
    return TrialSpec(index=index, key=key, sweep=spec.name, workload_name=spec.workload_name,
                     overrides=overrides, **resolved)


def _with_workload_defaults(spec: SweepSpec, params: WorkloadParams,
                            measure: dict[str, Any]) -> dict[str, Any]:
    """A workload's own window defaults (per mode, say) fill the measure fields left unset."""
    cls = workloads.get(spec.workload_name)
    if cls.epoch_based:
        fixed = [k for k in ("measure_steps", "measure_seconds", "repeats", "max_repeats")
                 if k in measure]
        fixed += ["sync"] if measure.get("sync") == "window" else []  # epochs sync per step
        if fixed:
            raise SpecError(spec.source, f"measure.{fixed[0]}", measure[fixed[0]],
                            f"{spec.workload_name} measures whole epochs (workload.epochs), "
                            "so a step window does not apply",
                            "remove it; set workload.epochs and measure.warmup_steps instead")
    defaults = cls.measure_defaults(params)
    if "measure_seconds" in measure:
        defaults.pop("measure_steps", None)
    return {**defaults, **measure}
