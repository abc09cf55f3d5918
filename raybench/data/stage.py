"""The preprocess stage a sweep declares: chip xView3 scenes once before the trials, measured.

Owns the `preprocess:` section of a sweep (its pydantic model lives here, beside the code that
consumes it), the cache (chips under `<out>/<tag>`, the tag a hash of the inputs' identity and
the chip parameters, so a second sweep reuses them) and the stage's result row
(`stage=preprocess`: chips/s, MB/s, peak memory). Optionally generates synthetic scenes first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pyarrow.fs import FileType
from pydantic import BaseModel, Field, model_validator

from raybench import store
from raybench.columns import Metric, declare
from raybench.data.xview3 import CHANNEL_FILES, scene_dirs
from raybench.records import TrialOutcome
from raybench.sections import STRICT

log = logging.getLogger(__name__)

declare(
    Metric("preprocess/chips", "count", "chips cut by this run of the stage"),
    Metric("preprocess/chips_total", "count", "chips in the stage's output"),
    Metric("preprocess/chips_per_s", "chips/s", "chips cut over the stage's work time"),
    Metric("preprocess/mb_per_s", "MB/s", "chip bytes written over the work time"),
    Metric("preprocess/seconds", "s", "the stage's work time"),
    Metric("preprocess/wall_s", "s", "the stage's wall time on the driver, cache check included"),
    Metric("preprocess/peak_rss_mb_{where}", "MB", "peak resident memory of a worker or the "
           "driver"),
    Metric("preprocess/cached", "bool", "the output was found and reused"),
    Metric("preprocess/nodes", "count", "Ray nodes whose tasks cut this run's chips"),
)


class GenerateSpec(BaseModel):
    """Synthetic scenes to create under `scenes`' parent when they do not exist yet."""

    model_config = STRICT
    scenes: int = Field(4, ge=1)
    size: str = Field("2400x2400", pattern=r"^\d+x\d+$")
    seed: int = 0
    density: float = Field(0.35, gt=0, le=1000, description="labels per megapixel (real: 0.35)")


class PreprocessSpec(BaseModel):
    model_config = STRICT
    scenes: str = Field(description="a split root of scene folders, e.g. data/xview3/train "
                        "or s3://bucket/xview3/train")
    labels: str = Field(description="that split's label CSV (a path or a URI)")
    out: str = Field("data/chips", description="cache root of chip outputs: a local path, or a "
                     "storage URI (s3://, gs://) where the cluster's nodes share no disk")
    chip_size: int = Field(800, ge=16)
    overlap: int = Field(0, ge=0)
    channels: list[str] = Field(default_factory=lambda: ["vh", "vv", "bathymetry"])
    normalize: Literal["standard", "reference"] = "standard"
    select: Literal["train", "all"] = "train"
    background: float = Field(0.5, ge=0)
    seed: int = 0
    on_error: Literal["fail", "skip"] = "fail"
    cpus: int | None = Field(None, ge=1, description="Ray CPUs the stage may use")
    fresh: bool = Field(False, description="chip into the run directory, ignoring the cache")
    generate: GenerateSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> PreprocessSpec:
        if self.overlap >= self.chip_size:
            raise ValueError(f"overlap ({self.overlap}) must be < chip_size ({self.chip_size})")

        unknown = [c for c in self.channels if c not in CHANNEL_FILES]
        if unknown or not self.channels:
            raise ValueError(f"unknown channels {unknown}; choose from {list(CHANNEL_FILES)}")
        if self.generate is None and not store.is_uri(self.scenes):  # URIs: check_inputs
            if not Path(self.scenes).is_dir():
                raise ValueError(f"scenes directory '{self.scenes}' does not exist (add "
                                 "preprocess.generate to create synthetic scenes)")
            if not store.is_uri(self.labels) and not Path(self.labels).is_file():
                raise ValueError(f"labels file '{self.labels}' does not exist")
        return self


def check_inputs(spec: PreprocessSpec) -> tuple[str, str] | None:
    """Before anything runs: an output URI takes a write, the label CSV reads strictly and
    every scene's rasters open.

    Returns (the spec key at fault, what is wrong, naming the file), or None when the inputs are
    usable. Opening a GeoTIFF reads its header only (milliseconds); damage deeper in a file is
    found by the stage itself, which names the scene and the file."""
    for key in ("out", "scenes") if spec.generate is not None else ("out",):
        where = getattr(spec, key)
        problem = store.check_writable(where) if store.is_uri(where) else None
        if problem:
            return f"preprocess.{key}", f"cannot write to {where}: {problem}"
    if spec.generate is not None:
        return None  # the stage writes these inputs itself
    import rasterio  # rasterio (0.2 s): spec.py, every sweep's loader, imports this module

    # rasterio (0.45 s): spec.py, every sweep's loader, imports this module
    from raybench.data.labels import read_labels

    try:
        read_labels(spec.labels)
    except ValueError as e:
        return "preprocess.labels", str(e)
    try:
        scenes = scene_dirs(spec.scenes)
    except (OSError, ValueError) as e:
        return "preprocess.scenes", str(e)
    for scene in scenes:
        for channel in spec.channels:
            path = store.join(scene, CHANNEL_FILES[channel])
            try:
                with rasterio.open(store.raster_path(path)) as src:
                    src.profile  # noqa: B018 - the header must parse
            except (OSError, rasterio.errors.RasterioError) as e:
                return "preprocess.scenes", f"{path}: not a readable GeoTIFF ({e})"
    return None


def run_stage(spec: PreprocessSpec, run_dir: Path) -> TrialOutcome:
    """Chip (or find cached) scenes; returns the stage row's fields. Needs Ray connected."""
    # Ray Data and rasterio (0.4 s): only when a stage runs
    from raybench.data.chip import chip_scenes
    from raybench.data.chipread import ChipParams

    _generate_if_missing(spec)
    params = ChipParams(spec.chip_size, spec.overlap, tuple(spec.channels), spec.normalize)
    out = store.join(spec.out, _tag(spec))
    if spec.fresh:  # every variant (cpus included) measured from scratch in the run directory
        out = str(run_dir / "preprocess" / variant_key(spec))
        shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    summary = chip_scenes(spec.scenes, spec.labels, out, params, spec.select,
                          spec.background, spec.seed, spec.on_error, cpus=spec.cpus)
    cached = summary["chips"] == 0 and summary["scenes_skipped_done"] > 0
    log.info("preprocess: %s chips in %s (%s)", summary["chips_total"], out,
             "cached" if cached else f"{summary['chips_per_s'] or 0:.1f} chips/s")
    return TrialOutcome(
        status="ok" if not summary["errors"] else "error",
        error=json.dumps(summary["errors"]) if summary["errors"] else None,
        config=stage_config(spec),
        metrics={
            "preprocess/chips": summary["chips"],
            "preprocess/chips_total": summary["chips_total"],
            "preprocess/chips_per_s": summary["chips_per_s"],
            "preprocess/mb_per_s": summary["mb_per_s"],
            "preprocess/seconds": summary["seconds"],
            "preprocess/wall_s": time.perf_counter() - t0,
            "preprocess/peak_rss_mb_worker": summary["peak_rss_mb_worker"],
            "preprocess/peak_rss_mb_driver": summary["peak_rss_mb_driver"],
            "preprocess/cached": cached,
            "preprocess/nodes": summary["nodes"],
        },
        output=out,
    )


def prepare_local(spec: PreprocessSpec, chip: bool = True) -> str:
    """The stage's chips cut in this process (no Ray), into the same cache the Ray stage uses;
    with `chip=False` only the directory, for ranks that wait while another one cuts."""
    out = store.join(spec.out, _tag(spec))
    if not chip:
        return out
    # Ray Data and rasterio (0.4 s): only when a stage runs
    from raybench.data.chip import chip_scenes
    from raybench.data.chipread import ChipParams

    _generate_if_missing(spec)
    params = ChipParams(spec.chip_size, spec.overlap, tuple(spec.channels), spec.normalize)
    summary = chip_scenes(spec.scenes, spec.labels, out, params, spec.select,
                          spec.background, spec.seed, spec.on_error, runner="local")
    log.info("chips for %s: %d (%d new) in %s", spec.scenes, summary["chips_total"],
             summary["chips"], out)
    return out


def variant_key(spec: PreprocessSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:12]


def stage_config(spec: PreprocessSpec) -> dict[str, Any]:
    """The stage's settings as `preprocess.*` result columns."""
    return {f"preprocess.{k}": v for k, v in spec.model_dump(mode="json").items()
            if k != "generate"}


def _generate_if_missing(spec: PreprocessSpec) -> None:
    if spec.generate is None or store.is_file(spec.labels):
        return
    # rasterio (0.4 s): only when scenes are generated
    from raybench.data.synth_xview3 import generate

    root = store.parent(spec.scenes)
    rows, cols = (int(v) for v in spec.generate.size.split("x"))
    log.info("preprocess: generating %d synthetic scenes of %s under %s", spec.generate.scenes,
             spec.generate.size, root)
    if not store.is_uri(root):
        generate(Path(root), spec.generate.scenes, rows, cols, spec.generate.seed,
                 spec.generate.density)
        return
    local = store.local_scratch("rb-scenes-")  # made here, then uploaded: the labels last,
    try:  # since their presence is what says the scenes are complete
        generate(local, spec.generate.scenes, rows, cols, spec.generate.seed,
                 spec.generate.density)
        for part in sorted(p.name for p in local.iterdir() if p.name != "labels"):
            store.upload_tree(local / part, store.join(root, part))
        store.upload_tree(local / "labels", store.join(root, "labels"))
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _tag(spec: PreprocessSpec) -> str:
    """Cache key: what the chips depend on (inputs' identity and chip parameters), not `cpus`."""
    stat = store.info(spec.labels)
    payload = {
        "scenes": store.identity(spec.scenes), "labels": store.identity(spec.labels),
        "labels_stat": [stat.size, stat.mtime_ns] if stat.type == FileType.File else None,
        **spec.model_dump(mode="json", exclude={"cpus", "fresh", "out", "on_error"}),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
