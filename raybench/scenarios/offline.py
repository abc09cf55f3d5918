"""The Offline scenario: every sample of a dataset through the replicas, as fast as they go.

Owns the two ways of running it (Ray Data: `map_batches` of the pass's batch numbers over a fixed
pool of replica actors, one GPU each where the trial has GPUs, each replica taking its batch's
inputs from a pool made before the pass and held in Ray's object store, its share sent as a few
tasks of several calls each; in-process: the same pool, one thread per replica pulling batches
from a shared queue)
and the figures (pure `summarize`): throughput over the timed pass (first batch start to last
batch end, on one clock: `pass_seconds`), each replica's rate while busy, per-node throughput,
utilisation, batch latency, agreement with the reference and the projected time of a dataset of
`project_samples` (replica start-up plus that many samples at the measured rate).
"""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import math
import queue
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np

from raybench import workloads
from raybench.columns import Metric, declare
from raybench.flops import mfu
from raybench.metrics import device_column
from raybench.scenarios.replica import Replica
from raybench.trials import TrialSpec

log = logging.getLogger(__name__)

declare(
    Metric("infer/samples", "count", "samples in the timed pass"),
    Metric("infer/wall_s", "s", "the timed pass, first batch start to last batch end"),
    Metric("infer/samples_per_s", "samples/s", "samples over the timed pass, all replicas"),
    Metric("infer/replicas_used", "count", "replicas that served a batch"),
    Metric("infer/nodes_used", "count", "nodes whose replicas served a batch"),
    Metric("infer/replica_samples_per_s_{stat}", "samples/s", "a replica's rate while busy "
           "(mean, min, max over replicas)"),
    Metric("infer/node_samples_per_s", "samples/s", "each node's rate (JSON {node: rate})"),
    Metric("infer/busy_pct", "%", "replicas' service time over replicas x the pass"),
    Metric("infer/batch_p{q}_ms", "ms", "service time of a batch, percentile"),
    Metric("infer/replica_wait_p{q}_ms", "ms", "a replica's idle time between one call's end "
           "and its next call's start (on its own clock), percentile: the hand-over a busy "
           "share under 100% is made of"),
    Metric("infer/setup_s", "s", "slowest replica's start-up (model, warmup)"),
    Metric("infer/project_samples", "count", "the dataset size projected to"),
    Metric("infer/projected_s", "s", "start-up plus project_samples at the measured rate"),
    Metric("infer/tokens_per_s", "tokens/s", "generated tokens over the pass"),
    Metric("infer/prefill_tokens_per_s", "tokens/s", "prompt tokens over time to first token"),
    Metric("infer/decode_tokens_per_s", "tokens/s", "generated tokens after the first over "
           "their time"),
    Metric("infer/accuracy", "score", "the accuracy gate's figure (agreement or task score)"),
    Metric("infer/accuracy_metric", "text", "what infer/accuracy is"),
    Metric("infer/accuracy_target", "score", "inference.accuracy_target"),
    Metric("infer/accuracy_compared", "count", "elements or samples the gate compared"),
    Metric("infer/accuracy_ok", "bool", "infer/accuracy reached the target"),
    Metric("infer/accuracy_check_s", "s", "the reference or validation pass, slowest replica"),
    Metric("infer/score/{name}", "score", "the task's scores of the worst replica"),
)


def summarize(records: list[dict[str, Any]], stats: list[dict[str, Any]], trial: TrialSpec,
              ) -> dict[str, Any]:
    """Row metrics of one offline pass from its per-batch records and replica facts (pure)."""
    inf = trial.inference
    n = sum(r["n"] for r in records)
    wall = pass_seconds(records)
    by_replica: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_replica[r["replica"]].append(r)
        by_node[r["node"]].append(r)
    busy_rates = [sum(r["n"] for r in rs) / sum(r["service_s"] for r in rs)
                  for rs in by_replica.values()]
    per_node = {node: sum(r["n"] for r in rs) / wall for node, rs in sorted(by_node.items())}
    batch_ms = np.array([r["service_s"] for r in records]) * 1e3
    setup = max(s["setup_s"] for s in stats) if stats else 0.0
    rate = n / wall
    out: dict[str, Any] = {
        "infer/samples": n,
        "infer/wall_s": wall,
        "infer/samples_per_s": rate,
        "infer/replicas_used": len(by_replica),
        "infer/nodes_used": len(by_node),
        "infer/replica_samples_per_s_mean": float(np.mean(busy_rates)),
        "infer/replica_samples_per_s_min": float(np.min(busy_rates)),
        "infer/replica_samples_per_s_max": float(np.max(busy_rates)),
        "infer/node_samples_per_s": json.dumps(per_node),  # a column of one type
        "infer/busy_pct": 100 * sum(r["service_s"] for r in records) / (len(by_replica) * wall),
        "infer/batch_p50_ms": float(np.percentile(batch_ms, 50)),
        "infer/batch_p99_ms": float(np.percentile(batch_ms, 99)),
        "infer/setup_s": setup,
    }
    waits = np.array([b["t_start"] - a["t_end"] for rs in by_replica.values()
                      for a, b in itertools.pairwise(sorted(rs, key=lambda r: r["t_start"]))])
    if waits.size:
        out["infer/replica_wait_p50_ms"] = float(np.percentile(waits, 50)) * 1e3
        out["infer/replica_wait_p90_ms"] = float(np.percentile(waits, 90)) * 1e3
    if inf.project_samples:
        out["infer/project_samples"] = inf.project_samples
        out["infer/projected_s"] = setup + inf.project_samples / rate
    gen = [r for r in records if r.get("first_token_s") is not None]
    if gen:
        prefill = sum(r["first_token_s"] for r in gen)
        decode = sum(r["service_s"] - r["first_token_s"] for r in gen)
        out["infer/tokens_per_s"] = sum(r["n"] * r["tokens"] for r in gen) / wall
        # While prefilling / decoding, per replica, summed over replicas: the two phases'
        # own rates, which a serving system schedules separately.
        out["infer/prefill_tokens_per_s"] = len(by_replica) * sum(
            r["n"] * r["prompt_tokens"] for r in gen) / prefill
        out["infer/decode_tokens_per_s"] = len(by_replica) * sum(
            r["n"] * (r["tokens"] - 1) for r in gen) / decode if decode > 0 else None
    out.update(accuracy(records, stats, trial))
    out.update(replica_facts(stats, rate, trial.hardware.precision))
    return out


def accuracy(records: list[dict[str, Any]], stats: list[dict[str, Any]], trial: TrialSpec
             ) -> dict[str, Any]:
    """The gate: agreement with the fp32 reference over every compared element, or, for a
    workload with a task metric, the lowest of the replicas' validation scores (each replica
    scored its own pass: a replica on a faulty device must not hide behind the others)."""
    inf = trial.inference
    if inf.accuracy_target is None:
        return {}
    metric = workloads.get(trial.workload_name).accuracy_metric
    extra: dict[str, Any] = {}
    if metric is None:
        metric = "agreement"
        compared = sum(r["compared"] for r in records)
        value = sum(r["matches"] for r in records) / compared if compared else None
    else:
        scores = [json.loads(s["score"]) for s in stats if s.get("score")]
        worst = min(scores, key=lambda sc: sc[metric], default=None)
        value = worst[metric] if worst else None
        compared = int(worst.get("samples", 0)) if worst else 0
        extra = {f"infer/score/{k}": v for k, v in (worst or {}).items()}
    # the reference or validation pass, per replica, not counted in the start-up time
    extra["infer/accuracy_check_s"] = max((s.get("accuracy_check_s") or 0.0 for s in stats),
                                          default=None)
    return {"infer/accuracy": value, "infer/accuracy_metric": metric,
            "infer/accuracy_target": inf.accuracy_target, "infer/accuracy_compared": compared,
            "infer/accuracy_ok": value is not None and value >= inf.accuracy_target, **extra}


def replica_facts(stats: list[dict[str, Any]], samples_per_s: float | None,
                  precision: str) -> dict[str, Any]:
    """What the replicas ran on and used, for Offline and Server rows alike: the device names,
    peak memory, forward FLOPs per sample (counted on a replica's real call), the TFLOP/s each
    replica achieved at `samples_per_s` over all of them, and MFU where the GPU's peak is
    known."""
    gpu = [s["peak_allocated_mb"] for s in stats if s.get("peak_allocated_mb") is not None]
    fps = next((s["flops_per_sample"] for s in stats if s.get("flops_per_sample")), None)
    per_replica = samples_per_s / len(stats) if samples_per_s and stats else None
    device = stats[0].get("device_name") if stats else None
    achieved, util = mfu(fps, per_replica, device, precision)
    return {"device": device_column(s["device_name"] for s in stats),
            "mem/peak_allocated_mb": max(gpu) if gpu else None,
            "host/rss_peak_mb": max((s["rss_peak_mb"] for s in stats), default=None),
            "perf/gflops_per_sample": fps / 1e9 if fps else None,
            "perf/achieved_tflops_per_gpu": achieved,
            "perf/mfu_pct": 100.0 * util if util is not None else None}


POOL_BATCHES = 8  # distinct input batches a pass makes before it starts

# How Ray Data carries the pass to the replicas. Each Ray Data task costs its actor about 5 ms of
# CPU around the call (Ray Data's bookkeeping), and its end reaches the driver's executor tens of
# ms later, which only then sends the next task. With one call per task and Ray Data's defaults
# (two tasks in flight, one at a time in the actor) a replica sat 10-16 ms idle between calls:
# 61-65% busy with calls of 26 ms on a 2-core VM, 71% with ResNet-50's 26 ms on the lent H100.
# So each replica's share of the pass comes as TASKS_PER_REPLICA tasks of several calls, up to
# TASKS_IN_FLIGHT of them sent ahead, and its actor takes ACTOR_TASKS at once: Ray Data still
# makes one call at a time (one thread runs the UDF), so a task's bookkeeping overlaps another
# task's call, never two forwards each other. Eight tasks a replica keep the pass's tail short
# (one task is an eighth of a replica's share) and the replicas' shares even.
TASKS_PER_REPLICA = 8
TASKS_IN_FLIGHT = 4
ACTOR_TASKS = 2


def run_local(trial: TrialSpec, devices: list[Any]) -> tuple[list[dict], list[dict]]:
    """Offline pass in this process: one thread per replica, batches from a shared queue.

    Inputs are made before the pass (pool_batches, then cycled): making a ResNet batch on one
    core takes longer than an H100 takes to classify it. So this measures the replicas with
    inputs in host memory (copies to the device included), as the Ray path does with the
    same inputs in its node's object store."""
    inf, b = trial.inference, trial.workload.batch_size
    replicas = [Replica(trial, i, device) for i, device in enumerate(devices)]
    chunks = [np.arange(lo, min(lo + b, inf.samples)) for lo in range(0, inf.samples, b)]
    pool = [_made(trial, ids) for ids in chunks[:pool_batches(trial)]]
    work: queue.Queue[np.ndarray] = queue.Queue()
    for ids in chunks:
        work.put(ids)
    records: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def drain(replica: Replica) -> None:
        try:
            while True:
                try:
                    ids = work.get_nowait()
                except queue.Empty:
                    return
                k, check = pool_turn(ids, b, len(pool))
                pool_ids, inputs = pool[k] if k is not None else _made(trial, ids)
                records.append(replica.serve(pool_ids, inputs, check=check))
        except BaseException as e:  # re-raised in the caller: a failed trial is a row
            errors.append(e)

    threads = [threading.Thread(target=drain, args=(r,)) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return records, [r.stats() for r in replicas]


def run_ray(trial: TrialSpec, start_timeout_s: float, logical_gpus: bool = False
            ) -> tuple[list[dict], list[dict]]:
    """Offline pass on Ray Data: batch numbers -> fixed actor pool of replicas -> driver.

    As in-process (run_local) and as MLPerf's LoadGen has its sample library load samples into
    memory before the timed run, the inputs are made before the pass: `pool_batches` distinct
    batches (and the short last one), made by tasks and held in Ray's object store, cycled in
    turn. Ray Data carries only batch numbers; each replica takes its batch's inputs from the
    store itself (`ray.get`: zero-copy on the replica's node, one transfer on another). Handed
    over as Ray Data blocks, every 38.5 MB ResNet batch was copied into a block by a task and
    out of it in the replica: on the lent H200 a replica serving 7,843 samples/s while busy got
    3,658 samples/s (busy 46.6%); the input operator, not the tasks' own 5.8 ms, held it back."""
    import ray  # Ray: only on its path; the local runner runs where Ray is not installed

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # A pipeline that cannot start or stops moving must fail, not wait (Ray's defaults: forever
    # for the pool, 30 min without progress). Placement was checked before, so these bound
    # start-ups (model, reference pass) and batches that never end.
    ctx.wait_for_min_actors_s = start_timeout_s + 300
    ctx.execution_no_progress_timeout_s = start_timeout_s + 600
    ctx.actor_init_retry_on_errors = False
    inf, hw, b = trial.inference, trial.hardware, trial.workload.batch_size
    # The pass's batch numbers come from the driver (from_items: no read task), one replica
    # call each: Ray Data cuts batches of sample ids at its blocks' edges, so batch_size alone
    # gave calls of other sizes (1,000 samples in 16 blocks: 62 or 63 ids each). A block of
    # numbers is one task (TASKS_PER_REPLICA). Inputs are made by 0-CPU tasks: replicas may
    # hold every CPU of the cluster (a task asking for one would then never be scheduled; seen
    # with replicas of 1.45 CPUs on 3).
    numbers = [{"batch": j} for j in range(math.ceil(inf.samples / b))]
    ds = ray.data.from_items(numbers, override_num_blocks=min(
        len(numbers), TASKS_PER_REPLICA * inf.replicas))
    make = ray.remote(num_cpus=0)(_made)
    pool = [make.remote(trial, np.arange(lo, lo + b))
            for lo in range(0, pool_batches(trial) * b, b)]
    short = inf.samples % b
    tail = make.remote(trial, np.arange(inf.samples - short, inf.samples)) if short else None
    ray.wait([*pool, *([tail] if tail else [])], num_returns=len(pool) + bool(tail),
             fetch_local=False)
    ds = ds.map_batches(
        _RayReplica, fn_constructor_kwargs={"trial": trial, "logical_gpus": logical_gpus,
                                            "pool": pool, "tail": tail},
        batch_size=1, **replica_pool(inf.replicas), num_cpus=hw.cpus_per_worker,
        num_gpus=1 if hw.use_gpu else 0, **env_option(hw.env))
    rows = []
    for row in ds.iter_rows():  # as they reach the driver: its clock times the pass
        row["arrived_s"] = time.perf_counter()
        rows.append(row)
    # Ray Data's account of the pass (each operator's time, the driver's waits): where a
    # replica's idle share is read from
    log.info("offline pass of trial %s on Ray Data:\n%s", trial.key, ds.stats())
    return _unpack(rows)


def replica_pool(replicas: int) -> dict[str, Any]:
    """`map_batches` options for the fixed pool of replicas: TASKS_IN_FLIGHT sent to each,
    ACTOR_TASKS at once in it. Ray 2.60 takes the latter as the pool's own
    `max_concurrent_calls_per_actor`, and warns that Ray's actor option `max_concurrency`
    among the remote args goes in 2.64; Ray 2.55 knows only the actor option."""
    import ray  # Ray: only on its path; the local runner runs where Ray is not installed

    pool = ray.data.ActorPoolStrategy
    fixed = {"size": replicas, "max_tasks_in_flight_per_actor": TASKS_IN_FLIGHT}
    if "max_concurrent_calls_per_actor" in inspect.signature(pool).parameters:
        return {"compute": pool(**fixed, max_concurrent_calls_per_actor=ACTOR_TASKS)}
    return {"compute": pool(**fixed), "max_concurrency": ACTOR_TASKS}


def env_option(env: dict[str, str]) -> dict[str, Any]:
    """Ray options giving replica processes the trial's `hardware.env` as they start."""
    return {"runtime_env": {"env_vars": dict(env)}} if env else {}


def pass_seconds(records: list[dict[str, Any]]) -> float:
    """First batch start to last batch end, on one clock.

    Replicas on other nodes have other clocks: their `t_start` times differ by the nodes'
    clock skew, which would enter the throughput. On Ray each batch also carries `arrived_s`,
    the driver's clock when it reached the driver, and each node's clock is put on the
    driver's by its quickest hand-over: the smallest `arrived_s - t_end` of its batches. So
    replicas on one node are timed on their own clock, and nodes differ by no more than their
    quickest hand-overs do. A batch's own arrival is no measure of its start: Ray Data hands a
    task's calls over together, and the first ones, with the pipeline filling, waited longest,
    so `arrived_s - service_s` put the start late (passes 0.5-8.5% short on a 2-core VM with
    one call a task, more with several). In-process all replicas share one clock."""
    if all(r.get("arrived_s") is not None for r in records):
        offset: dict[str, float] = {}
        for r in records:
            lag = r["arrived_s"] - r["t_end"]
            offset[r["node"]] = min(lag, offset.get(r["node"], lag))
        return (max(r["t_end"] + offset[r["node"]] for r in records)
                - min(r["t_start"] + offset[r["node"]] for r in records))
    return max(r["t_end"] for r in records) - min(r["t_start"] for r in records)


def pool_batches(trial: TrialSpec) -> int:
    """Distinct input batches made before the pass, then cycled: POOL_BATCHES, or as many as
    the accuracy check's samples fill (each is compared once, on its first use)."""
    inf = trial.inference
    need = math.ceil((inf.accuracy_samples if inf.accuracy_target else 0)
                     / trial.workload.batch_size)
    return min(max(POOL_BATCHES, need), math.ceil(inf.samples / trial.workload.batch_size))


def pool_turn(ids: np.ndarray, batch_size: int, pool_size: int) -> tuple[int | None, bool]:
    """Which pool batch serves the pass's batch of these ids, the pool cycled in turn (None:
    a batch of another size, the short last one, which gets inputs of its own), and whether
    its samples are compared with the reference: a pool batch's on its first use only."""
    if len(ids) != batch_size:
        return None, True
    turn = int(ids[0]) // batch_size
    return turn % pool_size, turn < pool_size


def _made(t: TrialSpec, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A batch as both passes hold it: its sample ids, and their inputs (whose names are the
    workload's own: fixed_service's input is called `id`)."""
    return ids, workloads.get(t.workload_name).serving_inputs(t.workload, ids)


class _RayReplica:
    """Ray Data's callable class around a Replica; one row per call: its record and the
    replica's facts (a row per sample made each ResNet batch of 256 into 256 rows for Ray Data
    to build and the driver to read, for the same figures)."""

    def __init__(self, trial: TrialSpec, logical_gpus: bool, pool: list, tail: Any):
        import ray  # Ray: only on its path; the local runner runs where Ray is not installed

        rt = ray.get_runtime_context()
        self.replica = Replica(trial, index=rt.get_actor_id()[:12],
                               node=ray.util.get_node_ip_address(), logical_gpus=logical_gpus)
        self.pool, self.tail, self.seq = pool, tail, 0  # object refs: not resolved until used

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import ray  # Ray: only on its path; the local runner runs where Ray is not installed

        # the pass's batch as `pool_turn` picks it; a pool batch brings its own samples, so
        # its ids (the accuracy check compares those with the reference)
        j, b = int(batch["batch"][0]), self.replica.trial.workload.batch_size
        wanted = np.arange(j * b, min((j + 1) * b, self.replica.trial.inference.samples))
        k, check = pool_turn(wanted, b, len(self.pool))
        ids, inputs = ray.get(self.pool[k] if k is not None else self.tail)
        rec = self.replica.serve(ids, inputs, check=check)
        self.seq += 1
        facts = {**rec, **{f"stat_{k}": v for k, v in self.replica.stats().items()},
                 "seq": self.seq}
        return {k: np.array([v], dtype=object if v is None or isinstance(v, str) else None)
                for k, v in facts.items()}


def _unpack(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """Per-call rows back to per-batch records and per-replica facts (its latest)."""
    batches = [{k: _plain(v) for k, v in row.items() if not k.startswith("stat_") and k != "seq"}
               for row in rows]
    stats = {row["replica"]: {k[5:]: _plain(v) for k, v in row.items() if k.startswith("stat_")}
             for row in sorted(rows, key=lambda r: int(r["seq"]))}
    return batches, list(stats.values())


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
