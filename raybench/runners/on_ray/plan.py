"""The plan: which trials a cluster can ever hold, and the `--dry-run` printout.

Owns the placement check (totals across nodes, and each worker on a single node) used both by the
dry run and by the sweep before it starts anything. Ray's own "can never fit" check needs an
autoscaler config, so without this an impossible trial would wait for its start deadline.
"""

from __future__ import annotations

import json
import sys

from raybench import workloads
from raybench.grid import stage_variants
from raybench.runners.on_ray import cluster
from raybench.spec import SweepSpec
from raybench.trials import TrialSpec


def dry_run(spec: SweepSpec, trials: list[TrialSpec], address: str | None) -> int:
    """Print the plan; exit code 2 if any trial can never fit, else 0. Runs nothing."""
    nodes, where = _nodes_for_plan(address)
    print(f"sweep {spec.name} ({spec.source}): {len(trials)} trials, workload "
          f"{spec.workload_name}, system {spec.system.label}; planned against {where}: "
          f"{_shape(nodes)}")
    for i, v in enumerate(stage_variants(spec)):
        print(f"  [stage {i}] preprocess {v.scenes} -> chip_size={v.chip_size} "
              f"overlap={v.overlap} channels={v.channels} cpus={v.cpus or 'all'} "
              f"{'fresh' if v.fresh else 'cached in ' + v.out}")
    bad = 0
    for t in trials:
        why = placement(t, nodes)
        bad += why is not None
        res = t.resources()
        print(f"  [{t.index:3d}] {t.key}  {json.dumps(t.overrides, sort_keys=True)}  "
              f"workers={res['workers']} per_worker={res['per_worker']}  "
              f"{'fits' if why is None else 'NEVER FITS: ' + why}")
    if bad:
        print(f"raybench: {bad} of {len(trials)} trials can never be placed on {where}",
              file=sys.stderr)
        return 2
    return 0


def _nodes_for_plan(address: str | None) -> tuple[list[dict[str, float]], str]:
    if cluster.target(address):
        cluster.connect(address)
        return cluster.nodes(), f"cluster {cluster.target(address)}"
    return [cluster.local_shape()], "an embedded Ray on this machine"


def _shape(nodes: list[dict[str, float]]) -> str:
    cpu = sum(n.get("CPU", 0) for n in nodes)
    gpu = sum(n.get("GPU", 0) for n in nodes)
    return f"{len(nodes)} node(s), {cpu:g} CPUs, {gpu:g} GPUs"


def placement(trial: TrialSpec, nodes: list[dict[str, float]]) -> str | None:
    """None if the trial can ever be placed on these nodes (their total resources), else why."""
    res = trial.resources()
    have = {k: sum(n.get(k, 0.0) for n in nodes) for k in res["total"]}
    short = [k for k, v in res["total"].items() if v > have[k] + 1e-9]
    if short:
        need = ", ".join(f"{k}={res['total'][k]:g}" for k in short)
        got = ", ".join(f"{k}={have[k]:g}" for k in short)
        return f"needs {need} in all ({res['workers']} workers) but the cluster has {got}"
    # Each worker must fit on a single node; count how many workers every node can hold.
    slots = sum(_slots(n, res["per_worker"]) for n in nodes)
    if slots < res["workers"]:
        return (f"needs {res['workers']} workers of {res['per_worker']} but the nodes hold "
                f"only {slots} such workers")
    return None


def gpus_missing(trials: list[TrialSpec], nodes: list[dict[str, float]]) -> str | None:
    """Why the sweep as a whole cannot run here: GPU trials on a cluster with no GPU at all.
    That is a sweep pointed at the wrong cluster (input to fix, exit 2), not a trial that
    happens not to fit (an `infeasible` row)."""
    asking = [t for t in trials if t.resources()["total"].get("GPU", 0) > 0]
    if asking and not any(n.get("GPU", 0) > 0 for n in nodes):
        return (f"{len(asking)} of {len(trials)} trials ask for GPUs but the Ray cluster has "
                f"none ({len(nodes)} node(s))")
    return None


NODE_TOKEN = "raybench_node"  # one per node: `per_node` trials take a whole node's token
TUNE_TRIAL_CPU = 0.01  # each running trial's Tune function holds this much beside its workers


def strategy(trial: TrialSpec, nodes: list[dict[str, float]], placement_mode: str,
             concurrency: str) -> str:
    """Ray placement strategy of a trial's workers: on one node when it fits there (no network
    between ranks), over several when it does not; `per_node` trials must stay on one node."""
    if concurrency == "per_node":
        return "STRICT_PACK"
    if placement_mode == "spread":
        return "SPREAD"
    if placement_mode == "pack":
        return "PACK"
    res = trial.resources()
    one = any(_slots(n, res["per_worker"]) >= res["workers"] for n in nodes)
    return "PACK" if one else "SPREAD"


def concurrency_limit(trials: list[TrialSpec], nodes: list[dict[str, float]],
                      mode: str) -> tuple[int, str]:
    """How many trials may run at once, and why. The bound is for an envelope trial (the most
    workers and the largest worker of the grid), so any that many trials fit side by side and
    none waits for resources (a waiting worker group would hit its start deadline)."""
    if mode == "exclusive" or not trials:
        return 1, "exclusive: one trial at a time"
    workers = max(t.resources()["workers"] for t in trials)
    per_worker: dict[str, float] = {}
    for t in trials:
        for k, v in t.resources()["per_worker"].items():
            if not k.startswith("node:"):  # a trial pinned to its node: `placement` checks it
                per_worker[k] = max(per_worker.get(k, 0.0), v)
    if mode == "per_node":
        fit = [n for n in nodes if n.get(NODE_TOKEN, 0) >= 1 and _slots(n, per_worker) >= workers]
        return (max(1, len(fit)), f"per_node: {len(fit)} of {len(nodes)} nodes each hold a whole "
                f"trial of {workers} x {per_worker}")
    # pack: copies of the envelope trial placed worker by worker, the Tune CPU included
    copies = sum(_slots(n, per_worker) for n in nodes) // workers
    cpus = sum(n.get("CPU", 0.0) for n in nodes)
    while copies > 1 and copies * (workers * per_worker.get("CPU", 0) + TUNE_TRIAL_CPU) > cpus:
        copies -= 1
    return (max(1, copies), f"pack: {copies} trials of {workers} x {per_worker} fit at once on "
            f"{_shape(nodes)}")


def worker_groups(trials: list[TrialSpec], strategies: dict[str, str], isolation: str,
                  limit: int) -> list[list[int]]:
    """Which trials share a worker group, as positions in `trials`, each group in the order
    its trials run: the most ranks first, grid order among equals.

    `process`: every trial alone. `worker`: trials of one shape (resources per worker,
    placement strategy, hardware.env: what a worker group is started with) share a group.
    Where trials run one at a time (`limit` 1) and are packed, trials of every rank count share
    one group of the most ranks: they run widest first, and before a trial of fewer ranks the
    group's last ranks leave it (rank/entry.py), ending their part of the run while their resources
    stay held, which no other trial could use meanwhile. Otherwise a group has one rank count:
    a spread group's first ranks are not a spread placement of fewer, and where `limit` trials
    may run at once, a shape's trials are dealt over up to `limit` groups so the sweep stays
    as parallel as before. A trial that keeps a checkpoint runs alone: Ray Train hands back one
    checkpoint per run."""
    if isolation == "process":
        return [[i] for i in range(len(trials))]
    shapes: dict[tuple, list[int]] = {}
    alone = []
    for i, t in enumerate(trials):
        if workloads.get(t.workload_name).saves_checkpoint(t.workload):
            alone.append([i])
            continue
        res = t.resources()
        packed = limit == 1 and strategies[t.key] == "PACK"
        shape = (None if packed else res["workers"], tuple(sorted(res["per_worker"].items())),
                 strategies[t.key], tuple(sorted(t.hardware.env.items())))
        shapes.setdefault(shape, []).append(i)
    out = []
    for members in shapes.values():
        members.sort(key=lambda i: -trials[i].resources()["workers"])  # stable: grid order
        n = min(limit, len(members))
        out += [members[k::n] for k in range(n)]
    return sorted(out + alone)


def _slots(node: dict[str, float], per_worker: dict[str, float]) -> int:
    """Workers of this shape one node holds."""
    return min(int(node.get(k, 0.0) // v + 1e-9) for k, v in per_worker.items() if v > 0)
