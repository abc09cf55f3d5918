"""Workload registry and contracts: a workload is one file in this package that registers itself.

Owns the contracts and the name -> class registry (a lookup imports the sibling module named
like the workload, else every sibling, so adding a workload touches no other file). Four
contracts: `Workload` (timed steps, what every workload is), `EpochWorkload` (whole epochs with
an evaluation after each), `Servable` (can be served in an inference scenario) and `Generative`
(served token by token by a continuously batching `TokenEngine`); a workload subclasses the
ones it meets.
Whatever a workload knows beyond its steps it declares here through hooks on its own class
(its extra row metrics, accuracy metric, the preprocess output it reads, its checkpoints), so
no core module names a workload or one of its fields. Does not own timing, DDP set-up or Ray: a
workload sees only a `WorkerContext` and the loop's `StepClock`, and imports torch, never ray.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, Field

from raybench import flops
from raybench.columns import Metric, declare
from raybench.sections import STRICT

if TYPE_CHECKING:
    import torch

    from raybench.clock import StepClock
    from raybench.context import WorkerContext
    from raybench.records import RankRecord
    from raybench.sections import HardwareSpec


@dataclass(frozen=True, eq=False)
class Reference:
    """A published figure of a GPU on a workload's configuration (report/reference.py sets it
    beside the best matching measured row); a workload lists its own (`references`)."""

    gpu: str  # a whole word of the device name ("A100", "V100-SXM2-16GB", "T4")
    workload: dict[str, Any]  # the row's config values that define it (workload.name too)
    mode: str  # "train" | "inference"
    precision: str  # raybench's name: fp32 | tf32 | amp_fp16 | bf16
    batch: int | None  # per GPU, where the source gives one
    samples_per_s: float  # per GPU
    source: str
    # what the report shows it in: a sample counted `per_sample` times (an LLM's sequence as
    # its tokens: tokens/s per GPU, the figure such sources publish)
    unit: str = "samples/s"
    per_sample: float = 1.0
    # False: another engine or precision than any row's (TensorRT-LLM in FP8 beside a bf16
    # transformers engine): matched whatever the row's precision, its ratio shown as a
    # comparison, not an equality
    like_for_like: bool = True


class WorkloadParams(BaseModel):
    """Parameters every workload has; a workload's own `Params` subclasses this."""

    model_config = STRICT
    batch_size: int = Field(32, ge=1, description="samples per rank per step")
    seed: int = 0


class EpochParams(WorkloadParams):
    """Parameters every epoch-based workload has (`EpochWorkload`)."""

    epochs: int = Field(5, ge=1, description="passes over the dataset")


class Workload(ABC):
    """One benchmark: builds its model and inputs from the context, then runs single steps.

    The timed loop calls `batches()` once, then per step `next()` (data wait), `to_device()`
    (still data wait) and `step()` (compute). It synchronises the device itself.
    """
    name: ClassVar[str]
    Params: ClassVar[type[WorkloadParams]] = WorkloadParams
    # Set by the contracts below, never by a workload: EpochWorkload, Servable.
    epoch_based: ClassVar[bool] = False
    serves: ClassVar[bool] = False
    # served token by token by an engine of its own (Generative)
    generates: ClassVar[bool] = False
    # The task's own accuracy figure, a row metric key (e.g. "xview3/aggregate"): the report
    # ranks accuracy per second by it. Where it is served, the accuracy gate uses it too (the
    # task's score of an untimed pass over its validation set, MLPerf's accuracy mode, through
    # `serving_validation_ids` and `serving_score`); None there: agreement of predictions with
    # an fp32 reference pass of the same weights.
    accuracy_metric: ClassVar[str | None] = None
    # The rate the report ranks this workload's training rows by, a row column it declares in
    # `columns` (tiles of different sizes are not the same sample: pixels/s); None: samples/s.
    headline_metric: ClassVar[str | None] = None
    # A hardware probe's datasheet figure for its headline, a row column it declares (the
    # matmul probe's dense peak at the trial's precision): `python -m raybench.validate` holds
    # the headline against it. None: no datasheet figure.
    datasheet_metric: ClassVar[str | None] = None
    # Its rows measure the machine's compute peak (the matmul probe): raybench.results.peaks states
    # later rows' MFU against the latest such measurement of the same system.
    measures_peak: ClassVar[bool] = False
    # Its own size axis, a config column the report draws throughput and memory against, a
    # line per batch (the tile of a tiled model); None: no such figures.
    size_axis: ClassVar[str | None] = None
    # Published figures of GPUs on this workload's configurations, each with its source.
    references: ClassVar[tuple[Reference, ...]] = ()
    # The row columns this workload adds (through `row_metrics`, or `end_epoch`'s figures),
    # each with its unit; registered with the core's when the workload registers.
    columns: ClassVar[tuple[Metric, ...]] = ()

    def __init__(self, params: WorkloadParams, ctx: WorkerContext,
                 clock: StepClock | None = None):
        """`clock`: the timed loop's (rank/loop.py), through which a step times its parts
        (`self.clock.phase(name)`) and DDP marks the rank's own compute
        (`ctx.prepare_model(model, self.clock)`); a workload built outside the loop (a
        replica, a check) gets one of its own that nobody reads."""
        if clock is None:
            from raybench.clock import StepClock  # torch: this package imports without it

            clock = StepClock(ctx.device)
        self.params = params
        self.ctx = ctx
        self.clock = clock

    @abstractmethod
    def setup(self) -> None:
        """Build model, optimizer and input pipeline; called once before warmup."""

    @abstractmethod
    def batches(self) -> Iterator[Any]:
        """An endless iterator of host-side batches."""

    @abstractmethod
    def to_device(self, batch: Any) -> Any:
        """Move one batch to the rank's device."""

    @abstractmethod
    def step(self, batch: Any) -> torch.Tensor | None:
        """One forward/backward/optimizer step; returns the loss without synchronising."""

    @property
    @abstractmethod
    def model(self) -> torch.nn.Module:
        """The unwrapped model, for parameter counts."""

    @classmethod
    def measure_defaults(cls, params: WorkloadParams) -> dict[str, Any]:
        """Warmup and window for this workload where the sweep sets none (see MeasureSpec)."""
        return {}

    @property
    def trains(self) -> bool:
        """Whether a step runs backward too (FLOPs are counted accordingly)."""
        return True

    @classmethod
    def forward_only(cls, params: WorkloadParams) -> bool:
        """Whether a step of these params is one forward and nothing else (`bench
        forward-check` compares its time with torch.utils.benchmark's)."""
        return False

    def forward_probe(self) -> Callable[[], Any] | None:
        """After setup, for a forward-only trial: one forward of the step's own input, exactly
        as the timed loop calls it; None where a step is more than a forward."""
        return None

    def samples_per_step(self) -> int:
        """Samples one step trains or serves on this rank (an optimizer step's, all its
        micro-batches)."""
        return self.params.batch_size * self.ctx.hardware.grad_accum_steps

    def flops_per_sample(self) -> float | None:
        """FLOPs of one sample of a step (forward, plus backward when it trains), for MFU;
        None when unknown. By default counted on the meta device from `describe()`'s
        `input_shape`; a workload whose work depends on the data counts a real call instead
        (`flops.counted`)."""
        import torch  # the package stays importable without torch (spec, --dry-run)

        from raybench.workloads import _memory  # torch, as above

        shape = self.describe().get("input_shape")
        if not shape:
            return None
        dtype = next(self.model.parameters()).dtype  # a bf16 inference model takes bf16
        with _memory.model_flops():
            return flops.flops_per_sample(self.model, torch.zeros(1, *shape, dtype=dtype),
                                          self.trains)

    def describe(self) -> dict[str, Any]:
        """Extra per-trial facts for the results (e.g. input shape); override to add some."""
        return {}

    # Hooks: what the core asks a workload instead of naming it.
    @classmethod
    def row_metrics(cls, records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
        """This workload's own row metrics from every rank's record (its `describe()` facts are
        in each) and the core metrics already computed; keys `namespace/quantity_unit`, each
        declared in `columns`."""
        return {}

    @classmethod
    def unsupported(cls, params: WorkloadParams, hardware: HardwareSpec
                    ) -> tuple[str, ...] | None:
        """(field, why) or (field, why, fix) where these settings cannot apply to this
        workload: an input error at expansion (the fix by default: remove the field). By
        default it does not accumulate gradients; a workload whose step runs
        `ctx.micro_batches` says so by returning None for it."""
        if hardware.grad_accum_steps > 1:
            return "hardware.grad_accum_steps", f"{cls.name} does not accumulate gradients"
        return None

    @classmethod
    def stage_input(cls, params: WorkloadParams, output: str) -> dict[str, Any]:
        """The fields of its params that take the preprocess stage's output (a directory) where
        this workload reads it and the sweep left it unset: none by default."""
        return {}

    @classmethod
    def saves_checkpoint(cls, params: WorkloadParams) -> bool:
        """Whether rank 0 leaves weights in `<artifact dir>/checkpoint` for the runner to keep
        (Ray Train's checkpoint on the Ray runner); every rank must give the same answer."""
        return False


class Probe(Workload):
    """A hardware probe (matmul, membw, transfer, allreduce): its step is the operation
    measured, on buffers `setup` made; no model, no data, no training, no FLOP count unless it
    says one. Its rows report the median step (`median_step_s`): a limit is what the hardware
    sustains step after step, where the mean would count a slow step's time too."""

    def batches(self) -> Iterator[Any]:
        while True:
            yield None

    def to_device(self, batch: Any) -> Any:
        return batch

    @property
    def model(self) -> torch.nn.Module:
        import torch  # torch: the package stays importable without it (spec, --dry-run)

        if not hasattr(self, "_identity"):
            self._identity = torch.nn.Identity()  # no parameters: size and params read 0
        return self._identity

    @property
    def trains(self) -> bool:
        return False

    def flops_per_sample(self) -> float | None:
        return None

    @staticmethod
    def floats_in(mib: float) -> int:
        """float32 elements in a buffer of `mib` MiB (at least one)."""
        return max(1, int(mib * 2**20 // 4))

    @staticmethod
    def median_step_s(records: list[RankRecord]) -> float:
        """The median measured step over every rank's steps."""
        return float(np.median(np.concatenate([np.asarray(r.compute_s) for r in records])))


class EpochWorkload(Workload):
    """A run of `params.epochs` passes over a dataset with `end_epoch` after each (evaluation);
    its `Params` subclass `EpochParams`.
    The timed loop measures every step but the first `warmup_steps`; measure_steps,
    measure_seconds and repeats do not apply."""

    epoch_based = True

    @abstractmethod
    def epoch_steps(self) -> int:
        """Steps in one epoch on this rank, the same on every rank."""

    @abstractmethod
    def end_epoch(self, epoch: int) -> dict[str, Any]:
        """Called on every rank after each epoch, outside the timing; returns that epoch's
        accuracy figures (rank 0) or {} (other ranks)."""


class Servable(Workload):
    """A workload that can be served in an inference scenario (scenarios/)."""

    serves = True
    # Whether `capture_serving` can replay its serving forward as CUDA graphs
    # (inference.cuda_graphs); the sweep loader refuses the setting for the others.
    serving_graphs = False

    # Inputs are numpy so they travel through Ray's object store (zero-copy on a node), and
    # depend on the sample ids alone, so a reference pass in another precision sees the same.
    @classmethod
    @abstractmethod
    def serving_inputs(cls, params: WorkloadParams, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Host-side inputs of these samples, deterministic per id."""

    @abstractmethod
    def setup_serving(self) -> None:
        """Build the model for forward-only use on ctx.device in the trial's precision."""

    @abstractmethod
    def serve(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        """One forward on the device, finished when it returns: {"pred": per-sample integer
        predictions (classes, pixel classes, tokens)}, plus for generative models
        "first_token_s" (from the call's start), "tokens" (generated per sample) and
        "prompt_tokens" (per sample)."""

    def capture_serving(self, largest: int) -> None:
        """After setup_serving on a GPU: serve from now on by replaying CUDA graphs captured
        for calls of up to `largest` samples (workloads with serving_graphs)."""
        raise TypeError(f"workload {self.name} serves eagerly only")

    @classmethod
    def serving_validation_ids(cls, params: WorkloadParams) -> np.ndarray:
        """The sample ids `serving_score` needs (workloads with an accuracy_metric)."""
        raise TypeError(f"workload {cls.name} scores agreement with a reference, not a task")

    def serving_score(self, preds: dict[int, Any]) -> dict[str, float]:
        """The task's scores from the predictions of every validation id, accuracy_metric's
        among them (workloads with an accuracy_metric)."""
        raise TypeError(f"workload {self.name} scores agreement with a reference, not a task")


# emit(request id, tokens generated so far, finished, the engine's time.monotonic() stamp,
# the generated token ids once finished else None): called on the engine's own thread
Emit = Callable[[str, int, bool, float, "list[int] | None"], None]


class TokenEngine(ABC):
    """A serving engine of one replica that batches requests continuously: requests join and
    leave its running batch at any step, each streaming its tokens as they are made."""

    @abstractmethod
    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int,
               emit: Emit) -> None:
        """Queue a request; returns at once. Exactly `max_new_tokens` come back (end of
        sequence ignored: random weights end at random), each through `emit`."""

    @abstractmethod
    def cancel(self, request_id: str) -> None:
        """Stop a request (a Server probe that has already failed): it emits nothing more."""

    def kv_use(self) -> float | None:
        """The fraction of the KV cache in use now, where the engine says."""
        return None

    def facts(self) -> dict[str, Any]:
        """What the engine was sized to (cache blocks, batch tokens), for the row."""
        return {}

    @abstractmethod
    def close(self) -> None:
        """Stop its threads; requests still running are dropped."""


class Generative(Servable):
    """A workload served token by token (scenarios/llm/): a language model whose engine
    batches requests continuously; the scenarios time every token on the client's side."""

    generates = True

    def setup_serving(self) -> None:  # the engine builds what it serves
        pass

    @classmethod
    def serving_inputs(cls, params: WorkloadParams, ids: np.ndarray) -> dict[str, np.ndarray]:
        raise TypeError(f"workload {cls.name} serves prompts through its engine")

    def serve(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        raise TypeError(f"workload {self.name} serves prompts through its engine")

    @classmethod
    def max_positions(cls, params: WorkloadParams) -> int | None:
        """Longest prompt plus output the model takes; None: no limit."""
        return None

    @classmethod
    def prompt(cls, params: WorkloadParams, index: int, length: int) -> list[int]:
        """Request `index`'s prompt of `length` tokens: deterministic, the same on every
        replica and in the reference pass."""
        rng = np.random.default_rng([params.seed, index, 0x9E37])
        return rng.integers(1, 256, size=length).tolist()

    @abstractmethod
    def engine(self, slots: int, max_tokens: int) -> TokenEngine:
        """The engine on ctx.device in the trial's precision, sized for `slots` requests of
        up to `max_tokens` (prompt and output) at once (a hint: an engine may take more)."""

    def reference_tokens(self, prompts: list[list[int]], max_new_tokens: int
                         ) -> list[list[int]] | None:
        """Greedy tokens of the same weights in fp32 without batching (the accuracy gate's
        reference); None where the workload has no weights."""
        return None


_REGISTRY: dict[str, type[Workload]] = {}
_loaded = False


def register(cls: type[Workload]) -> type[Workload]:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"workload name '{cls.name}' registered twice")
    declare(*cls.columns)
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if not _loaded:
        for mod in pkgutil.iter_modules(__path__):
            if not mod.name.startswith("_"):
                importlib.import_module(f"{__name__}.{mod.name}")
        _loaded = True


def get(name: str) -> type[Workload]:
    here = Path(__path__[0])
    own = (here / f"{name}.py").exists() or (here / name / "__init__.py").exists()
    if name not in _REGISTRY and name.isidentifier() and own:
        # the file (or folder: llama) named like the workload first: every rank of every
        # trial looks its workload up, and the siblings' imports (rasterio, detection models)
        # are not its own
        importlib.import_module(f"{__name__}.{name}")
    if name not in _REGISTRY:
        _load_all()
    if name not in _REGISTRY:
        raise KeyError(f"unknown workload '{name}'; registered: {names()}")
    return _REGISTRY[name]


def names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)
