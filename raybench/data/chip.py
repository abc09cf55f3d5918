"""Chipping xView3 scenes with Ray Data: `python -m raybench.data.chip`.

Owns the plan (which chips of which scene: labelled chips plus a background fraction for
training, every chip for inference), the Ray Data pipeline (one item per strip of chips,
`from_items` -> `map_batches`: a task reads its strips a few chips at a time and writes one
Parquet shard per strip itself, so chip pixels never pass through the driver), labels in chip
coordinates, the per-scene `_SUCCESS` marker that makes reruns skip finished scenes, and the
chip index tables.

Output: `shards/<scene_id>/strip-NNNNN.parquet` (columns scene_id, chip_index, chip_row,
chip_col, row_off, col_off, valid_fraction, data: float32 C x H x W bytes, mask: uint8 H x W
bytes), `chips.parquet` (one row per chip, with its shard), `chip_labels.parquet` (one row per
label per chip, in-chip row/col and box), `errors.json` for skipped scenes. Inputs and output
are local paths or storage URIs (`s3://bucket/chips`: raybench/store.py); a cluster whose nodes
share no disk needs a URI, since a strip task writes its shard from whichever node runs it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from raybench import console, store
from raybench.data import xview3 as x3
from raybench.data.chipread import ChipParams, ChipReadError, Scene, scene_shape, timed
from raybench.data.draws import Draws
from raybench.data.labels import chip_labels, read_labels
from raybench.memory import peak_rss_mb
from raybench.progress import Progress

log = logging.getLogger(__name__)
CHIPS_PER_READ = 4  # chips read and written together: bounds a task's memory at any scene width


def plan(scene_dir: str, labels: pd.DataFrame, params: ChipParams, select: str,
         background: float, seed: int) -> list[dict[str, Any]]:
    """Strip work items of one scene: each names its chip row and the chip columns to keep."""
    rows, cols = scene_shape(scene_dir)
    n_r, n_c = params.grid(rows, cols)
    if select == "all":
        keep = {(i, j) for i in range(n_r) for j in range(n_c)}
    else:
        labelled = {cell for _, lab in labels.iterrows()
                    for cell in _cells_of(lab, params, n_r, n_c)}
        empty = sorted({(i, j) for i in range(n_r) for j in range(n_c)} - labelled)
        n_bg = min(len(empty), int(math.ceil(background * len(labels))))
        picked = Draws([seed, int(store.name(scene_dir)[:8], 16)]).sample(len(empty), n_bg)
        keep = labelled | {empty[k] for k in picked}
    strips: dict[int, list[int]] = {}
    for i, j in sorted(keep):
        strips.setdefault(i, []).append(j)
    return [{"scene_dir": str(scene_dir), "scene_id": store.name(scene_dir), "strip": i, "cols": js,
             "n_cols": n_c} for i, js in sorted(strips.items())]


def _cells_of(label: pd.Series, params: ChipParams, n_r: int, n_c: int) -> list[tuple[int, int]]:
    """Every chip whose window contains the label's point (several where chips overlap)."""
    def span(v: float, n: int) -> range:
        hi = min(n - 1, int(v // params.stride))
        lo = max(0, int(math.floor((v - params.chip_size) / params.stride)) + 1)
        return range(lo, hi + 1)

    r, c = label["detect_scene_row"], label["detect_scene_column"]
    return [(i, j) for i in span(r, n_r) for j in span(c, n_c)]


def chip_scenes(scenes: str | Path, labels_csv: str | Path, out: str | Path, params: ChipParams,
                select: Literal["train", "all"] = "train", background: float = 0.5,
                seed: int = 0, on_error: Literal["fail", "skip"] = "fail",
                cpus: int | None = None, runner: Literal["ray", "local"] = "ray"
                ) -> dict[str, Any]:
    """Chip every unfinished scene under `scenes` with Ray Data (on at most `cpus` Ray CPUs),
    or in this process with `runner="local"` (the same strip tasks one after another: for the
    Ray-free runner and for small validation sets); returns the stage's figures. `scenes`,
    `labels_csv` and `out` are local paths or storage URIs (raybench/store.py): on a cluster
    whose nodes share no disk, a URI is what every strip task and training rank can reach."""

    params.validate()
    labels = read_labels(labels_csv)
    out = store.identity(out)  # strip tasks may run elsewhere: no path relative to here
    store.make_dirs(out)
    tag = params_tag(params, select, background, seed)
    todo, done, errors = [], [], {}
    for scene_dir in x3.scene_dirs(scenes):
        scene_id = store.name(scene_dir)
        if _finished(out, scene_id, tag):
            done.append(scene_id)
            continue
        try:
            items = plan(scene_dir, labels[labels.scene_id == scene_id], params, select,
                         background, seed)
        except ChipReadError as e:
            if on_error == "fail":
                raise
            errors[scene_id] = str(e)
            continue
        store.remove_tree(store.join(out, "shards", scene_id))
        todo += [{**it, "out": out, "params": asdict(params)} for it in items]
    log.info("chipping: %d strips from %d scenes (%d scenes already done)", len(todo),
             len({t["scene_id"] for t in todo}), len(done))
    t0 = time.perf_counter()
    strips = _strips(todo) if runner == "local" else _run_strips(todo, cpus)
    results = _with_progress(strips, todo) if todo else []
    elapsed = time.perf_counter() - t0
    metas = _finish_scenes(out, results, tag, errors, on_error)
    index = write_index(out, labels, params)
    chips = sum(m["chips"] for m in metas)
    nbytes = sum(m["bytes_read"] for m in metas)
    summary = {
        "stage": "preprocess", "scenes_done": len(metas), "scenes_skipped_done": len(done),
        "scenes_failed": len(errors), "chips": chips, "seconds": elapsed,
        "chips_per_s": chips / elapsed if elapsed > 0 and chips else None,
        "mb_per_s": nbytes / 2**20 / elapsed if elapsed > 0 and chips else None,
        "peak_rss_mb_worker": max((r["peak_rss_mb"] for r in results), default=None),
        "peak_rss_mb_driver": peak_rss_mb(), "chips_total": len(index), "errors": errors,
        "profile_s": _profile(results),
        "nodes": len({r["node"] for r in results if r.get("node")}) or None,
    }
    store.write_text(store.join(out, "errors.json"), json.dumps(errors, indent=1))
    return summary


# The chip arrays (data, mask) are written as they are: float32 SAR does not compress, so snappy
# spent its time for nothing, and Parquet's default dictionary attempt and min/max statistics
# hash and compare megabyte-sized values no reader uses. Writing was 44% of a strip task's time
# with the defaults (`bench chips`, docs/journal/2026-11.md). The small metadata columns keep them.
SHARD_WRITE = {"compression": {"data": "none", "mask": "snappy"},
               "use_dictionary": ["scene_id"], "write_statistics": ["chip_index", "chip_row",
                                                                   "chip_col"]}

PHASES = ("read", "resample", "normalize", "encode", "write")


def _profile(results: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per phase summed over the strip tasks (task-seconds: with several tasks at once
    they add up to more than the wall time), `other` the tasks' time outside the phases."""
    total = {p: sum(r.get("clock", {}).get(p, 0.0) for r in results) for p in PHASES}
    tasks = sum(r.get("clock", {}).get("task", 0.0) for r in results)
    return {**total, "other": max(0.0, tasks - sum(total.values())), "tasks": tasks}


def _with_progress(strips: Iterator[dict[str, Any]], todo: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """Strip results as they arrive, with a progress line: strips, whole scenes and chips."""
    left = Counter(t["scene_id"] for t in todo)
    scenes, chips, results = len(left), 0, []
    progress = Progress(len(todo), "strips")
    for r in strips:
        results.append(r)
        chips += len(json.loads(r["chips"]))  # the strip's chip metadata, as JSON
        left[r["scene_id"]] -= 1
        whole = sum(n == 0 for n in left.values())
        progress.advance(f"{whole}/{scenes} scenes, {chips} chips")
    return results


def _run_strips(todo: list[dict[str, Any]], cpus: int | None) -> Iterator[dict[str, Any]]:
    """Ray Data over the strip items: a few blocks per CPU, each task working its strips in turn.

    Measured on 2 CPUs (Ray 2.60): one block per strip ran one task at a time for seconds while
    Ray Data ramped up, and reserving resources per operator held back a CPU in this
    one-operator pipeline; two blocks per CPU without reservation keep every CPU busy."""
    import ray  # Ray Data: only where chips are cut; the chip index and shards read without it

    ctx = ray.data.DataContext.get_current()
    saved = ctx.op_resource_reservation_enabled, ctx.execution_options.resource_limits
    ctx.op_resource_reservation_enabled = False
    have = max(1, int(ray.cluster_resources().get("CPU", 1)))
    cpus = min(cpus or have, have)
    ctx.execution_options.resource_limits = ray.data.ExecutionResources.for_limits(cpu=cpus)
    try:
        items = [{"item": json.dumps(t)} for t in todo]
        ds = ray.data.from_items(items, override_num_blocks=min(len(items), 2 * cpus))
        for row in ds.map_batches(_strip_batch, num_cpus=1, batch_size=None).iter_rows():
            yield json.loads(row["result"])  # as each strip's task returns
    finally:
        ctx.op_resource_reservation_enabled, ctx.execution_options.resource_limits = saved


def _strip_batch(batch: dict[str, np.ndarray]) -> dict[str, list[str]]:
    import ray  # Ray Data: only where chips are cut; the chip index and shards read without it

    node = ray.get_runtime_context().get_node_id()  # which node cut it: the stage's spread
    return {"result": [json.dumps({**r, "node": node})
                       for r in _strips([json.loads(s) for s in batch["item"]])]}


def _strips(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Strip items in turn (a Ray Data block's, or the local runner's), each scene's files
    opened once for its consecutive strips."""
    scene = None
    try:
        for item in items:
            if scene is None or scene.dir != item["scene_dir"]:
                if scene:
                    scene.close()
                scene = Scene(item["scene_dir"])
            yield _strip_task(item, scene)
    finally:
        if scene:
            scene.close()


def _strip_task(item: dict[str, Any], scene: Scene) -> dict[str, Any]:
    """Read one strip from `scene`'s open files, write its shard all or nothing, return
    metadata only."""
    params = ChipParams(**{**item["params"], "channels": tuple(item["params"]["channels"])})
    rel = f"shards/{item['scene_id']}/strip-{item['strip']:05d}.parquet"
    fs, shard = store.resolve(store.join(item["out"], rel))
    local = not store.is_uri(item["out"])
    if local:  # renamed into place when whole; an object appears when its upload completes
        Path(shard).parent.mkdir(parents=True, exist_ok=True)
    target = f"{shard}.tmp{os.getpid()}" if local else shard
    meta, nbytes, writer = [], 0, None
    start, clock = time.perf_counter(), {}
    try:
        for k in range(0, len(item["cols"]), CHIPS_PER_READ):
            cols = item["cols"][k: k + CHIPS_PER_READ]
            data, mask = scene.read(item["strip"], cols, params, clock)
            with timed(clock, "encode"):
                rows = _chip_rows(item, cols, params.stride, mask)
                table = pa.table({**rows, "data": _fixed_binary(data),
                                  "mask": _fixed_binary(mask)})
            with timed(clock, "write"):
                writer = writer or pq.ParquetWriter(target, table.schema, filesystem=fs,
                                                    **SHARD_WRITE)
                writer.write_table(table)  # one row group per read: memory stays at one group
            nbytes += data.nbytes
            meta += [{c: v[i] for c, v in rows.items()} for i in range(len(cols))]
    except ChipReadError as e:
        if writer:
            writer.close()
            fs.delete_file(target)
        return {"scene_id": item["scene_id"], "strip": item["strip"], "error": str(e),
                "chips": "[]", "bytes_read": 0, "peak_rss_mb": peak_rss_mb()}
    with timed(clock, "write"):
        writer.close()
        if local:
            os.replace(target, shard)
    clock["task"] = time.perf_counter() - start
    return {"scene_id": item["scene_id"], "strip": item["strip"], "error": None,
            "chips": json.dumps([m | {"shard": rel} for m in meta]), "bytes_read": nbytes,
            "peak_rss_mb": peak_rss_mb(), "clock": clock}


def _chip_rows(item: dict[str, Any], cols: list[int], stride: int,
               mask: np.ndarray) -> dict[str, list]:
    n = len(cols)
    return {
        "scene_id": [item["scene_id"]] * n,
        "chip_index": [item["strip"] * item["n_cols"] + j for j in cols],
        "chip_row": [item["strip"]] * n, "chip_col": list(cols),
        "row_off": [item["strip"] * stride] * n, "col_off": [j * stride for j in cols],
        "valid_fraction": [float(m.mean()) for m in mask],
    }


def _fixed_binary(arr: np.ndarray) -> pa.Array:
    """One fixed-size binary value per chip, sharing the array's memory (no per-chip copies)."""
    arr = np.ascontiguousarray(arr)
    width = arr[0].nbytes
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(arr),
                                                [None, pa.py_buffer(arr)])


def _finish_scenes(out: str, results: list[dict[str, Any]], tag: str,
                   errors: dict[str, str], on_error: str) -> list[dict[str, Any]]:
    by_scene: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_scene.setdefault(r["scene_id"], []).append(r)
    metas = []
    for scene_id, parts in sorted(by_scene.items()):
        failed = [p["error"] for p in parts if p["error"]]
        folder = store.join(out, "shards", scene_id)
        if failed:
            if on_error == "fail":
                raise ChipReadError(failed[0])
            errors[scene_id] = failed[0]
            store.remove_tree(folder)
            continue
        chips = [c for p in parts for c in json.loads(p["chips"])]
        store.write_parquet(pd.DataFrame(chips).sort_values("chip_index"),
                            store.join(folder, "index.parquet"))
        store.write_text(store.join(folder, "_SUCCESS"),
                         json.dumps({"params": tag, "chips": len(chips)}))
        metas.append({"scene_id": scene_id, "chips": len(chips),
                      "bytes_read": sum(p["bytes_read"] for p in parts)})
    return metas


def write_index(out: str | Path, labels: pd.DataFrame, params: ChipParams) -> pd.DataFrame:
    """`chips.parquet` over every finished scene, and the labels in chip coordinates."""
    shards = store.join(out, "shards")
    found = [store.join(shards, d, "index.parquet")
             for d, folder in (store.list_dir(shards) if store.is_dir(shards) else []) if folder]
    parts = [store.read_parquet(p) for p in found if store.is_file(p)]
    chips = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    store.write_parquet(chips, store.join(out, "chips.parquet"))
    store.write_parquet(chip_labels(chips, labels, params), store.join(out, "chip_labels.parquet"))
    store.write_text(store.join(out, "chip_params.json"), json.dumps(asdict(params)))
    return chips


def params_tag(params: ChipParams, select: str, background: float, seed: int) -> str:
    blob = json.dumps([asdict(params), select, background, seed], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _finished(out: str, scene_id: str, tag: str) -> bool:
    marker = store.join(out, "shards", scene_id, "_SUCCESS")
    return store.is_file(marker) and json.loads(store.read_text(marker)).get("params") == tag


def load_chip(shard_row: dict[str, Any], channels: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode one shard row back into (C, H, W) float32 data and (H, W) mask."""
    data = np.frombuffer(shard_row["data"], dtype=np.float32).reshape(channels, size, size)
    mask = np.frombuffer(shard_row["mask"], dtype=np.uint8).reshape(size, size)
    return data, mask


def main(argv: list[str] | None = None, prog: str = "python -m raybench.data.chip") -> int:
    p = console.parser(prog, "Cut xView3 scenes into chips and their labels on Ray Data.")
    p.add_argument("--scenes", required=True, metavar="DIR", help="a split root of scene folders")
    p.add_argument("--labels", required=True, metavar="CSV", help="the split's label CSV")
    p.add_argument("--out", required=True, metavar="DIR", help="where the chips go")
    p.add_argument("--chip-size", type=int, default=800, metavar="PX",
                   help="chip side in pixels (default %(default)s)")
    p.add_argument("--overlap", type=int, default=0, metavar="PX",
                   help="pixels shared by neighbouring chips (default 0)")
    p.add_argument("--channels", default="vh,vv,bathymetry", metavar="A,B",
                   help="bands, in order (default %(default)s)")
    p.add_argument("--normalize", choices=["standard", "reference"], default="standard",
                   metavar="MODE", help="standard (fixed statistics) or reference (per chip)")
    p.add_argument("--select", choices=["train", "all"], default="train",
                   help="labelled chips plus background, or every chip")
    p.add_argument("--background", type=float, default=0.5, metavar="F",
                   help="empty chips per label row, for --select train")
    p.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="a corrupt scene fails the run, or is skipped")
    p.add_argument("--seed", type=int, default=0, help="seed of the background draw")
    p.add_argument("--num-cpus", type=int, metavar="N",
                   help="CPUs of the embedded Ray (default: all)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    params = ChipParams(args.chip_size, args.overlap, tuple(args.channels.split(",")),
                        args.normalize)
    with console.held():  # stdout for the summary line alone (Ray's messages: stderr)
        try:
            params.validate()
            # Ray Data: only where chips are cut; the chip index and shards read without it
            import ray

            # a Ray of its own (cluster.connect says why "local")
            ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                     logging_level=logging.WARNING)
            summary = chip_scenes(args.scenes, args.labels, args.out, params,
                                  args.select, args.background, args.seed, args.on_error)
        except (ValueError, FileNotFoundError, ChipReadError) as e:
            print(f"raybench: chipping failed: {e}", file=sys.stderr)
            return 2
        console.emit({"raybench_chips": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
