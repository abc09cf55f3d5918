"""The sweep spec: YAML schema, `--set` overrides and validation, all before Ray starts.

Owns `SweepSpec` (the whole file) and the one error type (`SpecError`) whose message names the
file, the dotted path, the bad value and the fix. The section models live in sections.py (the
worker side imports them without this loader), the preprocess and inference sections beside
their stages; each workload validates its block with its own `Params` model. Does not own grid
expansion (grid.py).
"""

from __future__ import annotations

import difflib
import re
import reprlib
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from raybench import workloads
from raybench.data.stage import PreprocessSpec
from raybench.sections import (  # re-exported: the sweep's models are read from here
    ExecutionSpec,
    HardwareSpec,
    InferenceSpec,
    MeasureSpec,
    OutputSpec,
    SearchSpec,
    Strict,
    SystemSpec,
)
from raybench.workloads import WorkloadParams

__all__ = ["ExecutionSpec", "HardwareSpec", "MeasureSpec", "OutputSpec", "SearchSpec",
           "SpecError", "SweepSpec", "SystemSpec", "load_sweep", "validate_sweep"]

class SpecError(ValueError):
    """A sweep file or override is invalid; the message is one paragraph a user can act on."""

    def __init__(self, source: str, path: str, value: Any, problem: str, fix: str):
        self.source, self.path, self.value = source, path, value
        self.problem, self.fix = problem, fix
        super().__init__(f"{source}: {path}={shown(value)}: {problem}. Fix: {fix}")


# What an error shows of a value: a few levels and items of each, so a YAML alias bomb (a
# billion elements that are references to ten) is named in a line, not written out in minutes.
_SHOWN = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 2, 80, 80, 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 6


def shown(value: Any) -> str:
    return _SHOWN.repr(value)


class _UniqueKeys(yaml.SafeLoader):
    """`yaml.safe_load` that refuses a key written twice in one mapping: PyYAML keeps the last
    silently, so a second `measure:` block would drop the first without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` may override keys: that is what it is for
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:
                continue  # an unhashable key: construct_mapping below says so
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)} (first at line {first.line + 1}); "
                    "merge the two", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """YAML as raybench reads it, whatever the file (a sweep, a `--set` value, a margins
    file): safe types only, every key once per mapping, and nesting Python can build."""
    try:
        return yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # 1,200 levels of [[[...]]] exhaust the parser's recursion
        raise yaml.YAMLError(f"nested deeper than Python's {sys.getrecursionlimit()} frames "
                             "can read") from None


# A sweep's name is a directory under output.root: ASCII letters and digits first (never `.`
# or `..`, which would write the run beside or above the root), then also _ . -
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class SweepSpec(Strict):
    name: str = Field(pattern=NAME)
    system: SystemSpec
    workload_name: str | None  # None: a preprocess-only sweep, no trials
    workload: WorkloadParams | None
    hardware: HardwareSpec = HardwareSpec()
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    measure: MeasureSpec = MeasureSpec()
    execution: ExecutionSpec = ExecutionSpec()
    output: OutputSpec = OutputSpec()
    preprocess: PreprocessSpec | None = None
    search: SearchSpec | None = None
    inference: InferenceSpec | None = None
    source: str = "<memory>"

    def to_yaml_dict(self) -> dict[str, Any]:
        """The resolved spec in the YAML layout it was read from."""
        return {
            "name": self.name,
            "system": self.system.model_dump(),
            **({"workload": {"name": self.workload_name, **self.workload.model_dump()}}
               if self.workload else {}),
            "hardware": self.hardware.model_dump(),
            "grid": self.grid,
            "measure": self.measure.model_dump(),
            "execution": self.execution.model_dump(),
            "output": self.output.model_dump(),
            **({"preprocess": self.preprocess.model_dump(mode="json")} if self.preprocess else {}),
            **({"search": self.search.model_dump(mode="json")} if self.search else {}),
            **({"inference": self.inference.model_dump(mode="json")} if self.inference else {}),
        }


# Sections that may be left out (their defaults apply); `system` is required.
OPTIONAL_SECTIONS: dict[str, type[Strict]] = {
    "hardware": HardwareSpec,
    "measure": MeasureSpec,
    "execution": ExecutionSpec,
    "output": OutputSpec,
}
TOP_KEYS = ["name", "system", "workload", "hardware", "grid", "measure", "execution", "output",
            "preprocess", "search", "inference"]


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """Read, override and validate a sweep file. Raises SpecError; has no side effects."""
    return validate_sweep(*_read(path, overrides))


def load_sections(path: str | Path, overrides: list[str] | None = None) -> str | None:
    """The checks of `load_sweep` that need no workload module (the file, its YAML, the top
    keys and the sections but `workload`, `preprocess`, `search` and `inference`), which take
    milliseconds: a workload's module imports torch (1.2-1.5 s on a small machine). Returns the
    workload's name, if the file names one; raises SpecError like `load_sweep`."""
    raw, source = _read(path, overrides)
    _sections(raw, source)
    block = raw.get("workload")
    return block.get("name") if isinstance(block, dict) else None


def _read(path: str | Path, overrides: list[str] | None) -> tuple[dict[str, Any], str]:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(source, "<file>", str(path), f"cannot be read ({e.strerror})",
                        "pass the path of an existing sweep YAML file") from None
    except UnicodeDecodeError as e:
        raise SpecError(source, "<file>", str(path), f"is not UTF-8 text (byte {e.start} is "
                        f"{e.object[e.start:e.start + 1]!r})", "pass a sweep YAML file, "
                        "saved as UTF-8") from None
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        raise _yaml_error(source, "<yaml>", e, "correct the YAML syntax at that line") from None
    if not isinstance(raw, dict):
        raise SpecError(source, "<top>", raw, "a sweep file must be a mapping",
                        f"write a mapping with the keys {', '.join(TOP_KEYS)}")
    for item in overrides or []:
        apply_override(raw, item, source)
    return raw, source


def apply_override(raw: dict[str, Any], item: str, source: str) -> None:
    """Apply one `--set dotted.key=value` (value parsed as YAML) to the raw mapping."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise SpecError(source, "--set", item, "an override must look like dotted.key=value",
                        "write e.g. --set measure.measure_steps=10")
    try:
        value = parse_yaml(text)
    except yaml.YAMLError as e:
        raise _yaml_error(source, f"--set {key}", e, "quote the value or correct its YAML, "
                          "e.g. --set 'grid.batch_size=[8, 16]'") from None
    if key.startswith("grid."):  # grid keys themselves contain dots: split once
        if raw.get("grid") is None:  # absent, or `grid:` left empty
            raw["grid"] = {}
        if not isinstance(raw["grid"], dict):
            raise SpecError(source, "grid", raw["grid"], "must map dotted keys to lists of "
                            f"values, so --set {key} has no mapping to go in",
                            "write e.g. grid: {batch_size: [16, 32]} in the file")
        raw["grid"][key[len("grid."):]] = value
        return
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SpecError(source, f"--set {key}", value, f"'{part}' is not a section",
                            "override a key inside a mapping section")
    node[parts[-1]] = value


def _yaml_error(source: str, path: str, e: yaml.YAMLError, fix: str) -> SpecError:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
    return SpecError(source, path, where, f"malformed YAML ({getattr(e, 'problem', e)})", fix)


def validate_sweep(raw: dict[str, Any], source: str = "<memory>") -> SweepSpec:
    name, system, sections = _sections(raw, source)
    workload_name, params = None, None
    if raw.get("workload") is not None or raw.get("preprocess") is None:
        workload_name, params = validate_workload(raw.get("workload"), source)
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict):
        raise SpecError(source, "grid", grid, "must map dotted keys to lists of values",
                        "write e.g. grid: {batch_size: [16, 32]}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SpecError(source, f"grid.{key}", values, "must be a non-empty list of "
                            "values", f"write grid.{key}: [value, ...] (one value: [value])")
        for i, value in enumerate(values):
            if not _plain(value):  # a row holds the value: bytes or a date would not store
                raise SpecError(source, f"grid.{key}[{i}]", value, f"is a {type(value).__name__}"
                                ", not a number, text, true/false or a list or mapping of them",
                                "write the value as a number or text")
    preprocess = None
    if raw.get("preprocess") is not None:
        preprocess = build_model(PreprocessSpec, raw["preprocess"], "preprocess", source)
    search = None
    if raw.get("search") is not None:
        search = build_model(SearchSpec, raw["search"], "search", source)
    inference = None
    if raw.get("inference") is not None:
        inference = build_model(InferenceSpec, raw["inference"], "inference", source)
        _check_inference(workload_name, sections["hardware"], search, source)
    return SweepSpec(name=name, system=system, workload_name=workload_name, workload=params,
                     grid=grid, source=source, preprocess=preprocess, search=search,
                     inference=inference, **sections)


def _plain(value: Any) -> bool:
    """Whether a value is what JSON holds: numbers, text, booleans, null, lists and mappings
    of them (YAML also gives bytes for `!!binary` and dates for `2026-01-01`)."""
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _sections(raw: dict[str, Any], source: str) -> tuple[str, SystemSpec, dict[str, Any]]:
    """The top keys, the name and the sections every sweep has: no workload module needed."""
    _reject_unknown(raw, TOP_KEYS, "", source)
    for key in ("name", "system", "workload"):
        if key == "workload" and raw.get("preprocess") is not None:
            continue  # a sweep of the preprocess stage alone
        if key not in raw:
            raise SpecError(source, key, None, "is required",
                            f"add a '{key}:' section (see sweeps/local_cpu.yaml)")
    name = raw["name"]
    if not isinstance(name, str) or not re.fullmatch(NAME, name):
        raise SpecError(source, "name", name, "must be ASCII letters, digits, _ . - starting "
                        "with a letter or digit (it names the run's directory)",
                        "use a name such as dgx_a100")
    system = build_model(SystemSpec, raw["system"], "system", source)
    sections = {k: build_model(model, raw.get(k) or {}, k, source)
                for k, model in OPTIONAL_SECTIONS.items()}
    return name, system, sections


def _check_inference(workload_name: str | None, hardware: HardwareSpec,
                     search: SearchSpec | None, source: str) -> None:
    if workload_name is None:
        raise SpecError(source, "inference", None, "needs a workload to serve",
                        "add a workload: section")
    if not workloads.get(workload_name).serves:
        servable = [n for n in workloads.names() if workloads.get(n).serves]
        raise SpecError(source, "workload.name", workload_name, "has no inference scenario",
                        f"use one of {servable}, or remove the inference: section")
    if hardware.num_gpus > 1:
        raise SpecError(source, "hardware.num_gpus", hardware.num_gpus, "an inference replica "
                        "holds one model copy on one GPU", "set hardware.num_gpus: 1 and "
                        "inference.replicas to the number of GPUs")
    if hardware.ranks_per_gpu > 1:
        raise SpecError(source, "hardware.ranks_per_gpu", hardware.ranks_per_gpu, "inference "
                        "replicas do not share a GPU (each holds the whole device)",
                        "remove hardware.ranks_per_gpu from an inference sweep")
    if search is not None:
        raise SpecError(source, "search", search.model_dump(), "the largest-batch search is "
                        "for training trials", "remove search: from an inference sweep")


def check_graphs(workload_name: str, hardware: HardwareSpec, inference: InferenceSpec,
                 source: str, where: str = "") -> None:
    """inference.cuda_graphs where it can apply (a trial's sections, as grid.py resolves them;
    `where` names its grid combination)."""
    if not inference.cuda_graphs:
        return
    key = "inference.cuda_graphs" + where
    graphed = [n for n in workloads.names() if getattr(workloads.get(n), "serving_graphs", False)]
    if workload_name not in graphed:
        raise SpecError(source, key, True, f"workload {workload_name} serves its forward "
                        "eagerly only", f"use one of {graphed}, or remove inference.cuda_graphs")
    if not hardware.use_gpu:
        raise SpecError(source, key, True, "CUDA graphs need a GPU replica",
                        "set hardware.num_gpus: 1, or remove inference.cuda_graphs")
    if hardware.compile:
        raise SpecError(source, key, True, "hardware.compile is set too: torch.compile "
                        "captures graphs of its own (mode reduce-overhead)",
                        "choose one: remove hardware.compile or inference.cuda_graphs")


TOKEN_FIELDS = ("input_tokens", "output_tokens", "lengths_file", "concurrency", "limits")


def check_tokens(workload_name: str, params: WorkloadParams, inference: InferenceSpec,
                 source: str, where: str = "") -> None:
    """The token fields of an inference trial (a trial's sections, as grid.py resolves them):
    only for workloads served token by token, and within the model's positions."""
    cls = workloads.get(workload_name)
    if not cls.generates:
        token = [n for n in workloads.names() if workloads.get(n).generates]
        if inference.scenario == "concurrency":
            raise SpecError(source, f"inference.scenario{where}", "concurrency", "closed-loop "
                            f"users are for token workloads ({token})",
                            "use offline or server for this workload")
        for name in TOKEN_FIELDS:
            if getattr(inference, name) is not None:
                raise SpecError(source, f"inference.{name}{where}", getattr(inference, name),
                                f"workload {workload_name} answers calls, not token streams",
                                f"use one of {token}, or remove inference.{name}")
        return
    if inference.latency_bound_ms is not None:
        raise SpecError(source, f"inference.latency_bound_ms{where}", inference.latency_bound_ms,
                        f"workload {workload_name} is judged token by token", "give "
                        "ttft_bound_ms and tpot_bound_ms (or limits: mlperf-server / "
                        "mlperf-interactive) instead")
    # pandas, to read a lengths file: only for token workloads' inference trials
    from raybench.scenarios.llm import lengths

    try:
        n = lengths.longest(inference)
    except ValueError as e:
        raise SpecError(source, f"inference.lengths_file{where}", inference.lengths_file,
                        str(e), "give a CSV file with input_tokens and output_tokens columns "
                        "of whole numbers, a row per request shape") from None
    positions = cls.max_positions(params)
    if positions is not None and n > positions:
        key = "lengths_file" if inference.lengths_file else "output_tokens"
        raise SpecError(source, f"inference.{key}{where}", getattr(inference, key),
                        f"a request of {n} positions (prompt and output) is more than the "
                        f"{positions} workload {workload_name} has",
                        "shorten input_tokens or output_tokens (or the file's longest "
                        "requests), or raise the workload's max_positions")


def validate_workload(block: Any, source: str) -> tuple[str, WorkloadParams]:
    if not isinstance(block, dict) or "name" not in block:
        raise SpecError(source, "workload", block, "must be a mapping with a 'name'",
                        f"write workload: {{name: ...}} with one of {workloads.names()}")
    name = block["name"]
    try:
        cls = workloads.get(name)
    except KeyError:
        close = difflib.get_close_matches(str(name), workloads.names(), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise SpecError(source, "workload.name", name, "is not a registered workload",
                        f"{hint}use one of {workloads.names()}") from None
    params = {k: v for k, v in block.items() if k != "name"}
    return name, build_model(cls.Params, params, "workload", source)


def build_model(model: type[BaseModel], data: Any, path: str, source: str) -> Any:
    """Validate `data` against `model`, turning the first pydantic error into a SpecError."""
    if not isinstance(data, dict):
        raise SpecError(source, path, data, "must be a mapping",
                        f"write {path}: as key: value lines")
    _reject_unknown(data, list(model.model_fields), path, source)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        where = f"{path}.{loc}" if loc else path
        value = err.get("input") if loc else data
        raise SpecError(source, where, value, _problem(err), _fix(model, err)) from None


def _reject_unknown(data: dict[str, Any], known: list[str], path: str, source: str) -> None:
    for key in data:
        if key not in known and not (path == "workload" and key == "name"):
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(known)}"
            where = f"{path}.{key}" if path else str(key)
            raise SpecError(source, where, data[key], "unknown key", hint)


def _problem(err: dict[str, Any]) -> str:
    msg = err["msg"]
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg


def _fix(model: type[BaseModel], err: dict[str, Any]) -> str:
    field = model.model_fields.get(str(err["loc"][0])) if err["loc"] else None
    if field is None:
        return "change the values so the section is consistent"
    desc = f" ({field.description})" if field.description else ""
    return f"give a value of type {_type_name(field.annotation)}{desc}"


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
