"""The sections of a sweep file: system, hardware, measure, execution, output, search and
inference. Pydantic models, strict and frozen; no raybench imports, so the worker side
(context, workloads, scenarios) depends on them without depending on the loader.

`spec.py` reads a file into these (with the workload's own `Params` and the preprocess
section) and owns the errors; this module owns only the fields and their checks.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Precision = Literal["fp32", "tf32", "amp_fp16", "bf16"]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables raybench, Ray or torch.distributed set per worker: a sweep value would be
# overwritten, or would break placement and the process group.
OWNED_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
})
OWNED_ENV_PREFIXES = ("RAY_", "TUNE_", "RAYBENCH_")


def env_problem(name: str) -> str | None:
    """Why a variable cannot be a sweep setting, or None."""
    if not ENV_NAME.fullmatch(name):
        return (f"'{name}' is not an environment variable name (letters, digits and _, not "
                "starting with a digit)")
    if name in OWNED_ENV or name.startswith(OWNED_ENV_PREFIXES):
        how = ("hardware.cpus_per_worker sets it" if name == "OMP_NUM_THREADS"
               else "raybench, Ray or torch.distributed set it for each worker")
        return f"{name} is not a sweep setting: {how}"
    return None


# Every section refuses unknown keys, is frozen once validated, and refuses .inf and .nan for a
# float (YAML writes them `.inf`, `.nan`): a deadline or a learning rate of inf passes every
# bound yet only fails inside a trial.
STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Strict(BaseModel):
    model_config = STRICT


def revalidated(model: BaseModel, **changes: Any) -> BaseModel:
    """A copy of a validated section with `changes`, through its validators again (pydantic's
    `model_copy(update=...)` skips them): one way to change a section after it was checked."""
    return type(model).model_validate({**model.model_dump(), **changes})


class SystemSpec(Strict):
    """The machine a sweep is written for; used to plan and to label results."""

    label: str = Field(min_length=1)
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    gpu_model: str | None = None
    gpu_memory_gb: float | None = Field(None, gt=0)
    cpus_per_node: int | None = Field(None, ge=1)
    memory_gb: float | None = Field(None, gt=0)
    gpu_hour_usd: float | None = Field(
        None, gt=0, description="what one GPU costs an hour: serving rows state the cost of a "
        "million output tokens from it")


class HardwareSpec(Strict):
    """How one trial uses the hardware: ranks, precision, memory format, input pipeline."""

    num_gpus: int = Field(0, ge=0, description="GPUs of the trial, one DDP rank each (see "
                          "ranks_per_gpu); 0 runs on CPU")
    ranks_per_gpu: int = Field(
        1, ge=1, le=8, description="DDP ranks sharing each GPU (Ray's fractional GPUs). Above "
        "1 the ranks talk over gloo, as NCCL refuses two ranks on one device: for running "
        "multi-rank code on a one-GPU machine, never for scaling figures")
    cpu_workers: int = Field(1, ge=1, description="DDP ranks when num_gpus is 0")
    cpus_per_worker: float = Field(1.0, gt=0, description="logical CPUs reserved per rank")
    precision: Precision = "fp32"
    channels_last: bool = False
    dataloader_workers: int = Field(2, ge=0)
    compile: bool = False
    cudnn_benchmark: bool = Field(
        True, description="cuDNN autotuning: the first steps of each input shape time the "
        "convolution algorithms and keep the fastest, as benchmark suites run; false for "
        "workloads whose shapes vary step to step, where it re-tunes every new shape")
    memory_budget_mb: float | None = Field(
        None, gt=0, description="enforced on GPU; on CPU compared with the measured peak")
    grad_accum_steps: int = Field(
        1, ge=1, description="micro-batches of batch_size per optimizer step (training "
        "workloads): a step then trains batch_size x grad_accum_steps samples per rank, with "
        "DDP's gradient all-reduce after the last micro-batch only")
    node: str | None = Field(
        None, min_length=1, description="on Ray: the IP address of the node the trial's "
        "workers must run on (Ray's node:<ip> resource; validate pins each per-node probe so); "
        "unset: Ray places them. Training trials")
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables of the trial's worker "
        "processes, set when they start, before CUDA or NCCL (CUDA_DEVICE_MAX_CONNECTIONS, "
        "NCCL_ALGO, ...); a grid axis as env.NAME")

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic names the type error
        for name in value:
            why = env_problem(str(name))
            if why:
                raise ValueError(why)
        # YAML gives numbers and booleans; a process environment holds strings
        env = {str(k): ("1" if v is True else "0" if v is False else str(v))
               if isinstance(v, str | int | float | bool) else v for k, v in value.items()}
        for name, v in env.items():
            if isinstance(v, str) and "\0" in v:  # no process can start with it: Ray's set-up
                raise ValueError(f"{name}'s value holds a NUL byte, which no environment "
                                 "can carry")  # of such a worker retries for minutes
        return env

    @model_validator(mode="after")
    def _shared(self) -> HardwareSpec:
        if self.ranks_per_gpu > 1 and not self.num_gpus:
            raise ValueError(f"ranks_per_gpu ({self.ranks_per_gpu}) shares GPUs between ranks "
                             "but num_gpus is 0: set num_gpus, or cpu_workers for CPU ranks")
        return self

    @property
    def world_size(self) -> int:
        return self.num_gpus * self.ranks_per_gpu or self.cpu_workers

    @property
    def gpu_share(self) -> float:
        """The GPU each rank asks Ray for: 1, or its share of one GPU, rounded down to Ray's
        resource unit (1e-4) so that the shares of one GPU never add up to more than it."""
        return 1 if self.ranks_per_gpu == 1 else int(10_000 / self.ranks_per_gpu) / 10_000

    @property
    def backend(self) -> str:
        """torch.distributed's backend between the ranks: NCCL between GPUs, gloo on CPU and
        where ranks share a GPU (NCCL refuses two ranks on one device)."""
        return "nccl" if self.use_gpu and self.ranks_per_gpu == 1 else "gloo"

    @property
    def nccl_between_ranks(self) -> bool:
        """Whether the ranks talk over NCCL (several, each on a GPU of its own): then each
        runner has NCCL write its debug file, to read back which network it chose."""
        return self.backend == "nccl" and self.world_size > 1

    @property
    def use_gpu(self) -> bool:
        return self.num_gpus > 0


class MeasureSpec(Strict):
    """The timed window: warmup is discarded; then fixed steps or a time window, `repeats` times."""

    warmup_steps: int = Field(5, ge=0)
    measure_steps: int | None = Field(None, ge=1)
    measure_seconds: float | None = Field(None, gt=0)
    repeats: int = Field(1, ge=1)
    max_repeats: int | None = Field(
        None, ge=2, description="windows to run at most while the last `repeats` disagree by "
        "more than the validity limit (their throughputs' CV over 5%): the windows before the "
        "last `repeats` then count as warmup, as a longer warmup would have. None, or repeats "
        "1 (one window has nothing to agree with): `repeats` windows and no more")
    profile_steps: int = Field(0, ge=0, description="steps after the windows that rank 0 "
                               "traces with torch.profiler (0: no trace)")
    sync: Literal["step", "window"] = Field(
        "step", description="step: the device is synchronised around every step (exact per-step "
        "and data-wait times, no CPU run-ahead); window: only at the window's ends, as a "
        "training job runs, with step times from CUDA events recorded between steps")

    @model_validator(mode="after")
    def _window(self) -> MeasureSpec:
        if self.measure_steps is not None and self.measure_seconds is not None:
            raise ValueError("set measure_steps or measure_seconds, not both")
        if self.measure_steps is None and self.measure_seconds is None:
            object.__setattr__(self, "measure_steps", 20)
        if self.measure_steps is not None and self.warmup_steps >= self.measure_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be < measure_steps "
                f"({self.measure_steps}): a window no longer than its warmup measures little"
            )
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(
                f"max_repeats ({self.max_repeats}) is below repeats ({self.repeats}): raise it "
                "to repeats or more, or remove max_repeats for exactly `repeats` windows")
        if self.measure_seconds is not None and self.warmup_steps < 2:
            raise ValueError("measure_seconds needs warmup_steps >= 2 to size the window")
        return self


class ExecutionSpec(Strict):
    """How trials are launched; placement that never happens must fail fast, not hang."""

    start_timeout_s: float = Field(
        30.0, gt=0, description="worker group placement deadline; as long again for the "
        "workers to start, after which a trial whose workers never came up is an error row")
    concurrency: Literal["exclusive", "per_node", "pack"] = Field(
        "exclusive", description="exclusive: one trial at a time on the cluster; per_node: trials "
        "side by side, each alone on its node(s); pack: side by side sharing nodes, never a GPU")
    placement: Literal["auto", "pack", "spread"] = Field(
        "auto", description="auto: a trial that fits on one node is packed onto one, a larger "
        "one spread over nodes")
    logical_gpus: bool = Field(
        False, description="GPUs are scheduling tokens only and workers compute on CPU (gloo): "
        "for rehearsing placement and concurrency on a machine without GPUs, never for figures")
    max_retries: int = Field(
        1, ge=0, description="fresh attempts for a trial whose worker process died (a lost "
        "node, a killed process); never for out-of-memory, errors or timeouts")
    trial_timeout_s: float | None = Field(
        None, gt=0, description="wall-clock limit per trial attempt, from its workers' start: "
        "a trial past it ends as status=timeout (default: none)")
    isolation: Literal["process", "worker"] = Field(
        "process", description="process: every trial on fresh worker processes (a Ray Train "
        "worker group of its own); worker: trials of the same shape (workers, resources, "
        "placement, hardware.env) run one after another on one worker group, each with a fresh "
        "model and data, memory peaks and allocator caches reset, saving the group's start-up "
        "(seconds per trial); with trials one at a time on packed placements, trials of every "
        "rank count share a group, widest first, and before a trial of fewer ranks the group's "
        "last ranks leave it. A trial that fails ends its group and the next starts fresh. "
        "Trials that keep a checkpoint always run alone. The row says which (trial/isolation, "
        "trial/group_ranks)")
    max_trials: int = Field(
        10_000, ge=1, description="the most trials a grid may expand to (the product of its "
        "axes' lengths), checked before expanding: a grid written larger by mistake would "
        "take the planner's memory and minutes before it said anything")


class MlflowSpec(Strict):
    tracking_uri: str = Field(
        min_length=1, description="where MLflow keeps the runs: a tracking server "
        "(http://host:5000), a database (sqlite:///mlflow.db) or another URI MLflow's client takes")
    experiment: str | None = Field(
        None, min_length=1, description="experiment name (created if missing); default the "
        "sweep's name")


class OutputSpec(Strict):
    root: str = "results"
    dir: str | None = None  # exact run directory; default <root>/<name>/<UTC timestamp>
    storage: str | None = Field(
        None, description="shared storage for a cluster: a path on a shared filesystem or a "
        "URI pyarrow understands (s3://bucket/prefix, gs://..., file:///...). Ray Train writes "
        "checkpoints there, and the driver copies the run directory there when the sweep ends")
    mlflow: MlflowSpec | None = Field(
        None, description="log one MLflow run per trial (configuration as parameters, the row's "
        "figures as metrics, the trial JSON as an artefact) under one run for the sweep (its "
        "report, system facts and table)")


class LargestBatchSpec(Strict):
    max_batch: int = Field(256, ge=1, description="largest batch size ever tried")


class SearchSpec(Strict):
    largest_batch: LargestBatchSpec | None = None


# MLPerf Inference's Llama-3.1-8B limits, p99 (mlcommons/inference, language/llama3.1-8b,
# loadgen/mlperf.conf): TTFT and TPOT, ms
MLPERF_LIMITS_MS = {"mlperf-server": (2000.0, 100.0), "mlperf-interactive": (500.0, 30.0)}


class InferenceSpec(Strict):
    """The `inference:` section: a model served by replicas, the MLPerf way (scenarios/)."""

    scenario: Literal["offline", "server", "concurrency"] = Field(
        "offline", description="offline: every request at once; server: Poisson arrivals "
        "and the rate search; concurrency (token workloads): closed-loop users")
    replicas: int = Field(1, ge=1, description="model replicas, each with hardware.num_gpus "
                          "(0 or 1) GPUs and hardware.cpus_per_worker CPUs")
    samples: int = Field(512, ge=1, description="offline: samples pushed through the replicas")
    project_samples: int | None = Field(
        None, ge=1, description="offline: dataset size whose processing time is projected "
        "from the measured throughput (e.g. 13368)")
    warmup_batches: int = Field(2, ge=0, description="untimed batches per replica at start")
    query_samples: int = Field(1, ge=1, description="server: samples per query")
    max_batch_queries: int = Field(
        1, ge=1, description="server: a free replica takes up to this many waiting queries in "
        "one call (dynamic batching, no waiting for more); 1: one query per call")
    latency_bound_ms: float | None = Field(
        None, gt=0, description="server: the latency the percentile must stay under")
    ttft_bound_ms: float | None = Field(
        None, gt=0, description="server: the time to first token the percentile must stay "
        "under (MLPerf's Llama-3.1-8B Server 2,000 ms, Interactive 500 ms); token workloads")
    tpot_bound_ms: float | None = Field(
        None, gt=0, description="server: the time per output token after the first the "
        "percentile must stay under (MLPerf's Llama-3.1-8B Server 100 ms, Interactive 30 ms)")
    latency_percentile: float = Field(99.0, gt=0, lt=100)
    rate_qps: float | None = Field(
        None, gt=0, description="server: one run at this Poisson arrival rate; unset: search "
        "the highest rate that keeps the latency percentile under latency_bound_ms")
    rate_max_qps: float | None = Field(
        None, gt=0, description="server: highest rate the search tries (default: 1.5x the "
        "replicas' measured capacity)")
    probe_seconds: float = Field(10.0, gt=0, description="server: length of each rate's run")
    min_queries: int = Field(200, ge=1, description="server: fewest queries a rate's run sends")
    search_seconds: float = Field(
        1800.0, gt=0, description="server: no new rate is tried after this long (the search "
        "and its certifying runs); the row then says server/search_truncated, its rate the "
        "best certified so far")
    rate_tolerance_pct: float = Field(
        5.0, gt=0, description="server: the search stops when its bracket is this narrow")
    early_stopping: bool = Field(
        True, description="server: MLPerf's rule decides the rate: the search brackets it by "
        "the percentile on probe_seconds probes, then it must pass runs of certify_seconds in "
        "which LoadGen's early stopping certifies each percentile judged, on the search's "
        "arrival sequence and confirm_runs fresh ones, stepping down by certify_tolerance_pct "
        "wherever one fails; a fixed rate_qps run is judged by the same rule. false: the "
        "percentile alone, for quick looks (the row says which rule)")
    certify_seconds: float = Field(
        60.0, gt=0, description="server: the length of each certifying run, at least the "
        "queries early stopping can certify (459 at p99): the longer, the nearer the rate to "
        "what MLPerf's own 600 s run certifies, and the less one burst of arrivals decides it")
    certify_queries: int | None = Field(
        None, ge=1, description="server, early_stopping: every certifying run sends this many "
        "queries (as LoadGen's min_query_count fixes a run's length), at least the fewest early "
        "stopping can certify (459 at p99), whatever rate the search's bracket ends at: the "
        "searches of a replica then run the same arrival sequences and repeat. Unset: "
        "certify_seconds at the bracket's answer, rounded to 1, 2 or 5 x 10^k queries (two "
        "searches whose brackets end either side of a rounding edge certify on runs of "
        "different lengths)")
    certify_tolerance_pct: float = Field(
        2.0, gt=0, description="server, early_stopping: the certified rate's step: down from "
        "the bracket's answer by 1, 2, 4, ... steps until every sequence passes, then bisected "
        "to this (two searches of a replica differ by about it; each step costs certifying "
        "runs)")
    rate_margin_pct: float = Field(
        5.0, ge=0, lt=100, description="server, early_stopping: the rate reported sits this "
        "far under the highest every sequence passed, where the search's own sequence (LoadGen's "
        "schedule) passes once more; at the edge LoadGen's run on the same arrivals is a coin "
        "flip (a 10 ms replica's 17.1 queries/s: raybench's run 2 late of 2 allowed, LoadGen's "
        "3). 0: the edge")
    confirm_runs: int = Field(
        2, ge=0, description="server: fresh arrival sequences the rate found must also pass; "
        "0: the search's own sequence alone")
    accuracy_target: float | None = Field(
        None, ge=0, le=1, description="agreement with an fp32 reference pass on the same "
        "inputs below which the run is invalid (top-1 for classifiers, per pixel for tiles, "
        "per token for the language model)")
    accuracy_samples: int = Field(64, ge=1, description="samples the agreement is measured on")
    seed: int = Field(0, description="seed of the Poisson arrivals")
    input_tokens: int | None = Field(
        None, ge=1, description="token workloads: prompt tokens per request (default 128)")
    output_tokens: int | None = Field(
        None, ge=1, description="token workloads: output tokens per request, forced (no end "
        "of sequence; default 128; MLPerf's Llama-3.1-8B: at most 128)")
    lengths_file: str | None = Field(
        None, min_length=1, description="token workloads: a CSV with input_tokens and "
        "output_tokens columns (a dataset's token counts, a row per request shape); each "
        "request draws a row, seeded by `seed` (instead of input_tokens / output_tokens)")
    concurrency: int | None = Field(
        None, ge=1, description="the concurrency scenario: users, each sending its next "
        "request when its last one ends; `samples` requests in all")
    limits: Literal["mlperf-server", "mlperf-interactive"] | None = Field(
        None, description="MLPerf's Llama-3.1-8B limits at p99: server TTFT 2,000 ms and "
        "TPOT 100 ms, interactive 500 ms and 30 ms (sets ttft_bound_ms and tpot_bound_ms)")
    loadgen: bool = Field(
        False, description="MLPerf's official LoadGen (pip install 'raybench[mlperf]') drives "
        "the replicas as its system under test: server: after raybench's search, one LoadGen "
        "run at the rate found (or rate_qps) confirms it; offline: LoadGen's Offline scenario "
        "at the replicas' measured capacity. Its logs are kept in the trial's folder, its "
        "verdict and figures are loadgen/* columns. Token workloads: LoadGen's token-latency "
        "mode, judging ttft_bound_ms and tpot_bound_ms")
    loadgen_seconds: float = Field(
        600.0, gt=0, description="LoadGen's min_duration: MLPerf's 600 s for a submittable "
        "run; a shorter one LoadGen itself marks min duration not met")
    cuda_graphs: bool = Field(
        False, description="GPU replicas replay their forward as CUDA graphs, one captured per "
        "batch size (powers of two up to the largest call), each call padded to the next, as "
        "deployed inference does; an eager forward of a small batch is bound by the host's "
        "kernel launches. Workloads resnet and efficientnet")

    @property
    def token_bounds_s(self) -> tuple[float | None, float | None]:
        """ttft_bound_ms and tpot_bound_ms in seconds (None: not set)."""
        return (None if self.ttft_bound_ms is None else self.ttft_bound_ms / 1e3,
                None if self.tpot_bound_ms is None else self.tpot_bound_ms / 1e3)

    @model_validator(mode="after")
    def _limits(self) -> InferenceSpec:
        if self.limits is not None:
            ttft, tpot = MLPERF_LIMITS_MS[self.limits]
            for name, value in (("ttft_bound_ms", ttft), ("tpot_bound_ms", tpot)):
                if getattr(self, name) not in (None, value):
                    raise ValueError(f"limits {self.limits} sets {name} to {value:g}, and "
                                     f"{name} says {getattr(self, name):g}: give one of them")
                object.__setattr__(self, name, value)
            if self.latency_percentile != 99.0:
                raise ValueError(f"limits {self.limits} are MLPerf's at p99, and "
                                 f"latency_percentile says {self.latency_percentile:g}")
        if self.lengths_file and (self.input_tokens or self.output_tokens):
            raise ValueError("lengths_file gives each request its lengths: leave input_tokens "
                             "and output_tokens unset")
        if self.scenario == "concurrency" and self.concurrency is None:
            raise ValueError("the concurrency scenario needs concurrency (its users)")
        if self.loadgen and self.scenario == "concurrency":
            raise ValueError("LoadGen has no closed-loop users scenario: loadgen runs with "
                             "scenario offline or server")
        if self.loadgen and self.scenario == "server" and all(
                b is None for b in (self.latency_bound_ms, self.ttft_bound_ms,
                                    self.tpot_bound_ms)):
            raise ValueError("loadgen in the server scenario judges latency_bound_ms (a token "
                             "workload: ttft_bound_ms and tpot_bound_ms): set them")
        return self

    @model_validator(mode="after")
    def _server(self) -> InferenceSpec:
        bounds = (self.latency_bound_ms, self.ttft_bound_ms, self.tpot_bound_ms)
        if self.scenario == "server" and self.rate_qps is None and all(
                b is None for b in bounds):
            raise ValueError("the server scenario needs latency_bound_ms (or ttft_bound_ms / "
                             "tpot_bound_ms for a token workload) to search a rate under (or "
                             "rate_qps for one run at a fixed rate)")
        return self
