"""Which Ray a sweep runs on, and what that cluster holds.

Owns the choice `--address`, else `RAY_ADDRESS` (set by `ray job submit`), else an embedded
local Ray sized to this machine; and the per-node resources that planning checks against.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raybench import store
from raybench.runners.on_ray import private as ray_private

log = logging.getLogger(__name__)

# Ray's own chatter and telemetry are off for benchmark runs; both are read at ray.init.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray starts its worker processes at nice 15, so that its own daemons come first; a
# benchmark's ranks then yield to every other process on the machine. With one busy process
# per core (nice 0), a two-rank worker group had still not started 60 s after its run began
# (9-14 s on this machine idle), and a rank ran on what the other processes left. Read when
# this process starts a Ray (embedded); a cluster's nodes take it from `ray start`'s
# environment (README, cluster/).
os.environ.setdefault("RAY_worker_niceness", "0")


# Whether Ray's own console output reaches this terminal: Tune's experiment box, the Train
# controller's resource lines, the workers' output, Ray's warnings. Off by default (`--verbose`
# turns it on): the terminal is raybench's progress, one line per finished trial and the
# summary; Ray's output stays in its session's log files. Read at ray.init and by Tune.
_verbose = False



class Unreachable(ConnectionError):
    """The cluster raybench was pointed at does not answer: an input error (exit 2) with its
    fix, raised within seconds rather than after the minutes a client library may retry."""


def show_ray_output(verbose: bool) -> None:
    global _verbose
    _verbose = verbose


def _quiet_tune() -> None:
    """Tune's new output prints its experiment box at any verbosity; the older one is silent at
    verbose=0. Read by the driver at each fit, so set wherever this process takes its Ray
    (`bench overhead` too). The commands' stdout would keep the box out of their JSON lines
    anyway (console.py); this keeps it out of the log on stderr."""
    if not _verbose:
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


def _console() -> dict[str, Any]:
    """ray.init's settings for the console (see _verbose)."""
    return {"log_to_driver": _verbose,
            "logging_level": logging.WARNING if _verbose else logging.ERROR}


def target(address: str | None) -> str | None:
    """The cluster address to join, or None for an embedded local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def local_shape() -> dict[str, float]:
    """What an embedded Ray on this machine will offer.

    One logical CPU more than the cores: each Tune trial holds a 0.01-CPU driver while its
    workers run, and Ray places by logical counts, so without it a trial asking for every
    core could never start on a small machine (the 2-core CI runner). The GPUs are those Ray
    finds itself, as on a cluster's nodes (NVML, within CUDA_VISIBLE_DEVICES), not torch's
    count: the sweep starts this Ray while torch is still being imported (sweep/command.py).
    """
    gpus = ray_private.visible_gpus()
    shape = {"CPU": float((os.cpu_count() or 1) + 1)}
    if gpus is not None:  # else Ray counts them at ray.init
        shape["GPU"] = float(gpus)
    return shape


def ray_is_up() -> bool:
    """Whether this process is already connected to a Ray (started or joined)."""
    return ray.is_initialized()


REACH_TIMEOUT_S = 5.0  # a head on another continent answers a TCP connect well within it


def check_reachable(addr: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise Unreachable unless something accepts a connection at `addr`: HOST:PORT (Ray's GCS
    port) or ray://HOST:PORT (a Ray Client server). `ray.init` on an address where nothing
    listens retried for minutes (over 2 min here, Ray 2.60; a ray:// one 31 s) before it gave
    up, and on a malformed one (`:::::`) raised at once. `auto` and `local` are Ray's own."""
    if addr in ("auto", "local"):
        return
    scheme, sep, rest = addr.partition("://")
    host, _, port = (rest if sep else addr).rpartition(":")
    if (sep and scheme != "ray") or not host.strip("[]") or not port.isdigit():
        raise Unreachable(
            f"{addr!r} is not the address of a Ray cluster. Fix: give its head as --address "
            "HOST:PORT (the GCS port, 6379 by default) or ray://HOST:PORT (Ray Client, 10001), "
            "or set RAY_ADDRESS; without either, raybench starts its own Ray on this machine")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise Unreachable(
            f"no Ray cluster answers at {addr} ({e.strerror or e}). Fix: start one there "
            "(`ray start --head`), or give the head's address as --address HOST:PORT (its GCS "
            "port, 6379 by default) or RAY_ADDRESS; without either, raybench starts its own "
            "Ray on this machine") from e


def connect(address: str | None) -> bool:
    """Join or start Ray; returns True when this process started it (and must shut it down).
    An address where nothing answers raises Unreachable within seconds."""
    addr = target(address)
    _quiet_tune()
    if ray.is_initialized():
        return False
    if addr:
        check_reachable(addr)
        log.info("joining Ray cluster at %s", addr)
        try:
            ray.init(address=addr, **_console())
        except ConnectionError as e:
            # something accepted the TCP connection and no Ray answered on it (a proxy or
            # another service on the port): Ray gave up after about 20 s here
            raise Unreachable(
                f"no Ray cluster answers at {addr} (the port accepts connections, but Ray's "
                f"handshake failed: {store.first_line(e, 160)}). Fix: give the head's GCS "
                "address as --address HOST:PORT (6379 by default; `ray status` on the head "
                "prints it) or RAY_ADDRESS; without either, raybench starts its own Ray on "
                "this machine") from e
        _say_where_ray_logs()
        return False
    shape = local_shape()
    log.info("starting an embedded Ray: %g CPUs, %s GPUs", shape["CPU"],
             f"{shape['GPU']:g}" if "GPU" in shape else "Ray's count of")
    # address="local": a Ray of its own, as the choice above says. Without an address
    # ray.init joins the Ray that `ray start` last started on this machine (its address file,
    # written by a worker node's `ray start --address` too), and with num_cpus given it then
    # raised "When connecting to an existing cluster, num_cpus and num_gpus must not be
    # provided" (seen on 2026-11-27 while a test's two-node cluster ran beside the sweep).
    # The dashboard serves the State API that Ray Train's placement-group cleaner polls; it
    # listens on loopback only, since an embedded Ray has no reason to be reachable.
    # one raybench_node token: what `concurrency: per_node` trials hold a node by (plan.py)
    ray.init(address="local", num_cpus=int(shape["CPU"]),
             num_gpus=int(shape["GPU"]) if "GPU" in shape else None,
             resources={"raybench_node": 1},
             include_dashboard=True, dashboard_host="127.0.0.1", **_console())
    _say_where_ray_logs()
    return True


def _say_where_ray_logs() -> None:
    if not _verbose:
        log.info("Ray's own output (its workers', Tune's, Train's) goes to the log files of "
                 "Ray session %s (logs/ in its session folder, /tmp/ray/session_latest on the "
                 "head node by default); --verbose shows it here",
                 ray.get_runtime_context().get_session_name())


def shutdown() -> None:
    """End the Ray this process started (connect() returned True).

    Ray ends its autoscaler monitor after the GCS, with a SIGTERM and up to a second's grace,
    which it always used up: 1.0 of the 1.4 s that `ray.shutdown` took at the end of every
    sweep here. An embedded Ray has nothing for it to scale or save, so it goes first, at
    once; the rest end as Ray ends them."""
    for monitor in ray_private.autoscaler_monitors():
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait(timeout=5)
    ray.shutdown()


def nodes() -> list[dict[str, float]]:
    """Resources of each alive node of the connected cluster."""
    return [
        {k: float(v) for k, v in n["Resources"].items()}
        for n in ray.nodes() if n.get("Alive")
    ]


NODE_FACTS_TIMEOUT_S = 120.0


def node_facts(embedded: bool = False) -> dict[str, dict[str, Any]]:
    """Every alive node's own system facts (GPUs, driver, CUDA, NCCL and its variables,
    topology), gathered by a 0-CPU task pinned to that node, keyed by node IP. A node that does
    not answer in time gets an `error` entry: facts never hold up a sweep. `embedded`: this
    process started Ray, so its workers share this process's machine and environment, and
    this node's facts are read here (a probe task's worker process costs seconds to start)."""
    from raybench import sysinfo  # torch (1.5 s): in each node's facts task only

    probe = ray.remote(num_cpus=0, max_retries=0)(sysinfo.machine)
    here = ray.get_runtime_context().get_node_id() if embedded else None
    alive = [n for n in ray.nodes() if n.get("Alive")]
    local = {n["NodeManagerAddress"]: sysinfo.machine() for n in alive if n["NodeID"] == here}
    alive = [n for n in alive if n["NodeID"] != here]
    refs = {n["NodeManagerAddress"]: probe.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in alive}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs),
                        timeout=NODE_FACTS_TIMEOUT_S) if refs else ([], [])
    out = dict(local)
    for ip, ref in sorted(refs.items()):
        try:
            out[ip] = ray.get(ref) if ref in ready else {
                "error": f"no answer in {NODE_FACTS_TIMEOUT_S:g} s"}
        except Exception as e:  # a node that cannot run the probe still lets the sweep run
            out[ip] = {"error": f"{type(e).__name__}: {e}"[:300]}
    for ref in refs.values():
        if ref not in ready:
            ray.cancel(ref, force=True)
    return dict(sorted(out.items()))


def describe() -> dict[str, Any]:
    return {
        "address": ray.get_runtime_context().gcs_address,
        "resources": {k: float(v) for k, v in ray.cluster_resources().items()
                      if not k.startswith("node:")},
        "nodes": [
            {"node_ip": n.get("NodeManagerAddress"), "alive": n.get("Alive"),
             "resources": {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}}
            for n in ray.nodes()
        ],
    }
