"""The trial, as every runner and rank receives it: `TrialSpec`, its key (`trial_key`), the
one way to change a validated trial (`derive`), and where its files go.

A leaf beside sections.py: it imports the section models and the workload and inference
parameter types, never the sweep loader (spec.py), the grid (grid.py) or the preprocess stage,
so a rank that runs a trial imports none of them. grid.py makes TrialSpecs; everything after it
reads them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raybench.sections import HardwareSpec, InferenceSpec, MeasureSpec, revalidated
from raybench.workloads import WorkloadParams

SECTIONS = ("workload", "hardware", "measure", "inference")  # inference: where a sweep has one


@dataclass(frozen=True)
class TrialSpec:
    index: int
    key: str
    sweep: str
    workload_name: str
    workload: WorkloadParams
    hardware: HardwareSpec
    measure: MeasureSpec
    overrides: dict[str, Any] = field(default_factory=dict)
    inference: InferenceSpec | None = None  # set: the trial is an inference scenario

    def config(self) -> dict[str, Any]:
        """Flat `section.field` config, as results columns."""
        flat = {"workload.name": self.workload_name}
        for section in SECTIONS:
            if getattr(self, section) is not None:
                for k, v in getattr(self, section).model_dump().items():
                    if isinstance(v, dict):  # hardware.env: a column per variable
                        flat.update({f"{section}.{k}.{name}": x for name, x in v.items()})
                    else:
                        flat[f"{section}.{k}"] = v
        return flat

    def resources(self) -> dict[str, Any]:
        """Training: one worker per DDP rank. Inference: one per replica."""
        hw = self.hardware
        workers = self.inference.replicas if self.inference else hw.world_size
        per_worker = {"CPU": hw.cpus_per_worker, **({"GPU": hw.gpu_share} if hw.use_gpu else {})}
        if hw.node:  # Ray's own resource of that node, at its smallest unit: pinned there
            per_worker[f"node:{hw.node}"] = NODE_SHARE
        total = {k: v * workers for k, v in per_worker.items()}
        return {"workers": workers, "per_worker": per_worker, "total": total}

    def to_dict(self) -> dict[str, Any]:
        """For the trial JSON only. A trial crosses to Tune, Train workers and spawned ranks as
        this object (pickled: pydantic restores its models without validating them again), so
        its values are validated once, at expansion."""
        return {
            "index": self.index, "key": self.key, "sweep": self.sweep,
            "workload_name": self.workload_name, "workload": self.workload.model_dump(),
            "hardware": self.hardware.model_dump(), "measure": self.measure.model_dump(),
            "overrides": self.overrides,
            "inference": self.inference.model_dump() if self.inference else None,
        }


NODE_SHARE = 0.0001  # Ray counts resources in units of 1e-4

# Fields added after trial keys were first recorded, at the value that means "as before": a
# trial that leaves them there keeps the key it had, so resumed runs and the history's
# regression tracking (grouped by key) still find it. A new field of that kind goes here.
KEY_NEUTRAL: dict[str, dict[str, Any]] = {
    "hardware": {"env": {}, "grad_accum_steps": 1, "ranks_per_gpu": 1, "node": None},
    "workload": {"activation_checkpointing": False},
    "measure": {"max_repeats": None},
    "inference": {"cuda_graphs": False, "ttft_bound_ms": None, "tpot_bound_ms": None,
                  "input_tokens": None, "output_tokens": None, "concurrency": None,
                  "limits": None, "lengths_file": None, "loadgen": False,
                  "loadgen_seconds": 600.0, "early_stopping": False, "confirm_runs": 0,
                  "certify_seconds": 60.0, "certify_tolerance_pct": 2.0,
                  "rate_margin_pct": 5.0, "certify_queries": None},
}
# Fields that join an inference trial's key only in the scenario they act in (added after
# keys were first recorded): another scenario's rows keep the keys they had.
SCENARIO_ONLY = {"early_stopping": "server", "confirm_runs": "server",
                 "certify_seconds": "server", "certify_tolerance_pct": "server",
                 "rate_margin_pct": "server", "certify_queries": "server"}
_MISSING = object()


def trial_key(workload_name: str, sections: dict[str, Any]) -> str:
    # The inference section joins the hash only where present: training keys stay as they were.
    payload = {"workload.name": workload_name,
               **{s: sections[s].model_dump(mode="json") for s in SECTIONS
                  if sections.get(s) is not None}}
    for section, fields in KEY_NEUTRAL.items():
        for name, value in fields.items():
            if section in payload and payload[section].get(name, _MISSING) == value:
                del payload[section][name]
    inference = payload.get("inference")
    for name, scenario in SCENARIO_ONLY.items():
        if inference is not None and inference.get("scenario") != scenario:
            inference.pop(name, None)
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def derive(trial: TrialSpec, *, rekey: bool, index: int | None = None,
           overrides: dict[str, Any] | None = None, **changes: dict[str, Any]) -> TrialSpec:
    """`trial` with fields of its sections changed (`workload={"batch_size": 64}`), each
    changed section validated again as expansion validates it: `model_copy(update=...)` would
    let a batch of 0 or a misspelt field travel to the ranks. `rekey`: the key follows the new
    configuration (a trial of its own: the batch search's probes); else the trial keeps its key
    (the same trial, resized inside a runner)."""
    sections = {name: revalidated(getattr(trial, name), **update)
                for name, update in changes.items()}
    new = dataclasses.replace(
        trial, **sections, index=trial.index if index is None else index,
        overrides=trial.overrides if overrides is None else overrides)
    if not rekey:
        return new
    return dataclasses.replace(new, key=trial_key(new.workload_name,
                                                  {s: getattr(new, s) for s in SECTIONS}))


def trace_path(trace_dir: str | None, trial: TrialSpec) -> str | None:
    """Where a trial's profiler trace goes, beside its JSON; None when it asks for none."""
    if not trace_dir or not trial.measure.profile_steps:
        return None
    return str(Path(trace_dir) / f"{trial.index:04d}_{trial.key}.trace.json")


def artifact_dir(trial_dir: str | None, trial: TrialSpec) -> str | None:
    """The trial's own folder beside its JSON, for files a workload writes (predictions...)."""
    if not trial_dir:
        return None
    return str(Path(trial_dir) / f"{trial.index:04d}_{trial.key}")
