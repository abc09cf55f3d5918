"""The two records that cross process boundaries, with their fields declared once.

`RankRecord`: what one rank measured in one trial (rank/loop.py makes it; rank 0 gathers
every rank's; metrics.summarize reads them). `TrialOutcome`: what became of one trial, whoever
ran it (a runner, a failure, the sweep loop); results/writer.py turns it into a row and a trial
file. Both travel as plain dicts where they cross JSON (Tune's report, the trial file, spawned
ranks): `to_dict` / `from_dict`, which refuse a field nobody declared. No raybench imports.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

Status = Literal["ok", "oom", "error", "timeout", "infeasible", "lost"]


def now() -> str:
    """The UTC time rows and outcomes carry (start_time, end_time), to the millisecond."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def present(v: Any) -> bool:
    """A row's cell holds a value: not None, not NaN (what a table gives a row for a column
    its own run did not have)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def uniform_cells(frame: Any) -> Any:
    """A table of rows (pandas) that Arrow can store: a column whose cells mix types (a grid
    axis of a field that takes `false` or `every_epoch`) holds them as text, booleans spelled
    as YAML and Arrow spell them (`true`, `false`); Arrow would refuse the column, and the row
    with it. Columns of one type are left as they are."""
    for name in frame.columns:
        if frame[name].dtype != object:
            continue
        if any(getattr(v, "ndim", 0) for v in frame[name]):
            # a list read back from Parquet is a numpy array, one just made a list: the same
            # cell, which must not make the column text on a resume's next write
            frame[name] = [v.tolist() if getattr(v, "ndim", 0) else v for v in frame[name]]
        kinds = {type(v) for v in frame[name] if present(v)}
        if len(kinds) > 1:
            frame[name] = [(str(v).lower() if isinstance(v, bool) else str(v)) if present(v)
                           else None for v in frame[name]]
    return frame


def _from_dict(cls: type, d: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {unknown}; declare them in records.py")
    return cls(**d)


@dataclass(kw_only=True)
class RankRecord:
    """One rank's measurements of one trial. Times in seconds, memory in MiB."""

    rank: int
    samples_per_step: int
    wait_s: list[float]  # per measured step: waiting for the batch and its copy to the device
    compute_s: list[float]  # per measured step: the rest of the step
    windows_s: list[float]  # wall time of each measured window (repeat)
    workload: str | None = None  # the registered name; records of older runs lack it
    local_rank: int = 0
    node_rank: int = 0
    hostname: str = ""
    node_id: str | None = None
    node_ip: str | None = None
    accelerator_ids: list[str] = field(default_factory=list)
    nccl_net: str | None = None  # the network NCCL chose (fabric.py); None without NCCL
    pid: int | None = None
    device: str = "cpu"
    device_name: str = "cpu"
    steps_per_window: int = 0
    window_steps: list[int] | None = None  # steps of each window (epochs differ)
    epochs: list[dict[str, Any]] | None = None  # epoch-based runs: per-epoch figures
    warmup_s: list[float] = field(default_factory=list)
    warmup_windows: int = 0  # windows run before the kept ones (measure.max_repeats)
    phase_s: dict[str, list[float]] = field(default_factory=dict)  # clock.phase(name) per step
    own_s: list[float] = field(default_factory=list)  # this rank's own forward + backward
    setup_s: float = 0.0
    loss_final: float | None = None
    params: int = 0
    model_size_mb: float = 0.0
    rss_peak_mb: float | None = None
    peak_allocated_mb: float | None = None
    peak_reserved_mb: float | None = None
    allocated_mb: float | None = None
    reserved_mb: float | None = None
    describe: dict[str, Any] = field(default_factory=dict)  # Workload.describe()
    precision: str = "fp32"
    ranks_per_gpu: int = 1  # hardware.ranks_per_gpu: ranks sharing this rank's GPU
    cpu_util_pct: float | None = None  # 100 = one core busy
    minor_faults_per_s: float | None = None  # the process's page faults over the window
    run_wait_pct: float | None = None  # its threads' wait for a core (100 = one thread's window)
    heap: str | None = None  # memory.steady_heap: fixed, user or other
    niceness: int | None = None  # the rank process's nice value (Ray's default for workers: 15)
    telemetry: list[dict[str, Any]] = field(default_factory=list)  # NVML samples
    trace: str | None = None  # profiler trace path
    gpu: dict[str, Any] | None = None  # telemetry.aggregate of the window
    flops_per_sample: float | None = None  # rank 0 only
    # wall-clock times (time.time()) of this rank's way through the trial, for the fixed cost
    # per trial: process_start, imported, loop_entry, setup_start, setup_end, measure_end, ...
    stamps: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, r: RankRecord | dict[str, Any]) -> RankRecord:
        return r if isinstance(r, RankRecord) else _from_dict(cls, r)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(kw_only=True)
class TrialOutcome:
    """What became of one trial (or one preprocess stage): the fields of its row and file."""

    status: Status
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # `namespace/quantity_unit` -> value
    ranks: list[dict[str, Any]] = field(default_factory=list)  # per-rank (or replica) table
    records: list[dict[str, Any]] = field(default_factory=list)  # raw records, as JSON
    start_time: str | None = None
    end_time: str | None = None
    output: str | None = None  # a preprocess stage's output directory
    config: dict[str, Any] | None = None  # a preprocess stage's configuration
    # wall-clock times of the trial's way through its runner (trial_start, fit_start, fit_end)
    stamps: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failed(cls, status: Status, error: str) -> TrialOutcome:
        return cls(status=status, error=error)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialOutcome:
        return _from_dict(cls, d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
